"""The client matrix's fixtures: a fake internet with the package managers' sites, the
agent virtualenv, compiled programs, and the collection of results for the docs' matrix.

Each matrix test reports through the ``matrix`` fixture: ``matrix(client, case, observed)``.
At the end of a session in which matrix tests ran with ``--write-results``
(``scripts/client_matrix.py --run``; a plain test run writes nothing), ``tests/clients/results.json`` holds one
entry per test: ``{"client", "rank", "case", "tls", "observed", "test", "outcome"}`` (``rank``: the
client's row); ``case`` is
``allowed``, ``denied`` or ``unwrapped``; ``tls`` says how HTTPS crossed the gate
(``tunnel``: a CONNECT tunnel, the gate sees no plaintext; ``inspected``: TLS inspection,
test_matrix_inspected.py, where ``denied`` is a path the inspected tunnel denies);
``outcome`` is pytest's. Entries of tests that did not run this session
are kept. ``scripts/client_matrix.py`` renders the file as the matrix of docs/guide/clients.md.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from fakenet import FakeInternet

from . import programs, site_content

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results.json"
#: The interpreter of the Python clients (scripts/setup.sh makes it): Debian's python3 with
#: httpx, aiohttp and openai, readable by the agent's user.
AGENT_VENV = "/opt/gatewrap-test/agent-venv"

_entries: dict[str, dict] = {}


@pytest.fixture(scope="module")
def net():
    """The fake internet, with pypi.test, git.test, npm.test and api.openai.test on
    allowed.test's addresses, and their sites filled in."""
    addrs = ["198.51.100.138", "2001:db8:100::10"]
    with FakeInternet(extra_names={h: addrs for h in site_content.HOSTS}) as n:
        site_content.build_all(n.sites_dir)
        yield n


@pytest.fixture(scope="session")
def agent_python() -> str:
    """The agent virtualenv's python; fails (never skips) if scripts/setup.sh did not make it."""
    py = os.path.join(AGENT_VENV, "bin", "python")
    probe = subprocess.run([py, "-c", "import httpx, aiohttp, openai"], capture_output=True, text=True) \
        if os.path.exists(py) else None
    if probe is None or probe.returncode != 0:
        pytest.fail(f"the agent virtualenv {AGENT_VENV} (with httpx, aiohttp, openai) is missing or broken "
                    f"({probe.stderr.strip() if probe else 'no interpreter'}): run sudo scripts/setup.sh test-deps")
    return py


@pytest.fixture(scope="session")
def progs(tmp_path_factory) -> str:
    """A folder the agent's user can read with every client program: ``client_<name>.py``,
    ``client_<name>.js``, ``goget`` (go build), ``Get.class`` (javac), and ``truststore.p12`` is
    added by the ``java_truststore`` fixture."""
    d = tempfile.mkdtemp(prefix="gwt-clients-")
    os.chmod(d, 0o755)
    for name, code in programs.PYTHON.items():
        Path(d, f"client_{name}.py").write_text(code)
    for name, code in programs.NODE.items():
        Path(d, f"client_{name}.js").write_text(code)
    build = tmp_path_factory.mktemp("gobuild")
    Path(build, "get.go").write_text(programs.GO)
    genv = dict(os.environ, GOCACHE=str(build / "cache"), GOPATH=str(build / "gopath"), CGO_ENABLED="0",
                GO111MODULE="off", GOFLAGS="", GOTOOLCHAIN="local")
    go = shutil.which("go", path=f"{os.environ.get('PATH', '')}:/usr/local/go/bin")
    assert go, "no go on PATH or in /usr/local/go/bin: run sudo scripts/setup.sh test-deps"
    p = subprocess.run([go, "build", "-o", os.path.join(d, "goget"), "get.go"],
                       cwd=build, env=genv, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, f"go build failed: {p.stderr}"
    Path(d, "Get.java").write_text(programs.JAVA)
    p = subprocess.run(["/usr/bin/javac", "-d", d, os.path.join(d, "Get.java")], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, f"javac failed: {p.stderr}"
    for root, dirs, files in os.walk(d):
        for name in dirs:
            os.chmod(os.path.join(root, name), 0o755)
        for name in files:
            os.chmod(os.path.join(root, name), 0o755 if name == "goget" else 0o644)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def java_truststore(net, progs) -> str:
    """The fake internet's CA as a PKCS#12 truststore (Java 17 reads no PEM truststores)."""
    path = os.path.join(progs, "truststore.p12")
    if os.path.exists(path):
        os.remove(path)
    p = subprocess.run(["keytool", "-importcert", "-noprompt", "-alias", "fakenet", "-file", net.ca_path,
                        "-keystore", path, "-storetype", "PKCS12", "-storepass", "changeit"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, f"keytool failed: {p.stderr}"
    os.chmod(path, 0o644)
    return path


@pytest.fixture
def matrix(request):
    """``matrix(client, case, observed, rank, tls="tunnel")``: this test's cell of the matrix
    (``rank``: the client's row, from 0)."""
    entry = _entries.setdefault(request.node.nodeid, {})

    def _set(client: str, case: str, observed: str, rank: int, tls: str = "tunnel") -> None:
        entry.update(client=client, rank=rank, case=case, tls=tls, observed=observed)

    return _set


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    rep = (yield).get_result()
    entry = _entries.get(item.nodeid)
    if entry is None:
        return
    if rep.when == "call" or (rep.when != "call" and rep.failed):
        entry["outcome"] = "failed" if rep.failed else rep.outcome


def pytest_sessionfinish(session, exitstatus):
    """Merge this session's cells into results.json (one entry per test id), in collection
    order (so the clients come in the order the tests list them); entries of tests that did
    not run this session stay, after them. Only with ``--write-results``."""
    if not session.config.getoption("write_results"):
        return
    ran = {nodeid: e for nodeid, e in _entries.items() if "client" in e and "outcome" in e}
    if not ran:
        return
    try:
        earlier = [e for e in json.loads(RESULTS.read_text()) if e.get("test") not in ran]
    except (OSError, ValueError, TypeError):
        earlier = []
    order = [i.nodeid for i in session.items if i.nodeid in ran]
    fresh = [{**ran[nodeid], "test": nodeid} for nodeid in order]
    RESULTS.write_text(json.dumps(fresh + earlier, indent=1) + "\n")
