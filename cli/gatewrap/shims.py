"""The agent's environment, from the table in ``agent_shims/env.toml``."""

from __future__ import annotations

import os
import shutil
import tempfile
import tomllib
from pathlib import Path

ENV_TABLE = Path(__file__).resolve().parent / "_shims" / "env.toml"


def env_table() -> dict[str, str]:
    """The variables gatewrap sets, with ``{proxy}`` unexpanded (name -> template)."""
    with open(ENV_TABLE, "rb") as f:
        return dict(tomllib.load(f)["env"])


def agent_env(base: dict[str, str], host: str, port: int) -> tuple[dict[str, str], list[str]]:
    """Return (the agent's environment, names of user variables that were overridden).

    ``base`` is copied; every variable of the table replaces the user's value, since a
    proxy variable that points elsewhere would only make the agent fail at the kernel.
    ``host``/``port``: the gate's listener in the sandbox (e.g. ``127.0.0.1``, 3128).
    """
    env = dict(base)
    overridden = []
    proxy_url = f"http://{host}:{port}"
    for name, template in env_table().items():
        value = template.replace("{proxy}", proxy_url).replace("{host}", host).replace("{port}", str(port))
        if name in env and env[name] != value:
            overridden.append(name)
        env[name] = value
    return env, overridden


#: The Python shim's folder in the package (``agent_shims/python``), and where the jail shows it.
PYTHON_SHIM = Path(__file__).resolve().parent / "_shims" / "python"
PYTHON_SHIM_IN_JAIL = "/run/gatewrap-shims/python"
#: The Node shim's folder (``agent_shims/node``), and where the jail shows it.
NODE_SHIM = Path(__file__).resolve().parent / "_shims" / "node"
NODE_SHIM_IN_JAIL = "/run/gatewrap-shims/node"
NODE_SHIM_FILE = "gatewrap-proxy.js"
#: The sandbox's resolv.conf (the DNS stub), shown by the jail as /etc/resolv.conf.
RESOLV_CONF = Path(__file__).resolve().parent / "_shims" / "resolv.conf"


#: Where staged shims go: ``/tmp/gatewrap-shims-<run id>-<random>`` (gc removes a dead run's).
STAGED_PREFIX = "gatewrap-shims-"


def staged_for_jail(run_id: str) -> tuple[str, list[tuple[str, str]]]:
    """Copy the shims to a fresh folder under /tmp that any user can read (nsjail runs as the
    agent's user, who may not reach the package, e.g. a virtualenv under /root); returns
    (the folder, to remove after the run; the (source, path in the jail) mounts)."""
    d = tempfile.mkdtemp(prefix=f"{STAGED_PREFIX}{run_id}-")
    os.chmod(d, 0o755)
    for name, src in (("python", PYTHON_SHIM), ("node", NODE_SHIM)):
        shutil.copytree(src, os.path.join(d, name), ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(RESOLV_CONF, os.path.join(d, "resolv.conf"))
    for root, dirs, files in os.walk(d):
        for name in dirs:
            os.chmod(os.path.join(root, name), 0o755)
        for name in files:
            os.chmod(os.path.join(root, name), 0o644)
    return d, [(os.path.join(d, "python"), PYTHON_SHIM_IN_JAIL),
               (os.path.join(d, "node"), NODE_SHIM_IN_JAIL),
               (os.path.join(d, "resolv.conf"), "/etc/resolv.conf")]


def add_python_shim(env: dict[str, str], shim_dir: str, gate_url: str, run_id: str) -> None:
    """Put the Python shim first on the agent's PYTHONPATH (its ``sitecustomize`` chains to
    any other), and tell it the gate's URL and the run id for its messages."""
    env["PYTHONPATH"] = shim_dir + (f":{env['PYTHONPATH']}" if env.get("PYTHONPATH") else "")
    env["GATEWRAP_GATE"] = gate_url
    env["GATEWRAP_RUN"] = run_id


def add_node_shim(env: dict[str, str], shim_dir: str) -> None:
    """Preload the Node shim (``--require``, appended to the agent's own NODE_OPTIONS), which
    routes fetch and http/https through the gate on Node versions that ignore the proxy
    variables (Node's ``NODE_OPTIONS`` quoting: a path with spaces is double-quoted)."""
    path = os.path.join(shim_dir, NODE_SHIM_FILE)
    arg = f'--require "{path}"' if " " in path else f"--require {path}"
    env["NODE_OPTIONS"] = f"{env['NODE_OPTIONS']} {arg}" if env.get("NODE_OPTIONS") else arg
