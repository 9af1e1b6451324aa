"""`gatewrap approvals` on a real held request (a real sandbox and gate, the fake internet as
upstream), the same tests on SQLite and PostgreSQL: approve, reject, edit, stale decisions,
--json, history after the run, the run's summary."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from conftest import ROOT, gatewrap_cmd

from . import held
from .held import cli

pytestmark = pytest.mark.kernel


def _ps_pending(run_id: str, until: int, wait: float = 30) -> int:
    """``pending_approvals`` of ``run_id`` in ``gatewrap ps --json``, polled until it is
    ``until`` (its audit record may follow the store's row by a moment; a bound, not a timing
    assertion)."""
    end = time.monotonic() + wait
    while True:
        ps = subprocess.run(gatewrap_cmd("ps", "--json"), capture_output=True, text=True, timeout=60, cwd=ROOT)
        (live,) = [r for r in json.loads(ps.stdout) if r["run"] == run_id]
        if live["pending_approvals"] == until or time.monotonic() > end:
            return live["pending_approvals"]
        time.sleep(0.2)


@pytest.fixture
def run(net, tmp_path, store_url):
    net.clear_logs()  # one fake internet per module: only this test's requests count
    r = held.start(net, tmp_path, store_url)
    yield r
    r.stop()


def test_approve_sends_the_request_once_and_the_agent_gets_the_answer(run, store_url, net):
    a = run.pending()
    assert net.access_entries(method="POST", path="/echo") == []  # nothing upstream before the yes
    assert _ps_pending(a["run_id"], until=1) == 1, "gatewrap ps counts the held approval"
    listed = cli("list", "--state", store_url)
    assert listed.returncode == 0 and a["id"] in listed.stdout and "POST http://allowed.test/echo" in listed.stdout
    shown = cli("show", a["id"], "--state", store_url)
    assert shown.returncode == 0, shown.stderr
    assert "  POST /echo HTTP/1.1\n" in shown.stdout and "  host: allowed.test\n" in shown.stdout.lower()
    assert "authorization: [redacted]" in shown.stdout.lower() and "sk-secret-1" not in shown.stdout
    assert '"to": "all-customers@example.com"' in shown.stdout
    ok = cli("approve", a["id"], "--yes", "--state", store_url)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith(f"gatewrap: approved {a['id']}")
    out = run.finish()
    assert out["code"] == 0, out["stderr"]
    assert out["agent"]["status"] == 200
    echoed = json.loads(out["agent"]["body"])
    headers = {k.lower(): v for k, v in echoed["headers"].items()}
    assert echoed["body"] == held.BODY and headers["authorization"] == "Bearer sk-secret-1"
    assert len(net.access_entries(method="POST", path="/echo")) == 1
    after = run.store.get(a["id"])
    assert (after["status"], after["decided_by"]) == ("sent", "alice")
    assert "1 approval asked (1 approved), 0 answered by grants" in out["stderr"]


def test_reject_gives_the_agent_403_with_the_reason_and_sends_nothing(run, store_url, net):
    a = run.pending()
    r = cli("reject", a["id"], "--reason", "not to all customers", "--yes", "--state", store_url)
    assert r.returncode == 0, r.stderr
    out = run.finish()
    assert out["agent"]["status"] == 403 and "not to all customers" in out["agent"]["body"]
    assert net.access_entries(method="POST", path="/echo") == []
    assert run.store.get(a["id"])["status"] == "rejected"


def test_edit_changes_the_body_show_prints_the_diff_and_upstream_gets_the_edit(run, store_url, net):
    a = run.pending()
    editor = {"EDITOR": "sed -i -e s/all-customers@/pricing-team@/ -e s/^x-trace:.*/x-trace:\\ reviewed/I"}
    r = cli("edit", a["id"], "--state", store_url, env=editor)
    assert r.returncode == 0, r.stderr
    assert '-{"to": "all-customers@example.com", "subject": "prices"}' in r.stdout
    assert '+{"to": "pricing-team@example.com", "subject": "prices"}' in r.stdout
    assert "-x-trace: t1" in r.stdout.lower() and "+x-trace: reviewed" in r.stdout.lower()
    shown = cli("show", a["id"], "--state", store_url, "--json")
    doc = json.loads(shown.stdout)
    assert doc["edited"] and doc["version"] == a["version"] + 1 and doc["digest"] != a["digest"]
    assert '+{"to": "pricing-team@example.com", "subject": "prices"}' in doc["diff"]
    # a decision on what was shown before the edit is stale
    stale = cli("approve", a["id"], "--version", str(a["version"]), "--digest", a["digest"], "--state", store_url)
    assert stale.returncode == 1 and "refused as stale" in stale.stderr, stale.stderr
    ok = cli("approve", a["id"], "--version", str(doc["version"]), "--digest", doc["digest"], "--state", store_url)
    assert ok.returncode == 0, ok.stderr
    out = run.finish()
    echoed = json.loads(out["agent"]["body"])
    assert echoed["body"] == '{"to": "pricing-team@example.com", "subject": "prices"}'
    headers = {k.lower(): v for k, v in echoed["headers"].items()}
    assert headers["x-trace"] == "reviewed"
    assert headers["authorization"] == "Bearer sk-secret-1"  # the original credential is sent


def test_a_second_decision_is_refused_as_stale_and_names_who_answered(run, store_url):
    a = run.pending()
    assert cli("approve", a["id"], "--yes", "--state", store_url).returncode == 0
    again = cli("reject", a["id"], "--reason", "too late", "--yes", "--state", store_url, "--json",
                "--version", str(a["version"]), "--digest", a["digest"])
    assert again.returncode == 1
    doc = json.loads(again.stdout)
    assert doc["ok"] is False and doc["why"] in ("decided", "edited")
    assert "alice" in doc["error"]
    assert run.finish()["agent"]["status"] == 200


def test_a_decision_on_an_ended_run_is_refused_and_history_stays_listed(run, store_url, net):
    a = run.pending()
    run.stop()
    r = cli("approve", a["id"], "--yes", "--state", store_url)
    assert r.returncode == 1 and "refused" in r.stderr, r.stderr
    assert net.access_entries(method="POST", path="/echo") == []
    listed = json.loads(cli("list", "--state", store_url, "--json").stdout)["approvals"]
    assert [(x["id"], x["status"]) for x in listed] == [(a["id"], "cancelled")]
    assert "token" not in listed[0] and "body" not in listed[0]


@pytest.mark.own_process
def test_a_decision_after_gatewrap_was_killed_is_refused_and_nothing_is_sent(run, store_url, net):
    a = run.pending()
    run.proc.kill()  # SIGKILL: gatewrap cannot end its run in the store
    run.proc.communicate(timeout=30)
    assert run.store.get(a["id"])["status"] == "pending"
    r = cli("approve", a["id"], "--yes", "--state", store_url, "--json")
    assert r.returncode == 1, r.stdout + r.stderr
    assert json.loads(r.stdout)["why"] == "run ended"
    assert run.store.get(a["id"])["status"] == "cancelled"
    assert net.access_entries(method="POST", path="/echo") == []
    # What the killed gatewrap left (its sandbox, without egress) is gc's to remove, and only
    # gc's: a run of the session daemon starts no gc, so a test's leftover would outlive it.
    g = subprocess.run(gatewrap_cmd("gc", "--json"), capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert g.returncode == 0 and a["run_id"] in json.loads(g.stdout)["runs"], g.stdout + g.stderr


def test_unknown_ids_exit_1_and_an_unopenable_store_exits_125(store_url, store, tmp_path):
    r = cli("show", "ap-aaaaaaaaaaaaaaaaaaaa", "--state", store_url)
    assert r.returncode == 1 and "no approval ap-aaaaaaaaaaaaaaaaaaaa" in r.stderr
    (tmp_path / "file").write_text("")
    bad = cli("list", "--state", f"sqlite:{tmp_path}/file/state.db")
    assert bad.returncode == 125
