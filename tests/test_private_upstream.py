"""Private-range upstreams (a company mirror on 10.x) through a real sandbox: the option that
allows one (``--allow-private``), the hint that names it on stderr (an HTTPS client never shows
the 403's body), report mode -> ``policy suggest`` -> enforce, ``public_ranges`` in the policy
file, and an ``ask`` rule with ``allow_private`` (an approved tunnel is dialled; one the guard
refuses is never recorded ``sent``)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import time

import pytest

from conftest import AGENT_UID, PUBLIC_RANGES, ROOT, Run, gatewrap_cmd, run_gatewrap
from fakenet import FakeInternet

pytestmark = pytest.mark.kernel

#: The mirror's address: private (RFC 1918), served by the fake internet, not used on this host.
MIRROR_IP = "10.20.30.40"
CURL = ["curl", "-sS", "--max-time", "20", "-o", "/dev/null", "-w", "%{http_code}\\n"]


@pytest.fixture(scope="module")
def net():
    with FakeInternet(extra_names={"mirror.test": MIRROR_IP}, private_addrs=[MIRROR_IP]) as n:
        yield n


def reached_mirror(net, path: str) -> int:
    return len([e for e in net.access_entries(event="request", path=path) if e["local"] == MIRROR_IP])


def test_allow_refuses_a_private_mirror_and_says_once_on_stderr_which_option_allows_it(net, tmp_path):
    r = run_gatewrap(net, tmp_path / "audit.jsonl", ["/bin/sh", "-c", " ; ".join(
        [shlex.join([*CURL, f"http://mirror.test/echo?t=m{i}"]) for i in range(2)] + [shlex.join([*CURL, "-p", "http://mirror.test/echo?t=m2"])])],
        allow=["mirror.test"])
    assert r.stdout.split() == ["403", "403", "000"], r.stdout + r.stderr
    hint = ("gatewrap: mirror.test resolves to 10.20.30.40, a private address, which the SSRF guard refuses; "
            "allow it with --allow-private mirror.test:80, or allow_private = true on its rule")
    assert r.stderr.count(hint) == 1, r.stderr
    recs = r.records(event="request") + r.records(event="connect")
    assert {(x["decision"], x["reason"]) for x in recs} == {("denied", "ssrf: private address 10.20.30.40")}, recs
    assert reached_mirror(net, "/echo?t=m0") == 0


@pytest.mark.parametrize("how", ["plain http", "a CONNECT tunnel"])
def test_allow_private_reaches_the_private_mirror(net, tmp_path, how):
    path = f"/echo?t=ok-{how.replace(' ', '-')}"
    tunnel = ["-p"] if how == "a CONNECT tunnel" else []
    r = run_gatewrap(net, tmp_path / "audit.jsonl", [*CURL, *tunnel, f"http://mirror.test{path}"],
                     extra=["--allow-private", "mirror.test"])
    assert r.stdout.strip() == "200", r.stdout + r.stderr
    (rec,) = r.records(event="connect" if tunnel else "request")
    assert (rec["decision"], rec["rule"], rec["dst_ip"]) == ("allowed", "--allow-private mirror.test", MIRROR_IP)
    assert reached_mirror(net, path) == 1


def test_allow_private_on_an_address_is_a_usage_error_that_says_to_use_allow(net, tmp_path):
    r = run_gatewrap(net, tmp_path / "audit.jsonl", ["/bin/true"], extra=["--allow-private", MIRROR_IP])
    assert r.returncode == 125
    assert f"use --allow {MIRROR_IP} (--allow-private is for names)" in r.stderr, r.stderr


def test_report_then_suggest_then_enforce_reaches_the_private_mirror(net, tmp_path):
    """Report mode does not lift the guard (DESIGN contract 4 holds in every mode): the run
    records the refusal with its reason; `policy suggest` turns it into a rule with
    allow_private = true; that draft, enforced, reaches the mirror."""
    report = tmp_path / "report.toml"
    report.write_text('mode = "report"\n')
    r = run_gatewrap(net, tmp_path / "report.jsonl", [*CURL, "http://mirror.test/echo?t=report"], extra=["--policy", str(report)])
    assert r.stdout.strip() == "403", r.stdout + r.stderr
    (rec,) = r.records(event="request")
    assert (rec["decision"], rec["reason"]) == ("denied", "ssrf: private address 10.20.30.40")
    assert "--allow-private mirror.test:80" in r.stderr
    p = subprocess.run(gatewrap_cmd("policy", "suggest", "--run", r.run_id, "--log", str(tmp_path / "report.jsonl")),
                       capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    assert 'host = "mirror.test"\nports = [80]\naction = "allow"\nallow_private = true\n' in p.stdout, p.stdout
    draft = tmp_path / "draft.toml"
    draft.write_text(p.stdout)
    draft.chmod(0o644)
    r = run_gatewrap(net, tmp_path / "enforce.jsonl", [*CURL, "http://mirror.test/echo?t=enforced"], extra=["--policy", str(draft)])
    assert r.stdout.strip() == "200", r.stdout + r.stderr
    assert reached_mirror(net, "/echo?t=enforced") == 1


def test_public_ranges_in_the_policy_file_count_as_public_for_the_guard(net, tmp_path):
    """No --public-range on the command line: the policy file's top-level key alone."""
    ranges = [r for flag, r in zip(PUBLIC_RANGES, PUBLIC_RANGES[1:]) if flag == "--public-range"]
    audit = tmp_path / "audit.jsonl"
    results = {}
    for name, text in [("without", ""), ("with", f"public_ranges = {json.dumps(ranges)}\n")]:
        policy = tmp_path / f"{name}.toml"
        policy.write_text(text + '\n[[rule]]\nhost = "allowed.test"\naction = "allow"\n')
        cmd = gatewrap_cmd("run", "--audit-log", str(audit), "--resolver", net.dns_server, "--workdir", "/tmp",
                           "--policy", str(policy), "--", *CURL, "http://allowed.test/")
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=ROOT,
                           env=dict(os.environ, SUDO_UID=str(AGENT_UID), SUDO_GID=str(AGENT_UID)))
        results[name] = p.stdout.strip()
        if name == "without":
            assert "--public-range CIDR" in p.stderr, p.stderr
    assert results == {"without": "403", "with": "200"}


ASK = '[[rule]]\nhost = "mirror.test"\naction = "ask"\ntimeout = "60s"\n'


@pytest.mark.parametrize("allow_private,want", [
    (True, ("200", "sent")),
    (False, ("000", "cancelled")),
], ids=["with allow_private the approved tunnel is dialled", "without it the guard refuses and nothing is 'sent'"])
def test_an_approved_tunnel_to_an_ask_rule_is_dialled_under_its_allow_private(net, tmp_path, allow_private, want):
    from gatewrap._gate_core import ApprovalStore

    policy = tmp_path / "policy.toml"
    policy.write_text(ASK + ("allow_private = true\n" if allow_private else ""))
    state = f"sqlite:{tmp_path / 'state.db'}"
    audit = tmp_path / "audit.jsonl"
    cmd = gatewrap_cmd("run", "--audit-log", str(audit), "--resolver", net.dns_server, "--workdir", "/tmp",
                       *PUBLIC_RANGES, "--policy", str(policy), "--state", state, "--",
                       *CURL, "-p", f"http://mirror.test/echo?t=ask-{allow_private}")
    env = dict(os.environ, SUDO_UID=str(AGENT_UID), SUDO_GID=str(AGENT_UID))
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    store = ApprovalStore(state)
    end = time.monotonic() + 30
    while not (pending := store.list(status="pending")):
        assert time.monotonic() < end and proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    (a,) = pending
    assert (a["method"], a["url"]) == ("CONNECT", "mirror.test:80")
    store.decide(a["id"], version=a["version"], digest=a["digest"], verdict="approve", by="tester")
    out, err = proc.communicate(timeout=60)
    run = Run(proc.returncode, out, err, audit)
    assert (out.strip(), store.get(a["id"])["status"]) == want, out + err
    (rec,) = run.records(event="connect", approval=a["id"])
    if allow_private:
        assert (rec["decision"], rec["dst_ip"]) == ("allowed", MIRROR_IP)
        assert reached_mirror(net, "/echo?t=ask-True") == 1
    else:
        assert (rec["decision"], rec["reason"]) == ("denied", "ssrf: private address 10.20.30.40")
        assert store.get(a["id"])["reason"] == "not sent: ssrf: private address 10.20.30.40"
        assert run.records(event="approval_cancelled", approval=a["id"]), "the log says it was not sent"
        assert not run.records(event="approval_sent")
