"""The run's network namespace, made without a netlink library (gatewrap.sandbox.netns)."""

from __future__ import annotations

import os
import subprocess

import pytest

from gatewrap.errors import SandboxError
from gatewrap.sandbox import netns

pytestmark = pytest.mark.kernel


def test_a_new_netns_has_only_lo_up_with_both_loopback_addresses_and_goes_away():
    name = "gw-test" + os.urandom(3).hex()
    path = netns.create(name)
    try:
        assert path == netns.path_of(name) and name in netns.list_gatewrap()
        # nsenter enters the netns only: `ip -n` also remounts / as a slave, which fails where /
        # is not a mount point (a chroot, as tools/fresh-debian's).
        links = subprocess.run(["nsenter", f"--net={path}", "ip", "-o", "link"], capture_output=True, text=True, check=True).stdout
        assert len(links.splitlines()) == 1 and "lo:" in links and ",UP" in links, links
        addrs = subprocess.run(["nsenter", f"--net={path}", "ip", "-o", "addr"], capture_output=True, text=True, check=True).stdout
        assert "127.0.0.1/8" in addrs and "::1/128" in addrs, addrs
        # Another netns than gatewrap's own.
        assert os.stat(path).st_ino != os.stat("/proc/self/ns/net").st_ino
    finally:
        netns.remove(name)
    assert not os.path.exists(path) and name not in netns.list_gatewrap()
    netns.remove(name)  # a missing one is fine


def test_a_name_in_use_is_refused_and_the_existing_one_stays():
    name = "gw-test" + os.urandom(3).hex()
    path = netns.create(name)
    try:
        with pytest.raises(SandboxError, match="cannot create network namespace"):
            netns.create(name)
        assert os.path.exists(path)
    finally:
        netns.remove(name)
