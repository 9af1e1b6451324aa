"""The escape suite's fixtures, and the collection of its results for the docs' table.

Each test reports what it observed through the ``outcome`` fixture:
``outcome(layer, observed, verdict="held")``. At the end of a session in which escape
tests ran with ``--write-results`` (``scripts/escape_table.py --run``; a plain test run
writes nothing), ``tests/escape/results.json`` gets one entry per test, in collection order:
``{"vector", "layer", "observed", "verdict", "test", "outcome"}`` where ``verdict`` is
``held`` (refused at the syscall, nothing reached the fake internet), ``OPEN`` (it got
out, or reached something outside the sandbox) or ``hang`` (nothing got out, but the call
hung instead of failing), and ``outcome`` is pytest's (passed, failed, xfailed, xpassed).
``scripts/escape_table.py`` turns the file into the table of docs/security.md.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results.json"

#: The table's order: the network vectors, then tampering, then what of the host reaches the
#: agent (environment, secrets) and what the agent leaves behind (protected paths) or shows the
#: human (the review page), then processes and lifetime, the host's resources, then the gate's
#: own faults (audit log, listeners), and last containers run by gatewrap-oci.
MODULE_ORDER = ["test_network.py", "test_dual_stack.py", "test_ssrf_named.py", "test_tamper.py", "test_environment.py", "test_secrets.py",
                "test_protected.py", "test_review_page.py", "test_lifecycle.py",
                "test_bounds.py", "test_audit_flood.py",
                "test_audit_failclosed.py", "test_containers.py", "test_container_runs.py"]

_entries: dict[str, dict] = {}


def _vector_of(item) -> str:
    cs = getattr(item, "callspec", None)
    if cs is not None and cs.id:
        return cs.id
    doc = (item.function.__doc__ or "").strip().splitlines()
    return doc[0].rstrip(".") if doc else item.name


@pytest.fixture
def outcome(request):
    """``outcome(layer, observed, verdict="held")``: what this vector met, for the table."""
    entry = _entries.setdefault(request.node.nodeid, {"vector": _vector_of(request.node)})

    def _set(layer: str, observed: str, verdict: str = "held") -> None:
        assert verdict in ("held", "OPEN", "hang"), verdict
        entry.update(layer=layer, observed=observed, verdict=verdict)

    return _set


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    rep = (yield).get_result()
    if not item.nodeid.startswith(_prefix(item)):
        return
    entry = _entries.setdefault(item.nodeid, {"vector": _vector_of(item)})
    if rep.when == "call" or (rep.when == "setup" and not rep.passed):
        if hasattr(rep, "wasxfail"):
            entry["outcome"] = "xpassed" if rep.passed else "xfailed"
        else:
            entry["outcome"] = "failed" if rep.outcome == "failed" else rep.outcome
    elif rep.when == "teardown" and rep.failed:
        entry["outcome"] = "failed"


def _prefix(item) -> str:
    root = Path(str(item.config.rootpath))
    try:
        return str(HERE.relative_to(root)) + "/"
    except ValueError:
        return str(HERE) + "/"


def pytest_sessionfinish(session, exitstatus):
    """Write results.json: this session's entries, in collection order, then (for a partial
    run, e.g. ``-k``) the earlier entries of tests that still exist and did not run. Only with
    ``--write-results``: a test run leaves the tracked file alone."""
    if not session.config.getoption("write_results"):
        return
    ran = [i for i in session.items if "outcome" in getattr(i, "fixturenames", ())
           and "outcome" in _entries.get(i.nodeid, {})]
    if not ran:
        return
    ran.sort(key=lambda i: MODULE_ORDER.index(i.nodeid.split("::")[0].rsplit("/", 1)[-1])
             if i.nodeid.split("::")[0].rsplit("/", 1)[-1] in MODULE_ORDER else len(MODULE_ORDER))
    out = []
    for item in ran:
        e = _entries[item.nodeid]
        out.append({
            "vector": e["vector"],
            "layer": e.get("layer", "?"),
            "observed": e.get("observed", "test failed before it observed the attempt"),
            "verdict": e.get("verdict", "FAILED"),
            "test": item.nodeid,
            "outcome": e["outcome"],
        })
    done = {e["test"] for e in out}
    known = {i.nodeid for i in session.items} | _deselected
    modules = {n.split("::", 1)[0] for n in known}
    root = Path(str(session.config.rootpath))
    try:
        earlier = json.loads(RESULTS.read_text())
    except (OSError, ValueError):
        earlier = []
    for e in earlier:
        test = e.get("test", "")
        module = test.split("::", 1)[0]
        # Keep what this session did not run but that still exists: deselected tests, and
        # tests of modules this session did not collect.
        if test not in done and (root / module).exists() and (test in known or module not in modules):
            out.append(e)
    RESULTS.write_text(json.dumps(out, indent=1) + "\n")


_deselected: set[str] = set()


def pytest_deselected(items):
    _deselected.update(i.nodeid for i in items)


@pytest.fixture(scope="session")
def agent_dir():
    """A directory the agent's user can read and execute (the pytest tmp dirs are 0700);
    used as the agent's working directory for the compiled probe."""
    d = tempfile.mkdtemp(prefix="gw-escape-")
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="session")
def probe(tmp_path_factory, agent_dir) -> str:
    """``escape_probe.c`` (io_uring with raw syscalls, sendmmsg) compiled with ``cc``."""
    build = tmp_path_factory.mktemp("probe-build")
    exe = build / "escape_probe"
    p = subprocess.run(["cc", "-O2", "-Wall", "-Werror", "-o", str(exe), str(HERE / "escape_probe.c")],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, f"cc failed: {p.stderr}"
    dst = os.path.join(agent_dir, "escape_probe")
    shutil.copy(exe, dst)
    os.chmod(dst, 0o755)
    return dst


@pytest.fixture
def quiet_net(net):
    """The fake internet with empty logs; the test asserts they stay empty."""
    net.clear_logs()
    yield net

