//! Table-driven tests of request and tunnel decisions: methods, paths, schemes, inspect,
//! ask, budgets, and the file keys behind them.

use std::time::Duration;

use super::canon::canonical_host;
use super::file::from_toml;
use super::{Action, Budget, Policy, RequestFacts, Scheme};

const FILE: &str = r#"
default = "deny"

[[rule]]
host = "api.github.com"
methods = ["POST", "PATCH", "DELETE"]
action = "ask"
inspect = true
timeout = "10m"

[[rule]]
host = "api.github.com"
path = "/repos/*/issues"
action = "deny"
inspect = true

[[rule]]
host = "api.github.com"
action = "allow"

[[rule]]
host = "api.sendgrid.com"
path = "/v3/mail/send"
action = "allow"
budget = { count = 6, per = "10m" }

[[rule]]
host = "plain.test"
schemes = ["http"]
methods = ["GET"]
action = "allow"

[[rule]]
host = "guarded.test"
path = "/admin"
action = "deny"

[[rule]]
host = "guarded.test"
action = "allow"
"#;

fn policy() -> Policy {
    from_toml(FILE, "p.toml").unwrap_or_else(|e| panic!("fixture: {e}"))
}

fn request(p: &Policy, scheme: Scheme, method: &str, host: &str, path: &str) -> (Action, String) {
    let h = canonical_host(host).unwrap_or_else(|e| panic!("{host}: {e}"));
    let port = if scheme == Scheme::Http { 80 } else { 443 };
    let d = p.decide_request(&RequestFacts { host: &h, port, scheme, method, path });
    (d.action, d.reason)
}

#[test]
fn requests_match_on_method_path_and_scheme() {
    use Scheme::{Http, Https};
    let p = policy();
    let ask1 = "ask: rule p.toml:rule[1] is a breakpoint";
    let table: &[(&str, Scheme, &str, &str, &str, Action, &str)] = &[
        ("a listed method asks", Https, "POST", "api.github.com", "/repos/x/pulls", Action::Ask, ask1),
        ("each listed method asks", Https, "DELETE", "api.github.com", "/x", Action::Ask, ask1),
        ("an unlisted method falls through", Https, "GET", "api.github.com", "/user", Action::Allow, "policy: rule p.toml:rule[3]"),
        ("a glob path rule denies", Https, "GET", "api.github.com", "/repos/gw/issues", Action::Deny, "policy: rule p.toml:rule[2]"),
        ("the query is not matched", Https, "GET", "api.github.com", "/repos/gw/issues?state=open", Action::Deny, "policy: rule p.toml:rule[2]"),
        ("an encoded path is matched decoded", Https, "GET", "api.github.com", "/repos/gw/%69ssues", Action::Deny, "policy: rule p.toml:rule[2]"),
        ("the glob does not go deeper", Https, "GET", "api.github.com", "/repos/gw/issues/1", Action::Allow, "policy: rule p.toml:rule[3]"),
        ("a lower-case method is refused by a method rule", Https, "post", "api.github.com", "/", Action::Deny,
         "method: \"post\" is not upper case; rule p.toml:rule[1] matches methods exactly"),
        ("a dot-dot path is refused by a path rule", Https, "GET", "api.github.com", "/repos/../admin", Action::Deny,
         "path: dot segment ('.' or '..'); rule p.toml:rule[2] matches paths, so the gate refuses it"),
        ("an encoded slash is refused by a path rule", Http, "GET", "guarded.test", "/adm%2Fin", Action::Deny,
         "path: encoded '/' (%2F) is ambiguous; rule p.toml:rule[6] matches paths, so the gate refuses it"),
        ("a deny path rule denies below it", Http, "GET", "guarded.test", "/admin/users", Action::Deny, "policy: rule p.toml:rule[6]"),
        ("a deny path rule lets siblings through", Http, "GET", "guarded.test", "/administrator", Action::Allow, "policy: rule p.toml:rule[7]"),
        ("a double slash is refused, not merged", Http, "GET", "guarded.test", "//admin", Action::Deny,
         "path: empty segment ('//'); rule p.toml:rule[6] matches paths, so the gate refuses it"),
        ("a path prefix allows", Https, "POST", "api.sendgrid.com", "/v3/mail/send", Action::Allow, "policy: rule p.toml:rule[4]"),
        ("a path prefix does not allow its neighbour", Https, "POST", "api.sendgrid.com", "/v3/mail/sendx", Action::Deny, "policy: default deny"),
        ("a scheme rule allows its scheme", Http, "GET", "plain.test", "/", Action::Allow, "policy: rule p.toml:rule[5]"),
        ("a scheme rule does not allow the other", Https, "GET", "plain.test", "/", Action::Deny, "policy: default deny"),
        ("a method rule does not allow other methods", Http, "PUT", "plain.test", "/", Action::Deny, "policy: default deny"),
    ];
    for (case, scheme, method, host, path, action, reason) in table {
        assert_eq!(request(&p, *scheme, method, host, path), (*action, reason.to_string()), "{case}");
    }
}

#[test]
fn tunnels_are_decided_without_seeing_requests_and_fail_closed() {
    let text = r#"
[[rule]]
host = "inspected.test"
methods = ["POST"]
action = "deny"
inspect = true

[[rule]]
host = "blind.test"
path = "/private"
action = "deny"

[[rule]]
host = "blind.test"
action = "allow"

[[rule]]
host = "skipped.test"
path = "/v1"
action = "allow"

[[rule]]
host = "breakpoint.test"
methods = ["POST"]
action = "ask"

[[rule]]
host = "whole.test"
action = "allow"
inspect = true
budget = { count = 1, per = "1m" }

[[rule]]
host = "counted.test"
action = "allow"
budget = { count = 1, per = "1m" }

[[rule]]
host = "plain-only.test"
schemes = ["http"]
action = "allow"

[[rule]]
host = "asked.test"
action = "ask"

[[rule]]
host = "asked-inside.test"
action = "ask"
inspect = true
"#;
    let p = from_toml(text, "t.toml").unwrap_or_else(|e| panic!("{e}"));
    let budget = Some(Budget { count: 1, per: Duration::from_secs(60) });
    // (case, host, action, inspect, budget counted on the tunnel, reason)
    type Row<'a> = (&'a str, &'a str, Action, bool, Option<Budget>, &'a str);
    let table: &[Row] = &[
        ("a method rule with inspect inspects the tunnel", "inspected.test", Action::Allow, true, None,
         "policy: rule t.toml:rule[1] inspects the tunnel"),
        ("a deny path rule without inspect denies the tunnel", "blind.test", Action::Deny, false, None,
         "policy: rule t.toml:rule[2] matches methods or paths, which a tunnel hides; it needs `inspect = true`"),
        ("an allow path rule without inspect is skipped", "skipped.test", Action::Deny, false, None, "policy: default deny"),
        ("an ask method rule without inspect denies the tunnel", "breakpoint.test", Action::Deny, false, None,
         "policy: rule t.toml:rule[5] matches methods or paths, which a tunnel hides; it needs `inspect = true`"),
        ("an allow rule with inspect inspects, its budget counts inner requests", "whole.test", Action::Allow, true, None,
         "policy: rule t.toml:rule[6]"),
        ("a plain allow rule's budget counts the tunnel", "counted.test", Action::Allow, false, budget,
         "policy: rule t.toml:rule[7]"),
        ("an http-only rule does not cover a tunnel", "plain-only.test", Action::Deny, false, None, "policy: default deny"),
        ("an ask rule decides a tunnel as ask", "asked.test", Action::Ask, false, None,
         "ask: rule t.toml:rule[9] is a breakpoint"),
        ("an ask rule with inspect inspects the tunnel: each inner request is asked", "asked-inside.test",
         Action::Allow, true, None, "policy: rule t.toml:rule[10] inspects the tunnel"),
    ];
    for (case, host, action, inspect, budget, reason) in table {
        let d = p.decide_connect(&canonical_host(host).unwrap_or_else(|e| panic!("{e}")), 443);
        assert_eq!((d.action, d.inspect, d.budget, d.reason.as_str()), (*action, *inspect, *budget, *reason), "{case}");
    }
}

#[test]
fn a_tunnel_to_a_port_other_than_443_may_carry_plain_http() {
    let text = r#"
[[rule]]
host = "a.test"
methods = ["POST"]
schemes = ["http"]
action = "deny"

[[rule]]
host = "a.test"
action = "allow"

[[rule]]
host = "tls-only.test"
schemes = ["https"]
action = "allow"

[[rule]]
host = "no-plain.test"
schemes = ["http"]
action = "deny"

[[rule]]
host = "no-plain.test"
action = "allow"
"#;
    let p = from_toml(text, "t.toml").unwrap_or_else(|e| panic!("{e}"));
    let table: &[(&str, &str, u16, Action, &str)] = &[
        ("an http-only deny rule with methods denies a tunnel to port 80", "a.test", 80, Action::Deny,
         "policy: rule t.toml:rule[1] matches methods or paths, which a tunnel hides; it needs `inspect = true`"),
        ("an http-only deny rule leaves a tunnel to port 443 alone", "a.test", 443, Action::Allow, "policy: rule t.toml:rule[2]"),
        ("an https-only allow rule does not allow a tunnel to port 80", "tls-only.test", 80, Action::Deny, "policy: default deny"),
        ("an https-only allow rule allows a tunnel to port 443", "tls-only.test", 443, Action::Allow, "policy: rule t.toml:rule[3]"),
        ("an http-only deny rule denies a tunnel to port 80", "no-plain.test", 80, Action::Deny, "policy: rule t.toml:rule[4]"),
        ("an http-only deny rule does not deny a tunnel to port 443", "no-plain.test", 443, Action::Allow,
         "policy: rule t.toml:rule[5]"),
    ];
    for (case, host, port, action, reason) in table {
        let d = p.decide_connect(&canonical_host(host).unwrap_or_else(|e| panic!("{e}")), *port);
        assert_eq!((d.action, d.reason.as_str()), (*action, *reason), "{case}");
    }
}

#[test]
fn ask_as_the_default_is_a_breakpoint_too() {
    let p = from_toml("default = \"ask\"\n", "p.toml").unwrap_or_else(|e| panic!("{e}"));
    let (action, reason) = request(&p, Scheme::Http, "GET", "x.test", "/");
    assert_eq!((action, reason.as_str()), (Action::Ask, "ask: the default is a breakpoint"));
}

#[test]
fn new_keys_are_parsed_with_their_units() {
    let p = policy();
    let r = p.file_rules();
    assert_eq!(r[0].methods.as_deref(), Some(&["POST".to_string(), "PATCH".into(), "DELETE".into()][..]));
    assert_eq!(r[0].timeout, Some(Duration::from_secs(600)));
    assert_eq!(r[3].budget, Some(Budget { count: 6, per: Duration::from_secs(600) }));
    assert_eq!(r[4].schemes.as_deref(), Some(&[Scheme::Http][..]));
    assert_eq!(r[1].path.as_ref().map(|p| p.as_str()), Some("/repos/*/issues"));
}

#[test]
fn bad_new_keys_name_the_line() {
    let rule = |body: &str| format!("[[rule]]\nhost = \"a.test\"\n{body}");
    let table: &[(&str, String, &str)] = &[
        ("a lower-case method", rule("methods = [\"get\"]\naction = \"allow\"\n"),
         "p.toml:3: invalid method \"get\": expected an upper-case HTTP method token, e.g. \"POST\""),
        ("a method with a space", rule("methods = [\"GET \"]\naction = \"allow\"\n"),
         "p.toml:3: invalid method \"GET \": expected an upper-case HTTP method token, e.g. \"POST\""),
        ("no methods", rule("methods = []\naction = \"allow\"\n"), "p.toml:3: `methods` is empty"),
        ("a relative path", rule("path = \"v1\"\naction = \"allow\"\n"), "p.toml:3: invalid path \"v1\": does not start with '/'"),
        ("a dot-dot path", rule("path = \"/a/../b\"\naction = \"allow\"\n"),
         "p.toml:3: invalid path \"/a/../b\": dot segment ('.' or '..')"),
        ("an unknown scheme", rule("schemes = [\"ftp\"]\naction = \"allow\"\n"),
         "p.toml:3: invalid scheme \"ftp\": expected \"http\" or \"https\""),
        ("no schemes", rule("schemes = []\naction = \"allow\"\n"), "p.toml:3: `schemes` is empty"),
        ("a timeout on an allow rule", rule("action = \"allow\"\ntimeout = \"10m\"\n"),
         "p.toml:4: `timeout` only applies to \"ask\" rules"),
        ("a bad timeout", rule("action = \"ask\"\ntimeout = \"10 minutes\"\n"),
         "p.toml:4: invalid duration \"10 minutes\": expected a whole number and a unit s, m or h (e.g. \"30s\", \"10m\", \"2h\"), from 1s to 31 days"),
        ("a budget on a deny rule", rule("action = \"deny\"\nbudget = { count = 1, per = \"1m\" }\n"),
         "p.toml:4: `budget` only applies to \"allow\" rules"),
        ("a zero budget", rule("action = \"allow\"\nbudget = { count = 0, per = \"1m\" }\n"),
         "p.toml:4: invalid budget count 0: expected a whole number from 1 to 4294967295"),
        ("a budget without a unit", rule("action = \"allow\"\nbudget = { count = 1, per = \"60\" }\n"),
         "p.toml:4: invalid duration \"60\": expected a whole number and a unit s, m or h (e.g. \"30s\", \"10m\", \"2h\"), from 1s to 31 days"),
        ("a budget with an unknown key", rule("action = \"allow\"\nbudget = { count = 1, per = \"1m\", burst = 2 }\n"),
         "p.toml:4: unknown key `burst`"),
        ("a budget without per", rule("action = \"allow\"\nbudget = { count = 1 }\n"), "p.toml:4: missing key `per`"),
        ("inspect not a bool", rule("action = \"allow\"\ninspect = 1\n"), "p.toml:4: invalid type: integer `1`, expected a boolean"),
    ];
    for (case, text, want) in table {
        match from_toml(text, "p.toml") {
            Ok(_) => panic!("{case}: accepted"),
            Err(e) => assert_eq!(e.to_string(), *want, "{case}"),
        }
    }
}
