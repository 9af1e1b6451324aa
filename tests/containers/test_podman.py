"""podman with ``--runtime gatewrap-oci``: the container's egress passes the gate, on the real
kernel, against the fake internet (issue 22)."""

from __future__ import annotations

import os
import subprocess

import pytest

from containers.conftest import PODMAN_RUN_FLAGS, podman_base, podman_gatewrap

pytestmark = pytest.mark.kernel

#: What the container runs: an allowed fetch, a denied one, a direct connect; one line each.
PROBE = r"""
import socket, subprocess
def fetch(url):
    return subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", url],
                          capture_output=True, text=True).stdout
print("allowed", fetch("http://allowed.test/"))
print("denied", fetch("http://denied.test/"))
s = socket.socket()
s.settimeout(5)
try:
    s.connect(("198.51.100.148", 80))
    print("direct connected")
except OSError as e:
    print("direct errno", e.errno)
try:
    socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)
    print("vsock made")
except OSError as e:
    print("vsock refused")
"""
EPERM = 1


def assert_nothing_left(c) -> None:
    """No cgroup, registry entry, staged shims or container of ``c`` remain."""
    assert not os.path.exists(f"/sys/fs/cgroup/unified/gatewrap/{c.run_id}")
    assert not os.path.exists(f"/run/gatewrap/runs/{c.run_id}.lock")
    assert not [d for d in os.listdir("/run/gatewrap-staged") if d.startswith(c.run_id)]
    ps = subprocess.run([*podman_base(), "ps", "-a", "-q", "--no-trunc"], capture_output=True, text=True)
    assert c.id not in ps.stdout


@pytest.mark.parametrize("network", ["none", "host"], ids=["network none", "network host gets the gate's netns"])
def test_a_container_reaches_allowed_hosts_through_the_gate_only(podman, network):
    c = podman("--network", network, "--annotation", "gatewrap.allow=allowed.test",
               cmd=["python3", "-c", PROBE])
    assert c.returncode == 0, c.stderr
    assert c.stdout.split("\n")[:4] == ["allowed 200", "denied 403", f"direct errno {EPERM}", "vsock refused"]
    start, = c.records(event="run_start")
    assert start["container"] == {"id": c.id, "policy": "annotations gatewrap.allow=allowed.test"}
    allowed, = c.records(event="request", dst_host="allowed.test")
    assert (allowed["decision"], allowed["rule"]) == ("allowed", "--allow allowed.test")
    denied, = c.records(event="request", dst_host="denied.test")
    assert (denied["decision"], denied["reason"]) == ("denied", "policy: default deny")
    direct, = c.records(event="direct_egress")
    assert (direct["decision"], direct["reason"], direct["dst_port"]) == ("denied", "kernel: not the gate", 80)
    end, = c.records(event="run_end")
    assert end["reason"] == "the container was deleted (gatewrap-oci delete)"
    assert_nothing_left(c)


def test_a_container_without_annotations_gets_the_default_deny_said_in_its_first_record(podman):
    c = podman("--network", "none", cmd=["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "http://allowed.test/"])
    assert c.stdout == "403"
    first = next(r for r in c.records())
    assert first["event"] == "run_start"
    assert first["container"]["policy"].startswith("default (deny everything)")
    assert "unix_sockets" not in first["container"]  # none named


def test_a_policy_file_named_by_annotation_is_the_runs_policy(podman, tmp_path):
    policy = tmp_path / "policy.toml"
    policy.write_text('version = 1\ndefault = "deny"\n[[rule]]\nhost = "allowed.test"\naction = "allow"\n')
    c = podman("--network", "none", "--annotation", f"gatewrap.policy={policy}",
               cmd=["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "http://allowed.test/"])
    assert c.stdout == "200", c.stderr
    allowed, = c.records(event="request", dst_host="allowed.test")
    assert allowed["decision"] == "allowed"


def test_a_policy_file_others_may_write_is_refused(podman, tmp_path):
    policy = tmp_path / "policy.toml"
    policy.write_text('version = 1\ndefault = "allow"\n')
    policy.chmod(0o666)
    c = podman("--network", "none", "--annotation", f"gatewrap.policy={policy}", cmd=["true"])
    assert c.returncode != 0
    assert "writable by root alone" in c.stderr


@pytest.mark.parametrize("flags, why", [
    (["--privileged"], "capabilities beyond the default set"),
    (["--cap-add", "SYS_ADMIN"], "CAP_SYS_ADMIN"),
    (["-v", "/sys/fs/bpf:/mnt"], "bind mount of the host's /sys/fs/bpf"),
    (["-v", "/run:/mnt"], "bind mount of the host's /run"),
], ids=["privileged", "cap-add SYS_ADMIN", "bpffs bound in", "host /run bound in"])
def test_a_container_that_could_undo_its_sandbox_is_refused_before_it_starts(podman, flags, why):
    c = podman("--network", "none", *flags, cmd=["true"])
    assert c.returncode != 0
    assert why in c.stderr
    assert c.records() == []


VSOCK = ("import socket\ntry:\n    socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)\n    print('made')\n"
         "except OSError as e:\n    print(e.errno)")


@pytest.mark.parametrize("flags, errno", [
    ([], 38),  # podman's profile: its default action, ENOSYS
    (["--security-opt", "seccomp=unconfined"], 97),  # gatewrap's profile: EAFNOSUPPORT
    (["--cap-add", "AUDIT_WRITE"], 38),  # podman's profile with its unconditional socket rule
], ids=["podman's profile", "no profile", "podman's profile with CAP_AUDIT_WRITE"])
def test_af_vsock_which_no_hook_sees_is_refused_by_the_seccomp_profile(podman, flags, errno):
    c = podman("--network", "none", *flags, cmd=["python3", "-c", VSOCK])
    assert c.returncode == 0, c.stderr
    assert c.stdout.strip() == str(errno)


#: unshare(1) of a user namespace, then a thread (clone3 refused with ENOSYS: glibc falls back to clone).
USERNS = ("unshare --user true 2>/dev/null; echo \"unshare $?\"; "
          "python3 -c \"import threading; t = threading.Thread(target=print, args=('thread',)); t.start(); t.join()\"")


@pytest.mark.parametrize("flags", [[], ["--security-opt", "seccomp=unconfined"]], ids=["podman's profile", "no profile"])
def test_a_container_makes_no_user_namespace_of_its_own_and_its_threads_still_start(podman, flags):
    c = podman("--network", "none", *flags, cmd=["sh", "-c", USERNS])
    assert c.returncode == 0, c.stderr
    assert c.stdout.split("\n")[:2] == ["unshare 1", "thread"], c.stdout


def test_a_host_unix_socket_named_by_annotation_is_bound_in(podman, tmp_path):
    import socket
    import threading
    tmp_path.chmod(0o755)
    path = tmp_path / "daemon.sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.listen(1)
    server.settimeout(30)
    heard = []
    t = threading.Thread(target=lambda: heard.append(server.accept()[0].recv(100)), daemon=True)
    t.start()
    try:
        c = podman("--network", "none", "--annotation", f"gatewrap.unix_sockets={path}", "-v", f"{path}:/run/d.sock",
                   cmd=["python3", "-c", "import socket; s = socket.socket(socket.AF_UNIX); s.connect('/run/d.sock'); "
                        "s.send(b'hello')"])
    finally:
        t.join(10)
        server.close()
    assert c.returncode == 0, c.stderr
    assert heard == [b"hello"]
    start, = c.records(event="run_start")  # what the container was let bind is on the record
    assert start["container"]["unix_sockets"] == [str(path)], start


def test_a_process_podman_exec_starts_gets_the_containers_proxy_and_reaches_allowed_hosts(podman):
    """podman exec passes runc a process file built from podman's own record of the container,
    without gatewrap's variables: gatewrap-oci adds those it lacks (a new user's exec'd curl
    could not resolve an allowed host); what the exec sets itself stays."""
    c = podman("-d", "--network", "none", "--annotation", "gatewrap.allow=allowed.test", cmd=["sleep", "60"])
    assert c.returncode == 0, c.stderr
    try:
        p = subprocess.run([*podman_base(), "exec", "-e", "NO_PROXY=mine.test", c.id, "sh", "-c",
                            'echo "$http_proxy $NO_PROXY"; curl -s -o /dev/null -w "%{http_code}\\n" http://allowed.test/'],
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stderr
        proxy, code = p.stdout.split("\n")[:2]
        assert proxy.startswith("http://127.0.0.1:") and proxy.endswith(" mine.test"), proxy
        assert code == "200"
        assert c.records(event="request", dst_host="allowed.test")
    finally:
        subprocess.run([*podman_base(), "rm", "-f", "-t", "0", c.id], capture_output=True, timeout=60)


def test_a_breakpoint_holds_a_containers_request_until_it_is_approved(podman, tmp_path):
    """An ``ask`` rule of the container's policy holds its request in the approvals store
    (the host's default, as the daemon's runs use) until a decision, as for gatewrap run."""
    import time

    from gatewrap._gate_core import ApprovalStore
    from gatewrap.approvals.state import DEFAULT_STATE

    policy = tmp_path / "ask.toml"
    policy.write_text('[[rule]]\nhost = "allowed.test"\naction = "ask"\ntimeout = "60s"\nhold = "wait"\n')
    c = podman("-d", "--network", "none", "--annotation", f"gatewrap.policy={policy}",
               cmd=["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}\\n", "--max-time", "90", "http://allowed.test/"], rm=False)
    assert c.returncode == 0, c.stderr
    try:
        store = ApprovalStore(DEFAULT_STATE)
        deadline = time.monotonic() + 30
        while not (mine := [a for a in store.list(status="pending") if a.get("run_id") == c.run_id]):
            assert time.monotonic() < deadline, "no pending approval of the container's run"
            time.sleep(0.1)
        a, = mine
        store.decide(a["id"], version=a["version"], digest=a["digest"], verdict="approve", by="tester")
        waited = subprocess.run([*podman_base(), "wait", c.id], capture_output=True, text=True, timeout=90)
        logs = subprocess.run([*podman_base(), "logs", c.id], capture_output=True, text=True, timeout=30)
        assert (waited.stdout.strip(), logs.stdout.strip()) == ("0", "200")
        events = [r["event"] for r in c.records() if r["event"].startswith("approval")]
        assert events[:1] == ["approval_asked"] and len(events) >= 2, events
    finally:
        subprocess.run([*podman_base(), "rm", "-f", "-t", "0", c.id], capture_output=True, timeout=60)


#: A denied fetch through the gate (curl prints its 403's body), then a direct connect (the
#: Python shim's message), each as the agent gets it.
TOLD = ["sh", "-c", "curl -s http://denied.test/; python3 -c 'import socket\ntry:\n"
        "    socket.create_connection((\"198.51.100.148\", 80), timeout=5)\nexcept OSError as e:\n    print(e)'"]


def test_a_containers_refusals_say_how_a_container_allows_a_host_not_gatewrap_runs_flags(podman):
    c = podman("--network", "none", "--annotation", "gatewrap.allow=allowed.test", cmd=TOLD)
    assert c.returncode == 0, c.stderr
    body, told = c.stdout.split("[Errno 1] ")
    assert body.startswith("gatewrap: egress to denied.test:80 was denied (default deny).\n"), body
    assert ("To allow it, create the container with the annotation gatewrap.allow=denied.test:80 (or its "
            "runtime with --gatewrap-allow=denied.test:80) or add to its policy file (annotation gatewrap.policy):") in body
    assert "egress to 198.51.100.148:80 was blocked by gatewrap" in told
    assert ("with the host allowed there (the container's annotation gatewrap.allow=HOST, or its runtime's "
            "--gatewrap-allow=HOST)") in told
    for text in (body, told):
        assert "gatewrap run" not in text and "--allow" not in text, text


@pytest.mark.parametrize("audit", ["/sys/gatewrap-audit.jsonl", "/proc/1/gatewrap/audit.jsonl"],
                         ids=["a file that cannot be made", "a folder that cannot be made"])
def test_an_audit_log_the_runtime_cannot_open_is_said_with_the_runtimes_flag_not_gatewrap_runs(
        net, oci_daemon, podman_image, audit):
    p = subprocess.run([*podman_gatewrap(oci_daemon, net, audit), "run", "--rm", *PODMAN_RUN_FLAGS, "--network", "none",
                        podman_image, "true"], capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and os.path.dirname(audit) in p.stderr, p.stderr
    assert "--gatewrap-audit-log" in p.stderr and " --audit-log" not in p.stderr, p.stderr
