"""``gatewrap reload RUN`` and SIGHUP: a running agent's next requests are decided by the policy
file read again; a file that does not parse leaves the old policy in force and says why; each
reload is one ``policy_reload`` record. Real sandbox, real gate, the fake internet; in both
modes (GATEWRAP_SHARED=1: the run is the daemon's and the reload goes through its socket)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from conftest import AGENT_UID, PUBLIC_RANGES, ROOT, gatewrap_cmd

pytestmark = pytest.mark.kernel

ALLOW = 'default = "deny"\n\n[[rule]]\nhost = "allowed.test"\naction = "allow"\n'
DENY = 'default = "deny"\n'
BROKEN = 'default = "deny"\n\n[[rule]]\nhost = "allowed.test"\nacton = "allow"\n'


class Agent:
    """A run whose agent fetches http://allowed.test/STEP each time the test says ``go STEP``."""

    def __init__(self, net, tmp_path: Path, steps: list[str]):
        self.steps = steps
        self.dir = Path(tempfile.mkdtemp(prefix="gwt-reload-"))
        os.chmod(self.dir, 0o755)
        self.policy = self.dir / "policy.toml"
        self.write_policy(ALLOW)
        self.audit = tmp_path / "audit.jsonl"
        script = " ; ".join(
            f"while [ ! -e {self.dir}/go-{s} ]; do sleep 0.05; done; "
            f"curl -sS --max-time 20 -o /dev/null -w '{s}=%{{http_code}}\\n' http://allowed.test/echo?t={s}" for s in steps)
        cmd = gatewrap_cmd("run", "--audit-log", str(self.audit), "--resolver", net.dns_server, "--workdir", "/tmp",
                           "--ro-bind", str(self.dir), *PUBLIC_RANGES, "--policy", str(self.policy),
                           "--", "/bin/sh", "-c", script)
        env = dict(os.environ, SUDO_UID=str(AGENT_UID), SUDO_GID=str(AGENT_UID))
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)

    def write_policy(self, text: str) -> None:
        self.policy.write_text(text)
        self.policy.chmod(0o644)

    def records(self, event: str) -> list[dict]:
        if not self.audit.exists():
            return []
        return [r for r in map(json.loads, self.audit.read_text().splitlines()) if r.get("event") == event]

    def run_id(self) -> str:
        end = time.monotonic() + 30
        while not self.records("run_start"):
            assert time.monotonic() < end and self.proc.poll() is None, self.proc.communicate()
            time.sleep(0.05)
        return self.records("run_start")[0]["run"]

    def go(self, step: str) -> None:
        """Let the agent fetch ``step`` and wait for its record."""
        (self.dir / f"go-{step}").touch()
        end = time.monotonic() + 30
        while not [r for r in self.records("request") if r.get("target", "").endswith(f"t={step}")]:
            assert time.monotonic() < end and self.proc.poll() is None, self.proc.communicate()
            time.sleep(0.05)

    def finish(self) -> tuple[str, str]:
        for s in self.steps:  # a test that failed half-way: the agent runs to its end
            (self.dir / f"go-{s}").touch()
        out, err = self.proc.communicate(timeout=60)
        shutil.rmtree(self.dir, ignore_errors=True)
        return out, err


def reload(run_id: str) -> subprocess.CompletedProcess:
    return subprocess.run(gatewrap_cmd("reload", run_id), capture_output=True, text=True, timeout=60, cwd=ROOT)


def test_reload_puts_the_new_file_in_force_and_a_broken_one_leaves_the_old(net, tmp_path):
    a = Agent(net, tmp_path, ["r1", "r2", "r3"])
    try:
        run_id = a.run_id()
        a.go("r1")
        a.write_policy(BROKEN)
        p = reload(run_id)
        assert p.returncode == 1, p.stdout + p.stderr
        assert "policy.toml:5: unknown key `acton`; did you mean `action`?" in p.stderr, p.stderr
        assert "the policy in force is unchanged" in p.stderr
        a.go("r2")
        a.write_policy(DENY)
        p = reload(run_id)
        assert p.returncode == 0, p.stdout + p.stderr
        assert p.stdout.startswith(f"gatewrap: reloaded {run_id}'s policy from {a.policy}"), p.stdout
        a.go("r3")
    finally:
        out, err = a.finish()
    assert out.split() == ["r1=200", "r2=200", "r3=403"], out + err
    failed, done = a.records("policy_reload")
    assert (failed["result"], done["result"]) == ("failed", "reloaded")
    assert failed["error"].endswith("unknown key `acton`; did you mean `action`?"), failed
    assert failed["old_digest"] == done["old_digest"], "the broken file was never in force"
    assert done["new_digest"] != done["old_digest"]
    assert "policy not reloaded, the one in force stays" in err and "policy reloaded from" in err, err


def test_reload_takes_a_unique_start_of_a_live_runs_id_and_says_the_whole_id(net, tmp_path):
    """As ``gatewrap stop`` does: the start of one live run's id, with or without ``gw-``."""
    a = Agent(net, tmp_path, ["s1"])
    try:
        run_id = a.run_id()
        a.write_policy(DENY)
        p = reload(run_id[3:10])
        assert p.returncode == 0, p.stdout + p.stderr
        assert p.stdout.startswith(f"gatewrap: reloaded {run_id}'s policy from {a.policy}"), p.stdout
        a.go("s1")
    finally:
        out, err = a.finish()
    assert out.split() == ["s1=403"], out + err


@pytest.mark.own_process  # SIGHUP reloads a run's own gatewrap; a shared run's client forwards it to the agent
def test_sighup_to_a_runs_own_gatewrap_reloads_its_policy(net, tmp_path):
    a = Agent(net, tmp_path, ["h1", "h2"])
    try:
        a.run_id()
        a.go("h1")
        a.write_policy(DENY)
        a.proc.send_signal(signal.SIGHUP)
        end = time.monotonic() + 30
        while not a.records("policy_reload"):
            assert time.monotonic() < end, "no policy_reload record after SIGHUP"
            time.sleep(0.05)
        a.go("h2")
    finally:
        out, err = a.finish()
    assert (a.proc.returncode, out.split()) == (0, ["h1=200", "h2=403"]), out + err
    (rec,) = a.records("policy_reload")
    assert rec["result"] == "reloaded"


def test_reload_of_a_run_without_a_policy_file_says_so(net, tmp_path):
    audit = tmp_path / "audit.jsonl"
    d = Path(tempfile.mkdtemp(prefix="gwt-reload-"))
    os.chmod(d, 0o755)
    cmd = gatewrap_cmd("run", "--audit-log", str(audit), "--resolver", net.dns_server, "--workdir", "/tmp",
                       "--ro-bind", str(d), "--allow", "allowed.test", "--", "/bin/sh", "-c",
                       f"while [ ! -e {d}/go ]; do sleep 0.05; done")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                            env=dict(os.environ, SUDO_UID=str(AGENT_UID), SUDO_GID=str(AGENT_UID)))
    try:
        end = time.monotonic() + 30
        while not (audit.exists() and '"run_start"' in audit.read_text()):
            assert time.monotonic() < end and proc.poll() is None, proc.communicate()
            time.sleep(0.05)
        run_id = next(r["run"] for r in map(json.loads, audit.read_text().splitlines()) if r["event"] == "run_start")
        p = reload(run_id)
        assert p.returncode == 1 and "has no --policy file to read again" in p.stderr, p.stderr
        (rec,) = [r for r in map(json.loads, audit.read_text().splitlines()) if r["event"] == "policy_reload"]
        assert (rec["result"], rec.get("policy_file")) == ("failed", None), rec
    finally:
        (d / "go").touch()
        proc.communicate(timeout=60)
        shutil.rmtree(d, ignore_errors=True)
