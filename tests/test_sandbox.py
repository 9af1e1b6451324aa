"""The agent's identity and confinement, exit codes, and what is left after a run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from conftest import AGENT_PYTHON, AGENT_UID, gatewrap_cmd, netns_holders

pytestmark = pytest.mark.kernel


def _leftovers(run_id: str) -> dict[str, list[str]]:
    """What is left of run ``run_id``: its netns, its cgroup, its live processes.

    Zombies are not counted: an orphan whose gatewrap was SIGKILLed is reaped by init. Nor
    are processes already exiting (PF_EXITING, 0x4 in /proc/PID/stat's flags:
    include/linux/sched.h): a pid namespace's init, killed, finishes its exit only once the
    kernel has reaped the rest of its namespace (zap_pid_ns_processes), after it has left
    its cgroup (which gc then removes).
    """
    from gatewrap.sandbox import cgroup, netns

    procs = []
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                with open(f"/proc/{p}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                dying = fields[0] == "Z" or int(fields[6]) & 0x4
                with open(f"/proc/{p}/cgroup") as f:
                    if f"/gatewrap/{run_id}" in f.read() and not dying:
                        procs.append(p)
            except OSError:
                pass
    return {"netns": [n for n in netns.list_named() if n == run_id],
            "cgroups": [c for c in cgroup.list_leaves(cgroup.parent_dir()) if c == run_id],
            "procs": procs}


NOTHING = {"netns": [], "cgroups": [], "procs": []}


def _run_id(audit) -> str:
    import json as _json

    return next(r["run"] for r in map(_json.loads, audit.read_text().splitlines()) if r["event"] == "run_start")


def test_the_agent_runs_as_the_invoking_user_without_privileges(gatewrap):
    r = gatewrap(python="""
        import os
        st = dict(l.split(":", 1) for l in open("/proc/self/status"))
        print(os.getuid(), os.geteuid(), os.getgid())
        print(st["CapEff"].strip(), st["CapPrm"].strip(), st["CapBnd"].strip(), st["NoNewPrivs"].strip())
        print(sorted(int(fd) for fd in os.listdir("/proc/self/fd")))
        print(open("/proc/self/cgroup").read().strip().splitlines()[-1])
        import socket
        print(sorted(name for _, name in socket.if_nameindex()))
        print(st["SigBlk"].strip())
    """)
    assert r.returncode == 0, r.stderr
    ids, caps, fds, cg, links, blocked = r.stdout.splitlines()
    assert ids == "65534 65534 65534"
    assert caps == "0000000000000000 0000000000000000 0000000000000000 1"
    assert fds == "[0, 1, 2, 3]"  # 3: the listing's own directory fd
    assert cg == "0::/"  # a cgroup namespace rooted at the run's leaf
    assert links == "['lo']"
    assert blocked == "0000000000000000"


def test_a_root_agent_has_no_capabilities(gatewrap):
    r = gatewrap(python="""
        st = dict(l.split(":", 1) for l in open("/proc/self/status"))
        print(st["Uid"].split()[0], st["CapEff"].strip(), st["CapBnd"].strip())
    """, user_env=False, extra=["--user", "root", "--jail", "none"])
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "0 0000000000000000 0000000000000000"
    assert "the agent runs as root" in r.stderr


@pytest.mark.parametrize("who", [[], ["--user", "root", "--jail", "none"]],
                         ids=["as the invoking user", "as root without the jail"])
def test_the_agent_cannot_leave_its_cgroup_or_make_one(gatewrap, who):
    from gatewrap.sandbox import cgroup

    root = cgroup.cgroup2_mount()
    r = gatewrap(python=f"""
        import os, errno
        for attempt in (lambda: open("{root}/cgroup.procs", "w").write(str(os.getpid())),
                        lambda: open("{root}/gatewrap/cgroup.procs", "w").write(str(os.getpid())),
                        lambda: os.mkdir("{root}/gatewrap/x")):
            try:
                attempt()
                print("DONE")
            except OSError as e:
                print(errno.errorcode[e.errno])
    """, user_env=not who, extra=who)
    # In the jail cgroupfs is absent (the view has no /sys); without it, hidden under an
    # empty mode-000 tmpfs by the launcher.
    assert r.stdout.split() == ["EACCES" if who else "ENOENT"] * 3, r.stderr


def test_a_root_agent_cannot_reach_the_bpf_pins_or_the_audit_log(gatewrap):
    r = gatewrap(python="""
        import os, errno
        for attempt in (lambda: os.listdir("/sys/fs/bpf"), lambda: os.listdir("/run/gatewrap"),
                        lambda: open(os.environ["GW_TEST_AUDIT"], "a").write("forged")):
            try:
                attempt()
                print("DONE")
            except OSError as e:
                print(errno.errorcode[e.errno])
    """, user_env=False, extra=["--user", "root", "--jail", "none"])
    # the audit log's folder hidden too (an empty mode-000 tmpfs): a root agent could hold the log's lock
    assert r.stdout.split() == ["EACCES", "EACCES", "EACCES"], r.stderr


@pytest.mark.parametrize("code", [0, 3, 77])
def test_the_exit_code_is_the_agents(gatewrap, code):
    r = gatewrap(["/bin/sh", "-c", f"exit {code}"])
    assert r.returncode == code, r.stderr
    assert f"exited {code}" in r.stderr


def test_a_signal_death_exits_128_plus_the_signal(gatewrap):
    r = gatewrap(["/bin/sh", "-c", "kill -TERM $$"])
    assert r.returncode == 128 + 15, r.stderr


def test_a_root_agent_is_not_jailed_and_root_without_sudo_runs_the_agent_as_nobody(gatewrap):
    # uid 0 without capabilities would still read root's 0600 files of the jail's /etc
    r = gatewrap(["/bin/true"], user_env=False, extra=["--user", "root"])
    assert r.returncode == 125
    assert "/etc/shadow" in r.stderr and "--jail none" in r.stderr
    assert "warning" not in r.stderr  # refused before anything is set up
    r = gatewrap(python="import os; print(os.getuid())", user_env=False)
    assert r.stdout == "65534\n", r.stderr
    assert "the agent runs as nobody" in r.stderr


def test_nothing_is_left_after_a_run_even_a_double_forked_child(gatewrap):
    r = gatewrap(["/bin/sh", "-c", "readlink /proc/self/ns/net; (setsid sleep 300 &) ; exit 0"])
    assert r.returncode == 0, r.stderr
    assert _leftovers(r.run_id) == NOTHING
    # The netns is held by no process and no descriptor any more (nor named anywhere).
    ino = int(r.stdout.strip().removeprefix("net:[").removesuffix("]"))
    assert ino != os.stat("/proc/self/ns/net").st_ino
    assert netns_holders(ino) == []


def test_sigterm_is_forwarded_and_the_sandbox_still_goes_away(net, tmp_path):
    audit = tmp_path / "audit.jsonl"
    env = dict(os.environ, SUDO_UID="65534", SUDO_GID="65534")
    p = subprocess.Popen(
        gatewrap_cmd("run", "--audit-log", str(audit), "--workdir", "/tmp", "--", AGENT_PYTHON, "-c",
                     # os.write, not print: the signal can come while print('ready') still holds
                     # stdout's buffer (the line is out, the flush not returned), and a print in
                     # the handler then raises "reentrant call" (seen under load).
                     "import os, signal, time\n"
                     "signal.signal(signal.SIGTERM, lambda *a: (os.write(1, b'got TERM\\n'), os._exit(42)))\n"
                     "print('ready', flush=True)\ntime.sleep(60)"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    assert p.stdout.readline() == "ready\n"
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=20)
    assert (out, p.returncode) == ("got TERM\n", 42), err
    assert _leftovers(_run_id(audit)) == NOTHING


def test_a_missing_command_exits_127(gatewrap):
    r = gatewrap(["/nonexistent/agent"])
    assert r.returncode == 127
    assert "command not found: /nonexistent/agent" in r.stderr
    assert r.audit() == []  # refused before any sandbox was set up: nothing to leave behind


def test_a_command_outside_the_view_exits_127_and_names_the_bind(gatewrap):
    """A virtualenv's python3 the host finds but the jail does not show: refused before the
    run, with the --ro-bind that shows it (not a bare 127 from nsjail's execve)."""
    import shutil
    import tempfile
    top = tempfile.mkdtemp(prefix="gw-venv-")
    try:
        os.chmod(top, 0o755)
        os.makedirs(f"{top}/venv/bin")
        open(f"{top}/venv/pyvenv.cfg", "w").close()
        os.symlink("/usr/bin/python3", f"{top}/venv/bin/python3")
        r = gatewrap([f"{top}/venv/bin/python3", "-c", "print('ran')"])
        assert r.returncode == 127, r.stderr
        assert f"--ro-bind {top}/venv" in r.stderr
        assert r.audit() == []
        shown = gatewrap([f"{top}/venv/bin/python3", "-c", "print('ran')"], extra=["--ro-bind", f"{top}/venv"])
        assert shown.returncode == 0, shown.stderr
        assert shown.stdout == "ran\n"
    finally:
        shutil.rmtree(top)


def test_a_relative_command_is_the_working_directorys(gatewrap):
    """``--workdir D -- ./agent.sh``: the jail's execve looks for ./agent.sh in D (nsjail
    changes there first), so that is the file checked and run, not one in gatewrap's own
    working directory (the tests run gatewrap from the repository, which has none); one
    outside the view is still refused with the --ro-bind that shows it."""
    import shutil
    import tempfile
    top = tempfile.mkdtemp(prefix="gw-rel-")
    try:
        os.chmod(top, 0o755)
        with open(f"{top}/agent.sh", "w") as f:
            f.write("#!/bin/sh\necho ran in $PWD\n")
        os.chmod(f"{top}/agent.sh", 0o755)
        r = gatewrap(["./agent.sh"], extra=["--workdir", top])
        assert r.returncode == 0, r.stderr
        assert r.stdout == f"ran in {top}\n"
        os.makedirs(f"{top}/sub")
        os.chmod(f"{top}/sub", 0o755)
        outside = tempfile.mkdtemp(prefix="gw-rel-out-")
        os.chmod(outside, 0o755)
        shutil.copy(f"{top}/agent.sh", f"{outside}/agent.sh")
        os.symlink(f"{outside}/agent.sh", f"{top}/sub/agent.sh")
        r = gatewrap(["sub/agent.sh"], extra=["--workdir", top])
        assert r.returncode == 127, r.stderr
        assert f"--ro-bind {outside}" in r.stderr
        shutil.rmtree(outside)
    finally:
        shutil.rmtree(top)


@pytest.mark.own_process
def test_sigkill_of_gatewrap_fails_closed_and_gc_removes_the_sandbox(net, tmp_path):
    audit = tmp_path / "audit.jsonl"
    env = dict(os.environ, SUDO_UID="65534", SUDO_GID="65534")
    agent = (
        "import socket, sys, time, errno\n"
        "print('ready', flush=True)\n"
        "sys.stdin.readline()\n"
        "for addr in (('127.0.0.1', 3128), ('198.51.100.138', 7)):\n"
        "    try:\n"
        "        socket.create_connection(addr, timeout=2); print('SENT', flush=True)\n"
        "    except OSError as e:\n"
        "        print(errno.errorcode[e.errno], flush=True)\n"
        "time.sleep(60)\n"
    )
    p = subprocess.Popen(
        gatewrap_cmd("run", "--audit-log", str(audit), "--workdir", "/tmp", "--", AGENT_PYTHON, "-c", agent),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    assert p.stdout.readline() == "ready\n"
    p.kill()
    p.wait()
    p.stdin.write("go\n")  # the agent tries only once gatewrap is dead
    p.stdin.flush()
    # The gate died with gatewrap; the hooks stay: the agent reaches nothing.
    assert p.stdout.readline() == "ECONNREFUSED\n"
    assert p.stdout.readline() == "EPERM\n"
    run_id = _run_id(audit)
    left = _leftovers(run_id)
    assert left["cgroups"] == [run_id] and left["procs"]  # the netns lives in the agent's processes
    g = subprocess.run(gatewrap_cmd("gc", "--json"), capture_output=True, text=True, timeout=30)
    assert g.returncode == 0, g.stderr
    assert run_id in json.loads(g.stdout)["runs"]
    assert _leftovers(run_id) == NOTHING
    assert not [d for d in os.listdir("/run/gatewrap-staged") if d.startswith(f"{run_id}-")]
    # The denial made after gatewrap died was still on the run's ring buffer: gc recorded it.
    recs = [json.loads(line) for line in audit.read_text().splitlines()]
    late = [r for r in recs if r["event"] == "direct_egress"]
    assert [(r["dst_ip"], r["dst_port"], r["hook"]) for r in late] == [("198.51.100.138", 7, "connect4")]
    assert recs[-1]["event"] == "checkpoint", "gc signs what it wrote"
    assert recs[-2]["event"] == "run_end" and "gatewrap died" in recs[-2]["reason"]


@pytest.mark.own_process
def test_gc_closes_a_started_run_whose_gatewrap_died_in_its_teardown(tmp_path):
    """gatewrap SIGKILLed after its run's cgroup was removed and before its run_end (the
    teardown cut short): no cgroup, no ring buffer left, but its lock file and run_start are;
    gc proves its owner dead and writes the run_end, once."""
    from gatewrap.sandbox import cgroup

    audit = tmp_path / "audit.jsonl"
    env = dict(os.environ, SUDO_UID="65534", SUDO_GID="65534")
    p = subprocess.Popen(gatewrap_cmd("run", "--audit-log", str(audit), "--workdir", "/tmp", "--",
                                      "/bin/sh", "-c", "echo ready; exec sleep 60"),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    assert p.stdout.readline() == "ready\n", p.stderr.read()
    p.kill()
    p.wait()
    run_id = _run_id(audit)
    cgroup.kill_and_remove(os.path.join(cgroup.parent_dir(), run_id))
    assert os.path.exists(f"/run/gatewrap/runs/{run_id}.lock")
    g = subprocess.run(gatewrap_cmd("gc", "--json"), capture_output=True, text=True, timeout=60)
    assert g.returncode == 0, g.stderr
    assert run_id in json.loads(g.stdout)["runs"]
    assert not os.path.exists(f"/run/gatewrap/runs/{run_id}.lock")
    recs = [json.loads(line) for line in audit.read_text().splitlines()]
    ends = [r for r in recs if r["event"] == "run_end"]
    assert [(e["run"], e["reason"], e["direct_egress"]) for e in ends] == [
        (run_id, "gatewrap died; collected by gatewrap gc", 0)]
    assert recs[-1]["event"] == "checkpoint", "gc signs what it wrote"
    again = subprocess.run(gatewrap_cmd("gc", "--json"), capture_output=True, text=True, timeout=60)
    assert run_id not in json.loads(again.stdout)["runs"]
    assert len([line for line in audit.read_text().splitlines() if '"run_end"' in line]) == 1


#: Runs that fail after their run_start is written, and how: (extra options, environment,
#: a script's first line or None for /bin/true, exit code, the run_end's reason).
FAILS_AFTER_RUN_START = {
    "nsjail missing (GATEWRAP_NSJAIL names no file)":
        ([], {"GATEWRAP_NSJAIL": "/nonexistent/nsjail"}, None, 127,
         "the agent could not be started: command not found: /nonexistent/nsjail"),
    "the command's exec failing in the launcher (its interpreter is missing)":
        (["--jail", "none"], {}, "#!/nonexistent/interpreter", 127, "the agent could not be started: "),
}


@pytest.mark.parametrize("case", list(FAILS_AFTER_RUN_START), ids=list(FAILS_AFTER_RUN_START))
def test_a_run_that_fails_after_run_start_gets_a_run_end_with_the_reason(gatewrap, case):
    import shutil
    import tempfile

    extra, env, first_line, code, reason = FAILS_AFTER_RUN_START[case]
    folder = tempfile.mkdtemp(prefix="gwt-fails-")
    try:
        os.chmod(folder, 0o755)
        argv = ["/bin/true"]
        if first_line is not None:
            argv = [os.path.join(folder, "agent")]
            with open(argv[0], "w") as f:
                f.write(f"{first_line}\n")
            os.chmod(argv[0], 0o755)
        r = gatewrap(argv, extra=extra, env=env)
    finally:
        shutil.rmtree(folder)
    assert r.returncode == code, r.stderr
    starts, ends = r.records(event="run_start"), r.records(event="run_end")
    assert len(starts) == 1 and len(ends) == 1, r.audit()
    assert ends[0]["run"] == starts[0]["run"] and ends[0]["exit_code"] == code
    assert ends[0]["reason"].startswith(reason), ends[0]
    assert r.audit()[-1]["event"] == "checkpoint"


def test_a_command_the_agents_user_cannot_reach_exits_126_and_says_why(gatewrap, tmp_path):
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)
    tool = closed / "tool"
    tool.write_text("#!/bin/sh\necho hi\n")
    tool.chmod(0o755)
    r = gatewrap([str(tool)])
    assert r.returncode == 126
    assert f"{tool} cannot be executed by nobody" in r.stderr


def test_a_workdir_the_agent_cannot_enter_is_refused_and_one_it_cannot_write_gets_a_note(gatewrap, tmp_path):
    closed = tmp_path / "wd"  # under pytest's 0700 folder
    closed.mkdir(mode=0o755)
    r = gatewrap(["/bin/true"], extra=["--workdir", str(closed)])
    assert r.returncode == 125
    assert f"cannot enter its working directory {closed}" in r.stderr
    r = gatewrap(["/bin/true"], extra=["--workdir", "/usr"])
    assert r.returncode == 0, r.stderr
    assert "cannot write its working directory /usr" in r.stderr


def test_an_audit_log_that_is_a_symlink_is_refused_and_its_target_untouched(tmp_path):
    victim = tmp_path / "victim.conf"
    victim.write_text("precious\n")
    link = tmp_path / "audit.jsonl"
    link.symlink_to(victim)
    # --workdir /tmp: the checkout may lie in a home the agent's user cannot enter (Debian 13's
    # useradd makes 0700 homes), which is refused before the audit log is opened.
    p = subprocess.run(gatewrap_cmd("run", "--audit-log", str(link), "--workdir", "/tmp", "--", "/bin/true"),
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 125
    assert f"audit log {link} is a symbolic link (never followed), not a regular file" in p.stderr
    assert victim.read_text() == "precious\n"


@pytest.mark.parametrize("below", [False, True], ids=["the working folder itself", "a folder above it"])
def test_an_audit_log_whose_folder_the_agent_writes_is_refused_saying_how(below):
    """The audit log's folder turns read-only under the agent: refused when it is the agent's
    working folder, or holds it; the error says which (it said "holds" of the folder itself)."""
    import shutil
    import tempfile
    from pathlib import Path

    top = Path(tempfile.mkdtemp(prefix="gwt-auditdir-", dir="/tmp"))  # not tmp_path: 0700, closed to the agent
    try:
        top.chmod(0o755)
        work = top / "work"
        work.mkdir(mode=0o755)  # root's: an audit log's folder others can write is refused first
        log = (top if below else work) / "audit.jsonl"
        p = subprocess.run(gatewrap_cmd("run", "--audit-log", str(log), "--workdir", str(work), "--", "/bin/true"),
                           capture_output=True, text=True, timeout=60)
    finally:
        shutil.rmtree(top, ignore_errors=True)
    assert p.returncode == 125, p.stderr
    how = f"holds the agent's writable {work}" if below else "is the agent's writable folder too"
    assert (f"the audit log's folder {log.parent} is read-only for the agent, and it {how}: put the audit log "
            "elsewhere (--audit-log)") in p.stderr, p.stderr


def test_gc_removes_the_approvals_wake_folder_a_killed_run_left():
    """A run's gate removes /run/gatewrap/<run>/ (its approvals' wake socket) when dropped;
    a gatewrap killed first leaves it, and gc removes it with the rest of the run."""
    run_id = "gw-" + os.urandom(5).hex()
    folder = f"/run/gatewrap/{run_id}"
    os.makedirs(folder, mode=0o700)
    open(f"{folder}/control.sock", "w").close()
    g = subprocess.run(gatewrap_cmd("gc", "--json"), capture_output=True, text=True, timeout=60)
    assert g.returncode == 0, g.stderr
    assert run_id in json.loads(g.stdout)["runs"] and not os.path.exists(folder)


#: The bounds nsjail applies unless its profile says otherwise (nsjail --help, config.proto),
#: with what the profile must say instead: none of them is a bound the user asked for.
NSJAIL_DEFAULT_BOUNDS = {
    "time_limit": "0",  # nsjail: 600 s of wall time, then SIGKILL (137)
    "rlimit_as_type": "INF",  # nsjail: 4096 MiB
    "rlimit_cpu_type": "INF",  # nsjail: 600 s of CPU
    "rlimit_fsize_type": "INF",  # nsjail: 1 MiB
    "rlimit_nofile_type": "HARD",  # nsjail: 32; the caller's hard limit as both
}


def test_the_jail_profile_overrides_every_bound_nsjail_sets_by_default():
    from gatewrap.sandbox import jail

    settings = {}
    for line in jail.PROFILE.read_text().splitlines():
        key, sep, value = line.partition(":")
        if sep and not line.startswith(("#", " ")) and "{" not in key:
            settings[key.strip()] = value.strip().strip('"')
    for key, value in NSJAIL_DEFAULT_BOUNDS.items():
        assert settings.get(key) == value, f"agent.cfg: {key} must be {value} (nsjail's default bounds the agent)"
    argv = jail.wrap(["/bin/true"], _nobody(), "/tmp", [], nsjail="/usr/local/bin/nsjail")
    assert not {"-t", "--time_limit", "--max_cpus"} & set(argv)


def _nobody():
    from gatewrap.sandbox import user

    return user.Target(name="nobody", uid=65534, gid=65534, groups=(65534,), home="/nonexistent")


def _limits(text: str) -> dict[str, tuple[str, str]]:
    """/proc/PID/limits (proc(5)) as {name: (soft, hard)}."""
    rows = {}
    for line in text.splitlines()[1:]:
        name, soft, hard = line[:26].strip(), *line[26:].split()[:2]
        rows[name] = (soft, hard)
    return rows


@pytest.mark.parametrize("jail", ["nsjail", "none"])
def test_the_agents_open_file_limit_is_the_callers_not_the_one_gatewrap_raised_for_itself(tmp_path, jail):
    """gatewrap raises its own soft RLIMIT_NOFILE to the hard one (the gate's sockets); a
    caller with soft < hard (as sudo under pam_limits leaves it on Debian) has its soft one
    back in the agent without the jail, and its hard one as both in the jail (nsjail sets one
    value: agent.cfg)."""
    cmd = ["prlimit", "--nofile=1000:", "--",
           *gatewrap_cmd("run", "--audit-log", str(tmp_path / "audit.jsonl"), "--jail", jail, "--workdir", "/tmp",
                         "--", "/bin/cat", "/proc/self/limits")]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60,
                       env={**os.environ, "SUDO_UID": str(AGENT_UID), "SUDO_GID": str(AGENT_UID)})
    assert r.returncode == 0, r.stderr
    hard = _limits(open("/proc/self/limits").read())["Max open files"][1]
    # In the jail nsjail sets both to one value: the caller's hard one (agent.cfg).
    assert _limits(r.stdout)["Max open files"] == ("1000" if jail == "none" else hard, hard), r.stdout


def test_the_agent_has_no_limit_the_user_did_not_set(gatewrap):
    """The jail adds no wall-clock, CPU, size or file bound: the agent's limits are the caller's
    (the core size is 0 by design: no core dump of an agent leaves its memory on the host;
    processes are bounded by the run's pids cgroup, see tests/test_limits.py)."""
    r = gatewrap(["/bin/cat", "/proc/self/limits"])
    assert r.returncode == 0, r.stderr
    agent, here = _limits(r.stdout), _limits(open("/proc/self/limits").read())
    for name in ("Max cpu time", "Max file size", "Max data size", "Max address space"):
        assert agent[name] == ("unlimited", "unlimited"), name
    # Open files: the caller's hard limit as both (nsjail sets one value; agent.cfg), which
    # the caller could raise its soft one to; outside the jail exactly the caller's.
    assert agent["Max open files"] == (here["Max open files"][1],) * 2, agent["Max open files"]
    for name in ("Max stack size", "Max locked memory", "Max realtime priority",
                 "Max msgqueue size", "Max pending signals"):
        assert agent[name][0] == here[name][0], (name, agent[name], here[name])
    # Processes: the run's pids cgroup bounds them (--pids); RLIMIT_NPROC, which counts the
    # user's processes host-wide, is the caller's, or the --pids bound where no pids
    # controller exists (gatewrap.sandbox.limits).
    from gatewrap.entry import DEFAULT_PIDS
    from gatewrap.sandbox import limits

    nproc = here["Max processes"][0] if limits.where("pids") else DEFAULT_PIDS
    assert agent["Max processes"] == (nproc, nproc), agent["Max processes"]
