"""The agent's environment, from the table in ``agent_shims/env.toml``."""

from __future__ import annotations

import os
import shutil
import tempfile
import tomllib
from pathlib import Path

from . import client_trust

ENV_TABLE = Path(__file__).resolve().parent / "_shims" / "env.toml"


def env_table(table: str = "env") -> dict[str, str]:
    """The variables gatewrap sets, with ``{proxy}`` unexpanded (name -> template).

    ``table``: ``"env"`` (every run) or ``"env_inspect"`` (runs that TLS-inspect: the CA
    variables, with ``{bundle}`` and ``{ca}`` unexpanded).
    """
    with open(ENV_TABLE, "rb") as f:
        return dict(tomllib.load(f)[table])


def agent_env(base: dict[str, str], host: str, port: int) -> dict[str, str]:
    """Return the agent's environment: ``base`` (:mod:`gatewrap.sandbox.environment`'s,
    copied) with every variable of the table set. ``host``/``port``: the gate's listener in
    the sandbox (e.g. ``127.0.0.1``, 3128). ``base`` holds none of the table's names (naming
    one is refused: a proxy variable that points elsewhere would only fail at the kernel).
    """
    env = dict(base)
    fields = {"proxy": f"http://{host}:{port}", "host": host, "port": str(port)}
    _set_table(env, "env", fields)
    return env


def add_ca_env(env: dict[str, str], ca: str, bundle: str) -> list[str]:
    """Point every common client at the gate's CA (the ``env_inspect`` table): ``bundle``
    is the system roots plus the CA, ``ca`` the CA alone, as paths the agent sees. Returns
    the names of variables whose (different) value of the user's was replaced."""
    return _set_table(env, "env_inspect", {"bundle": bundle, "ca": ca})


def _set_table(env: dict[str, str], table: str, fields: dict[str, str]) -> list[str]:
    """Set every variable of ``table`` in ``env``, its template's ``{field}``s filled from
    ``fields``; returns the names whose (different) value of the user's was replaced."""
    overridden = []
    for name, template in env_table(table).items():
        value = template
        for field, text in fields.items():
            value = value.replace("{" + field + "}", text)
        if name in env and env[name] != value:
            overridden.append(name)
        env[name] = value
    return overridden


#: The system's roots, which the bundle the agent trusts starts with (Debian's
#: ca-certificates); the gate's CA follows them.
SYSTEM_ROOTS = "/etc/ssl/certs/ca-certificates.crt"
CA_FILE, BUNDLE_FILE = "ca.crt", "ca-bundle.crt"
#: Java's trust store (the JDK's roots and the CA) and wget's startup file, when staged.
TRUSTSTORE_FILE, WGETRC_FILE = "java-truststore.p12", client_trust.WGETRC_FILE


def stage_ca(staged: str, ca_cert: str) -> tuple[str, str]:
    """Write the gate's CA certificate and the bundle (system roots, then the CA) into the
    staged folder ``staged``, readable by anyone; returns their paths (ca, bundle)."""
    with open(ca_cert, "rb") as f:
        pem = f.read()
    try:
        with open(SYSTEM_ROOTS, "rb") as f:
            roots = f.read()
    except FileNotFoundError:
        roots = b""
    ca, bundle = os.path.join(staged, CA_FILE), os.path.join(staged, BUNDLE_FILE)
    for path, data in ((ca, pem), (bundle, roots.rstrip(b"\n") + b"\n" + pem if roots else pem)):
        with open(path, "wb") as f:
            f.write(data)
        os.chmod(path, 0o644)
    return ca, bundle


def staged_dir(run_id: str) -> str:
    """A fresh folder ``/run/gatewrap-staged/<run id>-<random>`` (mode 0755) for the run's
    staged files; removed after the run (and by gc after a crash).

    Not under /tmp: an agent whose working directory is /tmp would see every other run's
    staged files there, and each start's look for unix sockets in the view would read them."""
    os.makedirs(STAGED_ROOT, mode=0o755, exist_ok=True)
    d = tempfile.mkdtemp(prefix=f"{run_id}-", dir=STAGED_ROOT)
    os.chmod(d, 0o755)
    return d


#: How the shims' messages say to allow a host (``GATEWRAP_ALLOW``), by :attr:`gatewrap.runner.Plan.allow_hint`:
#: with gatewrap run's flag, or for a container's run (gatewrap-oci) with its annotation or
#: its runtime's flag (docs/guide/containers.md).
ALLOW_HOST = {"run": "gatewrap run --allow HOST",
              "container": "the container's annotation gatewrap.allow=HOST, or its runtime's --gatewrap-allow=HOST"}

#: The Python shim's folder in the package (``agent_shims/python``), and where the jail shows it.
PYTHON_SHIM = Path(__file__).resolve().parent / "_shims" / "python"
SHIMS_IN_JAIL = "/run/gatewrap-shims"
PYTHON_SHIM_IN_JAIL = f"{SHIMS_IN_JAIL}/python"
#: The Node shim's folder (``agent_shims/node``), and where the jail shows it.
NODE_SHIM = Path(__file__).resolve().parent / "_shims" / "node"
NODE_SHIM_IN_JAIL = f"{SHIMS_IN_JAIL}/node"
NODE_SHIM_FILE = "gatewrap-proxy.js"
#: The sandbox's resolv.conf (the DNS stub), shown by the jail as /etc/resolv.conf.
RESOLV_CONF = Path(__file__).resolve().parent / "_shims" / "resolv.conf"
#: The sandbox's /etc/hosts: loopback names only, whatever the host's file has (a
#: debootstrapped system's is empty; the host's other names are not the agent's to dial).
HOSTS = Path(__file__).resolve().parent / "_shims" / "hosts"


#: Where staged shims go: ``/run/gatewrap-staged/<run id>-<random>`` (gc removes a dead run's;
#: outside /run/gatewrap, which the agent sees empty: an agent without the jail reads them there).
STAGED_ROOT = "/run/gatewrap-staged"


def stage_shims(d: str) -> None:
    """Copy the shims, the sandbox's resolv.conf and hosts into the staged folder ``d`` (see
    :func:`staged_dir`), which any user can read: the agent's user may not reach the package
    (a virtualenv under /root, a clone in a 0700 home), nor may a root agent without the jail,
    which has no CAP_DAC_OVERRIDE."""
    for name, src in (("python", PYTHON_SHIM), ("node", NODE_SHIM)):
        shutil.copytree(src, os.path.join(d, name), ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(RESOLV_CONF, os.path.join(d, "resolv.conf"))
    shutil.copy(HOSTS, os.path.join(d, "hosts"))
    for root, dirs, files in os.walk(d):
        for name in dirs:
            os.chmod(os.path.join(root, name), 0o755)
        for name in files:
            os.chmod(os.path.join(root, name), 0o644)


def jail_mounts(d: str) -> list[tuple[str, str]]:
    """The (source, path in the jail) mounts of the staged folder ``d`` (filled by
    :func:`stage_shims`): the shims, /etc/resolv.conf, /etc/hosts, and the CA files of
    :func:`stage_ca` when they are there."""
    mounts = [(os.path.join(d, "python"), PYTHON_SHIM_IN_JAIL),
              (os.path.join(d, "node"), NODE_SHIM_IN_JAIL),
              (os.path.join(d, "resolv.conf"), "/etc/resolv.conf"),
              (os.path.join(d, "hosts"), "/etc/hosts")]
    for name in (CA_FILE, BUNDLE_FILE, TRUSTSTORE_FILE, WGETRC_FILE):
        if os.path.exists(os.path.join(d, name)):
            mounts.append((os.path.join(d, name), f"{SHIMS_IN_JAIL}/{name}"))
    return mounts


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


def stage_run(run_id: str, jailed: bool, ca_cert: str | None,
              env: dict[str, str]) -> tuple[str, list[tuple[str, str]], list[str], list[str]]:
    """Stage the run's files the agent reads: the shims (:func:`stage_shims`) and, when the
    run inspects TLS, the CA, the bundle, Java's trust store and wget's startup file, with
    the variables that point at them. Returns (the staged folder, the jail's mounts (none
    without the jail), the user's variables replaced, notes for stderr)."""
    staged = staged_dir(run_id)
    stage_shims(staged)
    overridden: list[str] = []
    notes: list[str] = []
    if ca_cert is not None:
        stage_ca(staged, ca_cert)

        def seen(name: str) -> str:
            return f"{SHIMS_IN_JAIL}/{name}" if jailed else os.path.join(staged, name)

        overridden = add_ca_env(env, seen(CA_FILE), seen(BUNDLE_FILE))
        notes = _stage_client_trust(staged, ca_cert, env, seen)
    return staged, jail_mounts(staged) if jailed else [], overridden, notes


def _stage_client_trust(staged: str, ca_cert: str, env: dict[str, str], seen) -> list[str]:
    """Java's trust store (copied from the CA folder's cache; JAVA_TOOL_OPTIONS extended) and
    wget's startup file (WGETRC) for a run that inspects TLS; the notes of
    :mod:`gatewrap.client_trust` for what could not be done."""
    notes = []
    store, note = client_trust.java_truststore(ca_cert)
    if store is not None:
        shutil.copyfile(store, os.path.join(staged, TRUSTSTORE_FILE))
        os.chmod(os.path.join(staged, TRUSTSTORE_FILE), 0o644)
        options = client_trust.java_options(seen(TRUSTSTORE_FILE))
        env["JAVA_TOOL_OPTIONS"] = f"{env['JAVA_TOOL_OPTIONS']} {options}" if env.get("JAVA_TOOL_OPTIONS") else options
    else:
        notes.append(note)
    stage, note = client_trust.wgetrc_needed(env)
    if stage:
        client_trust.write_wgetrc(staged, seen(BUNDLE_FILE))
        env["WGETRC"] = seen(WGETRC_FILE)
    elif note:
        notes.append(note)
    return notes
