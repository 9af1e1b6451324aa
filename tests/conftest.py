"""Shared fixtures: the fake internet, and a helper that runs ``gatewrap run`` for real.

Kernel tests (marker ``kernel``) need root, cgroup v2, BPF and netns. They must run: a
skipped kernel test is reported as a failure, so CI cannot pass without them.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

from fakenet import AddressConflict, FakeInternet, cleanup_leftovers, hold_host_lock

ROOT = Path(__file__).resolve().parent.parent
#: The agents of the tests run as this user (as if `sudo` had been run by it).
AGENT_UID = 65534
#: The fake internet's servers live in documentation ranges, which the SSRF guard does not
#: count as public unless told (the documented --public-range setting, no test-only path).
PUBLIC_RANGES = ("--public-range", "198.51.100.128/25", "--public-range", "2001:db8:100::/48")
#: Debian's interpreter: readable by the agent's user, with python3-requests.
AGENT_PYTHON = "/usr/bin/python3"


# The suite runs as root, as if started by root itself, however it was started:
# - `sudo` (scripts/setup.sh test from a user) puts the user's SUDO_UID/SUDO_GID in the
#   environment, which gatewrap takes for the agent's user; tests that want one set it.
# - A shell without job control (`cmd &` in a script) starts its background commands with
#   SIGINT ignored, which exec keeps (signal(7)): the Ctrl-C the tests send to a follower or
#   a shipper would then be ignored. A handler (reset to the default on exec) restores it.
for _var in ("SUDO_UID", "SUDO_GID", "SUDO_USER", "SUDO_COMMAND"):
    os.environ.pop(_var, None)
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_addoption(parser):
    parser.addoption(
        "--write-results", action="store_true",
        help="write tests/escape/results.json and tests/clients/results.json, the docs' generated tables' "
             "sources (scripts/escape_table.py --run and scripts/client_matrix.py --run pass it); "
             "without it a test run leaves the work tree as it was")


#: The audit record's schema, the source of truth for its fields (compiled once).
AUDIT_SCHEMA = Draft202012Validator(json.loads((ROOT / "schema" / "audit.schema.json").read_text()),
                                    format_checker=Draft202012Validator.FORMAT_CHECKER)
#: Every audit log a gatewrap command of this session was given (``--audit-log``), and how
#: many of its bytes were checked against :data:`AUDIT_SCHEMA` already.
_AUDIT_LOGS: dict[Path, int] = {}
#: The event of records a test writes itself into a gatewrap run's log (to fill a disk):
#: not gatewrap's, so not checked.
TEST_FILLER = "test_filler"


def invalid_audit_records(path: Path, start: int = 0) -> tuple[list[str], int]:
    """The records of ``path`` from byte ``start`` on that break the schema, as
    ``file:line: error`` lines, and the offset of the end of its last complete line."""
    errors: list[str] = []
    try:
        # never blocking, never followed: tests plant FIFOs and links where a log should be
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return errors, start
    with open(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return errors, start
        if st.st_size < start:  # cut back or replaced: read it again
            start = 0
        before = f.read(start).count(b"\n")
        data = f.read()
    end = data.rfind(b"\n") + 1
    for n, raw in enumerate(data[:end].splitlines(), start=before + 1):
        try:
            rec = json.loads(raw)
        except ValueError as e:
            errors.append(f"{path}:{n}: not JSON ({e}): {raw[:200]!r}")
            continue
        if isinstance(rec, dict) and rec.get("event") == TEST_FILLER:
            continue
        err = best_match(AUDIT_SCHEMA.iter_errors(rec))
        if err is not None:
            where = "/".join(map(str, err.absolute_path)) or "(record)"
            errors.append(f"{path}:{n}: {where}: {err.message} (schema {'/'.join(map(str, err.schema_path))})")
    return errors, start + end


def _check_audit_logs() -> list[str]:
    """Check the lines added to the session's audit logs since the last check."""
    errors: list[str] = []
    for path, done in list(_AUDIT_LOGS.items()):
        bad, _AUDIT_LOGS[path] = invalid_audit_records(path, done)
        errors += bad
    return errors


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    # every record the test's gatewrap runs wrote must match the schema
    if call.when in ("call", "teardown"):
        bad = _check_audit_logs()
        if bad and not rep.failed:
            rep.outcome = "failed"
            rep.longrepr = "audit records that break schema/audit.schema.json:\n" + "\n".join(bad[:20])
    # an expected failure (xfail, a known bug a test documents) is reported as skipped too
    if rep.skipped and not hasattr(rep, "wasxfail") and item.get_closest_marker("kernel") is not None:
        rep.outcome = "failed"
        rep.longrepr = f"kernel test skipped ({rep.longrepr}): kernel tests must run (root, cgroup v2, BPF)"


def _default_daemon_answers() -> bool:
    """Whether a daemon answers on the host's default socket (/run/gatewrap/daemon.sock)."""
    import socket

    with socket.socket(socket.AF_UNIX) as s:
        try:
            s.connect("/run/gatewrap/daemon.sock")
        except OSError:
            return False
    return True


@pytest.fixture(scope="session", autouse=True)
def _shared_mode_daemon():
    """Every ``gatewrap run`` of the session goes through the shared mode, the default,
    unless ``GATEWRAP_SHARED=0`` is in the environment (runs of their own): the session
    starts a daemon of its own, on a socket of its own (``GATEWRAP_DAEMON_SOCKET``), and
    stops it at the end. The host's default socket is never used: a test that started a
    daemon there fails the session."""
    before = _default_daemon_answers()
    if os.environ.get("GATEWRAP_SHARED") == "0" or os.environ.get("GATEWRAP_DAEMON_SOCKET"):
        yield
    else:
        from shared.conftest import Daemon

        d = Daemon("--idle-exit", "0").start()
        os.environ["GATEWRAP_DAEMON_SOCKET"] = d.socket
        yield
        d.stop()
        del os.environ["GATEWRAP_DAEMON_SOCKET"]
    assert before or not _default_daemon_answers(), (
        "a gatewrap daemon answers on the host's default socket since this session started: a test ran "
        "gatewrap without the session's GATEWRAP_DAEMON_SOCKET")


@pytest.fixture(autouse=True)
def _own_process(request, monkeypatch):
    """A test marked ``own_process`` runs its gatewraps as runs of their own
    (``GATEWRAP_SHARED=0``, as ``run --own``), whatever the session's mode."""
    if request.node.get_closest_marker("own_process") is not None:
        monkeypatch.setenv("GATEWRAP_SHARED", "0")


@pytest.fixture(scope="session", autouse=True)
def _no_leftover_fake_internet():
    """Wait for any other session on this host (tests/fakenet/host_lock.py), then remove a
    fake internet a killed earlier session left (a live one is not ours to touch)."""
    lock = hold_host_lock("tests")
    cleanup_leftovers()
    yield
    if lock is not None:
        lock.close()


@pytest.fixture(scope="session")
def examples_dir():
    """A copy of examples/ the agent's user can read wherever the clone lives (a clone under
    /root or pytest's 0700 tmp dirs is closed to uid 65534); show it with --ro-bind."""
    d = tempfile.mkdtemp(prefix="gwt-examples-")
    os.chmod(d, 0o755)
    for name in os.listdir(ROOT / "examples"):
        if name.endswith(".py"):
            shutil.copy(ROOT / "examples" / name, d)
            os.chmod(os.path.join(d, name), 0o644)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def open_dir():
    """A folder every user can enter (pytest's are root's 0700), removed after the test."""
    d = Path(tempfile.mkdtemp(prefix="gwt-open-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d)


@pytest.fixture(scope="module")
def net():
    """The fake internet, one per test module (its addresses are fixed, so one at a time)."""
    with FakeInternet() as n:
        yield n


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef, request):
    """A fake internet whose addresses are taken on this host ends the session with that one
    line (no traceback): no test after it could build one either."""
    outcome = yield
    if outcome.excinfo is not None and isinstance(outcome.excinfo[1], AddressConflict):
        pytest.exit(f"fake internet: {outcome.excinfo[1]}", returncode=3)


@dataclass
class Run:
    """The outcome of one ``gatewrap run``."""

    returncode: int
    stdout: str
    stderr: str
    audit_path: Path

    def audit(self) -> list[dict]:
        """Records of the audit log, parsed."""
        if not self.audit_path.exists():
            return []
        return [json.loads(line) for line in self.audit_path.read_text().splitlines() if line.strip()]

    def records(self, **eq) -> list[dict]:
        """Audit records whose fields equal ``eq``."""
        return [r for r in self.audit() if all(r.get(k) == v for k, v in eq.items())]

    @property
    def run_id(self) -> str:
        return next(r["run"] for r in self.audit() if r.get("event") == "run_start")


def netns_holders(ino: int) -> list[str]:
    """Every /proc/PID/ns/net and /proc/PID/fd/FD on the host that is network namespace
    ``ino`` (a run's netns lives while one of these does)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        links = [f"/proc/{pid}/ns/net"]
        try:
            links += [f"/proc/{pid}/fd/{fd}" for fd in os.listdir(f"/proc/{pid}/fd")]
        except OSError:
            pass
        for link in links:
            try:
                if os.readlink(link) == f"net:[{ino}]":
                    found.append(link)
            except OSError:
                pass
    return found


#: Run as ``sh -c PIDNS_SETUP sh ARGV...`` in a new mount namespace: a /proc of the new pid
#: namespace's own, mounts made there not seen outside. ``unshare --mount-proc`` makes "/"
#: private first, which fails where "/" is no mount point (a chroot: fresh-debian's, "cannot
#: change root filesystem propagation"); then /proc, a mount point everywhere, is made private
#: before the new proc is mounted over it (mount_namespaces(7), "Shared subtrees").
PIDNS_SETUP = ("mount --make-rprivate / 2>/dev/null || mount --make-rprivate /proc || exit 126\n"
               "mount -t proc -o nosuid,nodev,noexec proc /proc || exit 126\n"
               'exec "$@"')


def in_new_pid_namespace(*argv: str) -> list[str]:
    """``argv`` as the first child of a new pid namespace (``unshare --pid --fork``) in a new
    mount namespace with its own /proc: what ``unshare --mount --pid --fork --mount-proc``
    does, also in a chroot (:data:`PIDNS_SETUP`). Exit 126: the namespace could not be made."""
    return ["unshare", "--mount", "--pid", "--fork", "--propagation", "unchanged",
            "/bin/sh", "-c", PIDNS_SETUP, "sh", *argv]


def gatewrap_cmd(*args: str) -> list[str]:
    """The gatewrap command line, with this interpreter (the project's venv). An
    ``--audit-log PATH`` among ``args`` is noted: its records are checked against the
    schema when the test ends (see :func:`pytest_runtest_makereport`)."""
    for flag, value in zip(args, args[1:]):
        if flag == "--audit-log":
            _AUDIT_LOGS.setdefault(Path(value), 0)
    return [sys.executable, "-m", "gatewrap", *args]


def run_gatewrap(net, audit: Path, argv=None, *, python=None, allow=(), deny=(), extra=(), env=None,
                 timeout=60, user_env=True, unnamed=None) -> Run:
    """Run ``gatewrap run`` once against ``net`` with its audit log at ``audit``; see
    :func:`gatewrap` for the arguments. For module-scoped runs (one sandbox, many cases)."""
    if python is not None:
        argv = [AGENT_PYTHON, "-c", textwrap.dedent(python)]
    cmd = gatewrap_cmd("run", "--audit-log", str(audit), "--resolver", net.dns_server,
                       "--workdir", "/tmp", "--ro-bind", net.tmpdir,
                       *PUBLIC_RANGES)
    for a in allow:
        cmd += ["--allow", a]
    for d in deny:
        cmd += ["--deny", d]
    e = dict(os.environ)
    if user_env:
        e.update(SUDO_UID=str(AGENT_UID), SUDO_GID=str(AGENT_UID))
    # For the agent (named: nothing of gatewrap's environment reaches it otherwise): the fake
    # internet's CA, the audit log's path, and ``env``'s, but for gatewrap's own settings.
    agent_env = {"GW_TEST_AUDIT": str(audit), "REQUESTS_CA_BUNDLE": net.ca_path, "CURL_CA_BUNDLE": net.ca_path,
                 "SSL_CERT_FILE": net.ca_path, **(env or {})}
    e.update(agent_env, **(unnamed or {}))
    for name in agent_env:
        if not name.startswith(("GATEWRAP_", "SUDO_")):
            cmd += ["--env", name]
    cmd += [*extra, "--", *argv]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=e, cwd=ROOT)
    return Run(p.returncode, p.stdout, p.stderr, audit)


@pytest.fixture
def gatewrap(net, tmp_path):
    """Run ``gatewrap run`` against the fake internet; returns a function.

    ``gatewrap(argv, allow=[...], python=CODE, env={...})`` runs ``argv`` (or, with
    ``python``, Debian's python3 running CODE) as uid 65534, resolving through the fake
    DNS, with a fresh audit log, and returns a :class:`Run`. ``env``'s variables are set
    in gatewrap's environment and named with ``--env`` (but SUDO_* and GATEWRAP_*, which
    are gatewrap's); so are REQUESTS_CA_BUNDLE, CURL_CA_BUNDLE and SSL_CERT_FILE (the fake
    internet's CA) and GW_TEST_AUDIT (the run's audit log). ``unnamed``'s are set in
    gatewrap's environment only (which the agent must not see).
    """

    def _run(argv=None, **kw) -> Run:
        audit = tmp_path / f"audit-{len(list(tmp_path.iterdir()))}.jsonl"
        return run_gatewrap(net, audit, argv, **kw)

    return _run
