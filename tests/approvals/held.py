"""A real run with a breakpoint, left holding: ``gatewrap run`` in the background (a real
sandbox, the real gate) whose agent POSTs to the fake internet under an ``ask`` rule, and
waits for a human. The tests then answer it through the CLI or the review page.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path

from conftest import AGENT_PYTHON, AGENT_UID, PUBLIC_RANGES, ROOT, gatewrap_cmd

#: The breakpoint: a POST to allowed.test/echo (the fake internet echoes the body it got).
POLICY = """\
version = 1
default = "deny"

[[rule]]
host = "allowed.test"
methods = ["POST"]
path = "/echo"
action = "ask"
timeout = "{timeout}"
"""

#: The agent: one POST with a credential the store must never hold, then the answer printed
#: as one JSON line {"status", "body"}.
AGENT = """\
import json, sys, urllib.error, urllib.request
req = urllib.request.Request("http://allowed.test/echo", data=sys.argv[1].encode(), method="POST",
                             headers={"Content-Type": "application/json", "Authorization": "Bearer sk-secret-1",
                                      "X-Trace": "t1"})
try:
    with urllib.request.urlopen(req, timeout=600) as r:
        print(json.dumps({"status": r.status, "body": r.read().decode()}), flush=True)
except urllib.error.HTTPError as e:
    print(json.dumps({"status": e.code, "body": e.read().decode()}), flush=True)
"""

BODY = '{"to": "all-customers@example.com", "subject": "prices"}'


@dataclass
class HeldRun:
    """``gatewrap run`` holding one request; :meth:`pending` waits for its approval."""

    proc: subprocess.Popen
    store: object
    audit: Path
    work: Path
    out: dict = field(default_factory=dict)

    def pending(self, timeout: float = 60, other_than: str | None = None) -> dict:
        """The run's pending approval, or its next one but ``other_than`` (an approval id);
        polls the store: a bound, not a timing assertion."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            items = [x for x in self.store.list(status="pending") if x["id"] != other_than]
            if items:
                return items[0]
            if self.proc.poll() is not None:
                raise AssertionError(f"the run ended before asking: {self.finish()}")
            time.sleep(0.1)
        raise AssertionError("no approval appeared")

    def finish(self, timeout: float = 120) -> dict:
        """Wait for the run to end; ``{"code", "agent" (its JSON line or None), "stderr"}``."""
        if not self.out:
            stdout, stderr = self.proc.communicate(timeout=timeout)
            line = next((ln for ln in stdout.splitlines() if ln.startswith("{")), None)
            self.out = {"code": self.proc.returncode, "agent": json.loads(line) if line else None,
                        "stdout": stdout, "stderr": stderr}
        return self.out

    def records(self, **eq) -> list[dict]:
        if not self.audit.exists():
            return []
        recs = [json.loads(ln) for ln in self.audit.read_text().splitlines() if ln.strip()]
        return [r for r in recs if all(r.get(k) == v for k, v in eq.items())]

    def stop(self) -> None:
        """End the run if it still holds (SIGTERM: gatewrap tears the sandbox down)."""
        shutil.rmtree(self.work, ignore_errors=True)
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.communicate()


def start(net, tmp_path: Path, store_url: str, *, body: str = BODY, timeout: str = "10m",
          extra: tuple[str, ...] = (), env: dict | None = None, agent: str = AGENT,
          agent_args: tuple[str, ...] | None = None) -> HeldRun:
    """Start the run (see the module's docstring) with its approvals in ``store_url``:
    ``agent`` (Python source) run with ``agent_args`` (default: ``body``)."""
    from gatewrap import _gate_core as core

    # the agent's user cannot enter pytest's 0700 tmp dirs: its files go to a folder it can read
    work = Path(tempfile.mkdtemp(prefix="gwt-appr-"))
    os.chmod(work, 0o755)
    (work / "policy.toml").write_text(POLICY.format(timeout=timeout))
    (work / "agent.py").write_text(textwrap.dedent(agent))
    for p in work.iterdir():
        os.chmod(p, 0o644)
    audit = tmp_path / "audit.jsonl"
    cmd = gatewrap_cmd("run", "--audit-log", str(audit), "--resolver", net.dns_server, "--workdir", "/tmp",
                       "--ro-bind", str(work), *PUBLIC_RANGES, "--policy", str(work / "policy.toml"),
                       "--state", store_url, *extra, "--", AGENT_PYTHON, str(work / "agent.py"),
                       *((body,) if agent_args is None else agent_args))
    e = dict(os.environ, SUDO_UID=str(AGENT_UID), SUDO_GID=str(AGENT_UID), **(env or {}))
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=e, cwd=ROOT)
    return HeldRun(proc, core.ApprovalStore(store_url), audit, work=work)


def cli(*args: str, env: dict | None = None, input: str | None = None) -> subprocess.CompletedProcess:
    """``gatewrap approvals ARGS`` as a human at a shell would run it (SUDO_USER=alice)."""
    e = dict(os.environ, SUDO_USER="alice", **(env or {}))
    return subprocess.run(gatewrap_cmd("approvals", *args), capture_output=True, text=True, env=e, cwd=ROOT,
                          input=input, timeout=60)
