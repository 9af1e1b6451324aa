"""`gatewrap policy suggest`: a report-mode run becomes a draft policy that lets the same agent
run in enforce mode, and denies what the run did not reach."""

from __future__ import annotations

import subprocess
import textwrap

import pytest

from conftest import AGENT_PYTHON, ROOT, gatewrap_cmd

pytestmark = pytest.mark.kernel

AGENT = """
    import sys, requests
    for url in sys.argv[1:] or ("http://allowed.test/", "https://other.allowed.test/"):
        r = requests.get(url, timeout=10)
        print(url, r.status_code, r.text.strip())
"""


def gw(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(gatewrap_cmd(*args), capture_output=True, text=True, timeout=60, cwd=ROOT)


def test_a_report_mode_run_suggests_a_policy_the_agent_then_runs_under(gatewrap, tmp_path):
    report = tmp_path / "report.toml"
    report.write_text('mode = "report"\n')
    first = gatewrap(python=AGENT, extra=["--policy", str(report)])
    assert first.returncode == 0, first.stderr
    assert [r.get("would") for r in first.records(event="request") + first.records(event="connect")] == ["deny"] * 2

    s = gw("policy", "suggest", "--run", first.run_id, "--log", str(first.audit_path))
    assert s.returncode == 0, s.stderr
    assert 'default = "deny"' in s.stdout and 'mode = "enforce"' in s.stdout
    assert '# allowed.test: covers 1 request (GET 1)' in s.stdout
    assert 'host = "allowed.test"\nports = [80]' in s.stdout
    assert 'host = "other.allowed.test"\nports = [443]' in s.stdout
    suggested = tmp_path / "suggested.toml"
    suggested.write_text(s.stdout)
    check = gw("policy", "check", str(suggested))
    assert (check.returncode, check.stderr) == (0, ""), check.stdout + check.stderr

    second = gatewrap(python=AGENT, extra=["--policy", str(suggested)])
    assert second.returncode == 0, second.stderr
    assert second.stdout.splitlines() == [
        "http://allowed.test/ 200 hello from allowed.test over http",
        "https://other.allowed.test/ 200 hello from other.allowed.test over https"]
    assert all(r["decision"] == "allowed" and "would" not in r
               for r in second.records(event="request") + second.records(event="connect"))

    third = gatewrap([AGENT_PYTHON, "-c", textwrap.dedent(AGENT), "http://denied.test/"],
                     extra=["--policy", str(suggested)])
    assert third.stdout.startswith("http://denied.test/ 403"), third.stdout + third.stderr
    (rec,) = third.records(event="request")
    assert (rec["decision"], rec["reason"]) == ("denied", "policy: default deny")
