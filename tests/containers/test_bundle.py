"""What gatewrap-oci checks and changes in a bundle's config.json (no kernel, no engine)."""

from __future__ import annotations

import copy

import pytest

from gatewrap.oci import argv, bundle

DEFAULT_CAPS = sorted(bundle.DEFAULT_CAPS)


def config(caps=DEFAULT_CAPS, mounts=(), seccomp=None):
    return {"process": {"capabilities": {"bounding": list(caps), "effective": list(caps)}},
            "mounts": list(mounts), "linux": {"namespaces": [{"type": "pid"}, {"type": "mount"}],
                                              **({"seccomp": seccomp} if seccomp else {})}}


@pytest.mark.parametrize("cfg, systemd, expected", [
    (config(), False, None),
    (config(caps=[*DEFAULT_CAPS, "CAP_SYS_ADMIN"]), False, "CAP_SYS_ADMIN"),
    (config(caps=[*DEFAULT_CAPS, "CAP_BPF"]), False, "CAP_BPF"),
    (config(mounts=[{"destination": "/x", "type": "bind", "source": "/", "options": ["rbind"]}]), False, "host's /"),
    (config(mounts=[{"destination": "/x", "type": "bind", "source": "/run/gatewrap/runs", "options": ["rbind"]}]), False,
     "/run/gatewrap/runs"),
    (config(mounts=[{"destination": "/x", "type": "bind", "source": "/srv/data", "options": ["rbind"]}]), False, None),
    (config(mounts=[{"destination": "/b", "type": "bpf", "source": "bpf"}]), False, "a bpf mount"),
    (config(), True, "--systemd-cgroup"),
    (config(seccomp={"defaultAction": "SCMP_ACT_TRACE"}), False, "default action is SCMP_ACT_TRACE"),
    (config(seccomp={"defaultAction": "SCMP_ACT_LOG"}), False, "default action is SCMP_ACT_LOG"),
    (config(seccomp={"defaultAction": "SCMP_ACT_ERRNO"}), False, None),
], ids=["default caps pass", "SYS_ADMIN refused", "BPF refused", "host root bound refused",
        "gatewrap runs folder bound refused", "another folder bound passes", "bpffs mount refused",
        "systemd cgroups refused", "a seccomp default of TRACE refused (a tracer of its own lets every call run)",
        "a seccomp default of LOG refused", "a seccomp default that refuses passes"])
def test_a_container_that_could_undo_its_sandbox_is_refused(cfg, systemd, expected):
    got = bundle.refusals(cfg, systemd_cgroup=systemd)
    if expected is None:
        assert got == []
    else:
        assert len(got) == 1 and expected in got[0]


def test_confine_replaces_the_network_namespace_and_the_engines_resolv_conf():
    cfg = {"linux": {"namespaces": [{"type": "pid"}, {"type": "network", "path": "/run/netns/engine"}]},
           "process": {"env": ["PATH=/bin", "PYTHONPATH=/app"]},
           "mounts": [{"destination": "/etc/resolv.conf", "type": "bind", "source": "/engine/resolv.conf"}]}
    bundle.confine(cfg, "/proc/1/fd/7", "/gatewrap/gw-x", {"PYTHONPATH": "/shim", "HTTP_PROXY": "http://127.0.0.1:3128"},
                   [("/staged/resolv.conf", "/etc/resolv.conf")])
    assert cfg["linux"]["namespaces"] == [{"type": "pid"}, {"type": "network", "path": "/proc/1/fd/7"}]
    assert cfg["linux"]["cgroupsPath"] == "/gatewrap/gw-x"
    assert cfg["process"]["env"] == ["PATH=/bin", "PYTHONPATH=/shim:/app", "HTTP_PROXY=http://127.0.0.1:3128"]
    assert cfg["mounts"] == [{"destination": "/etc/resolv.conf", "type": "bind", "source": "/staged/resolv.conf",
                              "options": ["rbind", "ro", "nosuid", "nodev"]}]


def allowed(cfg, family, protocol=0):
    """What the rewritten profile answers socket(family, _, protocol), evaluated as seccomp
    would for rules of one comparison per argument: ALLOW if an allowing rule matches."""
    prof = cfg["linux"]["seccomp"]
    values = {0: family, 2: protocol}
    for r in prof["syscalls"]:
        if "socket" in r["names"] and all(bundle._holds(a, values.get(a["index"], 0)) for a in r.get("args") or []):
            return r["action"] == "SCMP_ACT_ALLOW"
    return prof["defaultAction"] == "SCMP_ACT_ALLOW"


PODMAN = {"defaultAction": "SCMP_ACT_ERRNO", "syscalls": [
    {"names": ["socket"], "action": "SCMP_ACT_ERRNO", "errnoRet": 22,
     "args": [{"index": 0, "value": 16, "op": "SCMP_CMP_EQ"}, {"index": 2, "value": 9, "op": "SCMP_CMP_EQ"}]},
    {"names": ["socket"], "action": "SCMP_ACT_ALLOW", "args": [{"index": 2, "value": 9, "op": "SCMP_CMP_NE"}]},
    {"names": ["socket"], "action": "SCMP_ACT_ALLOW", "args": [{"index": 0, "value": 16, "op": "SCMP_CMP_NE"}]},
    {"names": ["read", "socket", "socketcall"], "action": "SCMP_ACT_ALLOW"}]}


@pytest.mark.parametrize("family, protocol, expected", [
    (40, 0, False), (2, 0, True), (10, 0, True), (1, 0, True), (16, 0, True), (16, 9, False), (2, 9, True)],
    ids=["vsock refused", "inet kept", "inet6 kept", "unix kept", "netlink kept", "netlink audit still refused",
         "inet protocol 9 kept"])
def test_the_engines_profile_is_narrowed_to_refuse_af_vsock_only(family, protocol, expected):
    cfg = bundle.seal_vsock({"linux": {"seccomp": {**PODMAN, "syscalls": [dict(r) for r in PODMAN["syscalls"]]}}})
    assert allowed(cfg, family, protocol) is expected
    assert not any("socketcall" in r["names"] and r["action"] == "SCMP_ACT_ALLOW" for r in cfg["linux"]["seccomp"]["syscalls"])


def test_a_container_without_a_profile_gets_one_refusing_af_vsock_and_socketcall():
    cfg = bundle.seal_vsock({"linux": {}})
    assert not allowed(cfg, 40) and allowed(cfg, 2)
    assert {"names": ["socketcall"], "action": "SCMP_ACT_ERRNO", "errnoRet": 97} in cfg["linux"]["seccomp"]["syscalls"]


@pytest.mark.parametrize("line, runc_globals, command, settings", [
    (["--root", "/r", "--log=/l", "--gatewrap-socket", "/run/gatewrap/x.sock", "create", "--bundle", "/b", "id1"],
     ["--root", "/r", "--log=/l"], "create", {"socket": "/run/gatewrap/x.sock"}),
    (["--gatewrap-allow=a.test,b.test", "--gatewrap-allow=c.test", "--systemd-cgroup", "delete", "id1"],
     ["--systemd-cgroup"], "delete", {"allow": ["a.test,b.test", "c.test"]}),
], ids=["valued flags both ways", "repeated flags and a switch"])
def test_gatewraps_flags_are_taken_out_of_runcs_command_line(line, runc_globals, command, settings):
    got = argv.split(line)
    assert (got.runc_globals, got.command) == (runc_globals, command)
    assert {k: v for k, v in got.gatewrap.items() if v} == settings


def test_create_finds_the_bundle_and_the_container_id():
    assert argv.create_args(["--bundle", "/b", "--pid-file", "/p", "--console-socket=/c", "id1"]) == ("/b", "id1")


@pytest.mark.parametrize("resources, expected", [
    (None, {"pids": None, "memory": None}),
    ({"pids": {"limit": 2048}}, {"pids": 2048, "memory": None}),
    ({"pids": {"limit": -1}, "memory": {"limit": 0}}, {"pids": None, "memory": None}),
    ({"pids": {"limit": 100}, "memory": {"limit": 268435456, "swap": 536870912}}, {"pids": 100, "memory": 268435456}),
    ({"pids": {"limit": True}, "memory": {"limit": "1g"}}, {"pids": None, "memory": None}),
], ids=["none set", "podman's default pids", "unlimited is none", "both set", "not numbers: none"])
def test_the_bounds_an_engine_set_are_read_from_linux_resources(resources, expected):
    cfg = {"linux": {"resources": resources}} if resources is not None else {}
    assert bundle.engine_bounds(cfg) == expected


def test_a_containers_run_gets_the_engines_bounds_and_a_runs_defaults_for_the_rest():
    from gatewrap.entry import DEFAULT_MEMORY, DEFAULT_PIDS
    from gatewrap.oci.runs import bounds_of
    from gatewrap.sizes import parse_count, parse_memory

    got = bounds_of({"pids": 2048, "memory": None})
    assert (got.pids, got.memory) == (2048, parse_memory(DEFAULT_MEMORY))
    got = bounds_of(None)
    assert (got.pids, got.memory) == (parse_count(DEFAULT_PIDS), parse_memory(DEFAULT_MEMORY))


@pytest.mark.parametrize("notes, refused", [
    ({"gatewrap.allow": "a.test", "gatewrap.policy": "/etc/p.toml", "io.podman.x": "1"}, None),
    ({"gatewrap.alow": "a.test"}, "gatewrap.alow"),
    ({"gatewrap.allow": "a.test", "gatewrap.Policy": "/etc/p.toml"}, "gatewrap.Policy"),
], ids=["gatewrap's two and an engine's own pass", "a misspelt allow refused", "a wrongly cased policy refused"])
def test_an_annotation_gatewrap_does_not_know_is_refused_not_ignored(notes, refused):
    """A misspelt ``gatewrap.*`` annotation would leave the container the default policy
    without a word (a new user's report): refused, naming it."""
    got = bundle.refusals({**config(), "annotations": notes})
    assert (got == []) if refused is None else (len(got) == 1 and refused in got[0])


def test_privileged_block_devices_are_named_up_to_three_then_counted():
    devices = [{"type": "b", "path": f"/dev/loop{i}", "major": 7, "minor": i} for i in range(40)]
    got = bundle.refusals({**config(), "linux": {**config()["linux"], "devices": devices}})
    assert len(got) == 1 and "/dev/loop0, /dev/loop1, /dev/loop2 and 37 more" in got[0] and len(got[0]) < 200


def test_a_misspelt_gatewrap_flag_is_refused_with_the_one_meant():
    with pytest.raises(argv.UsageError, match=r"unknown flag --gatewrap-alow \(did you mean --gatewrap-allow\?\)"):
        argv.split(["--gatewrap-alow=a.test", "create", "x"])


def test_the_runtimes_own_refusals_reach_runcs_log_and_exit_125(tmp_path):
    """The engines show a runtime's error from runc's --log (docker: log.json), not stderr."""
    import json
    import subprocess

    from containers.conftest import OCI

    log = tmp_path / "log.json"
    for args, said in [(["--gatewrap-alow=a.test"], "did you mean --gatewrap-allow"),
                       (["--gatewrap-runc", str(tmp_path / "crun")], "no such program")]:
        p = subprocess.run([OCI, "--log", str(log), "--log-format", "json", *args, "state", "x"],
                           capture_output=True, text=True)
        assert p.returncode == 125 and said in p.stderr and "Traceback" not in p.stderr
        assert said in json.loads(log.read_text().splitlines()[-1])["msg"]


def test_a_policy_file_that_does_not_exist_is_said_so_not_with_strerror():
    """podman reads "No such file or directory" in a runtime's error as its command missing
    (exit 127, "OCI runtime attempted to invoke a command that was not found")."""
    from gatewrap.errors import GatewrapError
    from gatewrap.oci import runs

    with pytest.raises(GatewrapError, match="the policy file /nonexistent/p.toml does not exist") as e:
        runs.checked_policy_file("/nonexistent/p.toml")
    assert "No such file" not in str(e.value)


def test_a_container_runs_end_reads_without_an_exit_code_it_does_not_have():
    """A container's run_end has no exit_code (only its engine knows it): the text line says
    none, not "exit None" (a new user's report)."""
    from gatewrap.audit_format import who_why

    end = {"event": "run_end", "run": "gw-c", "reason": "the container was deleted (gatewrap-oci delete)",
           "allowed": 1, "denied": 2}
    assert "exit" not in who_why(end) and "1 allowed, 2 denied" in who_why(end)
    assert "exit 3: 1 allowed" in who_why({**end, "exit_code": 3})


def test_a_policy_file_named_by_the_runtimes_flag_is_said_so_in_its_errors():
    from gatewrap.errors import GatewrapError
    from gatewrap.oci import runs

    with pytest.raises(GatewrapError, match="^--gatewrap-policy: the policy file /nonexistent/p.toml does not exist"):
        runs.checked_policy_file("/nonexistent/p.toml", "--gatewrap-policy")


def answer(cfg, name, flags=0):
    """What the rewritten profile answers syscall ``name`` with ``flags`` as its flags argument:
    the action (and errno) of the rules that match, which must agree, else the default."""
    prof = cfg["linux"]["seccomp"]
    got = {(r["action"], r.get("errnoRet")) for r in prof["syscalls"] if name in r["names"]
           and all(bundle._holds(a, flags) for a in r.get("args") or [])}
    assert len(got) <= 1, got
    return got.pop() if got else (prof["defaultAction"], prof.get("defaultErrnoRet"))


ALLOW = ("SCMP_ACT_ALLOW", None)
EPERM = ("SCMP_ACT_ERRNO", 1)
#: podman 4.3's profile as the bundle has it: clone, clone3 and unshare in its big allow rule
PODMAN_NS = {"defaultAction": "SCMP_ACT_ERRNO", "defaultErrnoRet": 38,
             "syscalls": [{"names": ["read", "clone", "clone3", "unshare", "socket"], "action": "SCMP_ACT_ALLOW"}]}
#: Docker's for a container without CAP_SYS_ADMIN (moby profiles/seccomp/default.json)
DOCKER_NS = {"defaultAction": "SCMP_ACT_ERRNO", "defaultErrnoRet": 1, "syscalls": [
    {"names": ["read", "socket"], "action": "SCMP_ACT_ALLOW"},
    {"names": ["clone"], "action": "SCMP_ACT_ALLOW", "args": [{"index": 0, "value": 2114060288, "valueTwo": 0,
                                                                "op": "SCMP_CMP_MASKED_EQ"}]},
    {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": 38}]}
THREAD = 0x3D0F00  # glibc's pthread_create flags (CLONE_VM|FS|FILES|SIGHAND|THREAD|SYSVSEM|SETTLS|...)


@pytest.mark.parametrize("profile", [None, PODMAN_NS, DOCKER_NS], ids=["no profile", "podman's", "docker's"])
@pytest.mark.parametrize("call, flags, expected", [
    ("clone", THREAD, ALLOW), ("clone", 0x11, ALLOW),
    ("clone", bundle.CLONE_NEWUSER, EPERM), ("clone", bundle.CLONE_NEWCGROUP | 0x11, EPERM),
    ("unshare", bundle.CLONE_NEWUSER | bundle.CLONE_NEWCGROUP | 0x20000, EPERM),
    ("clone3", 0, ("SCMP_ACT_ERRNO", 38)), ("read", 0, ALLOW)],
    ids=["a thread", "fork", "a user namespace", "a cgroup namespace", "unshare(user, cgroup, mount)",
         "clone3: ENOSYS, so glibc falls back to clone", "the rest unchanged"])
def test_the_profile_refuses_a_user_or_cgroup_namespace_of_the_containers_own(profile, call, flags, expected):
    seccomp = {} if profile is None else {"seccomp": {**profile, "syscalls": [dict(r) for r in profile["syscalls"]]}}
    cfg = bundle.seal_namespaces(bundle.seal_vsock({"linux": seccomp}))
    got = answer(cfg, call, flags)
    if expected == EPERM and profile is not None:
        assert got[0] == "SCMP_ACT_ERRNO", got  # the engine's default refusal (its errno)
    else:
        assert got == expected
    names = [n for r in cfg["linux"]["seccomp"]["syscalls"] for n in r["names"]]
    assert names.count("clone3") == 1


#: The actions under which a call does not run (config-linux.md, seccomp(2)).
REFUSING = {"SCMP_ACT_ERRNO", "SCMP_ACT_TRAP", "SCMP_ACT_KILL", "SCMP_ACT_KILL_THREAD", "SCMP_ACT_KILL_PROCESS"}
#: Engine profiles that let calls through by other actions than SCMP_ACT_ALLOW.
LETTING_THROUGH = {
    "LOG rules": {"defaultAction": "SCMP_ACT_ERRNO", "syscalls": [
        {"names": ["read", "socket"], "action": "SCMP_ACT_ALLOW"},
        {"names": ["clone", "clone3", "unshare"], "action": "SCMP_ACT_LOG"}]},
    "TRACE rules": {"defaultAction": "SCMP_ACT_ERRNO", "syscalls": [
        {"names": ["read"], "action": "SCMP_ACT_ALLOW"},
        {"names": ["clone", "clone3", "unshare", "socket"], "action": "SCMP_ACT_TRACE"}]},
    "NOTIFY rules under an ALLOW default": {"defaultAction": "SCMP_ACT_ALLOW", "listenerPath": "/run/x.sock", "syscalls": [
        {"names": ["clone", "unshare", "socket"], "action": "SCMP_ACT_NOTIFY"}]},
}


@pytest.mark.parametrize("profile", LETTING_THROUGH.values(), ids=LETTING_THROUGH.keys())
@pytest.mark.parametrize("call, flags, refused", [
    ("clone", THREAD, False), ("clone", bundle.CLONE_NEWUSER | 0x11, True),
    ("unshare", bundle.CLONE_NEWCGROUP, True), ("socket", bundle.AF_VSOCK, True), ("socket", 2, False)],
    ids=["a thread", "a user namespace", "a cgroup namespace", "AF_VSOCK", "AF_INET"])
def test_a_call_let_through_by_log_trace_or_notify_is_refused_as_one_let_through_by_allow(profile, call, flags, refused):
    """SCMP_ACT_LOG runs the call; SCMP_ACT_TRACE and SCMP_ACT_NOTIFY let a tracer or a
    listener run it (the tracer may be the container's own process)."""
    cfg = bundle.seal_namespaces(bundle.seal_vsock({"linux": {"seccomp": copy.deepcopy(profile)}}))
    assert (answer(cfg, call, flags)[0] in REFUSING) == refused, cfg["linux"]["seccomp"]


@pytest.mark.parametrize("named, deep, refused", [(None, True, True), (None, False, False), ("{sock}", True, False)],
                         ids=["a socket in a subfolder: refused", "no socket: bound", "the socket named: bound"])
def test_a_folder_holding_a_host_unix_socket_is_bound_in_only_when_the_annotation_names_it(tmp_path, named, deep, refused):
    import socket
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "file").write_text("x")
    sock = tmp_path / "a" / "b" / "daemon.sock"
    s = socket.socket(socket.AF_UNIX)
    if deep:
        s.bind(str(sock))
    cfg = config(mounts=[{"destination": "/var/run/d", "type": "bind", "source": str(tmp_path), "options": ["rbind"]}])
    if named is not None:
        cfg["annotations"] = {bundle.SOCKETS_ANNOTATION: named.format(sock=sock)}
    got = bundle.refusals(cfg)
    s.close()
    assert bool(got) == refused, got
    if refused:
        assert f"holds the host's unix socket {sock}" in got[0] and "gatewrap.unix_sockets" in got[0]


def test_unshare_of_a_mount_or_uts_namespace_alone_is_left_to_the_engines_profile():
    cfg = bundle.seal_namespaces(bundle.seal_vsock({"linux": {"seccomp": {**PODMAN_NS, "syscalls": [
        dict(r) for r in PODMAN_NS["syscalls"]]}}}))
    assert answer(cfg, "unshare", 0x20000 | 0x04000000) == ALLOW


@pytest.mark.parametrize("named, refused", [(None, True), ("{sock}", False), ("/elsewhere.sock, {sock}", False),
                                            ("/elsewhere.sock", True)],
                         ids=["not named: refused", "named", "named among others", "another named: refused"])
def test_a_host_unix_socket_is_bound_in_only_when_the_annotation_names_it(tmp_path, named, refused):
    import socket
    sock = tmp_path / "daemon.sock"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(sock))
    cfg = config(mounts=[{"destination": "/var/run/docker.sock", "type": "bind", "source": str(sock), "options": ["rbind"]}])
    if named is not None:
        cfg["annotations"] = {bundle.SOCKETS_ANNOTATION: named.format(sock=sock)}
    got = bundle.refusals(cfg)
    s.close()
    if refused:
        assert len(got) == 1 and f"unix socket {sock} at /var/run/docker.sock" in got[0] and "gatewrap.unix_sockets" in got[0]
    else:
        assert got == []
