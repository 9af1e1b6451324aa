"""The jail's file system view (gatewrap.sandbox.view.build): which mounts, in which order.

Table-driven on a given list of host mount points; the kernel tests of the view itself are
tests/escape/test_fs_view.py."""

from __future__ import annotations

import os

import pytest

from gatewrap.errors import GatewrapError
from gatewrap.sandbox import view
from gatewrap.sandbox.user import Target

ROOT_AGENT = Target(uid=0, gid=0, groups=(0,), name="root", home="/root")


def _mounts(tmp_path, cwd="/tmp", home="/nonexistent", ro=(), rw=(), points=()):
    return [(m.kind, m.dst, m.src) for m in view.build(cwd, home, ROOT_AGENT, list(ro), list(rw),
                                                        mount_points=list(points))]


def _dsts(mounts):
    return [dst for _, dst, _ in mounts]


def test_the_base_is_the_systems_software_and_no_root_bind(tmp_path):
    got = _mounts(tmp_path)
    for path in view.BASE:
        if os.path.islink(path):
            assert ("symlink", path, os.readlink(path)) in got
        elif os.path.isdir(path):
            assert ("ro", path, path) in got
        else:
            assert path not in _dsts(got)
    assert "/" not in _dsts(got)
    assert ("tmpfs", "/nonexistent", "") in got


CASES = [
    ("a home holding the working directory: the home's tmpfs first, the workdir on it",
     dict(home="{t}/home", cwd="{t}/home/proj"), [("tmpfs", "{t}/home"), ("rw", "{t}/home/proj")]),
    ("a working directory that is the home: shown, no tmpfs",
     dict(home="{t}/home", cwd="{t}/home"), [("rw", "{t}/home")]),
    ("a bound folder holding the home: the home's tmpfs covers it",
     dict(home="{t}/home", ro=["{t}"]), [("ro", "{t}"), ("tmpfs", "{t}/home")]),
    ("a mount below a read-only bind: bound again read-only after it",
     dict(ro=["{t}/data"], points=["{t}/data/disk", "{t}/data/disk/inner", "{t}/elsewhere"]),
     [("ro", "{t}/data"), ("ro", "{t}/data/disk"), ("ro", "{t}/data/disk/inner")]),
    ("a mount below a writable bind: read-only unless named",
     dict(rw=["{t}/data"], points=["{t}/data/disk"]), [("rw", "{t}/data"), ("ro", "{t}/data/disk")]),
    ("a mount below a writable bind that is named writable too",
     dict(rw=["{t}/data", "{t}/data/disk"], points=["{t}/data/disk"]), [("rw", "{t}/data"), ("rw", "{t}/data/disk")]),
    ("a mount inside the private home is left out",
     dict(home="{t}/home", ro=["{t}"], points=["{t}/home/.gvfs"]), [("ro", "{t}"), ("tmpfs", "{t}/home")]),
    ("a working directory that is /tmp: the jail's own, not bound",
     dict(cwd="/tmp"), []),
]


@pytest.mark.parametrize("kw,want", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_mounts_below_the_base(tmp_path, kw, want):
    t = str(tmp_path)
    for d in ("home/proj", "data/disk/inner", "elsewhere"):
        (tmp_path / d).mkdir(parents=True, exist_ok=True)
    kw = {k: ([x.format(t=t) for x in v] if isinstance(v, list) else v.format(t=t)) for k, v in kw.items()}
    got = [(kind, dst) for kind, dst, _ in _mounts(tmp_path, **kw) if dst.startswith(t) or kind == "tmpfs"]
    want = [(kind, dst.format(t=t)) for kind, dst in want]
    if "home" not in kw:
        want = [("tmpfs", "/nonexistent"), *want]
    assert sorted(got, key=lambda m: m[1]) == sorted(want, key=lambda m: m[1])
    order = _dsts(_mounts(tmp_path, **kw))
    for parent in order:
        for child in order:
            if child.startswith(parent.rstrip("/") + "/"):
                assert order.index(parent) < order.index(child), (parent, child, order)


def test_a_bound_symlink_is_a_link_to_its_bound_target_with_its_mounts(tmp_path):
    (tmp_path / "real" / "disk").mkdir(parents=True)
    (tmp_path / "link").symlink_to(tmp_path / "real")
    real, disk, link = (str(tmp_path / p) for p in ("real", "real/disk", "link"))
    got = _mounts(tmp_path, ro=[link], points=[disk])
    assert ("ro", real, real) in got and ("ro", disk, disk) in got and ("symlink", link, real) in got


def test_a_bind_below_var_tmp_is_made_below_the_jails_tmp():
    assert view.in_jail("/var/tmp/x/y") == "/tmp/x/y" and view.in_jail("/var/run/db.sock") == "/run/db.sock"
    assert view.in_jail("/var/tmpfoo") == "/var/tmpfoo" and view.in_jail("/srv/x") == "/srv/x"


@pytest.mark.parametrize("target", ["/", "/proc", "/proc/self", "/sys", "/dev", "/run", "/tmp"])
def test_a_bind_through_a_link_to_the_host_or_its_views_is_refused(tmp_path, target):
    (tmp_path / "data").symlink_to(target)
    with pytest.raises(GatewrapError, match=r"\(a link to "):
        view.build("/tmp", "/nonexistent", ROOT_AGENT, [str(tmp_path / "data")], [], mount_points=[])


@pytest.mark.parametrize("path,message", [("/", "whole host"), ("/srv/a:b", "':'")],
                         ids=["the root", "a colon"])
def test_paths_nsjail_cannot_show_are_refused(path, message):
    with pytest.raises(GatewrapError, match=message):
        view.build("/tmp", "/nonexistent", ROOT_AGENT, [path], [], mount_points=[])


def test_the_socket_notice_counts_the_sockets_once(tmp_path):
    import socket

    socks = []
    for name in ("a.sock", "sub/b.sock"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(tmp_path / name))
        socks.append(s)
    try:
        mounts = view.build("/tmp", "/nonexistent", ROOT_AGENT, [str(tmp_path)], [], mount_points=[])
        note = view.socket_notice(mounts, "/nonexistent")
        assert note is not None and "(and 1 more)" in note and str(tmp_path) in note, note
        assert view.socket_notice(view.build("/tmp", "/nonexistent", ROOT_AGENT, [], [], mount_points=[]),
                                  "/nonexistent") is None
    finally:
        for s in socks:
            s.close()


def test_the_socket_scan_counts_folders_toward_its_limit(tmp_path):
    # A tree of empty folders must not make the scan (on every run's start) unbounded.
    for i in range(50):
        (tmp_path / f"d{i}").mkdir()
    import socket

    s = socket.socket(socket.AF_UNIX)
    s.bind(str(tmp_path / "d49" / "late.sock"))
    try:
        assert view.sockets_under([str(tmp_path)], limit=10) == []
        assert view.sockets_under([str(tmp_path)]) == [str(tmp_path / "d49" / "late.sock")]
    finally:
        s.close()
