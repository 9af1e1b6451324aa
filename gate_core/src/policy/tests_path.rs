//! Table-driven tests of path canonicalisation, path patterns and durations.

use std::time::Duration;

use super::duration::{parse_duration, show_remaining};
use super::path::{canonical_path, PathError, PathPattern, PatternError};

#[test]
fn paths_are_decoded_once_and_ambiguous_ones_refused() {
    let ok: &[(&str, &str, &str)] = &[
        ("the root", "/", "/"),
        ("a plain path", "/v3/mail/send", "/v3/mail/send"),
        ("a trailing slash is kept", "/a/", "/a/"),
        ("an encoded unreserved character is decoded", "/%7Euser", "/~user"),
        ("lower-case hex is decoded the same", "/%7euser", "/~user"),
        ("an encoded letter is decoded", "/%61pi", "/api"),
        ("an encoded space is decoded", "/a%20b", "/a b"),
        ("a dot inside a segment is fine", "/a/.well-known/x", "/a/.well-known/x"),
        ("a dot inside a name is fine", "/v1.0/a.txt", "/v1.0/a.txt"),
        ("a literal star is a character", "/a*b", "/a*b"),
    ];
    for (case, input, want) in ok {
        assert_eq!(canonical_path(input).as_deref(), Ok(*want), "{case}");
    }
    use PathError::*;
    let bad: &[(&str, &str, PathError)] = &[
        ("empty", "", NotAbsolute),
        ("asterisk form", "*", NotAbsolute),
        ("a relative path", "a/b", NotAbsolute),
        ("a fragment", "/a#b", Fragment),
        ("a query in a path", "/a?b", Query),
        ("a lone percent", "/a%", BadPercent),
        ("one hex digit", "/a%4", BadPercent),
        ("not hex", "/a%zz", BadPercent),
        ("an encoded slash", "/a%2Fb", EncodedSlash),
        ("an encoded slash in lower case", "/a%2fb", EncodedSlash),
        ("an encoded backslash", "/a%5Cb", EncodedBackslash),
        ("an encoded question mark", "/a%3Fb", EncodedDelimiter),
        ("an encoded hash", "/a%23b", EncodedDelimiter),
        ("double encoding", "/a%252Fb", EncodedPercent),
        ("a backslash", "/a\\b", Backslash),
        ("an encoded NUL", "/a%00", Control),
        ("an encoded newline", "/a%0Ab", Control),
        ("a raw tab", "/a\tb", Control),
        ("DEL", "/a%7F", Control),
        ("an encoded non-ASCII byte", "/caf%C3%A9", NonAscii),
        ("raw non-ASCII", "/café", NonAscii),
        ("a dot-dot segment", "/a/../b", DotSegment),
        ("a trailing dot-dot", "/a/..", DotSegment),
        ("a dot segment", "/a/./b", DotSegment),
        ("an encoded dot-dot", "/a/%2e%2E/b", DotSegment),
        ("a half-encoded dot-dot", "/a/.%2e/b", DotSegment),
        ("dot-dot with a path parameter", "/a/..;x/b", Parameter),
        ("a path parameter", "/admin;x", Parameter),
        ("an encoded path parameter", "/admin%3Bx", Parameter),
        ("an encoded path parameter in lower case", "/admin%3bx/deeper", Parameter),
        ("a trailing dot on a segment", "/admin.", TrailingDotOrSpace),
        ("an encoded trailing dot", "/admin%2e/x", TrailingDotOrSpace),
        ("an encoded trailing space", "/admin%20", TrailingDotOrSpace),
        ("three dots", "/a/.../b", TrailingDotOrSpace),
        ("a leading empty segment", "//a", EmptySegment),
        ("an empty segment inside", "/a//b", EmptySegment),
    ];
    for (case, input, want) in bad {
        assert_eq!(canonical_path(input), Err(*want), "{case}");
    }
}

#[test]
fn path_patterns_match_segment_prefixes_or_globs() {
    let table: &[(&str, &str, &str, bool)] = &[
        ("a prefix matches itself", "/v3/mail/send", "/v3/mail/send", true),
        ("a prefix matches below itself", "/v3/mail/send", "/v3/mail/send/batch", true),
        ("a prefix stops at a segment boundary", "/v3/mail/send", "/v3/mail/sendx", false),
        ("a prefix does not match its parent", "/v3/mail/send", "/v3/mail", false),
        ("a prefix with a trailing slash matches below", "/v3/", "/v3/x", true),
        ("a prefix with a trailing slash needs it", "/v3/", "/v3", false),
        ("the root prefix matches everything", "/", "/anything/at/all", true),
        ("matching is case-sensitive", "/v3/mail", "/V3/mail", false),
        ("a star matches one segment", "/repos/*/issues", "/repos/gatewrap/issues", true),
        ("a star never crosses a slash", "/repos/*/issues", "/repos/a/b/issues", false),
        ("a star may match nothing", "/a*", "/a", true),
        ("a glob matches the whole path", "/repos/*/issues", "/repos/x/issues/1", false),
        ("a double star crosses slashes", "/files/**", "/files/a/b/c", true),
        ("a double star may match nothing", "/files/**", "/files/", true),
        ("a double star inside", "/a/**/z", "/a/b/c/z", true),
        ("a star inside a segment", "/v1/*.json", "/v1/models.json", true),
        ("a star inside a segment stays in it", "/v1/*.json", "/v1/x/models.json", false),
    ];
    for (case, pattern, path, want) in table {
        let p = PathPattern::parse(pattern).unwrap_or_else(|e| panic!("{case}: {e}"));
        assert_eq!(p.matches(path), *want, "{case}");
    }
    assert!(matches!(PathPattern::parse("/a/%2A"), Err(PatternError::EncodedStar(_))), "an encoded star");
    assert!(matches!(PathPattern::parse("/a/***"), Err(PatternError::TripleStar(_))), "three stars");
    assert!(matches!(PathPattern::parse("/a/../b"), Err(PatternError::Path(_, PathError::DotSegment))), "dot-dot");
    assert!(matches!(PathPattern::parse("/a?x=1"), Err(PatternError::Path(_, PathError::Query))), "a query");
    assert_eq!(PathPattern::parse("/a%20b"), Ok(PathPattern::Prefix("/a b".into())), "patterns are decoded too");
}

#[test]
fn a_glob_with_many_stars_matches_in_linear_time() {
    let p = PathPattern::parse(&format!("/{}b", "*a".repeat(30))).expect("pattern");
    let path = format!("/{}", "a".repeat(8000));
    assert!(!p.matches(&path));
}

#[test]
fn durations_are_a_number_and_one_unit() {
    let ok: &[(&str, &str, u64)] = &[
        ("seconds", "30s", 30),
        ("minutes", "10m", 600),
        ("hours", "2h", 7200),
        ("leading zeros", "010m", 600),
        ("31 days in hours", "744h", 744 * 3600),
    ];
    for (case, text, secs) in ok {
        assert_eq!(parse_duration(text), Ok(Duration::from_secs(*secs)), "{case}");
    }
    for (case, text) in [
        ("no unit", "10"),
        ("zero", "0s"),
        ("a fraction", "1.5m"),
        ("two units", "1h30m"),
        ("a space", "10 m"),
        ("upper case", "10M"),
        ("days", "1d"),
        ("negative", "-1s"),
        ("empty", ""),
        ("unit only", "m"),
        ("more than 31 days", "745h"),
        ("a huge number", "99999999999999999999s"),
    ] {
        let e = parse_duration(text).expect_err(case);
        assert!(e.to_string().contains("expected a whole number and a unit s, m or h"), "{case}: {e}");
    }
}

#[test]
fn time_left_is_rounded_up_to_one_unit() {
    let table: &[(&str, Duration, &str)] = &[
        ("nothing left still reads as a second", Duration::ZERO, "1s"),
        ("a part of a second rounds up", Duration::from_millis(39_200), "40s"),
        ("under two minutes in seconds", Duration::from_secs(119), "119s"),
        ("minutes round up", Duration::from_secs(599), "10m"),
        ("hours round up", Duration::from_secs(7201), "3h"),
    ];
    for (case, d, want) in table {
        assert_eq!(show_remaining(*d), *want, "{case}");
    }
}
