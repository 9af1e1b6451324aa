"""Escape suite, the environment: nothing of gatewrap's environment reaches the agent unless
named (DESIGN.md contract 6; cli/gatewrap/sandbox/environment.py). The caller's secrets
(a token, a database password, gatewrap's own GATEWRAP_STATE), its sockets' addresses and
what changes how programs load (LD_PRELOAD, PYTHONPATH) are set in gatewrap's environment
and named nowhere: the agent finds none of them, in its environment nor in any
/proc/PID/environ it can read, in the jail and without it (and through the shared daemon,
with GATEWRAP_SHARED=1). What a local user may not name (gatewrap's own settings, the proxy
variables, a file only root can read) is refused before anything starts (125)."""

from __future__ import annotations

import json
import secrets

import pytest

from conftest import run_gatewrap

pytestmark = pytest.mark.kernel

#: The agent prints its environment and every /proc/PID/environ it can read.
AGENT = r"""
import json, os
seen = {}
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            seen[pid] = f.read().decode(errors="replace")
    except OSError as e:
        seen[pid] = e.strerror
print(json.dumps({"env": dict(os.environ), "proc_environ": seen}))
"""

#: A name no one sets, so that an environment handed in whole is told from one filtered
#: by a list of well-known secrets.
RANDOM_NAME = "GW_HOST_" + secrets.token_hex(4).upper()

#: (vector, variable, its value in gatewrap's environment); none is named.
HOST_VARIABLES = [
    ("a GitHub token", "GITHUB_TOKEN", "ghp_gwHostToken0123456789"),
    ("a PostgreSQL password", "PGPASSWORD", "gw-host-pg-password"),
    ("gatewrap's own GATEWRAP_STATE (may hold a database password)", "GATEWRAP_STATE", None),
    ("an AWS secret key", "AWS_SECRET_ACCESS_KEY", "gwHostAwsSecretKey/0123456789"),
    ("the ssh agent's socket", "SSH_AUTH_SOCK", "/tmp/ssh-gwhost/agent.4242"),
    ("a preloaded library", "LD_PRELOAD", "/nonexistent/gw-host-preload.so"),
    ("a Python module path", "PYTHONPATH", "/nonexistent/gw-host-pythonpath"),
    ("a proxy of the caller's", "HTTPS_PROXY", "http://gw-host-proxy.invalid:8080"),
    ("a variable of any other name", RANDOM_NAME, "gw-host-random-value"),
]
MODES = {"in the jail": [], "without the jail": ["--jail", "none"]}


@pytest.fixture(scope="module")
def host_runs(net, tmp_path_factory):
    """mode -> (the agent's report, the values gatewrap's environment had): one run per mode."""
    runs: dict[str, tuple[dict, dict]] = {}

    def _run(mode: str) -> tuple[dict, dict]:
        if mode not in runs:
            d = tmp_path_factory.mktemp("env")
            values = {name: value or f"sqlite:{d}/gw-host-state.db" for _, name, value in HOST_VARIABLES}
            r = run_gatewrap(net, d / "audit.jsonl", python=AGENT, extra=MODES[mode], unnamed=values, timeout=60)
            assert r.returncode == 0, r.stderr
            runs[mode] = (json.loads(r.stdout.splitlines()[-1]), values)
        return runs[mode]

    return _run


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", [n for _, n, _ in HOST_VARIABLES],
                         ids=[f"the caller's {v} ({n}) does not reach the agent" for v, n, _ in HOST_VARIABLES])
def test_the_callers_variables_do_not_reach_the_agent(host_runs, outcome, name, mode):
    report, values = host_runs(mode)
    env, value = report["env"], values[name]
    leaked = [f"/proc/{pid}/environ" for pid, text in report["proc_environ"].items() if value in text]
    if name == "PYTHONPATH":  # the Python shim's folder is gatewrap's, the only one
        got = env[name]
        assert got.split(":") == [got.split(":")[0]] and "gatewrap" in got, got
    elif name == "HTTPS_PROXY":  # the gate's, as in every run
        assert env[name] == "http://127.0.0.1:3128", env[name]
    else:
        assert name not in env, env
    assert not [k for k, v in env.items() if value in v], env
    outcome("default-deny environment (sandbox/environment.py)" + (", nsjail" if not MODES[mode] else ""),
            "absent" + (" (readable /proc/PID/environ too)" if not leaked else f"; but in {leaked}"),
            "OPEN" if leaked else "held")
    assert not leaked, leaked
    assert not [k for k in env if k.startswith("GATEWRAP_") and k not in ("GATEWRAP_GATE", "GATEWRAP_RUN", "GATEWRAP_AUDIT", "GATEWRAP_ALLOW")]


def test_the_agents_home_and_user_are_its_own_not_the_callers(host_runs):
    """HOME, USER and LOGNAME are the agent's user's (nobody here), not root's under sudo."""
    for mode in MODES:
        env = host_runs(mode)[0]["env"]
        assert (env["USER"], env["LOGNAME"], env["HOME"]) == ("nobody", "nobody", "/nonexistent"), (mode, env)


#: (vector, what the caller names, how gatewrap refuses it).
REFUSED = [
    ("naming gatewrap's GATEWRAP_STATE with --env", ["--env", "GATEWRAP_STATE"],
     "--env: GATEWRAP_STATE: gatewrap's own settings never reach the agent"),
    ("naming a GATEWRAP_ variable with a value", ["--env", "GATEWRAP_GATE=http://198.51.100.148:80"],
     "--env: GATEWRAP_GATE: gatewrap's own settings never reach the agent"),
    ("naming a proxy variable that points elsewhere", ["--env", "HTTP_PROXY=http://198.51.100.148:3128"],
     "--env: HTTP_PROXY: gatewrap sets HTTP_PROXY in every run"),
    ("naming GATEWRAP_STATE in an --env-file", ["--env-file", "{env_file}"],
     "{env_file}:2: GATEWRAP_STATE: gatewrap's own settings never reach the agent"),
    ("naming GATEWRAP_STATE in the policy's [sandbox] env", ["--policy", "{policy}"],
     "{policy}:3: [sandbox] env: GATEWRAP_STATE: gatewrap's own settings never reach the agent"),
    ("reading a root-only file into the agent with --env-file", ["--env-file", "{root_only}"],
     "--env-file {root_only}: Permission denied (read as nobody, who ran gatewrap)"),
]


@pytest.mark.parametrize("names,said", [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
def test_what_may_not_be_named_is_refused_before_the_run_starts(gatewrap, outcome, tmp_path, open_dir, names, said):
    env_file = open_dir / "agent.env"
    env_file.write_text("# for the agent\nGATEWRAP_STATE\n")
    root_only_file = open_dir / "root.env"  # root's, 0600, in a folder anyone can enter
    root_only_file.write_text("ROOT_SECRET=gw-root-only\n")
    root_only_file.chmod(0o600)
    policy = tmp_path / "policy.toml"
    policy.write_text('default = "deny"\n[sandbox]\nenv = ["GATEWRAP_STATE"]\n')
    fill = {"env_file": str(env_file), "policy": str(policy), "root_only": str(root_only_file)}
    r = gatewrap(["/bin/true"], extra=[n.format(**fill) for n in names],
                 unnamed={"GATEWRAP_STATE": f"sqlite:{tmp_path}/gw-host-state.db"})
    outcome("gatewrap run's plan (sandbox/environment.py)", f"exit {r.returncode}, nothing started",
            "held" if r.returncode == 125 else "OPEN")
    assert r.returncode == 125, r.stderr
    assert f"gatewrap: {said.format(**fill)}" in r.stderr
    assert "gw-root-only" not in r.stderr
    assert not [rec for rec in r.audit() if rec.get("event") == "run_start"]
