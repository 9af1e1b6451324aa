"""Attacks on TLS inspection that once worked (or still do: strict xfail, with the fault):
the audit log must say what reached upstream, the CA key must stay out of the agent's
reach, and the CA directory must not be loosened or taken over by a local user."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from gatewrap import _gate_core as core
from fakenet import in_netns

pytestmark = pytest.mark.kernel

#: A TLS server in the fake internet that logs the head of each request it gets and how
#: many bytes followed, and never answers (what an upstream sees of a request).
LOGGING_SERVER = r"""
import socket, ssl, sys, threading
cert, key, log, port = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(cert, key)
s = socket.socket(socket.AF_INET6)
s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("::", port)); s.listen(16)
def one(c):
    t = ctx.wrap_socket(c, server_side=True)
    first = t.recv(65536)
    n = len(first)
    with open(log, "a") as f:
        f.write(first.split(b"\r\n")[0].decode("latin-1") + "\n")
    while (x := t.recv(1 << 20)):
        n += len(x)
    with open(log, "a") as f:
        f.write(f"{n} bytes\n")
while True:
    threading.Thread(target=one, args=(s.accept()[0],), daemon=True).start()
"""

#: The agent: one inspected POST with a chunked body of 17 MiB (over the 16 MiB limit).
CHUNKED_AGENT = r"""
import socket, ssl
s = socket.create_connection(("127.0.0.1", 3128), timeout=30)
s.sendall(b"CONNECT allowed.test:9451 HTTP/1.1\r\nHost: allowed.test:9451\r\n\r\n")
s.recv(1000)
s = ssl.create_default_context().wrap_socket(s, server_hostname="allowed.test")
s.sendall(b"POST /upload HTTP/1.1\r\nHost: allowed.test:9451\r\nTransfer-Encoding: chunked\r\n\r\n")
try:
    for _ in range(17):
        s.sendall(b"100000\r\n" + b"x" * (1 << 20) + b"\r\n")
    s.sendall(b"0\r\n\r\n")
    print(s.recv(2000).decode("latin-1").split("\r\n")[0])
except OSError as e:
    print("ERR", e)
"""


def test_a_streamed_body_over_the_limit_is_recorded_as_reaching_upstream(gatewrap, net, tmp_path):
    log = os.path.join(net.tmpdir, "upstream-heads.log")
    server = subprocess.Popen([*in_netns(net.netns), sys.executable, "-c", LOGGING_SERVER,
                               net.pki.server_cert, net.pki.server_key, log, "9451"])
    policy = tmp_path / "policy.toml"
    policy.write_text('[[rule]]\nhost = "allowed.test"\nports = [9451]\naction = "allow"\ninspect = true\n')
    try:
        time.sleep(1)
        r = gatewrap(python=CHUNKED_AGENT, extra=["--policy", str(policy), "--upstream-ca", net.ca_path,
                                                  "--ca-dir", str(tmp_path / "ca")], timeout=120)
        time.sleep(0.5)
    finally:
        server.kill()
        server.wait()
    # The agent sees the 413, or a reset if the gate closes while it is still sending.
    assert r.stdout.startswith(("HTTP/1.1 413", "ERR")), r.stdout + r.stderr
    with open(log) as f:
        seen = f.read().splitlines()
    assert seen[0] == "POST /upload HTTP/1.1", seen  # the request reached upstream ...
    # ... with part of its body: how much of the first 16 MiB is in flight when the gate cuts
    # the stream varies from run to run
    assert int(seen[1].split()[0]) > 1024 * 1024, seen
    (rec,) = r.records(event="request", proto="https")
    # ... so the log must not say it was denied (nothing would have left).
    assert (rec["decision"], rec["status"]) == ("allowed", 413), rec
    assert rec["error"] == ("limit: request body over 16777216 bytes; its head and up to 16777216 bytes of its "
                            "body were sent upstream"), rec


#: Where a host install keeps its CA (the escape suite's test_ca_key makes it).
DEFAULT_CA_DIR = "/var/lib/gatewrap/ca"


def test_a_root_agent_without_the_jail_cannot_read_the_default_ca_key_when_the_run_uses_another(gatewrap, tmp_path):
    core.ensure_ca(DEFAULT_CA_DIR)
    policy = tmp_path / "policy.toml"
    policy.write_text('[[rule]]\nhost = "allowed.test"\naction = "allow"\ninspect = true\n')
    code = f"""
import json
for p in ("{DEFAULT_CA_DIR}/private/ca.key", "{tmp_path}/ca/private/ca.key"):
    try:
        print(json.dumps([p, len(open(p).read())]))
    except OSError as e:
        print(json.dumps([p, e.strerror]))
"""
    r = gatewrap(["/usr/bin/python3", "-c", code], user_env=False,
                 extra=["--policy", str(policy), "--ca-dir", str(tmp_path / "ca"), "--user", "root", "--jail", "none"])
    got = dict(json.loads(x) for x in r.stdout.splitlines())
    assert got == {f"{DEFAULT_CA_DIR}/private/ca.key": "Permission denied",
                   f"{tmp_path}/ca/private/ca.key": "Permission denied"}, r.stdout + r.stderr


def _mode(p) -> int:
    return os.lstat(p).st_mode & 0o7777


def test_a_world_writable_ca_dir_is_refused_not_chmodded(tmp_path):
    d = tmp_path / "shared"
    d.mkdir()
    os.chmod(d, 0o1777)
    with pytest.raises(core.GateError, match="writable by others"):
        core.ensure_ca(str(d))
    assert _mode(d) == 0o1777


def test_a_ca_dir_link_a_local_user_planted_does_not_loosen_its_target(tmp_path):
    victim = tmp_path / "victim"
    victim.mkdir(mode=0o700)
    os.chmod(victim, 0o700)
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    link = shared / "ca"
    link.symlink_to(victim)
    os.lchown(link, 65534, 65534)
    with pytest.raises(core.GateError):
        core.ensure_ca(str(link))
    assert _mode(victim) == 0o700


def test_a_key_directory_owned_by_another_user_is_refused(tmp_path):
    d = tmp_path / "ca"
    (d / "private").mkdir(parents=True)
    os.chown(d, 65534, 65534)
    os.chown(d / "private", 65534, 65534)
    with pytest.raises(core.GateError, match="not owned by root"):
        core.ensure_ca(str(d))
