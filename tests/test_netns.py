"""The run's network namespace, made without a netlink library and held by a file
descriptor, not named under /run/netns (gatewrap.sandbox.netns)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from conftest import netns_holders
from gatewrap.sandbox import cgroup, netns

pytestmark = pytest.mark.kernel


def test_a_new_netns_has_only_lo_up_with_both_loopback_addresses_and_goes_away_when_let_go():
    ns = netns.create()
    ino = ns.ino
    try:
        assert ns.path == f"/proc/{os.getpid()}/fd/{ns.fd}"
        # nsenter enters the netns only: `ip -n` also remounts / as a slave, which fails where /
        # is not a mount point (a chroot, as tools/fresh-debian's).
        links = subprocess.run(["nsenter", f"--net={ns.path}", "ip", "-o", "link"], capture_output=True, text=True, check=True).stdout
        assert len(links.splitlines()) == 1 and "lo:" in links and ",UP" in links, links
        addrs = subprocess.run(["nsenter", f"--net={ns.path}", "ip", "-o", "addr"], capture_output=True, text=True, check=True).stdout
        assert "127.0.0.1/8" in addrs and "::1/128" in addrs, addrs
        assert ino != os.stat("/proc/self/ns/net").st_ino  # another netns than gatewrap's own
        assert netns_holders(ino) == [ns.path]  # only this process holds it
        # Not a mount: nothing in the host's mount table (each new mount namespace copies it).
        with open("/proc/self/mountinfo") as f:
            assert f"net:[{ino}]" not in f.read()
        assert not os.path.exists(os.path.join(netns.NETNS_DIR, f"gw-{ino}"))
    finally:
        ns.close()
    ns.close()  # idempotent
    assert netns_holders(ino) == []


def test_the_fd_is_not_inherited():
    ns = netns.create()
    try:
        out = subprocess.run([sys.executable, "-c", f"import os; print(os.path.exists('/proc/self/fd/{ns.fd}'))"],
                             capture_output=True, text=True, check=True, close_fds=False).stdout
        assert out == "False\n"
    finally:
        ns.close()


def test_of_cgroup_finds_the_netns_of_a_process_in_the_cgroup_and_only_that_one(tmp_path):
    ns = netns.create()
    leaf = os.path.join(cgroup.parent_dir(), "gw-test-netns" + os.urandom(3).hex())
    os.makedirs(leaf)
    proc = None
    try:
        assert netns.of_cgroup(leaf, ns.ino) is None  # nobody in it
        # A process in the cgroup and the netns (as the agent is), and one in the cgroup only.
        proc = subprocess.Popen(["nsenter", f"--net={ns.path}", "sleep", "30"])
        outsider = subprocess.Popen(["sleep", "30"])
        try:
            for pid in (outsider.pid, proc.pid):
                with open(os.path.join(leaf, "cgroup.procs"), "w") as f:
                    f.write(str(pid))
            for _ in range(200):  # nsenter has entered the netns (then exec'd sleep)
                if os.stat(f"/proc/{proc.pid}/ns/net").st_ino == ns.ino:
                    break
                time.sleep(0.05)
            found = netns.of_cgroup(leaf, ns.ino)
            assert found is not None and found.ino == ns.ino
            found.close()
            assert netns.of_cgroup(leaf, ns.ino + 1) is None  # another namespace's inode
        finally:
            outsider.kill()
            outsider.wait()
    finally:
        ns.close()
        if proc is not None:
            proc.kill()
            proc.wait()
        cgroup.kill_and_remove(leaf)


def test_a_named_netns_an_older_version_left_is_listed_and_removed():
    name = "gw-test-legacy" + os.urandom(3).hex()
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        assert name in netns.list_named()
    finally:
        netns.remove_named(name)
    assert name not in netns.list_named() and not os.path.exists(os.path.join(netns.NETNS_DIR, name))
    netns.remove_named(name)  # a missing one is fine
