"""The Python shim: a kernel refusal becomes a PermissionError that names gatewrap, existing
handlers still catch it, and the agent's own sitecustomize still runs."""

from __future__ import annotations

import os

import pytest

pytestmark = pytest.mark.kernel

AGENT = """
    import errno, socket
    for what, attempt in (("connect", lambda: socket.create_connection(("198.51.100.138", 7), timeout=2)),
                          ("sendto", lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", ("198.51.100.2", 53)))):
        try:
            attempt()
        except PermissionError as e:   # the handler an agent already has
            print(what, type(e).__name__, errno.errorcode[e.errno], "blocked by gatewrap" in str(e), "gatewrap audit --run gw-" in str(e))
"""


@pytest.mark.parametrize("jail", [[], ["--jail", "none", "--user", "root"]], ids=["in the jail", "without the jail"])
def test_a_kernel_refusal_raises_an_exception_that_names_gatewrap(gatewrap, jail):
    r = gatewrap(python=AGENT, extra=jail, user_env=not jail)
    assert r.stdout.splitlines() == ["connect EgressBlocked EPERM True True", "sendto EgressBlocked EPERM True True"], r.stderr


def test_the_agents_own_sitecustomize_still_runs(gatewrap, tmp_path):
    import shutil
    import tempfile

    own = tempfile.mkdtemp(prefix="gw-site-", dir="/tmp")  # pytest's tmp_path is closed to the agent
    try:
        os.chmod(own, 0o755)
        with open(os.path.join(own, "sitecustomize.py"), "w") as f:
            f.write("import builtins\nbuiltins.AGENT_SITE = 'ran'\n")
        r = gatewrap(python="print(AGENT_SITE)", env={"PYTHONPATH": own}, extra=["--ro-bind", own])
        assert r.stdout == "ran\n", r.stderr
    finally:
        shutil.rmtree(own)


def test_a_bind_the_agents_user_cannot_reach_is_refused(gatewrap, tmp_path):
    r = gatewrap(["/bin/true"], extra=["--ro-bind", str(tmp_path)])
    assert r.returncode == 125
    assert f"cannot reach {tmp_path}" in r.stderr


def test_an_eperm_on_a_non_inet_socket_is_not_blamed_on_gatewrap(gatewrap):
    r = gatewrap(python="""
        import socket
        s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)
        try:
            s.sendto(b"\\\\0" * 16, (0, 1))  # multicast to a netlink group needs privileges
        except PermissionError as e:
            print(type(e).__name__, "gatewrap" in str(e))
    """)
    assert r.stdout == "PermissionError False\n", r.stderr


def test_the_shim_on_the_path_twice_runs_once(gatewrap):
    r = gatewrap(python="""
        import os, subprocess, sys
        shim = os.environ["PYTHONPATH"].split(":")[0]
        os.symlink(shim, "/tmp/shimlink")
        env = dict(os.environ, PYTHONPATH=f"{shim}:/tmp/shimlink")
        p = subprocess.run([sys.executable, "-c", "print('ok')"], env=env, capture_output=True, text=True)
        print(p.stdout.strip(), "Error" in p.stderr)
    """)
    assert r.stdout == "ok False\n", r.stderr


def test_a_public_range_over_the_hosts_loopback_is_warned_about(gatewrap):
    r = gatewrap(["/bin/true"], extra=["--public-range", "127.0.0.0/8"])
    assert r.returncode == 0, r.stderr
    assert "--public-range 127.0.0.0/8 lets allowed names reach this host's own loopback services" in r.stderr
