"""``gatewrap policy check`` and ``gatewrap policy test``: no root, no netns, no network."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from gatewrap.cli import main

#: The DESIGN.md policy example, as far as it is built (methods, path, ask, budget are not),
#: plus the cases the policy section promises: a wildcard, a deny shadowing it, IDN, an IPv6 rule.
DESIGN_POLICY = """\
version = 1
default = "deny"
mode = "enforce"

[[rule]]
host = "api.openai.com"
action = "allow"

[[rule]]
host = "tracker.example.com"
action = "deny"

[[rule]]
host = "*.example.com"
ports = [443]
action = "allow"

[[rule]]
host = "münchen.test"
action = "allow"

[[rule]]
host = "2001:db8::10"
action = "allow"
"""
R_OPENAI, R_TRACKER, R_WILD, R_IDN, R_V6 = (f"rule[{i}]" for i in range(1, 6))


@pytest.fixture
def policy_file(tmp_path):
    def write(text: str = DESIGN_POLICY, name: str = "policy.toml") -> str:
        path = tmp_path / name
        path.write_text(textwrap.dedent(text), encoding="utf-8")
        return str(path)
    return write


def gw(capsys, *args: str) -> tuple[int, str, str]:
    """Run ``gatewrap ARGS`` in this process through its entry point: (exit code, stdout, stderr)."""
    with pytest.raises(SystemExit) as e:
        main(list(args))
    out = capsys.readouterr()
    return e.value.code, out.out, out.err


# --- policy test: the DESIGN.md example hosts ------------------------------------------------

DECISIONS = [
    # (id, url, decision, rule suffix or None, reason)
    ("an exact rule allows its host over https", "https://api.openai.com/v1/models", "allow", R_OPENAI, None),
    ("an exact rule without ports covers port 80 too", "http://api.openai.com/", "allow", R_OPENAI, None),
    ("an exact rule does not cover a subdomain", "https://eu.api.openai.com/", "deny", None, "policy: default deny"),
    ("an exact rule does not cover its parent", "https://openai.com/", "deny", None, "policy: default deny"),
    ("an explicit port outside the rule's ports is denied", "https://api.openai.com:8443/", "deny", None,
     "policy: default deny"),
    ("a wildcard matches a strict subdomain", "https://a.example.com/", "allow", R_WILD, None),
    ("a wildcard matches a deeper subdomain", "https://a.b.example.com/", "allow", R_WILD, None),
    ("a wildcard never matches the bare domain", "https://example.com/", "deny", None, "policy: default deny"),
    ("evilexample.com does not match example.com (label boundary)", "https://evilexample.com/", "deny", None,
     "policy: default deny"),
    ("a look-alike suffix does not match", "https://a.example.com.evil.test/", "deny", None,
     "policy: default deny"),
    ("a wildcard rule with ports [443] does not allow port 80", "http://a.example.com/", "deny", None,
     "policy: default deny"),
    ("the first matching rule decides: a deny before the wildcard", "https://tracker.example.com/", "deny",
     R_TRACKER, None),
    ("a trailing dot is removed before matching", "https://api.openai.com./", "allow", R_OPENAI, None),
    ("upper case is folded before matching", "https://API.OpenAI.COM/", "allow", R_OPENAI, None),
    ("an IDN host matches a wildcard as punycode", "https://bücher.example.com/", "allow", R_WILD, None),
    ("a punycode URL matches an IDN rule", "http://xn--mnchen-3ya.test/", "allow", R_IDN, None),
    ("a Unicode URL matches an IDN rule", "http://MÜNCHEN.test/", "allow", R_IDN, None),
    ("an IPv6 literal matches in any spelling", "http://[2001:DB8:0:0::10]/", "allow", R_V6, None),
    ("an IPv6 literal no rule names is denied", "https://[2001:db8::11]/", "deny", None, "policy: default deny"),
    ("a host no rule names is denied by default", "https://pypi.org/simple/", "deny", None,
     "policy: default deny"),
    ("the unspecified address is denied before any rule", "http://0.0.0.0/", "deny", None,
     "policy: unspecified address"),
    ("userinfo naming an allowed host does not pick the destination", "https://api.openai.com@evil.test/",
     "deny", None, "policy: default deny"),
    ("userinfo before an allowed host is ignored for matching", "https://evil.test:pw@api.openai.com/",
     "allow", R_OPENAI, None),
]


@pytest.mark.parametrize("url,decision,rule,reason", [c[1:] for c in DECISIONS], ids=[c[0] for c in DECISIONS])
def test_policy_test_decides_like_the_gate(capsys, policy_file, url, decision, rule, reason):
    path = policy_file()
    code, out, err = gw(capsys, "policy", "test", path, "GET", url, "--json")
    rec = json.loads(out)
    assert (code, rec["decision"]) == ({"allow": 0, "deny": 1}[decision], decision), err
    if rule is None:
        assert rec["rule"] is None
        assert rec["reason"] == reason
    else:
        assert rec["rule"]["id"] == f"{path}:{rule}"
        assert rec["reason"] == f"policy: rule {path}:{rule}"


def test_the_text_answer_names_decision_method_url_and_reason(capsys, policy_file):
    code, out, _ = gw(capsys, "policy", "test", policy_file(), "GET", "https://x.test/")
    assert code == 1
    assert out.splitlines()[0] == "deny  GET https://x.test/  (policy: default deny)"


def test_the_text_answer_names_the_rule_and_its_line(capsys, policy_file):
    path = policy_file()
    code, out, _ = gw(capsys, "policy", "test", path, "POST", "https://a.example.com/x")
    assert code == 0
    assert out.splitlines()[0] == f"allow POST https://a.example.com/x  (policy: rule {path}:{R_WILD})"
    assert f"rule {path}:{R_WILD} (line 13): host *.example.com, ports 443, allow" in out
    assert "SSRF guard" in out


def test_json_has_the_documented_keys_and_the_canonical_host(capsys, policy_file):
    code, out, _ = gw(capsys, "policy", "test", policy_file(), "GET", "https://u:secret@Bücher.Example.com.:443/p",
                      "--json")
    rec = json.loads(out)
    assert code == 0
    assert {"decision", "reason", "rule", "host", "port", "method", "url"} <= rec.keys()
    assert (rec["host"], rec["port"], rec["method"]) == ("xn--bcher-kva.example.com", 443, "GET")
    assert rec["rule"]["host"] == "*.example.com" and rec["rule"]["line"] == 13
    assert rec["userinfo"] == {"user": "u", "password": True}
    assert "secret" not in out


def test_text_output_reports_userinfo_and_masks_the_password(capsys, policy_file):
    _, out, _ = gw(capsys, "policy", "test", policy_file(), "GET", "https://bob:hunter2@api.openai.com/")
    assert "userinfo (user 'bob' and a password) is ignored for matching" in out
    assert "hunter2" not in out


@pytest.mark.parametrize("url,port", [
    ("http://pypi.org/", 80), ("https://pypi.org/", 443), ("https://pypi.org:8443/", 8443), ("HTTP://pypi.org:/", 80),
], ids=["http defaults to port 80", "https defaults to port 443", "an explicit port is kept",
        "an empty port means the default"])
def test_default_ports(capsys, policy_file, url, port):
    _, out, _ = gw(capsys, "policy", "test", policy_file(), "GET", url, "--json")
    assert json.loads(out)["port"] == port


# --- policy test: flags ---------------------------------------------------------------------

FLAGS = [
    ("--deny overrides an allow rule of the file", ["--deny", "api.openai.com"], "https://api.openai.com/",
     "deny", "--deny api.openai.com"),
    ("--allow overrides the file's default", ["--allow", "pypi.org"], "https://pypi.org/", "allow", "--allow pypi.org"),
    ("--allow overrides a deny rule of the file", ["--allow", "tracker.example.com"], "https://tracker.example.com/",
     "allow", "--allow tracker.example.com"),
    ("--deny is checked before --allow", ["--allow", "pypi.org", "--deny", "pypi.org"], "https://pypi.org/", "deny",
     "--deny pypi.org"),
    ("a flag's port limits it", ["--allow", "pypi.org:8443"], "https://pypi.org/", "deny", None),
    ("a flag matches canonically", ["--deny", "*.EXAMPLE.com."], "https://a.example.com/", "deny",
     "--deny *.EXAMPLE.com."),
    ("an IPv4 address written as one decimal number is the dotted quad", ["--allow", "198.51.100.138"],
     "http://3325256842/", "allow", "--allow 198.51.100.138"),
    ("an IPv4 address in hex and octal parts is the dotted quad", ["--deny", "198.51.100.138"],
     "https://0xc6.063.0x64.0x8a/", "deny", "--deny 198.51.100.138"),
    ("a short IPv4 form is the dotted quad", ["--allow", "127.0.0.1"], "http://127.1/", "allow", "--allow 127.0.0.1"),
]


@pytest.mark.parametrize("flags,url,decision,rule", [c[1:] for c in FLAGS], ids=[c[0] for c in FLAGS])
def test_command_line_rules_come_before_the_file(capsys, policy_file, flags, url, decision, rule):
    code, out, err = gw(capsys, "policy", "test", policy_file(), "GET", url, *flags, "--json")
    rec = json.loads(out)
    assert rec["decision"] == decision, err
    assert code == (0 if decision == "allow" else 1)
    assert (rec["rule"] or {}).get("id") == rule


# --- policy test: refusals (exit 125) ---------------------------------------------------------

REFUSED = [
    ("a URL without a scheme", "GET", "api.openai.com", "http:// or https://"),
    ("an ftp URL", "GET", "ftp://api.openai.com/", "http:// or https://"),
    ("a URL without a host", "GET", "https:///path", "no host"),
    ("a host with an empty label", "GET", "https://a..b/", 'invalid host "a..b": empty label'),
    ("a numeric host that is no IPv4 address", "GET", "http://1.2.3.4.5/", "not an IPv4 address in any spelling"),
    ("a percent-encoded host", "GET", "http://%61pi.openai.com/", "invalid host"),
    ("a port out of range", "GET", "https://api.openai.com:99999/", "99999"),
    ("a port that is not a number", "GET", "https://api.openai.com:https/", "api.openai.com:https"),
    ("port 0", "GET", "https://api.openai.com:0/", "port 0"),
    ("a backslash in the host part", "GET", "http://api.openai.com\\@evil.test/", "backslash"),
    ("a space in the URL", "GET", "http://api.openai.com /", "space or control"),
    ("a method that is not an HTTP token", "GE T", "https://api.openai.com/", "invalid method"),
    ("an empty method", "", "https://api.openai.com/", "invalid method"),
]


@pytest.mark.parametrize("method,url,needle", [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
def test_bad_requests_exit_125_with_the_reason(capsys, policy_file, method, url, needle):
    code, out, err = gw(capsys, "policy", "test", policy_file(), method, url)
    assert code == 125
    assert out == ""
    assert err.startswith("gatewrap: ") and needle in err


def test_an_invalid_policy_file_exits_125_not_deny(capsys, policy_file):
    path = policy_file('version = 1\nbogus = 1\n', name="bad.toml")
    code, _, err = gw(capsys, "policy", "test", path, "GET", "https://api.openai.com/")
    assert code == 125
    assert f"{path}:2: unknown key `bogus`" in err


def test_a_bad_flag_exits_125(capsys, policy_file):
    code, _, err = gw(capsys, "policy", "test", policy_file(), "GET", "https://x.test/", "--allow", "https://x.test")
    assert code == 125 and "a host, not a URL" in err


def test_help_says_https_is_decided_on_the_tunnel_and_the_ssrf_guard_comes_after(capsys):
    code, out, _ = gw(capsys, "policy", "test", "--help")
    assert code == 0
    text = " ".join(out.split())
    assert "CONNECT tunnel" in text and "inspect = true" in text
    assert "SSRF guard" in text and "DNS" in text
    assert "Exit 0 allow, 1 deny, 2 ask" in text


# --- policy check -----------------------------------------------------------------------------

def test_check_summarises_a_valid_policy(capsys, policy_file):
    path = policy_file()
    code, out, err = gw(capsys, "policy", "check", path)
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0] == f"{path}: valid"
    assert lines[1] == "default deny, mode enforce, 5 rules (first match decides)"
    rows = [line.split() for line in lines[2:]]
    assert rows == [
        [f"{path}:{R_OPENAI}", "api.openai.com", "80,443", "allow"],
        [f"{path}:{R_TRACKER}", "tracker.example.com", "80,443", "deny"],
        [f"{path}:{R_WILD}", "*.example.com", "443", "allow"],
        [f"{path}:{R_IDN}", "xn--mnchen-3ya.test", "80,443", "allow"],
        [f"{path}:{R_V6}", "2001:db8::10", "80,443", "allow"],
    ]


def test_check_shows_allow_private(capsys, policy_file):
    path = policy_file('[[rule]]\nhost = "registry.internal.example"\naction = "allow"\nallow_private = true\n')
    code, out, _ = gw(capsys, "policy", "check", path)
    assert code == 0
    assert out.splitlines()[-1].split() == [f"{path}:rule[1]", "registry.internal.example", "80,443", "allow",
                                            "allow_private"]


def test_check_json(capsys, policy_file):
    path = policy_file()
    code, out, _ = gw(capsys, "policy", "check", path, "--json")
    rec = json.loads(out)
    assert code == 0
    assert (rec["valid"], rec["error"], rec["default"], rec["mode"], rec["warnings"]) == (True, None, "deny",
                                                                                         "enforce", [])
    assert [r["line"] for r in rec["rules"]] == [5, 9, 13, 18, 22]
    assert rec["rules"][2] == {"id": f"{path}:{R_WILD}", "host": "*.example.com", "ports": [443],
                               "ports_default": False, "action": "allow", "origin": "file", "line": 13,
                               "allow_private": False, "inspect": False, "methods": None, "path": None,
                               "schemes": None, "timeout": None, "budget": None, "inject": None}


BAD_FILES = [
    ("an unknown key names its line", 'version = 1\n\n[[rule]]\nhost = "a.test"\nactoin = "allow"\n',
     "5: unknown key `actoin`"),
    ("an unknown top-level key names its line", 'default = "deny"\nfoo = 1\n', "2: unknown key `foo`"),
    ("bad TOML names its line", 'default = "deny"\n[[rule]\n', "2: invalid table header"),
    ("an unterminated string names its line", 'default = "deny\n', "1: "),
    ("a lower-case method is refused", '[[rule]]\nhost = "a.test"\naction = "allow"\nmethods = ["get"]\n',
     '4: invalid method "get": expected an upper-case HTTP method token'),
    ("an ambiguous path is refused", '[[rule]]\nhost = "a.test"\naction = "allow"\npath = "/a%2Fb"\n',
     "4: invalid path \"/a%2Fb\": encoded '/' (%2F) is ambiguous"),
    ("a duration without a unit is refused", '[[rule]]\nhost = "a.test"\naction = "ask"\ntimeout = "600"\n',
     '4: invalid duration "600": expected a whole number and a unit s, m or h'),
    ("a budget on a deny rule is refused",
     '[[rule]]\nhost = "a.test"\naction = "deny"\nbudget = { count = 1, per = "1m" }\n', "4: `budget` only applies"),
    ("a bad host in a rule is refused", '[[rule]]\nhost = "a..test"\naction = "allow"\n',
     'invalid host "a..test": empty label'),
    ("allow_private on a deny rule is refused", '[[rule]]\nhost = "a.test"\naction = "deny"\nallow_private = true\n',
     "allow_private"),
    ("gatewrap's own variable in [sandbox] env is refused", '[sandbox]\nenv = ["A",\n  "GATEWRAP_STATE"]\n',
     "3: [sandbox] env: GATEWRAP_STATE: gatewrap's own settings never reach the agent"),
    ("a proxy variable in [sandbox] env is refused", '[sandbox]\nenv = ["http_proxy=http://x.test"]\n',
     "2: [sandbox] env: http_proxy: gatewrap sets http_proxy in every run"),
    ("a bad name in [sandbox] env is refused", '[sandbox]\nenv = ["A B=1"]\n', "2: [sandbox] env: 'A B' is not a variable name"),
]


@pytest.mark.parametrize("text,needle", [c[1:] for c in BAD_FILES], ids=[c[0] for c in BAD_FILES])
def test_check_refuses_a_bad_file_with_file_and_line(capsys, policy_file, text, needle):
    path = policy_file(text, name="bad.toml")
    code, out, err = gw(capsys, "policy", "check", path)
    assert (code, out) == (1, "")
    assert err.startswith(f"gatewrap: {path}:") and needle in err
    assert len(err.strip().splitlines()) == 1, err


def test_check_shows_the_sandbox_env_names_but_no_value(capsys, policy_file):
    path = policy_file('[sandbox]\nenv = ["OPENAI_API_KEY",\n  "LOG_LEVEL=debug-secret"]\n')
    code, out, _ = gw(capsys, "policy", "check", path)
    assert code == 0 and "debug-secret" not in out
    assert out.splitlines()[-2:] == ["  env OPENAI_API_KEY  (line 2)", "  env LOG_LEVEL=…  (line 3)"]
    code, out, _ = gw(capsys, "policy", "check", path, "--json")
    assert json.loads(out)["sandbox"]["env"] == [{"name": "OPENAI_API_KEY", "value": False, "line": 2},
                                                 {"name": "LOG_LEVEL", "value": True, "line": 3}]
    assert "debug-secret" not in out


SECRETS_POLICY = """\
public_ranges = ["198.18.0.0/15", "2001:DB8::/32"]

[[rule]]
host = "api.anthropic.com"
inspect = true
action = "allow"
inject = { secret = "anthropic", header = "X-Api-Key" }

[[rule]]
host = "maps.example.com"
schemes = ["http"]
action = "allow"
inject = { secret = "maps", query = "key" }

[[secret]]
name = "anthropic"
from_command = ["pass", "show", "cmd-arg-not-shown"]
placeholder_env = "ANTHROPIC_API_KEY"

[[secret]]
name = "maps"
from_env = "VARIABLE_NOT_SHOWN"
budget = 20

[[secret]]
name = "unused"
from_file = "/etc/gatewrap/secrets/path-not-shown"
"""


def test_check_shows_public_ranges_and_secrets_by_name_kind_and_place_never_where_they_are_read(capsys, policy_file):
    path = policy_file(SECRETS_POLICY)
    code, out, err = gw(capsys, "policy", "check", path)
    assert (code, err) == (0, "")
    lines = out.splitlines()
    at = lines.index(next(line for line in lines if line.startswith("public_ranges:")))
    assert lines[at:] == [
        "public_ranges: 198.18.0.0/15, 2001:db8::/32 (the SSRF guard counts these addresses as public, as "
        "--public-range)",
        "secrets the gate injects where a rule says (by name; sudo gatewrap secrets list shows where each is read, "
        "secrets check whether it resolves):",
        "  anthropic  from_command  placeholder in $ANTHROPIC_API_KEY  (line 15)",
        f"    {path}:rule[1]  api.anthropic.com  into header x-api-key",
        "  maps  from_env  budget 20 per run  (line 20)",
        f"    {path}:rule[2]  maps.example.com  into query key",
        "  unused  from_file  (line 25)",
        "    (no rule injects it: never read)",
    ]
    code, out, _ = gw(capsys, "policy", "check", path, "--json")
    rec = json.loads(out)
    assert code == 0 and rec["public_ranges"] == ["198.18.0.0/15", "2001:db8::/32"]
    assert rec["secrets"] == [
        {"name": "anthropic", "source": {"kind": "command"}, "placeholder_env": "ANTHROPIC_API_KEY", "budget": None,
         "origin": f"{path}:15", "rules": [{"rule": f"{path}:rule[1]", "host": "api.anthropic.com",
                                            "place": "header x-api-key"}]},
        {"name": "maps", "source": {"kind": "env"}, "placeholder_env": None, "budget": 20, "origin": f"{path}:20",
         "rules": [{"rule": f"{path}:rule[2]", "host": "maps.example.com", "place": "query key"}]},
        {"name": "unused", "source": {"kind": "file"}, "placeholder_env": None, "budget": None, "origin": f"{path}:25",
         "rules": []},
    ]
    for text in (out, *lines):
        assert not any(hidden in text for hidden in ("cmd-arg-not-shown", "VARIABLE_NOT_SHOWN", "path-not-shown"))


def test_check_of_a_policy_without_public_ranges_or_secrets_says_nothing_of_them(capsys, policy_file):
    code, out, _ = gw(capsys, "policy", "check", policy_file())
    assert code == 0 and "public_ranges" not in out and "secrets" not in out
    rec = json.loads(gw(capsys, "policy", "check", policy_file(), "--json")[1])
    assert (rec["public_ranges"], rec["secrets"]) == ([], [])


def test_check_json_on_a_bad_file(capsys, policy_file):
    path = policy_file('foo = 1\n', name="bad.toml")
    code, out, _ = gw(capsys, "policy", "check", path, "--json")
    rec = json.loads(out)
    assert code == 1
    assert (rec["valid"], rec["error"]) == (False, f"{path}:1: unknown key `foo`")


def test_check_a_missing_file_exits_125(capsys, tmp_path):
    code, _, err = gw(capsys, "policy", "check", str(tmp_path / "nope.toml"))
    assert code == 125 and "nope.toml" in err


WARNINGS = [
    ("a default allow without deny rules allows everything", 'default = "allow"\n', "allows everything"),
    ("a default allow with only allow rules allows everything",
     'default = "allow"\n[[rule]]\nhost = "a.test"\naction = "allow"\n', "allows everything"),
    ("report mode only records", 'mode = "report"\n', 'mode = "report"'),
    ("a method rule without inspect cannot see https", '[[rule]]\nhost = "a.test"\nmethods = ["GET"]\naction = "deny"\n',
     "has no `inspect = true`: https requests travel in CONNECT tunnels that hide both, so this deny rule denies "
     "the whole tunnel"),
    ("an allow path rule without inspect is skipped on https", '[[rule]]\nhost = "a.test"\npath = "/v1"\naction = "allow"\n',
     "so this allow rule is skipped on them"),
]


@pytest.mark.parametrize("text,needle", [c[1:] for c in WARNINGS], ids=[c[0] for c in WARNINGS])
def test_check_warns_but_passes(capsys, policy_file, text, needle):
    code, out, err = gw(capsys, "policy", "check", policy_file(text))
    assert code == 0 and "valid" in out
    assert err.startswith("gatewrap: warning: ") and needle in err


def test_check_does_not_warn_about_http_only_or_inspected_method_rules(capsys, policy_file):
    text = ('[[rule]]\nhost = "a.test"\nmethods = ["GET"]\nschemes = ["http"]\naction = "allow"\n\n'
            '[[rule]]\nhost = "b.test"\npath = "/x/**"\ninspect = true\naction = "deny"\n')
    code, out, err = gw(capsys, "policy", "check", policy_file(text))
    assert (code, err) == (0, "")
    assert "methods GET  schemes http" in out and "path /x/**  inspect" in out


def test_check_does_not_warn_when_a_default_allow_has_a_deny_rule(capsys, policy_file):
    code, _, err = gw(capsys, "policy", "check", policy_file('default = "allow"\n[[rule]]\nhost = "a.test"\n'
                                                             'action = "deny"\n'))
    assert (code, err) == (0, "")


def test_report_mode_is_noted_by_policy_test(capsys, policy_file):
    code, out, _ = gw(capsys, "policy", "test", policy_file('mode = "report"\n'), "GET", "https://x.test/")
    assert code == 1
    assert "mode = report" in out


def test_the_installed_command_runs(policy_file):
    p = subprocess.run([sys.executable, "-m", "gatewrap", "policy", "test", policy_file(), "GET",
                        "https://api.openai.com/"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("allow GET https://api.openai.com/  (policy: rule ")


# --- policy test: the DESIGN.md policy block, exactly as written there -------------------------

DESIGN_MD_POLICY = """\
default = "deny"                 # deny | allow | ask
mode = "enforce"                 # enforce | report (allow all, log what enforce would do)

[[rule]]
host = "api.openai.com"          # exact; "*.example.com" = subdomains only; "example.com" ≠ "evilexample.com"
action = "allow"

[[rule]]
host = "api.github.com"
methods = ["POST", "PATCH", "DELETE"]   # method/path need TLS inspection for https
action = "ask"                   # breakpoint: a human approves, edits or rejects
timeout = "10m"                  # expiry = deny

[[rule]]
host = "api.sendgrid.com"
path = "/v3/mail/send"
action = "allow"
budget = { count = 6, per = "10m" }   # then deny with reason "budget"
"""
GH_TUNNEL = "policy: rule {p}:rule[2] matches methods or paths, which a tunnel hides; it needs `inspect = true`"
DESIGN_MD_CASES = [
    # (case, method, url, decision, stage, reason with {p} for the file)
    ("an exact host is allowed over https", "GET", "https://api.openai.com/v1/models", "allow", "tunnel",
     "policy: rule {p}:rule[1]"),
    ("evilexample.com is not example.com", "GET", "https://evilexample.com/", "deny", "tunnel", "policy: default deny"),
    ("a listed method on http is a breakpoint", "POST", "http://api.github.com/repos/gw/issues", "ask", "request",
     "ask: rule {p}:rule[2] is a breakpoint"),
    ("each listed method is a breakpoint", "DELETE", "http://api.github.com/repos/gw", "ask", "request",
     "ask: rule {p}:rule[2] is a breakpoint"),
    ("an unlisted method falls to the default", "GET", "http://api.github.com/user", "deny", "request",
     "policy: default deny"),
    ("on https the method rule cannot be seen, so the tunnel is denied", "POST", "https://api.github.com/repos",
     "deny", "tunnel", GH_TUNNEL),
    ("even a GET is denied on https: the whole tunnel is", "GET", "https://api.github.com/user", "deny", "tunnel",
     GH_TUNNEL),
    ("the allowed path on http", "POST", "http://api.sendgrid.com/v3/mail/send", "allow", "request",
     "policy: rule {p}:rule[3]"),
    ("below the allowed path", "POST", "http://api.sendgrid.com/v3/mail/send/batch?x=1", "allow", "request",
     "policy: rule {p}:rule[3]"),
    ("a percent-encoded spelling of the path is decoded once", "POST", "http://api.sendgrid.com/v3/mail/%73end",
     "allow", "request", "policy: rule {p}:rule[3]"),
    ("a sibling of the path is not allowed", "POST", "http://api.sendgrid.com/v3/mail/sendx", "deny", "request",
     "policy: default deny"),
    ("the parent of the path is not allowed", "GET", "http://api.sendgrid.com/v3/mail", "deny", "request",
     "policy: default deny"),
    ("a dot-dot path is refused, not resolved", "POST", "http://api.sendgrid.com/v3/mail/send/../../admin", "deny",
     "request", "path: dot segment ('.' or '..'); rule {p}:rule[3] matches paths, so the gate refuses it"),
    ("an encoded slash is refused", "POST", "http://api.sendgrid.com/v3/mail/send%2F..%2Fadmin", "deny", "request",
     "path: encoded '/' (%2F) is ambiguous; rule {p}:rule[3] matches paths, so the gate refuses it"),
    ("on https the path rule cannot be seen, so it is skipped", "POST", "https://api.sendgrid.com/v3/mail/send",
     "deny", "tunnel", "policy: default deny"),
]


@pytest.mark.parametrize("method,url,decision,stage,reason", [c[1:] for c in DESIGN_MD_CASES],
                         ids=[c[0] for c in DESIGN_MD_CASES])
def test_policy_test_answers_the_design_md_examples(capsys, policy_file, method, url, decision, stage, reason):
    path = policy_file(DESIGN_MD_POLICY)
    code, out, err = gw(capsys, "policy", "test", path, method, url, "--json")
    rec = json.loads(out)
    assert (code, rec["decision"], rec["stage"]) == ({"allow": 0, "deny": 1, "ask": 2}[decision], decision, stage), err
    assert rec["reason"] == reason.format(p=path)


def test_the_design_md_policy_checks_with_warnings_about_inspect(capsys, policy_file):
    path = policy_file(DESIGN_MD_POLICY)
    code, out, err = gw(capsys, "policy", "check", path)
    assert code == 0
    assert f"{path}:rule[2]  api.github.com    80,443  ask    methods POST,PATCH,DELETE  timeout 10m" in out
    assert f"{path}:rule[3]  api.sendgrid.com  80,443  allow  path /v3/mail/send  budget 6 per 10m" in out
    warnings = err.splitlines()
    assert len(warnings) == 2, err
    assert f"rule {path}:rule[2] matches methods or paths but has no `inspect = true`" in warnings[0]
    assert f"rule {path}:rule[3] matches methods or paths but has no `inspect = true`" in warnings[1]


def test_an_ask_answer_says_the_gate_holds_it_for_a_human(capsys, policy_file):
    code, out, _ = gw(capsys, "policy", "test", policy_file(DESIGN_MD_POLICY), "PATCH", "http://api.github.com/x")
    assert code == 2
    assert "ask: a breakpoint; the gate holds the request until a human answers (gatewrap approvals) or its timeout denies it" in out
    assert "methods POST,PATCH,DELETE, timeout 10m" in out



INSPECTED = '[[rule]]\nhost = "api.github.com"\nmethods = ["POST"]\naction = "ask"\ninspect = true\n\n' \
            '[[rule]]\nhost = "api.github.com"\naction = "allow"\n'


@pytest.mark.parametrize("method,decision,reason", [
    ("POST", "ask", "ask: rule {p}:rule[1] is a breakpoint"),
    ("GET", "allow", "policy: rule {p}:rule[2]"),
], ids=["an inspected tunnel's request is decided on its method", "another method falls through"])
def test_an_inspected_https_url_is_decided_as_its_request(capsys, policy_file, method, decision, reason):
    path = policy_file(INSPECTED)
    code, out, _ = gw(capsys, "policy", "test", path, method, "https://api.github.com/repos", "--json")
    rec = json.loads(out)
    assert (code, rec["decision"], rec["stage"], rec["reason"]) == (
        {"allow": 0, "ask": 2}[decision], decision, "request", reason.format(p=path))


@pytest.mark.parametrize("example", ["examples/agent-policy.toml", "examples/breakpoint/policy.toml"])
def test_the_example_policies_check_without_warnings(example):
    """A reader copies the examples: they must not teach a rule `policy check` warns about."""
    from pathlib import Path
    path = Path(__file__).resolve().parent.parent / example
    p = subprocess.run([sys.executable, "-m", "gatewrap", "policy", "check", str(path)],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "warning" not in p.stderr, p.stderr


# --- policy check --workdir: the protected paths of a run there --------------------------------

def test_check_with_a_workdir_lists_its_protected_paths_and_the_unprotected_ones(capsys, policy_file, tmp_path):
    work = tmp_path / "work"
    for folder in ("work/.git/hooks", "work/.vscode", "bound/.idea"):
        (tmp_path / folder).mkdir(parents=True)
    (work / ".git/config").write_text("[core]\n")
    path = policy_file(f'[sandbox]\nbind = ["{tmp_path / "bound"}"]\nunprotect = [".vscode"]\n')
    code, out, _ = gw(capsys, "policy", "check", path, "--workdir", str(work))
    assert code == 0
    got = out.split("protected in ", 1)[1].splitlines()
    assert got[0].startswith(f"{work} and the bind paths (read-only for the agent")
    assert [line.strip() for line in got[1:4]] == [str(tmp_path / "bound/.idea"), str(work / ".git/config"),
                                                   str(work / ".git/hooks")]
    assert f"  left writable: {work / '.vscode'}" in got
    code, out, _ = gw(capsys, "policy", "check", path, "--workdir", str(work), "--json")
    record = json.loads(out)["protected"]
    assert record["workdir"] == str(work) and record["unprotected"] == [str(work / ".vscode")]
    assert str(work / ".git/info") in record["watched"] and str(work / ".git/info") not in record["readonly"]
    code, out, _ = gw(capsys, "policy", "check", path)
    assert "protected in" not in out, "only with --workdir"


def test_check_without_a_file_lists_the_protected_paths_of_a_run_without_a_policy(capsys, tmp_path):
    (tmp_path / ".git/hooks").mkdir(parents=True)
    (tmp_path / ".git/config").write_text("[core]\n")
    code, out, _ = gw(capsys, "policy", "check", "--workdir", str(tmp_path))
    assert code == 0
    assert out.startswith("(no policy file): valid\ndefault deny"), out
    assert f"  {tmp_path / '.git/config'}" in out.splitlines()
    assert "  + any .envrc, .vscode, .idea, .devcontainer or repository (.git) the run makes in them" in out
    code, _, err = gw(capsys, "policy", "check")
    assert code != 0 and "give a policy FILE, or --workdir DIR" in err
