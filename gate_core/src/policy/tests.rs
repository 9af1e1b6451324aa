//! Table-driven policy tests: (case, input, expected verdict, expected reason).

use super::canon::{canonical_host, canonical_pattern, split_spec, Host};
use super::file::from_toml;
use super::{Action, Policy, PolicyError};

#[test]
fn canonical_hosts() {
    let ok: &[(&str, &str, &str)] = &[
        ("a plain name is kept", "example.com", "example.com"),
        ("upper case is lowered", "ExAmPle.COM", "example.com"),
        ("one trailing dot is stripped", "example.com.", "example.com"),
        ("an IDN becomes punycode", "bücher.example", "xn--bcher-kva.example"),
        ("an upper-case IDN becomes punycode", "BÜCHER.example", "xn--bcher-kva.example"),
        ("an IPv4 literal is kept", "192.0.2.1", "192.0.2.1"),
        ("an IPv4 literal with a trailing dot", "192.0.2.1.", "192.0.2.1"),
        ("a short IPv4 form fills the last bytes", "127.1", "127.0.0.1"),
        ("a three-part IPv4 form: the last part fills two bytes", "203.0.28938", "203.0.113.10"),
        ("one decimal number is the whole address", "3405803786", "203.0.113.10"),
        ("octal parts", "0313.0.0161.012", "203.0.113.10"),
        ("hex parts, any case", "0xCB.0.0x71.0XA", "203.0.113.10"),
        ("one hex number", "0x7f000001", "127.0.0.1"),
        ("mixed bases with a trailing dot", "0x7f.0.0.01.", "127.0.0.1"),
        ("full-width digits map to an IPv4 address", "\u{ff11}\u{ff12}\u{ff17}.0.0.1", "127.0.0.1"),
        ("a bracketed IPv6 literal is normalised", "[2001:DB8:0:0::1]", "2001:db8::1"),
        ("a bare IPv6 literal is normalised", "0:0:0:0:0:0:0:1", "::1"),
        ("a hyphenated label is fine", "my-host.example", "my-host.example"),
        ("a single label is fine", "localhost", "localhost"),
    ];
    for (case, input, want) in ok {
        match canonical_host(input) {
            Ok(h) => assert_eq!(h.to_string(), *want, "{case}"),
            Err(e) => panic!("{case}: {input:?} refused: {e}"),
        }
    }
    let bad: &[(&str, &str, &str)] = &[
        ("empty", "", "empty"),
        ("only a dot", ".", "empty"),
        ("two trailing dots", "example.com..", "empty label"),
        ("an empty label inside", "a..example.com", "empty label"),
        ("a leading dot", ".example.com", "empty label"),
        ("an underscore", "a_b.example.com", "characters outside [a-z0-9-.]"),
        ("a space", "a b.example", "characters outside [a-z0-9-.]"),
        ("broken punycode", "xn--a.example", "not a valid IDN"),
        ("a wildcard in a request host", "*.example.com", "'*' is only allowed as a leading \"*.\" in rules"),
        ("a name ending in a hex label", "a.0x7f", "numeric last label but not an IPv4 address in any spelling"),
        ("five numeric parts", "1.2.3.4.5", "numeric last label but not an IPv4 address in any spelling"),
        ("a part too large", "1.2.3.256", "numeric last label but not an IPv4 address in any spelling"),
        ("a last part too large for what is left", "1.2.65536", "numeric last label but not an IPv4 address in any spelling"),
        ("a bad octal part", "1.2.3.09", "numeric last label but not an IPv4 address in any spelling"),
        ("a zone id", "[fe80::1%eth0]", "not an IPv6 address inside brackets"),
        ("unbalanced bracket", "[::1", "unbalanced '['"),
        ("a port glued on", "example.com:443", "':' outside an IPv6 literal"),
        ("a 64-char label", &"a".repeat(64), "label longer than 63 characters"),
    ];
    for (case, input, why) in bad {
        match canonical_host(input) {
            Ok(h) => panic!("{case}: {input:?} accepted as {h}"),
            Err(e) => assert_eq!(e.why, *why, "{case}"),
        }
    }
    let long = format!("{}.example", vec!["a".repeat(50); 5].join("."));
    assert_eq!(canonical_host(&long).map_err(|e| e.why), Err("longer than 253 characters"));
}

#[test]
fn patterns_match_strict_subdomains_only() {
    let table: &[(&str, &str, &str, bool)] = &[
        ("exact matches itself", "example.com", "example.com", true),
        ("exact matches regardless of case and dot", "example.com", "EXAMPLE.com.", true),
        ("exact does not match a subdomain", "example.com", "a.example.com", false),
        ("exact does not match a longer name", "example.com", "evilexample.com", false),
        ("wildcard matches one label down", "*.example.com", "a.example.com", true),
        ("wildcard matches two labels down", "*.example.com", "a.b.example.com", true),
        ("wildcard does not match the apex", "*.example.com", "example.com", false),
        ("wildcard does not match a label boundary miss", "*.example.com", "evilexample.com", false),
        ("wildcard does not match a suffix trick", "*.example.com", "example.com.evil.test", false),
        ("wildcard does not match an IP", "*.example.com", "192.0.2.1", false),
        ("IPv6 exact matches a different spelling", "[2001:db8::1]", "2001:db8:0::1", true),
        ("IPv4 does not match its mapped IPv6 form", "127.0.0.1", "[::ffff:127.0.0.1]", false),
        ("IDN rule matches punycode request", "bücher.example", "xn--bcher-kva.example", true),
    ];
    for (case, pattern, host, want) in table {
        let p = canonical_pattern(pattern).unwrap_or_else(|e| panic!("{case}: {e}"));
        let h = canonical_host(host).unwrap_or_else(|e| panic!("{case}: {e}"));
        assert_eq!(p.matches(&h), *want, "{case}");
    }
    for (case, pattern) in [("wildcard on an IP", "*.192.0.2.1"), ("inner wildcard", "a.*.example.com"), ("bare star", "*")] {
        assert!(canonical_pattern(pattern).is_err(), "{case}");
    }
}

#[test]
fn cli_specs_split_host_and_port() {
    let table: &[(&str, &str, Option<&str>)] = &[
        ("name only", "pypi.org", None),
        ("name and port", "pypi.org:8443", Some("8443")),
        ("bracketed IPv6 and port", "[::1]:443", Some("443")),
        ("bracketed IPv6 alone", "[::1]", None),
        ("bare IPv6", "2001:db8::1", None),
        ("wildcard and port", "*.example.com:443", Some("443")),
    ];
    for (case, spec, port) in table {
        let (_, p) = split_spec(spec).unwrap_or_else(|e| panic!("{case}: {e}"));
        assert_eq!(p, *port, "{case}");
    }
}

const FILE: &str = r#"
version = 1
default = "deny"

[[rule]]
host = "blocked.example.com"
action = "deny"

[[rule]]
host = "*.example.com"
action = "allow"

[[rule]]
host = "api.example.org"
ports = [8443, 9443]
action = "allow"

[[rule]]
host = "127.0.0.1"
port = 8080
action = "allow"
"#;

fn policy_with_cli() -> Policy {
    let mut p = from_toml(FILE, "policy.toml").expect("fixture parses");
    p.add_rule("a.example.com", "deny", "--deny a.example.com").expect("valid flag");
    p.add_rule("[::1]:443", "allow", "--allow [::1]:443").expect("valid flag");
    p
}

#[test]
fn decisions_follow_evaluation_order() {
    let p = policy_with_cli();
    let table: &[(&str, &str, u16, Action, &str)] = &[
        ("a CLI deny beats a file allow", "a.example.com", 443, Action::Deny, "policy: rule --deny a.example.com"),
        ("the first file rule wins over a later one", "blocked.example.com", 443, Action::Deny, "policy: rule policy.toml:rule[1]"),
        ("a wildcard allows a subdomain on 443", "b.example.com", 443, Action::Allow, "policy: rule policy.toml:rule[2]"),
        ("a wildcard allows a subdomain on 80", "b.example.com", 80, Action::Allow, "policy: rule policy.toml:rule[2]"),
        ("no port means not 8080", "b.example.com", 8080, Action::Deny, "policy: default deny"),
        ("the apex falls to the default", "example.com", 443, Action::Deny, "policy: default deny"),
        ("a listed port is allowed", "api.example.org", 9443, Action::Allow, "policy: rule policy.toml:rule[3]"),
        ("an unlisted port is not", "api.example.org", 443, Action::Deny, "policy: default deny"),
        ("a single port on an IP", "127.0.0.1", 8080, Action::Allow, "policy: rule policy.toml:rule[4]"),
        ("another port on that IP", "127.0.0.1", 80, Action::Deny, "policy: default deny"),
        ("an IPv6 CLI rule with a port", "::1", 443, Action::Allow, "policy: rule --allow [::1]:443"),
        ("an unrelated host", "evilexample.com", 443, Action::Deny, "policy: default deny"),
    ];
    for (case, host, port, action, reason) in table {
        let h = canonical_host(host).unwrap_or_else(|e| panic!("{case}: {e}"));
        let d = p.decide_connect(&h, *port);
        assert_eq!(d.action, *action, "{case}");
        assert_eq!(d.reason, *reason, "{case}");
        assert_eq!(d.default_applied(), reason.contains("default"), "{case}");
    }
}

#[test]
fn default_allow_and_report_mode() {
    let p = from_toml("default = \"allow\"\nmode = \"report\"\n", "p.toml").expect("parses");
    let d = p.decide_connect(&Host::Name("x.test".into()), 443);
    assert_eq!((d.action, d.reason.as_str(), d.rule), (Action::Allow, "policy: default allow", None));
    assert_eq!(p.mode, super::Mode::Report);
}

#[test]
fn file_rules_carry_line_numbers() {
    let p = from_toml(FILE, "policy.toml").expect("parses");
    let lines: Vec<_> = p.file_rules().iter().map(|r| r.line).collect();
    assert_eq!(lines, vec![Some(5), Some(9), Some(13), Some(18)]);
}

#[test]
fn bad_files_name_the_line_and_key() {
    let table: &[(&str, &str, &str)] = &[
        ("an unknown top-level key", "default = \"deny\"\ncolour = 1\n", "p.toml:2: unknown key `colour`"),
        ("an unknown rule key", "[[rule]]\nhost = \"a.test\"\naction = \"allow\"\nfoo = 1\n", "p.toml:4: unknown key `foo`"),
        ("a bad action", "[[rule]]\nhost = \"a.test\"\naction = \"permit\"\n", "p.toml:3: invalid action \"permit\": expected \"allow\", \"deny\" or \"ask\""),
        ("a missing host", "\n[[rule]]\naction = \"allow\"\n", "p.toml:2: missing key `host`"),
        ("a bad host", "[[rule]]\nhost = \"a..test\"\naction = \"allow\"\n", "p.toml:2: invalid host \"a..test\": empty label"),
        ("port zero", "[[rule]]\nhost = \"a.test\"\nport = 0\naction = \"allow\"\n", "p.toml:3: invalid port 0: expected 1-65535"),
        ("port too large", "[[rule]]\nhost = \"a.test\"\nports = [443, 70000]\naction = \"allow\"\n", "p.toml:3: invalid port 70000: expected 1-65535"),
        ("port and ports", "[[rule]]\nhost = \"a.test\"\nport = 1\nports = [2]\naction = \"allow\"\n", "p.toml:4: use either `port` or `ports`, not both"),
        ("empty ports", "[[rule]]\nhost = \"a.test\"\nports = []\naction = \"allow\"\n", "p.toml:3: `ports` is empty"),
        ("version 2", "version = 2\n", "p.toml:1: unsupported version 2: only 1 is known"),
        ("a bad mode", "mode = \"audit\"\n", "p.toml:1: invalid mode \"audit\": expected \"enforce\" or \"report\""),
        ("allow_private on a deny rule", "[[rule]]\nhost = \"a.test\"\naction = \"deny\"\nallow_private = true\n", "p.toml:4: `allow_private` only applies to \"allow\" and \"ask\" rules"),
        ("a port as a string", "[[rule]]\nhost = \"a.test\"\nport = \"443\"\naction = \"allow\"\n", "p.toml:3: invalid type: string \"443\", expected one port (443) or a list of ports ([443, 8443])"),
        ("an empty port list", "[[rule]]\nhost = \"a.test\"\nport = []\naction = \"allow\"\n", "p.toml:3: `port` is empty"),
        ("a bad port in a port list", "[[rule]]\nhost = \"a.test\"\nport = [443, 0]\naction = \"allow\"\n", "p.toml:3: invalid port 0: expected 1-65535"),
        ("a misspelt rule key", "[[rule]]\nhost = \"a.test\"\naction = \"allow\"\nallow_privat = true\n", "p.toml:4: unknown key `allow_privat`; did you mean `allow_private`?"),
        ("two letters swapped", "[[rule]]\nhost = \"a.test\"\nprot = 1\naction = \"allow\"\n", "p.toml:3: unknown key `prot`; did you mean `port`?"),
        ("a misspelt top-level key", "defualt = \"deny\"\n", "p.toml:1: unknown key `defualt`; did you mean `default`?"),
        ("a misspelt table key", "[sandbox]\nro_bnd = [\"/opt\"]\n", "p.toml:2: unknown key `ro_bnd`; did you mean `ro_bind`?"),
        ("public_ranges over the metadata address", "public_ranges = [\"10.0.0.0/8\", \"169.254.0.0/16\"]\n", "p.toml:1: public_ranges: 169.254.0.0/16 covers the cloud metadata address 169.254.169.254, which is never public; name the address in a rule if the agent must reach it"),
        ("public_ranges not a CIDR", "public_ranges = [\"10.0.0.0\"]\n", "p.toml:1: public_ranges: "),
        ("allow_private on an address", "[[rule]]\nhost = \"10.0.0.1\"\naction = \"allow\"\nallow_private = true\n", "p.toml:4: `allow_private` applies to names; a rule naming an address allows it already"),
        ("allow_private not a bool", "[[rule]]\nhost = \"a.test\"\naction = \"allow\"\nallow_private = \"yes\"\n", "p.toml:4: invalid type: string \"yes\", expected a boolean"),
    ];
    for (case, text, want) in table {
        match from_toml(text, "p.toml") {
            Ok(_) => panic!("{case}: accepted"),
            // A message ending in ": " is a prefix (the rest is the CIDR parser's own text).
            Err(e) if want.ends_with(": ") => assert!(e.to_string().starts_with(want), "{case}: {e}"),
            Err(e) => assert_eq!(e.to_string(), *want, "{case}"),
        }
    }
    let syntax = from_toml("[[rule]\n", "p.toml").err().map(|e| e.to_string()).unwrap_or_default();
    assert!(syntax.starts_with("p.toml:1: "), "syntax error names the line: {syntax}");
}

#[test]
fn bad_cli_rules_name_the_value() {
    let mut p = Policy::new(Action::Deny);
    let table: &[(&str, &str, &str, &str)] = &[
        ("port zero", "a.test:0", "allow", "invalid port \"0\": expected 1-65535"),
        ("port not a number", "a.test:https", "allow", "invalid port \"https\": expected 1-65535"),
        ("port with a sign", "a.test:+443", "allow", "invalid port \"+443\": expected 1-65535"),
        ("empty port", "a.test:", "allow", "invalid port \"\": expected 1-65535"),
        ("empty host", ":443", "allow", "invalid host \"\": empty"),
        ("bad host", "a..test", "allow", "invalid host \"a..test\": empty label"),
        ("junk after brackets", "[::1]x", "allow", "invalid host \"[::1]x\": expected ':PORT' after ']'"),
    ];
    for (case, spec, action, want) in table {
        match p.add_rule(spec, action, "--x") {
            Ok(()) => panic!("{case}: accepted"),
            Err(e) => assert_eq!(e.to_string(), *want, "{case}"),
        }
    }
    assert!(p.cli_rules().is_empty());
    assert!(matches!(p.add_rule("a.test", "maybe", "--x"), Err(PolicyError::Action { .. })));
}

const UNSPECIFIED_SPELLINGS: [&str; 8] =
    ["0.0.0.0", "0.0.0.0.", "::", "[::]", "0:0:0:0:0:0:0:0", "[0000::0]", "::ffff:0.0.0.0", "[::FFFF:0.0.0.0]"];

#[test]
fn rules_naming_an_unspecified_address_are_refused() {
    let why = "unspecified address (0.0.0.0 or ::) can never be a destination; the gate refuses it regardless of rules";
    for spelling in UNSPECIFIED_SPELLINGS {
        let mut p = Policy::new(Action::Deny);
        let with_port = match spelling.contains(':') {
            true => format!("[{}]:443", spelling.trim_matches(['[', ']'])),
            false => format!("{spelling}:443"),
        };
        for spec in [spelling.to_string(), with_port] {
            match p.add_rule(&spec, "allow", "--allow x") {
                Ok(()) => panic!("{spelling}: --allow {spec} accepted"),
                Err(e) => assert!(e.to_string().ends_with(why), "{spelling}: --allow {spec}: {e}"),
            }
        }
        assert!(p.cli_rules().is_empty(), "{spelling}");
        let text = format!("default = \"deny\"\n\n[[rule]]\nhost = \"{spelling}\"\naction = \"deny\"\n");
        match from_toml(&text, "p.toml") {
            Ok(_) => panic!("{spelling}: file rule accepted"),
            Err(e) => assert_eq!(e.to_string(), format!("p.toml:4: invalid host {spelling:?}: {why}"), "{spelling}"),
        }
    }
    // Neighbours of the unspecified addresses are ordinary rules.
    let mut p = Policy::new(Action::Deny);
    for spec in ["0.0.0.1", "::1", "::ffff:0.0.0.1", "zero.test"] {
        p.add_rule(spec, "allow", spec).unwrap_or_else(|e| panic!("{spec}: {e}"));
    }
}

#[test]
fn unspecified_destinations_are_denied_whatever_the_rules() {
    let p = from_toml("default = \"allow\"\nmode = \"report\"\n", "p.toml").expect("parses");
    for spelling in UNSPECIFIED_SPELLINGS {
        let h = canonical_host(spelling).unwrap_or_else(|e| panic!("{spelling}: {e}"));
        assert!(h.is_unspecified(), "{spelling}");
        for port in [80, 443, 8080] {
            let d = p.decide_connect(&h, port);
            assert_eq!((d.action, d.reason.as_str(), &d.rule), (Action::Deny, "policy: unspecified address", &None), "{spelling}");
            assert!(d.fixed && !d.default_applied(), "{spelling}");
        }
    }
    for other in ["0.0.0.1", "::1", "::ffff:127.0.0.1", "zero.test"] {
        let h = canonical_host(other).unwrap_or_else(|e| panic!("{other}: {e}"));
        assert!(!h.is_unspecified(), "{other}");
        assert_eq!(p.decide_connect(&h, 80).action, Action::Allow, "{other}");
    }
}

#[test]
fn allow_private_is_carried_by_allow_decisions() {
    let text = "default = \"allow\"\n\n[[rule]]\nhost = \"*.corp.test\"\naction = \"allow\"\nallow_private = true\n\n\
                [[rule]]\nhost = \"plain.test\"\naction = \"allow\"\nallow_private = false\n";
    let p = from_toml(text, "p.toml").expect("parses");
    assert_eq!(p.file_rules().iter().map(|r| r.allow_private).collect::<Vec<_>>(), vec![true, false]);
    let d = |h: &str| p.decide_connect(&Host::Name(h.into()), 443).allow_private;
    assert!(d("git.corp.test"));
    assert!(!d("plain.test"));
    assert!(!d("other.test"), "the default never allows private addresses");
}

#[test]
fn names_ip_needs_an_allow_rule_naming_the_address_and_port() {
    let text = "default = \"allow\"\n\n[[rule]]\nhost = \"10.0.0.9\"\naction = \"deny\"\n\n\
                [[rule]]\nhost = \"10.0.0.9\"\naction = \"allow\"\n\n\
                [[rule]]\nhost = \"169.254.169.254\"\nport = 80\naction = \"allow\"\n\n\
                [[rule]]\nhost = \"::ffff:127.0.0.1\"\nport = 8080\naction = \"allow\"\n\n\
                [[rule]]\nhost = \"10.0.0.7\"\npath = \"/one\"\naction = \"allow\"\n\n\
                [[rule]]\nhost = \"10.0.0.6\"\nmethods = [\"GET\"]\naction = \"allow\"\n";
    let p = from_toml(text, "p.toml").expect("parses");
    let ip = |s: &str| s.parse::<std::net::IpAddr>().unwrap_or_else(|e| panic!("{s}: {e}"));
    let table: &[(&str, u16, Option<&str>)] = &[
        ("169.254.169.254", 80, Some("p.toml:rule[3]")),
        ("169.254.169.254", 443, None),
        ("10.0.0.9", 443, None),
        ("::ffff:127.0.0.1", 8080, Some("p.toml:rule[4]")),
        ("127.0.0.1", 8080, None),
        ("10.0.0.8", 443, None),
        // scoped to some requests: named only for those it decides (the guard's by_decision)
        ("10.0.0.7", 80, None),
        ("10.0.0.6", 80, None),
    ];
    for (addr, port, want) in table {
        assert_eq!(p.names_ip(ip(addr), *port), *want, "{addr}:{port}");
    }
    let mut cli = Policy::new(Action::Deny);
    cli.add_rule("[fd00:ec2::254]:80", "allow", "--allow [fd00:ec2::254]:80").expect("rule");
    assert_eq!(cli.names_ip(ip("fd00:ec2::254"), 80), Some("--allow [fd00:ec2::254]:80"));
}

#[test]
fn approvals_held_bytes_defaults_to_256_mib_and_must_be_positive() {
    let p = from_toml("", "p.toml").expect("parses");
    assert_eq!(p.approvals.held_bytes, super::DEFAULT_HELD_BYTES);
    assert_eq!(super::DEFAULT_HELD_BYTES, 256 * 1024 * 1024);
    let p = from_toml("[approvals]\nheld_bytes = 1000\n", "p.toml").expect("parses");
    assert_eq!(p.approvals.held_bytes, 1000);
    for bad in ["0", "-1"] {
        let e = from_toml(&format!("[approvals]\nheld_bytes = {bad}\n"), "p.toml").expect_err("refused");
        assert!(e.to_string().contains("held_bytes"), "{e}");
    }
    assert!(from_toml("[approvals]\nheld = 1\n", "p.toml").is_err(), "unknown keys are refused");
}

#[test]
fn approvals_reread_defaults_to_one_second_and_takes_a_policy_duration() {
    let p = from_toml("", "p.toml").expect("parses");
    assert_eq!(p.approvals.reread, std::time::Duration::from_secs(1));
    assert_eq!(super::DEFAULT_REREAD, std::time::Duration::from_secs(1));
    let p = from_toml("[approvals]\nreread = \"1h\"\n", "p.toml").expect("parses");
    assert_eq!(p.approvals.reread, std::time::Duration::from_secs(3600));
    for (bad, why) in [("\"0s\"", "invalid duration"), ("\"500ms\"", "invalid duration"), ("\"1\"", "invalid duration"), ("1", "expected a string")] {
        let e = from_toml(&format!("[approvals]\nreread = {bad}\n"), "p.toml").expect_err("refused");
        assert!(e.to_string().contains(why), "{bad}: {e}");
    }
}

#[test]
fn approvals_pending_caps_default_to_100_per_run_and_1000_per_store_and_must_be_positive() {
    let p = from_toml("", "p.toml").expect("parses");
    assert_eq!((p.approvals.max_pending, p.approvals.max_pending_store), (100, 1000));
    let p = from_toml("[approvals]\nmax_pending = 3\nmax_pending_store = 7\n", "p.toml").expect("parses");
    assert_eq!((p.approvals.max_pending, p.approvals.max_pending_store, p.approvals.held_bytes), (3, 7, super::DEFAULT_HELD_BYTES));
    for (key, bad) in [("max_pending", "0"), ("max_pending_store", "-5")] {
        let e = from_toml(&format!("[approvals]\n{key} = {bad}\n"), "p.toml").expect_err("refused");
        assert!(e.to_string().contains(&format!("invalid {key} {bad}")), "{e}");
    }
}

#[test]
fn a_port_list_public_ranges_and_allow_private_on_an_ask_rule_are_read() {
    let text = "public_ranges = [\"10.20.0.0/16\", \"2001:db8:100::/48\"]\n\n\
                [[rule]]\nhost = \"mirror.corp.test\"\nport = [443, 8443]\naction = \"ask\"\nallow_private = true\n";
    let p = from_toml(text, "p.toml").unwrap_or_else(|e| panic!("{e}"));
    let ranges: Vec<String> = p.public_ranges.ranges().iter().map(|c| c.to_string()).collect();
    assert_eq!(ranges, ["10.20.0.0/16", "2001:db8:100::/48"]);
    let rule = &p.file_rules()[0];
    assert_eq!((rule.ports.to_vec(), rule.allow_private), (vec![443, 8443], true));
    let d = p.decide_connect(&Host::Name("mirror.corp.test".into()), 8443);
    assert_eq!((d.action, d.allow_private), (Action::Ask, true), "an ask carries allow_private to the guard");
}

#[test]
fn allow_private_flags_take_names_only() {
    let mut p = Policy::new(Action::Deny);
    p.add_private_rule("mirror.corp.test:8443", "--allow-private mirror.corp.test:8443").unwrap_or_else(|e| panic!("{e}"));
    let d = p.decide_connect(&Host::Name("mirror.corp.test".into()), 8443);
    assert_eq!((d.action, d.reason.as_str(), d.allow_private), (Action::Allow, "policy: rule --allow-private mirror.corp.test:8443", true));
    let e = p.add_private_rule("10.0.0.1", "--allow-private 10.0.0.1").err().map(|e| e.to_string());
    assert_eq!(e.as_deref(), Some("\"10.0.0.1\" is an address: a rule naming an address allows it already (use --allow); --allow-private is for names"));
}
