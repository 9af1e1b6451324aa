"""Escape suite, processes and lifetime: children, threads and exec'd programs are held
like the agent; nothing of the agent outlives its run; if gatewrap dies the sandbox fails
closed, and ``gatewrap gc`` removes it."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import textwrap
import time

import pytest

from conftest import Run, gatewrap_cmd, in_new_pid_namespace

from .helpers import (assert_audited, assert_bounded, assert_nothing_reached, attempts, python_argv,
                      run_id_of, spawn)

pytestmark = pytest.mark.kernel

INET4, INET6, ECHO = "198.51.100.138", "2001:db8:100::10", 7
TCP4 = {"hook": "connect4", "dst_ip": INET4, "dst_port": ECHO, "proto": "tcp"}

CONNECT = f"attempt('connect', sock(V4, TCP).connect, ('{INET4}', {ECHO}))"

CHILDREN = {
    "a forked child process (no exec)": f"""
        print(json.dumps({{"agent": os.getpid()}}), flush=True)
        pid = os.fork()
        if pid == 0:
            print(json.dumps({{"child": os.getpid()}}), flush=True)
            {CONNECT}
            os._exit(0)
        os.waitpid(pid, 0)
    """,
    "a thread": f"""
        print(json.dumps({{"agent": os.getpid()}}), flush=True)
        t = threading.Thread(target=lambda: {CONNECT}); t.start(); t.join()
    """,
    "an exec'd bash using /dev/tcp": f"""
        os.execv("/bin/bash", ["bash", "-c",
            't0=$EPOCHREALTIME; msg=$( (exec 3<>/dev/tcp/{INET4}/{ECHO}) 2>&1 ); rc=$?; t1=$EPOCHREALTIME; '
            'echo "BASH $rc $t0 $t1 $msg"'])
    """,
}


def _bash_attempt(out: str) -> dict:
    line = next(x for x in out.splitlines() if x.startswith("BASH "))
    _, rc, t0, t1, msg = line.split(" ", 4)
    err = "EPERM" if "Operation not permitted" in msg else ("TIMEOUT" if "timed out" in msg else msg or None)
    return {"step": "bash /dev/tcp", "errno": None if rc == "0" else err,
            "elapsed": float(t1.replace(",", ".")) - float(t0.replace(",", "."))}


@pytest.mark.parametrize("how", list(CHILDREN), ids=list(CHILDREN))
def test_children_threads_and_execd_programs_are_refused(gatewrap, quiet_net, outcome, how):
    r = gatewrap(python_argv(CHILDREN[how]), timeout=30)
    a = _bash_attempt(r.stdout) if "bash" in how else attempts(r.stdout)[-1]
    outcome("connect4 (the cgroup is inherited)", f"{a['errno'] or 'connected'} (connect)",
            "OPEN" if a["errno"] is None else "held")
    assert a["errno"] == "EPERM", (a, r.stderr)
    assert_bounded(a)
    (rec,) = assert_audited(r, TCP4)
    ids = {k: v for line in r.stdout.splitlines() if line.startswith("{")
           for k, v in json.loads(line).items() if k in ("agent", "child")}
    if "thread" in how:
        assert rec["tid"] != rec["pid"], rec
    elif "bash" in how:
        assert rec["comm"] == "bash", rec
    else:
        assert "child" in ids and ids["child"] != ids["agent"], ids
    assert_nothing_reached(quiet_net)


def _run_procs(run_id: str) -> list[str]:
    """Live processes in the run's cgroup: not zombies, nor exiting already (PF_EXITING, 0x4
    in /proc/PID/stat's flags: a killed pid namespace's init finishes its exit after it has
    left its cgroup, once the kernel has reaped the rest of its namespace)."""
    procs = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if fields[0] == "Z" or int(fields[6]) & 0x4:
                continue
            with open(f"/proc/{p}/cgroup") as f:
                if f"/gatewrap/{run_id}" in f.read():
                    procs.append(p)
        except OSError:
            pass
    return procs


def _procs_with(token: str) -> list[str]:
    out = []
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                with open(f"/proc/{p}/cmdline", "rb") as f:
                    if token.encode() in f.read():
                        out.append(p)
            except OSError:
                pass
    return out


def test_a_double_forked_child_that_outlives_the_agent_is_gone_after_the_run(gatewrap, quiet_net, outcome):
    """a child that double-forks, calls setsid and outlives the agent."""
    token = f"gw-escape-orphan-{secrets.token_hex(4)}"
    r = gatewrap(python_argv(f"""
        r, w = os.pipe()
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                {CONNECT}
                os.write(w, b"x")
                os.execv("/bin/sh", ["sh", "-c", "sleep 300", "{token}"])
            os._exit(0)
        os.read(r, 1)   # the grandchild made its attempt; the agent exits, it lives on
    """), timeout=30)
    a = attempts(r.stdout)[-1]
    left = _procs_with(token) + _run_procs(r.run_id)
    outcome("cgroup.kill of the run's leaf at teardown",
            f"attempt: {a['errno'] or 'connected'}; after the run: "
            f"{'gone' if not left else 'STILL RUNNING: ' + ' '.join(left)}",
            "OPEN" if left or a["errno"] is None else "held")
    assert r.returncode == 0, r.stderr
    assert a["errno"] == "EPERM"
    assert_bounded(a)
    assert_audited(r, TCP4)
    assert left == []
    assert_nothing_reached(quiet_net)


@pytest.mark.own_process
def test_gatewrap_killed_with_sigkill_fails_closed_and_gc_removes_the_sandbox(tmp_path, quiet_net, outcome):
    """gatewrap killed with SIGKILL mid-run."""
    p, audit = spawn(tmp_path, quiet_net, python_argv(f"""
        print("ready", flush=True)
        sys.stdin.readline()
        attempt("gate v4", sock(V4, TCP).connect, ("127.0.0.1", 3128))
        attempt("gate v6", sock(V6, TCP).connect, ("::1", 3128))
        attempt("TCP v4", sock(V4, TCP).connect, ("{INET4}", {ECHO}))
        attempt("TCP v6", sock(V6, TCP).connect, ("{INET6}", {ECHO}))
        attempt("UDP sendto", sock(V4, UDP).sendto, b"x", ("{INET4}", {ECHO}))
        print("done", flush=True)
        sys.stdin.readline()   # stay alive until the test is done (gc must kill us)
    """), stdin=subprocess.PIPE)
    try:
        assert p.stdout.readline() == "ready\n", p.stderr.read()
        run_id = run_id_of(audit)
        p.kill()
        p.wait(timeout=10)
        p.stdin.write("go\n")
        p.stdin.flush()
        lines = []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            line = p.stdout.readline()
            if not line or line == "done\n":
                break
            lines.append(line)
        got = attempts("".join(lines))
        before_gc = _run_procs(run_id)
        g = subprocess.run(gatewrap_cmd("gc", "--json"), capture_output=True, text=True, timeout=30)
        after_gc = _run_procs(run_id)
        netns_left = os.path.exists(f"/var/run/netns/{run_id}")
        cg_left = _cgroup_exists(run_id)
    finally:
        try:
            p.stdin.close()
        except OSError:
            pass
    errs = {a["step"]: a["errno"] for a in got}
    recs = Run(0, "", "", audit).records(event="direct_egress")
    outcome("hooks stay attached; the gate is gone",
            f"gate: {errs.get('gate v4')}/{errs.get('gate v6')}; elsewhere: "
            f"{'/'.join(sorted({str(errs.get(k)) for k in ('TCP v4', 'TCP v6', 'UDP sendto')}))}; "
            f"{len(recs)} audit records after the kill (no reader); gc: "
            f"{'removed it' if not (after_gc or netns_left or cg_left) else 'LEFT SOMETHING'}",
            "OPEN" if any(v is None for v in errs.values()) or quiet_net.access_entries() else "held")
    assert errs == {"gate v4": "ECONNREFUSED", "gate v6": "ECONNREFUSED", "TCP v4": "EPERM",
                    "TCP v6": "EPERM", "UDP sendto": "EPERM"}, (got, p.stderr.read() if p.stderr else "")
    for a in got:
        assert_bounded(a)
    assert_nothing_reached(quiet_net)
    assert before_gc, "the agent should still be running before gc"
    assert g.returncode == 0, g.stderr
    assert run_id in json.loads(g.stdout)["runs"]
    assert (after_gc, netns_left, cg_left) == ([], False, False)


def _cgroup_exists(run_id: str) -> bool:
    from gatewrap.sandbox import cgroup

    return os.path.isdir(os.path.join(cgroup.parent_dir(), run_id))


#: An agent that answers each line on its stdin with one attempt at its gate (the gate's
#: listener and the hooks' configuration of its cgroup both still there: connected).
ANSWERING = """
    print("ready", flush=True)
    for _ in sys.stdin:
        attempt("gate", sock(V4, TCP).connect, ("127.0.0.1", 3128))
"""


def _second_install(script: str, **popen) -> subprocess.Popen:
    """``script`` (sh) run by another install of gatewrap on this kernel: this venv's gatewrap
    (``$GW``) in a mount and pid namespace of its own (:func:`conftest.in_new_pid_namespace`),
    with a registry and state of its own (tmpfs over /run/gatewrap and /var/lib/gatewrap
    there), as a chroot's or a container's would be; the cgroup hierarchy and bpffs are the
    kernel's, shared."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWRAP_")}
    env.update(SUDO_UID="65534", SUDO_GID="65534", GW=" ".join(gatewrap_cmd()))
    setup = ("mount -t tmpfs -o mode=0755 gatewrap-second /run/gatewrap && "
             "mount -t tmpfs -o mode=0755 gatewrap-second /var/lib/gatewrap && ")
    popen.setdefault("stdout", subprocess.PIPE)
    popen.setdefault("stderr", subprocess.STDOUT)
    return subprocess.Popen(in_new_pid_namespace("/bin/sh", "-c", setup + script),
                            env=env, text=True, start_new_session=True, **popen)


def test_another_gatewrap_in_its_own_mount_and_pid_namespace_leaves_the_hosts_live_runs_alone(tmp_path, outcome):
    """another gatewrap on the same kernel (its own mount and pid namespace) starts a run and collects."""
    from shared.conftest import Daemon

    own_env = {k: v for k, v in os.environ.items() if k not in ("GATEWRAP_SHARED", "GATEWRAP_DAEMON_SOCKET")}
    own_env.update(SUDO_UID="65534", SUDO_GID="65534", GATEWRAP_SHARED="0")  # runs of their own
    d = Daemon().start()

    def host_run(name: str, env: dict) -> tuple[subprocess.Popen, str]:
        audit = tmp_path / f"{name}.jsonl"
        p = subprocess.Popen(gatewrap_cmd("run", "--audit-log", str(audit), "--workdir", "/tmp", "--",
                                          *python_argv(ANSWERING)),
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        assert p.stdout.readline() == "ready\n", p.stderr.read()
        return p, run_id_of(audit)

    def answer(p: subprocess.Popen) -> str | None:
        p.stdin.write("go\n")
        p.stdin.flush()
        got = attempts(p.stdout.readline())
        return got[0]["errno"] if got else "NO ANSWER"

    procs: list[subprocess.Popen] = []
    second_long = None
    try:
        own, own_id = host_run("own", own_env)
        procs.append(own)
        shared, shared_id = host_run("shared", {**own_env, **d.env})
        procs.append(shared)
        killed, killed_id = host_run("killed", own_env)
        killed.kill()
        killed.wait()
        host_run_dev = os.stat("/run/gatewrap").st_dev
        # The second install starts a run (its start-up collection) and runs its gc.
        second = _second_install(f"$GW run --own --audit-log {tmp_path}/second.jsonl --workdir /tmp -- /bin/true; "
                                 "echo \"run exit $?\"; $GW gc; echo \"gc exit $?\"")
        said, _ = second.communicate(timeout=120)
        answers = {"own": answer(own), "shared": answer(shared)}
        # The converse, from the host: its own dead run is collected, the second's live one left.
        second_long = _second_install(f"exec $GW run --own --audit-log {tmp_path}/second-long.jsonl --workdir /tmp -- "
                                      "/bin/sh -c 'echo ready; exec sleep 120'", stderr=subprocess.DEVNULL)
        assert second_long.stdout.readline() == "ready\n"
        second_id = run_id_of(tmp_path / "second-long.jsonl")
        # Its tmpfs stay in its mount namespace (in a chroot, whose "/" cannot be made private,
        # a shared parent mount would show them here).
        assert not os.path.ismount("/run/gatewrap") or os.stat("/run/gatewrap").st_dev == host_run_dev
        g = subprocess.run(gatewrap_cmd("gc", "--json"), capture_output=True, text=True, timeout=60, env=own_env)
        host_gc = json.loads(g.stdout)
        after = {"own": answer(own), "shared": answer(shared)}
        second_procs = _run_procs(second_id)
    finally:
        for p in procs:
            with contextlib.suppress(OSError):
                p.stdin.close()
        if second_long is not None:
            os.killpg(second_long.pid, signal.SIGTERM)
            second_long.wait(timeout=60)
        for p in procs:
            p.wait(timeout=60)
        d.stop()
    not_ours = "alone: not started by this gatewrap's registry (another install on this kernel?)"
    survived = answers == after == {"own": None, "shared": None}
    outcome("gc: only what the run registry and pid namespace prove dead",
            f"the host's runs {'answer through their gates' if survived else 'LOST: ' + str((answers, after))}; "
            f"the second gatewrap {'says it left them alone' if f'left {own_id} {not_ours}' in said else 'SAID NOTHING'}",
            "held" if survived else "OPEN")
    assert "run exit 0" in said and "gc exit 0" in said, said
    for run_id in (own_id, shared_id, killed_id):  # said by its run's start (or counted there), and by its gc
        assert f"gatewrap: left {run_id}" in said or "more sandboxes alone" in said, said
        assert said.count(f"left {run_id} {not_ours}") in (1, 2), said
    assert "removed" not in said, said
    assert answers == {"own": None, "shared": None}, (answers, said)
    assert after == {"own": None, "shared": None}, (after, host_gc)
    assert killed_id in host_gc["runs"], host_gc
    assert [second_id, "not started by this gatewrap's registry (another install on this kernel?)"] in host_gc["left"]
    assert not {own_id, shared_id} & {r for r, _ in host_gc["left"]} and not {own_id, shared_id} & set(host_gc["runs"])
    assert second_procs, "the second install's run lived through the host's gc"
    assert not _cgroup_exists(second_id), "its own gatewrap tore it down when stopped"


#: The agent's attempts on its jail's init (pid 1 of the run's pid namespace, ``gatewrap-wait
#: --init``, running as the agent's user), then a setsid'd grandchild left behind and an exit
#: code of its own.
INIT_TAMPER = """
    def state1():
        with open("/proc/1/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    attempt("SIGKILL to pid 1", os.kill, 1, 9)
    attempt("SIGSTOP to pid 1", os.kill, 1, 19)
    time.sleep(0.2)
    print(json.dumps({{"init_state": state1()}}), flush=True)
    attempt("ptrace(PTRACE_ATTACH, 1)", lambda: check(libc.ptrace(16, 1, 0, 0)))
    attempt("open /proc/1/mem for writing", lambda: os.close(os.open("/proc/1/mem", os.O_RDWR)))
    attempt("SIGTERM to pid 1 (forwarded to the agent, which ignores it)",
            lambda: (signal.signal(signal.SIGTERM, signal.SIG_IGN), os.kill(1, 15)))
    r, w = os.pipe()
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.write(w, b"x")
            os.execv("/bin/sh", ["sh", "-c", "sleep 300", "{token}"])
        os._exit(0)
    os.read(r, 1)
    sys.exit(7)
"""


def test_the_agent_can_neither_kill_stop_trace_nor_write_its_jails_init(gatewrap, quiet_net, outcome):
    """the agent against its jail's init (kill, stop, ptrace, /proc/1/mem), then a child left behind"""
    token = f"gw-escape-init-{secrets.token_hex(4)}"
    body = "import signal\n" + textwrap.dedent(INIT_TAMPER).format(token=token)
    # (A root agent is refused in the jail: only with --jail none, which has no init of its own.)
    r = gatewrap(python_argv(body), timeout=60)
    got = {a["step"]: a["errno"] for a in attempts(r.stdout) if "step" in a}
    state = next(json.loads(x)["init_state"] for x in r.stdout.splitlines() if "init_state" in x)
    left = _procs_with(token) + _run_procs(r.run_id)
    # Signals from inside a pid namespace to its init without a handler are discarded
    # (kernel/signal.c, sig_task_ignored: SIGNAL_UNKILLABLE): kill(2) says 0 and nothing happens.
    held = (state != "T" and r.returncode == 7 and not left and got["ptrace(PTRACE_ATTACH, 1)"] == "EPERM"
            and got["open /proc/1/mem for writing"] is not None)
    outcome("pid namespace init (signals from inside discarded), seccomp (ptrace), read-only /proc",
            f"init {'stopped' if state == 'T' else 'running'} after SIGKILL/SIGSTOP; "
            f"ptrace {got['ptrace(PTRACE_ATTACH, 1)'] or 'ATTACHED'}; /proc/1/mem rw "
            f"{got['open /proc/1/mem for writing'] or 'OPENED'}; exit {r.returncode} (the agent's 7); "
            f"after the run: {'nothing left' if not left else 'STILL RUNNING: ' + ' '.join(left)}",
            "held" if held else "OPEN")
    assert state in ("S", "R"), (state, r.stdout, r.stderr)
    assert got["ptrace(PTRACE_ATTACH, 1)"] == "EPERM", got
    assert got["open /proc/1/mem for writing"] in ("EROFS", "EACCES", "EPERM"), got
    assert r.returncode == 7, (r.returncode, r.stdout, r.stderr)
    assert left == []
    assert_nothing_reached(quiet_net)


def test_the_jails_init_shows_the_agent_nothing_of_the_hosts_paths(gatewrap, quiet_net, outcome):
    """/proc/1 of the jail (cmdline, exe, maps, environ): the init's host path"""
    from gatewrap.sandbox import jail

    host_path = os.path.dirname(jail.init_path())
    r = gatewrap(python_argv("""
        def read(p):
            try:
                with open(p, "rb") as f:
                    return f.read().decode(errors="replace")
            except OSError as e:
                return "ERR " + errno.errorcode[e.errno]
        def link(p):
            try:
                return os.readlink(p)
            except OSError as e:
                return "ERR " + errno.errorcode[e.errno]
        env1 = read("/proc/1/environ")
        own = "".join(f"{k}={v}\\0" for k, v in os.environ.items())
        print(json.dumps({"cmdline": read("/proc/1/cmdline"), "exe": link("/proc/1/exe"),
                          "maps": read("/proc/1/maps"), "root": link("/proc/1/root"),
                          "environ_extra": sorted(set(env1.split("\\0")) - set(own.split("\\0")))
                                           if not env1.startswith("ERR") else env1}), flush=True)
    """), timeout=30)
    seen = json.loads(next(x for x in r.stdout.splitlines() if x.startswith("{")))
    leaks = sorted(k for k, v in seen.items() if host_path in str(v))
    extra = seen["environ_extra"] not in ([], "ERR EACCES")  # EACCES: the init is not dumpable
    outcome("/proc of the jail's init",
            f"the init's host folder {host_path} in /proc/1/: {', '.join(leaks) or 'nowhere'}; "
            f"init's environment beyond the agent's: {seen['environ_extra'] or 'nothing'}",
            "OPEN" if leaks or extra else "held")
    assert r.returncode == 0, r.stderr
    assert leaks == [], {k: seen[k] for k in leaks}
    assert seen["environ_extra"] in ([], "ERR EACCES"), seen
    assert_nothing_reached(quiet_net)
