//! Property tests of canonicalisation: canonical forms are fixed points, subdomain patterns
//! never match across a label boundary, paths keep to their character set.

use proptest::prelude::*;

use super::canon::{canonical_host, canonical_pattern, Host, HostPattern};
use super::path::{allowed_byte, canonical_path, PathPattern};

/// Host-ish strings: letters of both cases, digits, dots, dashes, a few non-ASCII letters.
fn hostish() -> impl Strategy<Value = String> {
    "[a-zA-Z0-9.\\-äöü]{1,40}"
}

/// Path-ish strings: the characters that matter to canonicalisation.
fn pathish() -> impl Strategy<Value = String> {
    "/[a-z0-9./%;*\\\\?#~A-F ]{0,40}"
}

proptest! {
    #[test]
    fn canonical_host_is_idempotent(s in hostish()) {
        if let Ok(h) = canonical_host(&s) {
            let again = canonical_host(&h.to_string());
            prop_assert_eq!(again.as_ref(), Ok(&h));
        }
    }

    #[test]
    fn canonical_names_are_lower_case_ascii(s in hostish()) {
        if let Ok(Host::Name(n)) = canonical_host(&s) {
            prop_assert!(n.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.'), "{}", n);
            prop_assert!(!n.ends_with('.'));
        }
    }

    #[test]
    fn subdomain_patterns_never_match_across_a_label_boundary(
        suffix in "[a-z]{1,8}\\.[a-z]{2,5}", glue in "[a-z0-9\\-]{1,8}", sub in "[a-z]{1,8}",
    ) {
        let p = canonical_pattern(&format!("*.{suffix}")).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let glued = canonical_host(&format!("{glue}{suffix}"));
        if let Ok(h) = glued {
            prop_assert!(!p.matches(&h), "*.{} matched {}", suffix, h);
        }
        let apex = canonical_host(&suffix).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert!(!p.matches(&apex));
        let child = canonical_host(&format!("{sub}.{suffix}")).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert!(p.matches(&child));
        let exact = HostPattern::Exact(apex.clone());
        prop_assert!(!exact.matches(&child));
    }

    #[test]
    fn canonical_path_is_idempotent_and_keeps_to_its_characters(s in pathish()) {
        if let Ok(p) = canonical_path(&s) {
            prop_assert!(p.starts_with('/'));
            prop_assert!(p.bytes().all(allowed_byte), "{:?}", p);
            let again = canonical_path(&p);
            prop_assert_eq!(again.as_ref(), Ok(&p));
        }
    }

    #[test]
    fn a_prefix_pattern_matches_what_it_prefixes_at_a_segment(a in "/[a-z]{1,6}(/[a-z]{1,6}){0,3}", rest in "(/[a-z]{0,6}){0,3}") {
        let p = PathPattern::parse(&a).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let full = format!("{a}{rest}");
        if let Ok(c) = canonical_path(&full) {
            prop_assert!(p.matches(&c), "{} should match {}", a, c);
        }
        let glued = format!("{a}x");
        prop_assert!(!p.matches(&glued));
    }
}
