//! Request paths as rules see them: percent-decoded exactly once, and refused rather than
//! guessed at wherever servers are known to read the same bytes differently.
//!
//! A rule's `path` and a request's path go through the same [`canonical_path`], so a rule
//! written `/a%7Eb` matches requests for `/a~b` and `/a%7eb` alike: all become `/a~b`. Matching is
//! case-sensitive (RFC 3986 §6.2.2.1) and ignores the query (everything from the first `?`).
//!
//! Refused classes (each a [`PathError`] variant; the gate denies the request with reason
//! `path: <the error>` when a rule with `path` has to look at it):
//! - a path that does not start with `/` (empty, `*` of `OPTIONS *`, a relative path);
//! - `#` (a fragment is never part of a request target, RFC 9112 §3.2), and `?` in a
//!   rule's path (rules match the path without the query);
//! - malformed percent-encoding (`%` not followed by two hex digits);
//! - encoded delimiters: `%2F` (`/`), `%5C` (`\`), `%3F` (`?`), `%23` (`#`) and `%25` (`%`:
//!   decoded twice it would be another path);
//! - a backslash `\` (some servers read it as `/`);
//! - NUL and other control characters (0x00-0x1F, 0x7F), raw or encoded (`%00`, `%0A`);
//! - non-ASCII bytes, raw or encoded (servers differ on Unicode normalisation and on
//!   invalid UTF-8);
//! - `;`, raw or encoded (`%3B`): a path parameter, which Java servers (Tomcat, Jetty,
//!   Spring) strip before routing (`/admin;x` is `/admin` to them, `..;x` is `..`);
//! - dot segments `.` and `..`, raw or encoded (`%2e%2E`);
//! - a segment ending in `.` or a space (`/admin.`, `/admin%20`), which Windows servers
//!   (IIS) trim;
//! - empty segments (`//`), which some servers merge into one `/`.
//!
//! The canonical form is the decoded path: printable ASCII (0x20-0x7E) other than `%`, `\`,
//! `?`, `#` and `;`, starting with `/`. Canonicalising it again gives it back unchanged.

/// Why a path was refused; the text goes into the audit reason after `path: `.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    #[error("does not start with '/'")]
    NotAbsolute,
    #[error("'#' (a fragment) in a request target")]
    Fragment,
    #[error("'?' (a query); paths are matched without it")]
    Query,
    #[error("malformed percent-encoding")]
    BadPercent,
    #[error("encoded '/' (%2F) is ambiguous")]
    EncodedSlash,
    #[error("encoded '\\' (%5C) is ambiguous")]
    EncodedBackslash,
    #[error("encoded '?' or '#' (%3F, %23) is ambiguous")]
    EncodedDelimiter,
    #[error("encoded '%' (%25) is ambiguous (double encoding)")]
    EncodedPercent,
    #[error("backslash is ambiguous")]
    Backslash,
    #[error("NUL or control character")]
    Control,
    #[error("non-ASCII character")]
    NonAscii,
    #[error("';' (a path parameter) is ambiguous")]
    Parameter,
    #[error("dot segment ('.' or '..')")]
    DotSegment,
    #[error("a segment ending in '.' or ' ' is ambiguous")]
    TrailingDotOrSpace,
    #[error("empty segment ('//')")]
    EmptySegment,
}

/// Whether `b` may appear in a canonical path (see the module doc).
pub fn allowed_byte(b: u8) -> bool {
    (0x20..=0x7e).contains(&b) && !matches!(b, b'%' | b'\\' | b'?' | b'#' | b';')
}

fn hex(b: u8) -> Option<u8> {
    (b as char).to_digit(16).map(|d| d as u8)
}

/// The path part of an origin-form request target (`/a/b?q` -> `/a/b`).
pub fn without_query(target: &str) -> &str {
    target.split_once('?').map_or(target, |(p, _)| p)
}

/// Decode `path` (no query) once and check it; see the module doc for what is refused.
pub fn canonical_path(path: &str) -> Result<String, PathError> {
    let raw = path.as_bytes();
    if raw.first() != Some(&b'/') {
        return Err(PathError::NotAbsolute);
    }
    let mut out = String::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        let b = raw[i];
        let decoded = match b {
            b'%' => {
                let (h, l) = match (raw.get(i + 1).copied().and_then(hex), raw.get(i + 2).copied().and_then(hex)) {
                    (Some(h), Some(l)) => (h, l),
                    _ => return Err(PathError::BadPercent),
                };
                i += 3;
                match (h << 4) | l {
                    b'/' => return Err(PathError::EncodedSlash),
                    b'\\' => return Err(PathError::EncodedBackslash),
                    b'?' | b'#' => return Err(PathError::EncodedDelimiter),
                    b'%' => return Err(PathError::EncodedPercent),
                    b';' => return Err(PathError::Parameter),
                    d => d,
                }
            }
            b'#' => return Err(PathError::Fragment),
            b';' => return Err(PathError::Parameter),
            b'\\' => return Err(PathError::Backslash),
            b'?' => return Err(PathError::Query),
            _ => {
                i += 1;
                b
            }
        };
        if decoded < 0x20 || decoded == 0x7f {
            return Err(PathError::Control);
        }
        if decoded > 0x7f {
            return Err(PathError::NonAscii);
        }
        out.push(decoded as char);
    }
    check_segments(&out)?;
    Ok(out)
}

fn check_segments(path: &str) -> Result<(), PathError> {
    let segments: Vec<&str> = path[1..].split('/').collect();
    let last = segments.len() - 1;
    for (n, seg) in segments.iter().enumerate() {
        // A trailing slash ("/a/") ends in one empty segment; "/" is that alone.
        if seg.is_empty() && n != last {
            return Err(PathError::EmptySegment);
        }
        if *seg == "." || *seg == ".." {
            return Err(PathError::DotSegment);
        }
        if seg.ends_with('.') || seg.ends_with(' ') {
            return Err(PathError::TrailingDotOrSpace);
        }
    }
    Ok(())
}

/// A rule's `path`: a segment prefix, or (when it has `*`) a glob over the whole path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathPattern {
    /// `/v3/mail/send` matches itself and anything below it (`/v3/mail/send/x`), never
    /// `/v3/mail/sendx`. `/` matches every path.
    Prefix(String),
    /// `*` matches any run of characters within one segment (no `/`); `**` any run,
    /// `/` included. The glob must match the whole path: `/repos/*/issues`.
    Glob(String),
}

/// Why a rule's `path` was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatternError {
    #[error("invalid path {0:?}: {1}")]
    Path(String, PathError),
    #[error("invalid path {0:?}: write '*' only as a wildcard, not as %2A")]
    EncodedStar(String),
    #[error("invalid path {0:?}: '***'; use '*' (one segment) or '**' (any depth)")]
    TripleStar(String),
}

impl PathPattern {
    /// Canonicalise a rule's `path` with [`canonical_path`] (a query is refused, as `?`).
    pub fn parse(text: &str) -> Result<PathPattern, PatternError> {
        if text.to_ascii_lowercase().contains("%2a") {
            return Err(PatternError::EncodedStar(text.to_string()));
        }
        let canon = canonical_path(text).map_err(|e| PatternError::Path(text.to_string(), e))?;
        if canon.contains("***") {
            return Err(PatternError::TripleStar(text.to_string()));
        }
        Ok(if canon.contains('*') { PathPattern::Glob(canon) } else { PathPattern::Prefix(canon) })
    }

    pub fn as_str(&self) -> &str {
        match self {
            PathPattern::Prefix(p) | PathPattern::Glob(p) => p,
        }
    }

    /// Whether a canonical path (from [`canonical_path`]) matches.
    pub fn matches(&self, path: &str) -> bool {
        match self {
            PathPattern::Prefix(p) => {
                path == p
                    || (path.starts_with(p.as_str()) && (p.ends_with('/') || path[p.len()..].starts_with('/')))
            }
            PathPattern::Glob(g) => glob_matches(g.as_bytes(), path.as_bytes()),
        }
    }
}

#[derive(Clone, Copy)]
enum Tok {
    Byte(u8),
    Star,
    DoubleStar,
}

fn tokens(glob: &[u8]) -> Vec<Tok> {
    let mut toks = Vec::with_capacity(glob.len());
    let mut i = 0;
    while i < glob.len() {
        match (glob[i], glob.get(i + 1)) {
            (b'*', Some(b'*')) => {
                toks.push(Tok::DoubleStar);
                i += 2;
            }
            (b'*', _) => {
                toks.push(Tok::Star);
                i += 1;
            }
            (b, _) => {
                toks.push(Tok::Byte(b));
                i += 1;
            }
        }
    }
    toks
}

/// Glob match in O(len(glob) * len(path)) time (no backtracking blow-up).
fn glob_matches(glob: &[u8], path: &[u8]) -> bool {
    let toks = tokens(glob);
    // live[j]: the first j tokens can match the path read so far.
    let mut live = vec![false; toks.len() + 1];
    live[0] = true;
    close_stars(&toks, &mut live);
    for &c in path {
        let mut next = vec![false; toks.len() + 1];
        for (j, tok) in toks.iter().enumerate() {
            if !live[j] {
                continue;
            }
            match *tok {
                Tok::Byte(b) if b == c => next[j + 1] = true,
                Tok::Star if c != b'/' => next[j] = true,
                Tok::DoubleStar => next[j] = true,
                _ => {}
            }
        }
        close_stars(&toks, &mut next);
        live = next;
    }
    live[toks.len()]
}

/// A star can match nothing: whoever reaches it also reaches the token after it.
fn close_stars(toks: &[Tok], live: &mut [bool]) {
    for j in 0..toks.len() {
        if live[j] && matches!(toks[j], Tok::Star | Tok::DoubleStar) {
            live[j + 1] = true;
        }
    }
}
