"""The lock files beside the daemon's socket, removed by their holder when it is done
(gatewrap.shared.lockfile): at most one process holds the lock of the file the path names,
whoever waited for a file that was removed meanwhile."""

from __future__ import annotations

import os
import threading
import time

import pytest

from gatewrap.shared import lockfile


def test_a_lock_taken_makes_its_file_and_another_taker_waits_or_is_refused(tmp_path):
    path = str(tmp_path / "daemon.sock.start")
    fd = lockfile.take(path)
    try:
        assert os.path.exists(path)
        with pytest.raises(BlockingIOError):
            lockfile.take(path, wait=False)
    finally:
        lockfile.remove(path, fd)
    assert not os.path.exists(path)
    os.close(lockfile.take(path, wait=False))  # free again, made anew


def test_a_waiter_whose_file_was_removed_takes_the_new_files_lock_after_its_holder(tmp_path):
    path = str(tmp_path / "daemon.sock.start")
    first = lockfile.take(path)
    got: list[int] = []
    waiter = threading.Thread(target=lambda: got.append(lockfile.take(path)))
    waiter.start()
    time.sleep(0.3)  # the waiter has opened the first file and waits for its lock
    assert got == []
    lockfile.remove(path, first)  # the holder done: the file goes, the lock is let go
    try:
        third = lockfile.take(path, wait=False)  # a new file at the path
    except BlockingIOError:  # the waiter was first to the new file: it holds that one
        waiter.join(10)
        assert len(got) == 1 and os.stat(path).st_ino == os.fstat(got[0]).st_ino
        lockfile.remove(path, got[0])
        return
    try:
        waiter.join(0.5)
        assert got == [], "two takers hold the lock of the same path at once"
    finally:
        lockfile.remove(path, third)
    waiter.join(10)
    assert len(got) == 1 and os.stat(path).st_ino == os.fstat(got[0]).st_ino
    lockfile.remove(path, got[0])
    assert not os.path.exists(path)


def test_remove_leaves_a_file_that_is_no_longer_the_holders(tmp_path):
    path = str(tmp_path / "daemon.sock.lock")
    fd = lockfile.take(path)
    os.unlink(path)
    other = lockfile.take(path)  # another's, made since
    lockfile.remove(path, fd)
    assert os.path.exists(path) and os.stat(path).st_ino == os.fstat(other).st_ino
    lockfile.remove(path, other)
