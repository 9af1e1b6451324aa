//! Arbitrary bytes into the gate's parsers of what a client names: the request-target
//! authority (`split_authority`), hosts and rule patterns (`canonical_host`,
//! `canonical_pattern`) and paths (`canonical_path`, `PathPattern::parse`).
//!
//! Invariants: nothing panics; every canonical form is a fixed point (canonicalising it
//! again gives it back) and contains only the characters its kind allows.
#![no_main]

use _gate_core::gate::target::split_authority;
use _gate_core::policy::path::allowed_byte;
use _gate_core::policy::{canonical_host, canonical_path, canonical_pattern, Host, PathPattern};
use http::uri::Authority;
use libfuzzer_sys::fuzz_target;

fn check_host(s: &str) {
    let Ok(h) = canonical_host(s) else { return };
    let shown = h.to_string();
    let ok = match &h {
        Host::Name(_) => shown.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.'),
        Host::V4(_) => shown.bytes().all(|b| b.is_ascii_digit() || b == b'.'),
        Host::V6(_) => shown.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase() || b == b':' || b == b'.'),
    };
    assert!(ok, "{s:?} -> {shown:?}");
    assert!(!shown.is_empty() && !shown.ends_with('.') || matches!(h, Host::V6(_)), "{s:?} -> {shown:?}");
    assert_eq!(canonical_host(&shown).as_ref(), Ok(&h), "{s:?} -> {shown:?} is not a fixed point");
}

fn check_path(s: &str) {
    if let Ok(p) = canonical_path(s) {
        assert!(p.starts_with('/') && p.bytes().all(allowed_byte), "{s:?} -> {p:?}");
        assert_eq!(canonical_path(&p).as_deref(), Ok(p.as_str()), "{s:?} -> {p:?} is not a fixed point");
    }
    if let Ok(pat) = PathPattern::parse(s) {
        let text = pat.as_str().to_string();
        assert_eq!(PathPattern::parse(&text).as_ref(), Ok(&pat), "{s:?} -> {text:?}");
        assert!(pat.matches(&text), "{s:?}: a pattern matches its own text");
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else { return };
    if let Ok(a) = s.parse::<Authority>() {
        if let Ok((host, _port)) = split_authority(&a) {
            check_host(host);
        }
    }
    check_host(s);
    if let Ok(p) = canonical_pattern(s) {
        assert_eq!(canonical_pattern(&p.to_string()).as_ref(), Ok(&p), "{s:?} -> {p}");
    }
    check_path(s);
});
