"""Escape suite, the file system view: the jail shows nothing of the host unless named
(DESIGN.md, contract 6). Host unix sockets, other file systems and the invoking user's
secrets are absent wherever they live; what is shown is read-only down to every mount
below it; --ro-bind/--bind (and the policy's [sandbox] table) widen the view, /run
included.

Every host object the tests make (sockets, tmpfs mounts, a user with a home) is made
here and removed afterwards; the sockets are mode 0777 and the tmpfs mode 1777, so only
the view can be what stops the agent."""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest

from conftest import gatewrap_cmd

from .helpers import assert_nothing_reached, attempts, python_argv

pytestmark = pytest.mark.kernel

TAG = f"gw-fsview-{secrets.token_hex(3)}"


def _mount_tmpfs(path: str) -> None:
    os.makedirs(path, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=1777,size=1m", "tmpfs", path], check=True)


def _umount(path: str) -> None:
    subprocess.run(["umount", "-l", path], check=False)


@pytest.fixture(scope="module")
def invoker():
    """A user made for this module, with a home holding secrets: the agent runs as it (as if
    it had run sudo). Yields (uid, gid, home)."""
    name = TAG.replace("-", "")[:30]
    home = f"/home/{TAG}"
    subprocess.run(["useradd", "--create-home", "--home-dir", home, "--shell", "/bin/sh", name], check=True)
    try:
        pw = pwd.getpwnam(name)
        for rel, text in ((".ssh/id_ed25519", "PRIVATE KEY"), (".aws/credentials", "aws_secret_access_key=x"),
                          (".netrc", "machine a.test password p"), (".bashrc", "# the user's own")):
            p = Path(home, rel)
            p.parent.mkdir(mode=0o700, exist_ok=True)
            p.write_text(text)
            p.chmod(0o600)
            os.chown(p.parent, pw.pw_uid, pw.pw_gid)
            os.chown(p, pw.pw_uid, pw.pw_gid)
        yield pw.pw_uid, pw.pw_gid, home
    finally:
        subprocess.run(["userdel", "--remove", name], check=False, capture_output=True)
        shutil.rmtree(home, ignore_errors=True)


class Listener:
    """Unix stream servers (mode 0777) at the given paths; ``accepted`` counts connections."""

    def __init__(self, paths: list[str]):
        self.socks = []
        for path in paths:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            os.chmod(os.path.dirname(path), 0o755)
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.bind(path)
            os.chmod(path, 0o777)
            s.listen(8)
            s.setblocking(False)
            self.socks.append((path, s))

    def accepted(self) -> int:
        n = 0
        for _, s in self.socks:
            try:
                while True:
                    s.accept()[0].close()
                    n += 1
            except BlockingIOError:
                pass
        return n

    def close(self) -> None:
        for path, s in self.socks:
            s.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)


@pytest.fixture(scope="module")
def places(invoker):
    """Host places the view must hide, each with a socket: (label, socket path)."""
    uid, gid, home = invoker
    srv_fs = f"/srv/{TAG}-fs"
    _mount_tmpfs(srv_fs)
    made = [f"/var/lib/{TAG}", f"/home/{TAG}-other", f"/opt/{TAG}"]
    found = [("under /var/lib (a database's socket)", f"/var/lib/{TAG}/db.sock"),
             ("in another user's home (/home/...)", f"/home/{TAG}-other/.ssh/cm.sock"),
             ("under /opt (a tool's daemon)", f"/opt/{TAG}/daemon.sock"),
             ("on a separate file system (a tmpfs below /srv)", f"{srv_fs}/agent.sock"),
             ("in the invoking user's ~/.ssh (an ssh ControlMaster)", f"{home}/.ssh/cm-{TAG}.sock")]
    listener = Listener([p for _, p in found])
    yield found, listener
    listener.close()
    _umount(srv_fs)
    for d in [*made, srv_fs]:
        shutil.rmtree(d, ignore_errors=True)


def _agent(gatewrap, invoker, body: str, extra=(), **kw):
    uid, gid, _ = invoker
    return gatewrap(python_argv(body), extra=list(extra), env={"SUDO_UID": str(uid), "SUDO_GID": str(gid)},
                    timeout=60, **kw)


def test_host_unix_sockets_are_absent_wherever_they_live(gatewrap, quiet_net, outcome, places, invoker):
    """a host unix socket outside /run and /tmp (under /var/lib, /opt, a home, a separate mount)."""
    found, listener = places
    body = "\n".join(
        f"attempt({label!r}, lambda: socket.socket(socket.AF_UNIX).connect({path!r}))" for label, path in found)
    r = _agent(gatewrap, invoker, body)
    got = attempts(r.stdout)
    assert len(got) == len(found), r.stderr
    errnos = sorted({a["errno"] or "connected" for a in got})
    outcome("jail: default-deny view (the socket's folder is not in it)",
            f"{'/'.join(errnos)} (connect, {len(got)} places)",
            "OPEN" if any(a["errno"] is None for a in got) else "held")
    assert all(a["errno"] == "ENOENT" for a in got), got
    assert listener.accepted() == 0
    assert_nothing_reached(quiet_net)


def test_a_bound_folder_with_sockets_is_said_once(gatewrap, quiet_net, places, invoker, tmp_path):
    """Binding a folder that holds sockets shows them (read-only does not stop connect), and
    gatewrap says so in one line, naming one and counting the rest."""
    found, listener = places
    folder = os.path.dirname(found[0][1])
    extra_sock = Listener([f"{folder}/second.sock"])
    try:
        r = _agent(gatewrap, invoker, f"attempt('connect', lambda: socket.socket(socket.AF_UNIX).connect({found[0][1]!r}))",
                   extra=["--ro-bind", folder])
        notes = [line for line in r.stderr.splitlines() if "holds a unix socket" in line]
        assert len(notes) == 1, r.stderr
        assert "(and 1 more)" in notes[0] and folder in notes[0], notes
        assert attempts(r.stdout)[-1]["errno"] is None, r.stdout
        assert listener.accepted() == 1
        unbound = _agent(gatewrap, invoker, "print('ok')")
        assert unbound.returncode == 0 and "holds a unix socket" not in unbound.stderr, unbound.stderr
    finally:
        extra_sock.close()


def test_file_systems_below_root_are_absent_or_read_only(gatewrap, quiet_net, outcome, invoker):
    """a writable file system mounted below / (a tmpfs under /srv, under /usr, nested in a bound folder)."""
    unbound = f"/srv/{TAG}-rw"
    in_base = f"/usr/local/share/{TAG}"
    bound = f"/srv/{TAG}-tree"
    nested, deeper = f"{bound}/sub", f"{bound}/sub/deeper"
    for path in (unbound, in_base):
        _mount_tmpfs(path)
    os.makedirs(bound, exist_ok=True)
    os.chmod(bound, 0o1777)
    _mount_tmpfs(nested)
    _mount_tmpfs(deeper)
    try:
        cases = [("a tmpfs below /srv, not bound", unbound, "ENOENT"),
                 ("a tmpfs below /usr (the base view)", in_base, "EROFS"),
                 ("a folder bound with --ro-bind", bound, "EROFS"),
                 ("a tmpfs inside the --ro-bind folder", nested, "EROFS"),
                 ("a tmpfs inside that one", deeper, "EROFS")]
        body = "\n".join(f"attempt({label!r}, lambda: open({path + '/f'!r}, 'w').write('x'))"
                         for label, path, _ in cases)
        body += "\nattempt('the root', lambda: open('/f', 'w').write('x'))"
        r = _agent(gatewrap, invoker, body, extra=["--ro-bind", bound])
        got = attempts(r.stdout)
        assert len(got) == len(cases) + 1, r.stderr
        outcome("jail: default-deny view; every mount below a bound path bound again read-only",
                "; ".join(f"{a['step']}: {a['errno'] or 'WRITTEN'}" for a in got),
                "OPEN" if any(a["errno"] is None for a in got) else "held")
        for a, (_, _, want) in zip(got, cases + [("", "", "EROFS")]):
            assert a["errno"] == want, (a, r.stderr)
        # --bind makes the named folder's own file system writable, and only that.
        rw = _agent(gatewrap, invoker, f"attempt('top', lambda: open({bound + '/f'!r}, 'w').write('x'))\n"
                                       f"attempt('nested', lambda: open({nested + '/f'!r}, 'w').write('x'))",
                    extra=["--bind", bound])
        assert [a["errno"] for a in attempts(rw.stdout)] == [None, "EROFS"], rw.stderr
        assert os.path.exists(f"{bound}/f") and not os.path.exists(f"{nested}/f")
    finally:
        for path in (deeper, nested, in_base, unbound):
            _umount(path)
        for path in (unbound, in_base, bound):
            shutil.rmtree(path, ignore_errors=True)


def test_the_invoking_users_secrets_are_absent(gatewrap, quiet_net, outcome, invoker):
    """the invoking user's secrets in its home (~/.ssh, ~/.aws, ~/.netrc, ~/.bashrc)."""
    _, _, home = invoker
    names = (".ssh/id_ed25519", ".aws/credentials", ".netrc", ".bashrc")
    body = "\n".join(f"attempt({n!r}, lambda: open(os.path.join(os.environ['HOME'], {n!r})).read())" for n in names)
    body += ("\nprint(json.dumps({'home': os.environ['HOME'], 'listing': os.listdir(os.environ['HOME'])}))"
             "\nattempt('write in HOME', lambda: open(os.path.join(os.environ['HOME'], 'note'), 'w').write('x'))")
    r = _agent(gatewrap, invoker, body)
    got = attempts(r.stdout)
    reads, write = got[:-1], got[-1]
    view = next(json.loads(x) for x in r.stdout.splitlines() if x.startswith('{"home"'))
    outcome("jail: an empty private tmpfs at $HOME",
            f"{'/'.join(sorted({a['errno'] or 'READ' for a in reads}))} (open, {len(reads)} files); "
            f"HOME empty and writable", "OPEN" if any(a["errno"] is None for a in reads) else "held")
    assert [a["errno"] for a in reads] == ["ENOENT"] * len(names), r.stderr
    assert view == {"home": home, "listing": []}
    assert write["errno"] is None, write
    assert not os.path.exists(os.path.join(home, "note")), "the agent's home is private, not the host's"
    assert Path(home, ".bashrc").read_text() == "# the user's own"


def test_the_view_holds_the_system_and_nothing_else(gatewrap, invoker):
    """The root lists the base, the private folders and the home; nothing else."""
    _, _, home = invoker
    r = _agent(gatewrap, invoker, "print(json.dumps(sorted(os.listdir('/'))))")
    top = json.loads(r.stdout.strip().splitlines()[-1])
    assert set(top) <= {"bin", "sbin", "lib", "lib32", "lib64", "libx32", "usr", "etc", "proc", "tmp", "run",
                        "dev", "var", home.split("/")[1]}, top
    for absent in ("root", "srv", "opt", "mnt", "sys", "boot", "media"):
        assert absent not in top, top


def test_binds_under_run_work(gatewrap, invoker, tmp_path):
    """--ro-bind and --bind of paths under /run (nsjail used to exit 255: /var/run's tmpfs covered /run)."""
    uid, gid, _ = invoker
    ro, rw = f"/run/{TAG}-ro", f"/run/{TAG}-rw"
    for d in (ro, rw):
        os.makedirs(d, exist_ok=True)
    Path(ro, "data").write_text("shown")
    os.chown(rw, uid, gid)
    try:
        r = _agent(gatewrap, invoker, f"attempt('read', lambda: open({ro + '/data'!r}).read())\n"
                                      f"attempt('write ro', lambda: open({ro + '/x'!r}, 'w').write('x'))\n"
                                      f"attempt('write rw', lambda: open({rw + '/x'!r}, 'w').write('x'))\n"
                                      f"attempt('via /var/run', lambda: open({'/var' + ro + '/data'!r}).read())",
                   extra=["--ro-bind", ro, "--bind", rw])
        assert r.returncode == 0, r.stderr
        got = attempts(r.stdout)
        assert [(a["errno"], a["result"]) for a in got] == [(None, "shown"), ("EROFS", None), (None, 1),
                                                            (None, "shown")], got
        assert Path(rw, "x").read_text() == "x"
    finally:
        for d in (ro, rw):
            shutil.rmtree(d, ignore_errors=True)


def test_the_policy_files_binds_work(gatewrap, invoker, tmp_path):
    """[sandbox] ro_bind/bind in the policy file widen the view as --ro-bind/--bind do."""
    uid, gid, _ = invoker
    ro, rw = f"/srv/{TAG}-pro", f"/srv/{TAG}-prw"
    for d in (ro, rw):
        os.makedirs(d, exist_ok=True)
    Path(ro, "data").write_text("team")
    os.chown(rw, uid, gid)
    policy = tmp_path / "policy.toml"
    policy.write_text(f'default = "deny"\n\n[sandbox]\nro_bind = ["{ro}"]\nbind = ["{rw}"]\n')
    try:
        r = _agent(gatewrap, invoker, f"attempt('read', lambda: open({ro + '/data'!r}).read())\n"
                                      f"attempt('write ro', lambda: open({ro + '/x'!r}, 'w').write('x'))\n"
                                      f"attempt('write rw', lambda: open({rw + '/x'!r}, 'w').write('x'))",
                   extra=["--policy", str(policy)])
        assert [(a["errno"], a["result"]) for a in attempts(r.stdout)] == [(None, "team"), ("EROFS", None), (None, 1)], \
            r.stderr
        check = subprocess.run(gatewrap_cmd("policy", "check", str(policy)), capture_output=True, text=True)
        assert check.returncode == 0, check.stderr
        assert f"ro_bind {ro}" in check.stdout and f"bind {rw}" in check.stdout, check.stdout
    finally:
        for d in (ro, rw):
            shutil.rmtree(d, ignore_errors=True)


@pytest.mark.parametrize("text,line,message", [
    ('default = "deny"\n[sandbox]\nro_bind = ["relative/path"]\n', 3, "expected an absolute path"),
    ('[sandbox]\nro_bind = []\nrw = ["/srv"]\n', 3, "unknown key `rw`"),
    ('[sandbox]\n\nbind = ["/nonexistent-gw-fsview/x"]\n', 3, "does not exist on this host"),
], ids=["a relative path", "an unknown key", "a path that does not exist"])
def test_a_malformed_sandbox_table_names_file_and_line(gatewrap, invoker, tmp_path, text, line, message):
    policy = tmp_path / "policy.toml"
    policy.write_text(text)
    r = _agent(gatewrap, invoker, "print('ran')", extra=["--policy", str(policy)])
    assert r.returncode == 125, r.stderr
    assert f"{policy}:{line}: " in r.stderr and message in r.stderr, r.stderr
    assert "ran" not in r.stdout


@pytest.fixture
def open_dir():
    """A folder every user can enter (pytest's tmp_path lies below a 0700 one)."""
    d = tempfile.mkdtemp(prefix="gw-fsview-", dir="/var/tmp")
    os.chmod(d, 0o755)
    yield Path(d)
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.parametrize("target", ["/", "/proc", "/proc/1", "/sys/fs/cgroup", "/run", "/dev"])
def test_a_bind_that_resolves_to_the_host_or_its_views_is_refused(gatewrap, quiet_net, outcome, open_dir, target):
    """a --ro-bind / --bind path that is a link (planted by anyone who can write where it
    lies) to / or a host view (/proc, /sys, /dev, the host's /run)"""
    link = open_dir / "data"
    link.symlink_to(target)
    for flag in ("--ro-bind", "--bind"):
        r = gatewrap(["/bin/true"], extra=[flag, str(link)])
        assert r.returncode == 125, r.stderr
        assert f"{link} (a link to {target})" in r.stderr, r.stderr
    outcome("gatewrap: binds are resolved (realpath) and checked before the jail starts",
            f"exit 125: data -> {target} refused")
    assert_nothing_reached(quiet_net)


def test_a_bind_through_a_link_to_a_folder_shows_that_folder(gatewrap, open_dir):
    real = open_dir / "real"
    real.mkdir()
    real.chmod(0o755)
    (real / "f").write_text("inside\n")
    (real / "f").chmod(0o644)
    link = open_dir / "link"
    link.symlink_to(real)
    r = gatewrap(["/bin/cat", f"{link}/f"], extra=["--ro-bind", str(link)])
    assert r.returncode == 0 and r.stdout == "inside\n", r.stderr
