//! `[[secret]]` and a rule's `inject` (issue 20): (case, policy text, expected model or
//! `FILE:LINE` error).

use super::file::{from_toml, secrets_from_toml};
use super::secret::{Inject, Place, Source};
use super::{Action, RequestFacts, Scheme};

const SECRET: &str = "[[secret]]\nname = \"github\"\nfrom_env = \"GH\"\nplaceholder_env = \"GITHUB_TOKEN\"\n";

fn rule(extra: &str) -> String {
    format!("{SECRET}\n[[rule]]\nhost = \"api.github.com\"\naction = \"allow\"\n{extra}\n")
}

#[test]
fn secrets_are_read_with_their_source_and_placeholder() {
    let text = "[[secret]]\nname = \"a\"\nfrom_file = \"/etc/gatewrap/secrets/a\"\n\n\
                [[secret]]\nname = \"b-2\"\nfrom_env = \"B\"\n\n\
                [[secret]]\nname = \"c_3\"\nfrom_command = [\"gh\", \"auth\", \"token\"]\nplaceholder_env = \"GH_TOKEN\"\n";
    let p = from_toml(text, "p.toml").expect("parses");
    let got: Vec<_> = p.secrets.iter().map(|s| (s.name.as_str(), s.source.clone(), s.placeholder_env.as_deref(), s.origin.as_str())).collect();
    assert_eq!(got, vec![
        ("a", Source::File("/etc/gatewrap/secrets/a".into()), None, "p.toml:1"),
        ("b-2", Source::Env("B".into()), None, "p.toml:5"),
        ("c_3", Source::Command(vec!["gh".into(), "auth".into(), "token".into()]), Some("GH_TOKEN"), "p.toml:9"),
    ]);
}

#[test]
fn each_inject_spelling_gives_its_place() {
    let table: &[(&str, &str, Place)] = &[
        ("bearer", "inspect = true\ninject = { secret = \"github\", as = \"bearer\" }", Place::Bearer),
        ("basic", "inspect = true\ninject = { secret = \"github\", as = \"basic\" }", Place::Basic),
        ("a header, lower-cased", "inspect = true\ninject = { secret = \"github\", header = \"X-Api-Key\" }", Place::Header("x-api-key".into())),
        ("a query parameter", "inspect = true\ninject = { secret = \"github\", query = \"key\" }", Place::Query("key".into())),
        ("plain http needs no inspection", "schemes = [\"http\"]\ninject = { secret = \"github\", as = \"bearer\" }", Place::Bearer),
    ];
    for (case, extra, place) in table {
        let mut p = from_toml(&rule(extra), "p.toml").unwrap_or_else(|e| panic!("{case}: {e}"));
        p.add_host_secrets(Vec::new()).unwrap_or_else(|e| panic!("{case}: {e}"));
        let r = p.file_rules()[0].inject.as_deref().cloned();
        assert_eq!(r, Some(Inject { secret: "github".into(), place: place.clone() }), "{case}");
    }
}

#[test]
fn bad_secrets_and_injects_name_the_line() {
    let table: &[(&str, String, &str)] = &[
        ("https without inspection", rule("inject = { secret = \"github\", as = \"bearer\" }"),
         "p.toml:9: `inject` on https needs `inspect = true`"),
        ("a deny rule", format!("{SECRET}\n[[rule]]\nhost = \"x.test\"\naction = \"deny\"\ninspect = true\ninject = {{ secret = \"github\", as = \"bearer\" }}\n"),
         "p.toml:10: `inject` only applies to \"allow\" and \"ask\" rules"),
        ("two places", rule("inspect = true\ninject = { secret = \"github\", as = \"bearer\", query = \"k\" }"),
         "p.toml:10: `inject` needs one of `as`, `header` or `query`"),
        ("an unknown as", rule("inspect = true\ninject = { secret = \"github\", as = \"digest\" }"),
         "p.toml:10: invalid as \"digest\": expected \"bearer\" or \"basic\""),
        ("the Host header", rule("inspect = true\ninject = { secret = \"github\", header = \"Host\" }"),
         "p.toml:10: header \"Host\" cannot be injected"),
        ("an unknown key in inject", rule("inspect = true\ninject = { secret = \"github\", as = \"bearer\", user = \"x\" }"),
         "p.toml:10: unknown key `user`"),
        ("a secret without a source", "[[secret]]\nname = \"x\"\n".into(), "p.toml:2: secret \"x\" has no source"),
        ("a secret with two sources", "[[secret]]\nname = \"x\"\nfrom_env = \"X\"\nfrom_file = \"/x\"\n".into(),
         "p.toml:2: secret \"x\": give one of from_file, from_env, from_command"),
        ("a relative file", "[[secret]]\nname = \"x\"\nfrom_file = \"x\"\n".into(), "p.toml:3: invalid from_file \"x\": expected an absolute path"),
        ("an empty command", "[[secret]]\nname = \"x\"\nfrom_command = []\n".into(), "p.toml:3: `from_command` is empty"),
        ("an upper-case name", "[[secret]]\nname = \"GH\"\nfrom_env = \"X\"\n".into(), "p.toml:2: invalid secret name \"GH\""),
        ("a bad placeholder variable", "[[secret]]\nname = \"x\"\nfrom_env = \"X\"\nplaceholder_env = \"A-B\"\n".into(),
         "p.toml:4: invalid placeholder_env \"A-B\""),
        ("a name twice", format!("{SECRET}{SECRET}"), "p.toml:5: secret \"github\" is defined twice (first at p.toml:1)"),
        ("a value in the policy", "[[secret]]\nname = \"x\"\nvalue = \"hunter2\"\n".into(), "p.toml:3: unknown key `value`"),
    ];
    for (case, text, want) in table {
        let e = from_toml(text, "p.toml").err().map(|e| e.to_string()).unwrap_or_else(|| panic!("{case}: parsed"));
        assert!(e.starts_with(want), "{case}: {e}");
    }
}

#[test]
fn an_inject_must_name_a_secret_of_the_policy_or_the_host() {
    let text = "[[rule]]\nhost = \"api.github.com\"\naction = \"allow\"\ninspect = true\ninject = { secret = \"github\", as = \"bearer\" }\n";
    let mut p = from_toml(text, "p.toml").expect("parses: the host's file may define it");
    let e = p.clone().add_host_secrets(Vec::new()).err().map(|e| e.to_string());
    assert_eq!(e.as_deref(), Some("p.toml:1: rule p.toml:rule[1] injects secret \"github\", which no [[secret]] defines (the policy or /etc/gatewrap/secrets.toml)"));
    let host = secrets_from_toml("[[secret]]\nname = \"github\"\nfrom_file = \"/etc/gatewrap/gh\"\n", "/etc/gatewrap/secrets.toml").expect("parses");
    assert_eq!(host[0].origin, "/etc/gatewrap/secrets.toml:1");
    p.add_host_secrets(host.clone()).expect("the host defines it");
    let mut twice = from_toml(SECRET, "p.toml").expect("parses");
    let e = twice.add_host_secrets(host).err().map(|e| e.to_string());
    assert_eq!(e.as_deref(), Some("/etc/gatewrap/secrets.toml:1: secret \"github\" is defined twice (first at p.toml:1)"));
    let e = secrets_from_toml("[[rule]]\nhost = \"x\"\naction = \"allow\"\n", "s.toml").err().map(|e| e.to_string());
    assert_eq!(e.as_deref(), Some("s.toml:1: unknown key `rule`"));
}

#[test]
fn the_decision_on_a_request_carries_the_inject_and_a_tunnel_none() {
    let p = from_toml(&rule("inspect = true\npath = \"/repos\"\ninject = { secret = \"github\", as = \"bearer\" }"), "p.toml").expect("parses");
    let host = super::canonical_host("api.github.com").expect("host");
    let req = |path| RequestFacts { host: &host, port: 443, scheme: Scheme::Https, method: "GET", path };
    let d = p.decide_request(&req("/repos/x"));
    assert_eq!((d.action, d.inject.map(|i| i.secret.clone())), (Action::Allow, Some("github".to_string())));
    let d = p.decide_request(&req("/user"));
    assert_eq!((d.action, d.inject), (Action::Deny, None), "outside the rule's path: default deny, nothing injected");
    assert_eq!(p.decide_connect(&host, 443).inject, None);
}
