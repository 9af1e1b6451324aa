"""The SQLite store is root's alone (issue 21, item 5): its folder is checked as the audit log's
(root's, not writable by group or others, no symbolic link, the folders above it root's and not
writable by others unless sticky) and an existing file (and its -wal, -shm and -journal) must be
a regular file of root's with mode 0600; a store a local user could have written is refused with
the reason and what to do, by the CLI and the gate alike. A command that only reads or decides
never creates a store: a mistyped URL or a missing folder is said, nothing is made."""

from __future__ import annotations

import os
import subprocess

import pytest

from gatewrap import _gate_core as core

from .held import cli

NOBODY = 65534


@pytest.fixture
def folder(tmp_path):
    """A root-owned 0700 folder for the store (pytest's tmp_path is root's, 0700)."""
    d = tmp_path / "state"
    d.mkdir(mode=0o700)
    return d


def _made(folder, name="state.db"):
    """A genuine store made by gatewrap at ``folder/name``; its path."""
    core.ApprovalStore(f"sqlite:{folder / name}")
    return folder / name


def _chown(path, uid):
    os.chown(path, uid, uid, follow_symlinks=False)


@pytest.mark.parametrize("case, plant, why", [
    ("a file another user pre-created, mode 0666",
     lambda p: (p.write_bytes(b""), _chown(p, NOBODY), p.chmod(0o666)), "not root's"),
    ("a store of root's that others may read (0644)",
     lambda p: (_made(p.parent), p.chmod(0o644)), "mode 0644"),
    ("a store of root's handed to another user", lambda p: (_made(p.parent), _chown(p, NOBODY)), "not root's"),
    ("a symbolic link to a store elsewhere",
     lambda p: (_made(p.parent, "real.db"), p.symlink_to(p.parent / "real.db")), "symbolic link"),
    ("a -wal file of another user's beside a good store",
     lambda p: (_made(p.parent), (p.parent / "state.db-wal").write_bytes(b""),
                _chown(p.parent / "state.db-wal", NOBODY)), "state.db-wal"),
    ("a -shm file others may write beside a good store",
     lambda p: (_made(p.parent), (p.parent / "state.db-shm").write_bytes(b""),
                (p.parent / "state.db-shm").chmod(0o666)), "state.db-shm"),
    ("a folder others may write", lambda p: p.parent.chmod(0o777), "writable by others"),
    ("a folder of another user's", lambda p: _chown(p.parent, NOBODY), "not owned by root"),
])
def test_a_store_a_local_user_could_write_is_refused_with_the_reason(folder, case, plant, why):
    path = folder / "state.db"
    plant(path)
    with pytest.raises((OSError, ValueError)) as e:
        core.ApprovalStore(f"sqlite:{path}")
    assert why in str(e.value), (case, str(e.value))
    r = cli("list", "--state", f"sqlite:{path}")
    assert r.returncode == 125, (case, r.stderr)
    assert why in r.stderr and "Traceback" not in r.stderr, (case, r.stderr)
    assert any(w in r.stderr for w in ("chown", "chmod", "remove")), (case, "the message says what to do", r.stderr)


def test_a_pending_approval_in_a_planted_store_cannot_be_approved_through_it(folder):
    """The attack of item 5: a user pre-creates the store 0666, and later UPDATEs it. gatewrap
    refuses to use such a file at all, so neither the gate nor a human's command works on it."""
    path = folder / "state.db"
    path.write_bytes(b"")
    path.chmod(0o666)
    _chown(path, NOBODY)
    r = cli("approve", "ap-aaaaaaaaaaaaaaaaaaaa", "--yes", "--state", f"sqlite:{path}")
    assert r.returncode == 125 and "not root's" in r.stderr, r.stderr
    assert path.stat().st_size == 0, "nothing was written to it"


def test_a_store_gatewrap_makes_is_root_s_0600_in_a_0700_folder(tmp_path):
    path = tmp_path / "new" / "deeper" / "state.db"
    core.ApprovalStore(f"sqlite:{path}")
    assert (path.stat().st_mode & 0o777, path.parent.stat().st_mode & 0o777) == (0o600, 0o700)
    assert (path.stat().st_uid, path.parent.stat().st_uid) == (0, 0)
    assert core.ApprovalStore(f"sqlite:{path}").list() == [], "and it opens again"


@pytest.mark.parametrize("command", [("list",), ("show", "ap-aaaaaaaaaaaaaaaaaaaa"), ("grants",),
                                     ("approve", "ap-aaaaaaaaaaaaaaaaaaaa", "--yes"),
                                     ("prune", "--older-than", "1d")])
def test_a_read_or_decision_on_a_missing_store_makes_nothing(tmp_path, command):
    missing = tmp_path / "missing" / "dir" / "x.db"
    r = cli(*command, "--state", f"sqlite:{missing}")
    assert r.returncode == 125 and "does not exist" in r.stderr, r.stderr
    assert not (tmp_path / "missing").exists(), "no folder made"


def test_a_mistyped_scheme_is_refused_and_makes_nothing(tmp_path):
    r = subprocess.run([*cli_cmd(), "list", "--state", "sqlit:/x"], capture_output=True, text=True, cwd=tmp_path,
                       timeout=60)
    assert r.returncode == 125 and "sqlit:" in r.stderr and "sqlite:PATH" in r.stderr, r.stderr
    assert list(tmp_path.iterdir()) == [], "no folder 'sqlit:' made in the working directory"


def cli_cmd() -> list[str]:
    from conftest import gatewrap_cmd

    return gatewrap_cmd("approvals")


def test_a_store_on_a_read_only_file_system_is_said_not_a_traceback(tmp_path):
    mnt = tmp_path / "ro"
    mnt.mkdir(mode=0o700)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0700,size=4m", "tmpfs", str(mnt)], check=True)
    try:
        store = mnt / "state.db"
        a_run = core.ApprovalStore(f"sqlite:{store}")
        a_run.start_run("gw-00000000c1")
        del a_run
        subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
        with pytest.raises(OSError) as e:
            core.ApprovalStore(f"sqlite:{mnt / 'other.db'}")
        assert "Read-only file system" in str(e.value) or "read-only" in str(e.value).lower(), str(e.value)
        r = cli("list", "--state", f"sqlite:{store}")
        assert r.returncode in (0, 125) and "Traceback" not in r.stderr, r.stderr
        if r.returncode == 125:
            assert "read-only" in r.stderr.lower() or "readonly" in r.stderr.lower(), r.stderr
    finally:
        subprocess.run(["umount", str(mnt)], check=False)
