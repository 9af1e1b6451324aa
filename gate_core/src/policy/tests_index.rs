//! The host index (`index.rs`) against the linear scan it replaced: for random rule sets
//! (exact names, `*.` suffixes and IP literals overlapping each other, in random case and
//! spelling, with ports, methods, paths, schemes and inspect; file and command-line rules
//! interleaved) and random queries, the indexed decisions equal the scan's, and the
//! candidates are ascending and hold every rule whose host matches.

use proptest::prelude::*;

use super::canon::{canonical_host, canonical_pattern, Host};
use super::path::PathPattern;
use super::rules::{Action, Origin, Policy, Ports, RequestFacts, Rule, Scheme};

/// A host spelling over a few labels, so that rules and queries overlap: random case, an IDN
/// (`bücher` = `xn--bcher-kva`), an optional trailing dot; sometimes an IP literal (in the
/// WHATWG shorthand `127.1`, IPv4-mapped IPv6, bracketed IPv6).
fn host_text() -> impl Strategy<Value = String> {
    let label = prop_oneof![Just("a"), Just("A"), Just("b"), Just("xn--bcher-kva"), Just("bücher"), Just("c-d")];
    let name = (prop::collection::vec(label, 1..4), prop_oneof![Just("com"), Just("COM"), Just("test")], any::<bool>())
        .prop_map(|(labels, tld, dot)| format!("{}.{tld}{}", labels.join("."), if dot { "." } else { "" }));
    let ip = prop_oneof![Just("10.0.0.1"), Just("10.0.0.2"), Just("127.1"), Just("127.0.0.1"), Just("::1"), Just("::ffff:10.0.0.1"), Just("[2001:db8::1]")];
    prop_oneof![6 => name, 1 => ip.prop_map(String::from)]
}

#[derive(Debug, Clone)]
struct Spec {
    host: String,
    subdomains: bool,
    ports: Option<Vec<u16>>,
    action: Action,
    methods: Option<Vec<&'static str>>,
    path: Option<&'static str>,
    schemes: Option<Vec<Scheme>>,
    inspect: bool,
    cli: bool,
}

fn port() -> impl Strategy<Value = u16> {
    prop_oneof![Just(80u16), Just(443), Just(8080)]
}

fn spec() -> impl Strategy<Value = Spec> {
    let shape = (host_text(), prop::bool::weighted(0.4), prop::option::of(prop::collection::vec(port(), 1..3)));
    let action = prop_oneof![Just(Action::Allow), Just(Action::Deny), Just(Action::Ask)];
    let methods = prop::option::weighted(0.3, prop::collection::vec(prop_oneof![Just("GET"), Just("POST")], 1..3));
    let path = prop::option::weighted(0.3, prop_oneof![Just("/a"), Just("/a/*/c"), Just("/")]);
    let scheme = prop_oneof![Just(Scheme::Http), Just(Scheme::Https)];
    let schemes = prop::option::weighted(0.2, prop::collection::vec(scheme, 1..3));
    (shape, action, methods, path, schemes, any::<bool>(), prop::bool::weighted(0.2)).prop_map(
        |((host, subdomains, ports), action, methods, path, schemes, inspect, cli)| Spec {
            host,
            subdomains,
            ports,
            action,
            methods,
            path,
            schemes,
            inspect,
            cli,
        },
    )
}

/// The policy of `specs` in their order (a command-line rule among them still goes before
/// the file's); specs the rule syntax refuses (`*.` on an IP) are left out.
fn policy(specs: &[Spec], default: Action) -> Policy {
    let mut p = Policy::new(default);
    for (i, s) in specs.iter().enumerate() {
        let text = if s.subdomains { format!("*.{}", s.host) } else { s.host.clone() };
        let Ok(host) = canonical_pattern(&text) else { continue };
        let ports = s.ports.clone().map_or(Ports::Web, Ports::List);
        let origin = if s.cli { Origin::Cli } else { Origin::File };
        let mut r = Rule::new(format!("r{i}"), host, ports, s.action, origin);
        r.methods = s.methods.as_ref().map(|m| m.iter().map(|x| x.to_string()).collect());
        r.path = s.path.map(|t| PathPattern::parse(t).expect("a valid pattern"));
        r.schemes = s.schemes.clone();
        r.inspect = s.inspect;
        p.push_rule(r);
    }
    p
}

fn ids<'a>(rules: impl Iterator<Item = &'a Rule>) -> Vec<&'a str> {
    rules.map(|r| r.id.as_str()).collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn indexed_decisions_are_the_linear_scans(
        specs in prop::collection::vec(spec(), 0..24),
        default in prop_oneof![Just(Action::Allow), Just(Action::Deny), Just(Action::Ask)],
        queries in prop::collection::vec((host_text(), port(), prop_oneof![Just(Scheme::Http), Just(Scheme::Https)],
            prop_oneof![Just("GET"), Just("POST"), Just("get"), Just("PUT")],
            prop_oneof![Just("/a"), Just("/a/b/c?q=1"), Just("/x"), Just("/a/%2F"), Just("/")]), 1..12),
    ) {
        let p = policy(&specs, default);
        for (text, port, scheme, method, path) in &queries {
            let Ok(host) = canonical_host(text) else { continue };
            let slots: Vec<_> = p.index().candidates(&host).collect();
            prop_assert!(slots.windows(2).all(|w| w[0] < w[1]), "not ascending: {:?}", slots);
            let matching = ids(p.rules().filter(|r| r.host.matches(&host)));
            prop_assert_eq!(ids(slots.iter().map(|s| p.at(*s)).filter(|r| r.host.matches(&host))), matching);

            prop_assert_eq!(p.decide_connect(&host, *port), p.decide_connect_linear(&host, *port));
            let facts = RequestFacts { host: &host, port: *port, scheme: *scheme, method, path };
            prop_assert_eq!(p.decide_request(&facts), p.decide_request_linear(&facts));
            if let Some(ip) = host.ip() {
                prop_assert_eq!(p.names_ip(ip, *port), p.names_ip_linear(ip, *port));
            }
        }
    }
}

/// The index keys canonical forms: rules and queries spelled differently meet.
#[test]
fn spellings_meet_in_the_index() {
    let table: &[(&str, &str, &str, bool)] = &[
        ("a rule in upper case, a query in lower", "API.Example.COM", "api.example.com", true),
        ("a trailing dot on the rule", "api.example.com.", "api.example.com", true),
        ("a suffix in upper case with a trailing dot", "*.Example.COM.", "deep.api.example.com", true),
        ("an IDN rule, a punycode query", "bücher.test", "xn--bcher-kva.test", true),
        ("a punycode suffix, an IDN query", "*.xn--bcher-kva.test", "www.bücher.test", true),
        ("a WHATWG shorthand rule, a dotted query", "127.1", "127.0.0.1", true),
        ("a bracketed IPv6 rule, a bare query", "[2001:DB8::1]", "2001:db8::1", true),
        ("the apex is no subdomain", "*.example.com", "example.com", false),
        ("no match across a label boundary", "*.example.com", "evilexample.com", false),
        ("IPv4-mapped IPv6 is not the IPv4 rule", "10.0.0.1", "::ffff:10.0.0.1", false),
    ];
    for (case, rule, query, hit) in table {
        let mut p = Policy::new(Action::Deny);
        p.push_rule(Rule::new("r".into(), canonical_pattern(rule).expect(case), Ports::Web, Action::Allow, Origin::File));
        let h = canonical_host(query).expect(case);
        assert_eq!(p.candidates(&h).count() == 1, *hit, "{case}");
        assert_eq!(p.decide_connect(&h, 443).rule.is_some(), *hit, "{case}");
    }
}

/// A `--deny` added after the file was read is still looked at first.
#[test]
fn a_later_command_line_rule_comes_first() {
    let mut p = super::file::from_toml("[[rule]]\nhost = \"*.example.com\"\naction = \"allow\"\n", "p.toml").expect("parses");
    p.add_rule("a.example.com", "deny", "--deny a.example.com").expect("valid flag");
    let h = Host::Name("a.example.com".into());
    assert_eq!(ids(p.candidates(&h)), ["--deny a.example.com", "p.toml:rule[1]"]);
    assert_eq!(p.decide_connect(&h, 443).reason, "policy: rule --deny a.example.com");
}
