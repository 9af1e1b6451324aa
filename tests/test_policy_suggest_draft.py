"""`gatewrap policy suggest` on audit logs written here (no root, no netns); the kernel test
(test_policy_suggest.py) drafts from a real report-mode run."""

from __future__ import annotations

import json

import pytest

from test_policy_cli import gw


def _log(tmp_path, records: list[dict]) -> str:
    path = tmp_path / "audit.jsonl"
    path.write_text("".join(json.dumps({"v": 1, "run": "gw-1", **r}) + "\n" for r in records)
                    + json.dumps({"v": 1, "run": "gw-2", "event": "request", "dst_host": "other-run.test",
                                  "dst_port": 80, "decision": "allowed", "method": "GET"}) + "\n")
    return str(path)


SUGGEST_LOG = [
    {"event": "run_start"},
    {"event": "request", "method": "GET", "dst_host": "b.test", "dst_port": 80, "decision": "allowed",
     "would": "deny", "reason": "policy: default deny"},
    {"event": "request", "method": "POST", "dst_host": "b.test", "dst_port": 8080, "decision": "allowed"},
    {"event": "connect", "method": "CONNECT", "dst_host": "b.test", "dst_port": 443, "decision": "allowed"},
    {"event": "connect", "method": "CONNECT", "dst_host": "2001:db8::1", "dst_port": 443, "decision": "allowed"},
    {"event": "connect", "method": "CONNECT", "dst_host": "a.test", "dst_port": 443, "decision": "failed"},
    {"event": "request", "method": "GET", "dst_host": "lan.test", "dst_port": 80, "decision": "denied",
     "reason": "ssrf: private address 10.0.0.1"},
    {"event": "request", "method": "GET", "decision": "denied", "reason": "protocol: absolute-form request without a host"},
    {"event": "direct_egress", "comm": "python3", "proto": "tcp", "dst_ip": "198.51.100.148", "dst_port": 80,
     "hook": "connect4", "decision": "denied"},
    {"event": "dns", "dst_host": "leak.test", "decision": "denied"},
    {"event": "request", "method": "GET", "dst_host": "0.0.0.0", "dst_port": 80, "decision": "denied",
     "reason": "policy: unspecified address"},
    {"event": "run_end"},
]


def test_suggest_drafts_one_sorted_rule_per_host_that_policy_check_accepts(capsys, tmp_path):
    log = _log(tmp_path, SUGGEST_LOG)
    code, out, err = gw(capsys, "policy", "suggest", "--run", "gw-1", "--log", log)
    assert (code, err) == (0, "")
    assert out.splitlines()[0] == ("# Draft policy from run gw-1 (gatewrap policy suggest): 6 requests to 4 hosts.")
    hosts = [line for line in out.splitlines() if line.startswith("host = ")]
    assert hosts == ['host = "2001:db8::1"', 'host = "a.test"', 'host = "b.test"', 'host = "lan.test"']
    assert "# b.test: covers 3 requests (CONNECT 1, GET 1, POST 1)\n" in out
    assert "# denied in that run: 1 request (policy: default deny)\n" in out
    assert 'host = "b.test"\nports = [80, 443, 8080]\naction = "allow"\n' in out
    assert 'host = "lan.test"\nports = [80]\naction = "allow"\nallow_private = true\n' in out
    assert "#   python3 -> tcp 198.51.100.148:80 [connect4] (1 time)" in out
    assert "#   leak.test (1 time)" in out
    assert "#   0.0.0.0:80 (1 time)" in out, "an unspecified address is a comment: policy check refuses it as a rule"
    assert "other-run.test" not in out
    draft = tmp_path / "draft.toml"
    draft.write_text(out)
    code, out, err = gw(capsys, "policy", "check", str(draft))
    assert (code, err) == (0, ""), out
    assert "default deny, mode enforce, 4 rules" in out


def test_suggest_json_and_an_unknown_run(capsys, tmp_path):
    log = _log(tmp_path, SUGGEST_LOG)
    code, out, _ = gw(capsys, "policy", "suggest", "--run", "gw-1", "--log", log, "--json")
    rec = json.loads(out)
    assert code == 0 and rec["run"] == "gw-1" and rec["policy"].startswith("# Draft policy")
    assert rec["rules"][2] == {"host": "b.test", "ports": [80, 443, 8080], "requests": 3,
                               "methods": {"CONNECT": 1, "GET": 1, "POST": 1}, "allow_private": False}
    code, _, err = gw(capsys, "policy", "suggest", "--run", "gw-nope", "--log", log)
    assert code == 1 and "no audit records of run gw-nope" in err
    code, _, err = gw(capsys, "policy", "suggest", "--run", "gw-1", "--log", str(tmp_path / "none.jsonl"))
    assert code == 1 and "no audit log at" in err


def test_suggest_counts_a_folded_record_as_its_count(capsys, tmp_path):
    log = _log(tmp_path, [
        {"event": "request", "method": "GET", "dst_host": "c.test", "dst_port": 80, "decision": "denied",
         "reason": "policy: default deny"},
        {"event": "request", "method": "GET", "dst_host": "c.test", "dst_port": 80, "decision": "denied",
         "reason": "policy: default deny", "count": 999},
        {"event": "request", "method": "GET", "decision": "denied", "count": 40, "overflow": True,
         "reason": "gate: denials beyond the 4096 distinct ones a run folds, folded together (any rule, host and reason)"},
        {"event": "direct_egress", "comm": "python3", "proto": "tcp", "dst_ip": "198.51.100.148", "dst_port": 80,
         "hook": "connect4", "decision": "denied", "count": 7},
    ])
    code, out, err = gw(capsys, "policy", "suggest", "--run", "gw-1", "--log", log)
    assert (code, err) == (0, "")
    assert "# c.test: covers 1000 requests (GET 1000)\n# denied in that run: 1000 requests (policy: default deny)" in out
    assert "#   python3 -> tcp 198.51.100.148:80 [connect4] (7 times)" in out
    assert "denied by the gate beyond the distinct denials a run records one by one" in out and "(40 times)" in out


def test_suggest_carries_allow_private_where_the_guard_refused_a_name_on_a_private_address(capsys, tmp_path):
    log = _log(tmp_path, [
        {"event": "connect", "method": "CONNECT", "dst_host": "mirror.corp.test", "dst_port": 443,
         "decision": "denied", "reason": "ssrf: private address 10.20.30.40", "dst_ip": "10.20.30.40"},
        {"event": "request", "method": "GET", "dst_host": "public.test", "dst_port": 80, "decision": "allowed",
         "would": "deny", "reason": "policy: default deny"},
        {"event": "request", "method": "GET", "dst_host": "10.1.2.3", "dst_port": 80, "decision": "denied",
         "reason": "ssrf: private address 10.1.2.3"},
        {"event": "request", "method": "GET", "dst_host": "meta.test", "dst_port": 80, "decision": "denied",
         "reason": "ssrf: metadata address 169.254.169.254"},
        # reached in the report run through --allow-private (or --public-range): the draft's
        # enforcing run needs allow_private too
        {"event": "connect", "method": "CONNECT", "dst_host": "pypi.org", "dst_port": 443, "decision": "allowed",
         "rule": "--allow-private pypi.org", "dst_ip": "203.0.113.80"},
        {"event": "connect", "method": "CONNECT", "dst_host": "files.test", "dst_port": 443, "decision": "allowed",
         "would": "deny", "reason": "policy: default deny", "dst_ip": "2001:db8::5"},
    ])
    code, out, err = gw(capsys, "policy", "suggest", "--run", "gw-1", "--log", log)
    assert (code, err) == (0, ""), out
    assert ('host = "mirror.corp.test"\nports = [443]\naction = "allow"\nallow_private = true\n') in out
    assert ('host = "pypi.org"\nports = [443]\naction = "allow"\nallow_private = true\n') in out
    assert ('host = "files.test"\nports = [443]\naction = "allow"\nallow_private = true\n') in out
    assert 'host = "public.test"\nports = [80]\naction = "allow"\n\n' in out or out.endswith(
        'host = "public.test"\nports = [80]\naction = "allow"\n'), "no allow_private where none was needed"
    assert 'host = "10.1.2.3"\nports = [80]\naction = "allow"\n' in out, "an address: a rule naming it is enough"
    assert "#   meta.test:80: ssrf: metadata address 169.254.169.254 (1 time)" in out, "no rule for a name opens metadata"
    assert 'host = "meta.test"' not in out
    draft = tmp_path / "draft.toml"
    draft.write_text(out)
    code, out, err = gw(capsys, "policy", "check", str(draft))
    assert (code, err) == (0, ""), out
    code, out, _ = gw(capsys, "policy", "suggest", "--run", "gw-1", "--log", log, "--json")
    rules = {r["host"]: r for r in json.loads(out)["rules"]}
    assert (rules["mirror.corp.test"]["allow_private"], rules["public.test"]["allow_private"]) == (True, False)


#: Runs of one log whose ids share starts, as ``gatewrap audit --run`` takes them.
STARTS_LOG = ["gw-0123456789", "gw-0123abcdef", "gw-fedcba9876"]
SUGGEST_RUN_CASES = [
    ("a whole id", "gw-0123abcdef", 0, "gw-0123abcdef"),
    ("a start of one run's id", "gw-fed", 0, "gw-fedcba9876"),
    ("a start of one run's id without gw-", "01234", 0, "gw-0123456789"),
    ("a start of two runs' ids: both listed", "0123", 125,
     "0123 starts the id of more than one run in {log} (gw-0123456789, gw-0123abcdef): give more of it"),
    ("a start of none: what to do", "gw-abcd", 1,
     "no audit records of run gw-abcd; check the id with `gatewrap audit`, or pass --log PATH"),
]


@pytest.mark.parametrize("given,code,said", [c[1:] for c in SUGGEST_RUN_CASES], ids=[c[0] for c in SUGGEST_RUN_CASES])
def test_suggest_takes_a_unique_start_of_a_run_id_as_audit_does(capsys, tmp_path, given, code, said):
    log = tmp_path / "audit.jsonl"
    log.write_text("".join(json.dumps({"v": 1, "run": run, "event": "request", "method": "GET", "dst_host": "a.test",
                                       "dst_port": 80, "decision": "allowed"}) + "\n" for run in STARTS_LOG))
    got, out, err = gw(capsys, "policy", "suggest", "--run", given, "--log", str(log), "--json")
    assert got == code, err
    if code == 0:
        assert json.loads(out)["run"] == said
    else:
        assert said.format(log=log) in " ".join(err.split()) and out == ""
