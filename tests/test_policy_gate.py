"""Method, path, ask and budget rules carried out by the gate, through a real sandbox with curl
(plain http in absolute form: the gate sees each request; https tunnels are decided whole)."""

from __future__ import annotations

import shlex
import subprocess

import pytest

from conftest import gatewrap_cmd

pytestmark = pytest.mark.kernel

#: Print each answer's status code on a line of its own.
CODE = ["curl", "-sS", "--max-time", "10", "-o", "/dev/null", "-w", "%{http_code}\\n"]


def curls(*args: str, body: tuple[str, ...] = ()) -> list[str]:
    """A shell command running one curl (``CODE`` + the args, split on spaces) per entry of
    ``args``, then one printing the body (no status) per entry of ``body``."""
    cmds = [shlex.join([*CODE, *a.split()]) for a in args]
    cmds += [shlex.join(["curl", "-sS", "--max-time", "10", *a.split()]) for a in body]
    return ["/bin/sh", "-c", "; ".join(cmds)]


def write_policy(tmp_path, text: str) -> str:
    path = tmp_path / "policy.toml"
    path.write_text(text)
    return str(path)


METHOD_PATH_POLICY = """\
[[rule]]
host = "allowed.test"
methods = ["POST"]
action = "deny"

[[rule]]
host = "allowed.test"
path = "/status"
action = "allow"

[[rule]]
host = "allowed.test"
path = "/echo"
methods = ["GET"]
action = "allow"
"""
# (case, curl arguments, status, reason with {p} for the policy file)
METHOD_PATH_CASES = [
    ("a path prefix allows below it", "http://allowed.test/status/200", "200", "policy: rule {p}:rule[2]"),
    ("a method rule denies POST wherever it goes", "-X POST http://allowed.test/status/200", "403",
     "policy: rule {p}:rule[1]"),
    ("a path and method rule allows its method", "http://allowed.test/echo", "200", "policy: rule {p}:rule[3]"),
    ("a path and method rule does not allow another method", "-X PUT http://allowed.test/echo", "403",
     "policy: default deny"),
    ("a path no rule names is denied", "http://allowed.test/bytes/3", "403", "policy: default deny"),
    ("a dot-dot path is refused, not resolved", "--path-as-is http://allowed.test/status/../bytes/3", "403",
     "path: dot segment ('.' or '..'); rule {p}:rule[2] matches paths, so the gate refuses it"),
    ("an encoded slash is refused", "http://allowed.test/status%2F..%2Fbytes/3", "403",
     "path: encoded '/' (%2F) is ambiguous; rule {p}:rule[2] matches paths, so the gate refuses it"),
]


def test_method_and_path_rules_decide_each_plain_http_request(gatewrap, tmp_path):
    p = write_policy(tmp_path, METHOD_PATH_POLICY)
    r = gatewrap(curls(*(c[1] for c in METHOD_PATH_CASES)), extra=["--policy", p])
    assert r.returncode == 0, r.stderr
    codes = r.stdout.splitlines()
    recs = r.records(event="request")
    # A repeated denial (the same rule, host and reason within a second) is folded into a
    # later record with its count and the last one's method and target.
    assert len(codes) == sum(x.get("count", 1) for x in recs) == len(METHOD_PATH_CASES), r.stdout + r.stderr
    by_request = {(x["method"], x["target"]): x for x in recs}
    for (case, args, status, reason), code in zip(METHOD_PATH_CASES, codes):
        rec = by_request[(args.split()[1] if args.startswith("-X") else "GET", args.split()[-1])]
        assert code == status, case
        assert rec["reason"] == reason.format(p=p), case
        assert rec["decision"] == ("allowed" if status == "200" else "denied"), case


def test_a_method_rule_without_inspect_denies_the_https_tunnel(gatewrap, tmp_path):
    p = write_policy(tmp_path, METHOD_PATH_POLICY)
    r = gatewrap(["curl", "-sS", "--max-time", "10", "https://allowed.test/status/200"], extra=["--policy", p])
    assert r.returncode != 0 and "403" in r.stderr
    (rec,) = r.records(event="connect")
    assert (rec["decision"], rec["rule"]) == ("denied", f"{p}:rule[1]")
    assert rec["reason"] == (f"policy: rule {p}:rule[1] matches methods or paths, which a tunnel hides; "
                             "it needs `inspect = true`")


def test_an_ask_rule_holds_the_request_and_an_unanswered_one_is_denied_when_it_expires(gatewrap, tmp_path):
    p = write_policy(tmp_path, '[[rule]]\nhost = "allowed.test"\naction = "ask"\ntimeout = "1s"\n')
    r = gatewrap(["curl", "-sS", "-i", "--max-time", "30", "http://allowed.test/"],
                 extra=["--policy", p, "--state", f"sqlite:{tmp_path}/state.db"])
    assert r.stdout.startswith("HTTP/1.1 403"), r.stdout + r.stderr
    assert "a timeout is never a yes" in r.stdout and "nothing was sent" in r.stdout
    assert "gatewrap: approval ap-" in r.stderr
    # The line's commands name this run's store (not the default one) and say sudo (SUDO_UID
    # is a user's): pasted without sudo (we are root), `show` finds the approval.
    (line,) = [ln for ln in r.stderr.splitlines() if "answer with:" in ln]
    store = f"sqlite:{tmp_path}/state.db"
    approval = line.split("gatewrap: approval ")[1].split()[0]
    assert line.endswith(f"answer with: sudo gatewrap approvals approve {approval} --state {store} | reject "
                         f"{approval} --reason TEXT --state {store} | show {approval} --state {store}"), line
    show = subprocess.run(gatewrap_cmd("approvals", *shlex.split(line.rsplit(" | ", 1)[1])), capture_output=True,
                          text=True, timeout=60)
    assert show.returncode == 0 and show.stdout.startswith(f"approval:  {approval}\n"), show.stderr
    (rec,) = r.records(event="request")
    assert (rec["decision"], rec["status"], rec["rule"]) == ("denied", 403, f"{p}:rule[1]")
    assert rec["reason"].startswith("ask: approval ap-") and rec["reason"].endswith("expired (a timeout is never a yes)")


BUDGET_POLICY = """\
[[rule]]
host = "allowed.test"
action = "allow"
budget = { count = 2, per = "10m" }

[[rule]]
host = "other.allowed.test"
port = 443
action = "allow"
budget = { count = 1, per = "1h" }
"""


def test_a_spent_budget_denies_with_reason_budget_and_is_told_once(gatewrap, tmp_path):
    p = write_policy(tmp_path, BUDGET_POLICY)
    r = gatewrap(curls(*["http://allowed.test/"] * 4, *["https://other.allowed.test/"] * 2,
                       body=("http://allowed.test/",)), extra=["--policy", p])
    lines = r.stdout.splitlines()
    # A tunnel counts once; curl's http_code is 000 when its CONNECT gets a 403.
    assert lines[:6] == ["200", "200", "403", "403", "200", "000"], r.stdout + r.stderr
    assert f"rule {p}:rule[1] allows 2 per 10m and that budget is spent" in "\n".join(lines[6:])
    # Repeated denials are folded (one record with their count, as the kernel's): each
    # record counts as many decisions as it stands for.
    reqs = [x for x in r.records(event="request") for _ in range(x.get("count", 1))]
    assert [(x["decision"], x["reason"]) for x in reqs] == [
        ("allowed", f"policy: rule {p}:rule[1]"), ("allowed", f"policy: rule {p}:rule[1]"),
        ("denied", "budget"), ("denied", "budget"), ("denied", "budget")]
    assert all(x["rule"] == f"{p}:rule[1]" for x in reqs)
    assert [x["status"] for x in reqs[2:]] == [403, 403, 403]
    conns = r.records(event="connect")
    assert [(x["decision"], x["reason"]) for x in conns] == [("allowed", f"policy: rule {p}:rule[2]"),
                                                             ("denied", "budget")]
    told = [line for line in r.stderr.splitlines() if "budget spent" in line]
    assert len(told) == 2, r.stderr
    assert told[0].startswith(f"gatewrap: budget spent: rule {p}:rule[1] allows 2 per 10m; its requests are "
                              "denied (reason budget) for the next ")
    assert told[1].startswith(f"gatewrap: budget spent: rule {p}:rule[2] allows 1 per 1h; ")
    assert "(budget)" not in r.stderr, "a spent budget is told once per window, not once per request"


def test_report_mode_lets_a_request_over_budget_through_and_records_would_deny(gatewrap, tmp_path):
    p = write_policy(tmp_path, 'mode = "report"\n\n[[rule]]\nhost = "allowed.test"\naction = "allow"\n'
                               'budget = { count = 1, per = "10m" }\n')
    r = gatewrap(curls("http://allowed.test/", "http://allowed.test/"), extra=["--policy", p])
    assert r.stdout.splitlines() == ["200", "200"], r.stdout + r.stderr
    first, second = r.records(event="request")
    assert (first["decision"], first.get("would"), first["reason"]) == ("allowed", None, f"policy: rule {p}:rule[1]")
    assert (second["decision"], second["would"], second["reason"], second["rule"]) == (
        "allowed", "deny", "budget", f"{p}:rule[1]")
    assert "report mode lets them through (would = deny)" in r.stderr
    (end,) = r.records(event="run_end")
    assert (end["allowed"], end["would_deny"]) == (2, 1), end
    assert ", 1 would be denied in enforce mode (report mode)" in r.stderr, r.stderr
