"""Command-line behaviour: usage errors, root check, audit reader, doctor."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from conftest import gatewrap_cmd


def _gw(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(gatewrap_cmd(*args), capture_output=True, text=True, timeout=60, **kw)


@pytest.mark.parametrize("args,needle", [
    (["run"], "Missing argument"),
    (["run", "--bogus", "--", "true"], "No such option"),
    (["run", "--allow", "exa mple.com", "--", "true"], "--allow 'exa mple.com'"),
    (["run", "--allow", "http://example.com", "--", "true"], "a host, not a URL"),
    (["run", "--deny", "", "--", "true"], "--deny ''"),
    (["run", "--allow", "example.com:99999", "--", "true"], "99999"),
    (["run", "--policy", "/nonexistent.toml", "--", "true"], "/nonexistent.toml"),
    (["run", "--timeout", "10x", "--", "true"],
     'invalid duration "10x": expected a whole number and a unit s, m or h (e.g. "30s", "10m", "2h"), from 1s to '
     '31 days; or a number of seconds (90, 0.5)'),
    (["run", "--timeout", "0", "--", "true"], "'0' is not a positive number of seconds"),
    (["run", "--allow-private", "10.20.30.40", "--", "true"], "use --allow 10.20.30.40 (--allow-private is for names)"),
    (["reload", "gw-0123456789"], "no live run gw-0123456789"),
])
def test_usage_errors_exit_125_with_a_message(args, needle):
    p = _gw(*args)
    assert p.returncode == (1 if args[0] == "reload" else 125), p.stderr
    assert needle in p.stderr, p.stderr


@pytest.mark.parametrize("value,seconds", [("90", 90.0), ("0.5", 0.5), ("30s", 30.0), ("10m", 600.0), ("2h", 7200.0)])
def test_timeout_takes_seconds_or_the_policy_files_durations(value, seconds):
    from gatewrap import cli

    assert cli.run.make_context("run", ["--timeout", value, "--", "true"]).params["timeout"] == seconds


@pytest.mark.parametrize("cmd", [["audit"], ["policy", "suggest", "--run", "gw-0123456789"]],
                         ids=["audit", "policy suggest"])
def test_an_audit_log_the_user_cannot_read_exits_125_and_says_to_use_sudo(tmp_path, cmd):
    log = tmp_path / "audit.jsonl"
    log.write_text('{"v": 1, "run": "gw-0123456789", "event": "run_start"}\n')
    log.chmod(0o600)
    tmp_path.chmod(0o755)
    # imported before the uid changes: the clone may be in a home closed to 65534 (Debian 13's 0700)
    code = ("import os, sys; from gatewrap.cli import main; import gatewrap.cli_audit, gatewrap.cli_policy; "
            "import gatewrap.audit_format, gatewrap.audit_reader, gatewrap.policy_suggest; "
            f"os.setresuid(65534, 65534, 0); main({[*cmd, '--log', str(log)]!r})")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 125, p.stderr
    assert f"cannot read the audit log {log} (Permission denied)" in p.stderr and "sudo" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr and p.stdout == "", (p.stdout, p.stderr)


def test_without_root_run_exits_125_and_says_to_use_sudo():
    code = ("import os, sys; from gatewrap.cli import main; import gatewrap.runner; "
            "os.setresuid(65534, 65534, 0); main(['run', '--', '/bin/true'])")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 125
    assert "sudo" in p.stderr


def test_resolver_port_defaults_to_53():
    from gatewrap.cli import _with_port

    assert [_with_port(a, 53) for a in ("192.0.2.1", "192.0.2.1:5353", "2001:db8::1", "[2001:db8::1]",
                                        "[2001:db8::1]:5353")] == [
        "192.0.2.1:53", "192.0.2.1:5353", "[2001:db8::1]:53", "[2001:db8::1]:53", "[2001:db8::1]:5353"]


#: Modules a shared run's client does without (lazy commands, the daemon's side, what only
#: starting a daemon or an audit query needs): each costs start-up time of every run.
NOT_ON_THE_SHARED_RUNS_PATH = [
    "gatewrap.cli_audit", "gatewrap.cli_host", "gatewrap.cli_policy", "gatewrap.approvals.commands",
    "gatewrap.shared.commands", "gatewrap.shared.daemon", "gatewrap.runner", "gatewrap.audit_schema",
    "gatewrap.syslog_facility", "gatewrap.run_types", "gatewrap.sandbox.limits", "dataclasses", "socket",
    "importlib.resources", "pathlib", "tempfile", "shutil", "subprocess", "shlex"]


def test_a_shared_runs_client_imports_only_what_it_needs():
    # what `gatewrap run --shared` imports up to asking the daemon: the CLI, the options
    # parsed (their callbacks run) and the client
    assert _imported_of("from gatewrap import cli; from gatewrap.shared import client; "
                        "cli.run.make_context('run', ['--shared', '--memory', '1G', '--', '/bin/true'])",
                        NOT_ON_THE_SHARED_RUNS_PATH) == []


def _imported_of(code: str, modules: list[str]) -> list[str]:
    """Which of ``modules`` a fresh interpreter has imported after running ``code``."""
    probe = f"import json, sys; {code}; print(json.dumps([m for m in {modules!r} if m in sys.modules]))"
    p = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


#: Command lines gatewrap.entry parses without click, each as click parses it.
FAST_SHARED_RUNS = [
    ["run", "--shared", "--", "/bin/true"],
    ["run", "--shared", "/bin/echo", "--allow", "x"],
    ["run", "--allow", "a.test", "--shared", "--allow=b.test:8080", "--deny", "c.test", "--", "sh", "-c", "exit 3"],
    ["run", "--shared", "--json", "--audit-log", "/var/log/gw/a.jsonl", "--audit-log=/var/log/gw/b.jsonl", "--", "true"],
    ["run", "--shared", "--policy", "no-such-policy.toml", "--", "true"],
    ["run", "--shared", "--", "--", "-x"],
    ["run", "--policy", "a.toml", "--shared", "--policy=b.toml", "--deny=e.test=f", "--json", "--json", "cmd", "--", "x"],
    ["run", "--deny", "a.test", "--shared", "--shared", "--allow", "=", "--deny", "x=y", "--", "-"],
    ["run", "--shared", "--audit-log", "rel/audit.jsonl", "--policy", "rel.toml", "cmd"],
    ["run", "--shared", "--env", "TOKEN", "--env=A=b c", "--env-file", "rel.env", "--env", "B=", "--env-file=/x.env", "cmd"],
    ["run", "--shared", "--unprotect", ".vscode", "--unprotect=/srv/r/.git/hooks", "--", "true"],
    ["run", "--shared", "--allow-private", "mirror.corp.test", "--allow-private=m2.test:8443", "--", "true"],
    ["run", "--", "/bin/true"], ["run", "--allow", "a.test", "--json", "curl", "a.test"],
]
#: Command lines left to click (its checks, its messages, a run of its own), with GATEWRAP_SHARED unset.
CLICKS_OWN = [
    ["run", "--own", "--", "/bin/true"], ["run", "--shared", "--own", "--", "true"], ["run", "--own", "--shared", "true"],
    ["run", "--shared", "--help"], ["run", "--shared", "-h", "--", "true"],
    ["run", "--shared"], ["run", "--shared", "--"], ["run", "--shared", "--allow"],
    ["run", "--shared", "--allow", "--", "true"], ["run", "--shared", "--allow=", "--", "true"],
    ["run", "--shared", "--memory", "1G", "--", "true"], ["run", "--shared=1", "--", "true"],
    ["run", "--shared", "--policy", "/", "--", "true"], ["run", "--shared", "-", "true"],
    ["--version"], ["ps"], ["run", "--shared", "--jail", "none", "--", "true"],
]


@pytest.mark.parametrize("args", FAST_SHARED_RUNS, ids=" ".join)
def test_a_common_shared_run_is_parsed_without_click_as_click_parses_it(args):
    from gatewrap import cli, entry

    params = dict(cli.run.make_context("run", list(args[1:])).params)
    assert params.pop("shared") is True
    summary = "json" if params.pop("as_json") else "text"
    assert entry.shared_run(args, {}) == (cli.run_fields(**params), summary)


def test_gatewrap_shared_1_in_the_environment_is_a_shared_run_for_the_fast_parser_too():
    from gatewrap import entry

    fields, _ = entry.shared_run(["run", "--", "true"], {"GATEWRAP_SHARED": "1"})
    assert fields["argv"] == ["true"]
    assert entry.shared_run(["run", "--", "true"], {"GATEWRAP_SHARED": "yes"}) is None  # click's to read


def test_the_shared_mode_is_the_default_and_gatewrap_shared_0_or_own_is_a_run_of_its_own():
    from gatewrap import cli, entry

    for env in ({}, {"GATEWRAP_SHARED": ""}):
        assert entry.shared_run(["run", "--", "true"], env) is not None
    assert entry.shared_run(["run", "--", "true"], {"GATEWRAP_SHARED": "0"}) is None
    assert entry.shared_run(["run", "--shared", "--", "true"], {"GATEWRAP_SHARED": "0"}) is not None  # the flag wins
    assert cli.run.make_context("run", ["--", "true"]).params["shared"] is True
    assert cli.run.make_context("run", ["--own", "--", "true"]).params["shared"] is False


#: Words of a shared run's command line, for command lines made of them at random.
WORDS = ["--shared", "--own", "--json", "--allow", "a.test", "--allow=b.test", "--deny", "c.test", "--deny=d.test=x",
         "--policy", "p.toml", "--policy=/tmp", "--audit-log", "/tmp/x.jsonl", "--", "cmd", "-x", "-", "--allow=",
         "--deny=-q", "--shared=", "--js", "--all", "--ALLOW", "-h", "--policy=", "=", "--allow=--",
         "--env", "TOKEN", "--env=A=1", "--env-file", "rel.env", "--env-file=", "--envfile",
         "--unprotect", ".envrc", "--unprotect="]


@pytest.mark.parametrize("seed", range(4))
def test_command_lines_made_of_run_s_words_are_read_by_the_fast_parser_as_click_reads_them_or_left_to_it(seed, monkeypatch):
    import random

    import click

    from gatewrap import cli, entry

    rng = random.Random(seed)
    for _ in range(1500):
        args = ["run", *rng.choices(WORDS, k=rng.randint(1, 7))]
        env = rng.choice([{}, {"GATEWRAP_SHARED": "1"}, {"GATEWRAP_SHARED": "true"}, {"GATEWRAP_SHARED": "0"}])
        fast = entry.shared_run(args, env)
        if fast is None:
            continue  # click's to read
        monkeypatch.delenv("GATEWRAP_SHARED", raising=False)
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        try:
            params = dict(cli.run.make_context("run", list(args[1:])).params)
        except click.ClickException as e:
            raise AssertionError(f"{args} {env}: the fast parser took what click refuses ({e})") from None
        assert params.pop("shared") is True, (args, env)
        summary = "json" if params.pop("as_json") else "text"
        assert fast == (cli.run_fields(**params), summary), (args, env)


def test_a_shared_runs_paths_are_absolute_for_the_daemon_whose_working_directory_is_another(tmp_path, monkeypatch):
    from gatewrap import cli, entry

    monkeypatch.chdir(tmp_path)
    (tmp_path / "w").mkdir()
    fields, _ = entry.shared_run(["run", "--shared", "--policy", "p.toml", "--audit-log", "a.jsonl", "--", "true"], {})
    assert (fields["policy_file"], fields["audit_log"]) == (str(tmp_path / "p.toml"), str(tmp_path / "a.jsonl"))
    params = dict(cli.run.make_context("run", ["--shared", "--workdir", "w", "--", "true"]).params)
    del params["shared"], params["as_json"]
    assert cli.run_fields(**params)["cwd"] == str(tmp_path / "w")


@pytest.mark.parametrize("args", CLICKS_OWN, ids=" ".join)
def test_every_other_command_line_is_left_to_click(args):
    from gatewrap import entry

    assert entry.shared_run(args, {}) is None


def test_the_fast_shared_runs_path_imports_no_click():
    assert _imported_of("from gatewrap import entry; from gatewrap.shared import client; "
                        "entry.shared_run(['run', '--shared', '--allow', 'a.test', '--', '/bin/true'], {})",
                        ["click", "typing", *NOT_ON_THE_SHARED_RUNS_PATH]) == []


def test_the_shared_runs_client_sends_its_request_before_loading_the_launcher():
    # The launcher's extension (12 MB), ctypes and the agent's process helpers load while the
    # daemon sets the sandbox up (shared.client.run), not before the request goes out.
    assert _imported_of("from gatewrap import entry; from gatewrap.shared import client; "
                        "entry.shared_run(['run', '--', '/bin/true'], {})",
                        ["gatewrap.agent_process", "gatewrap._gate_core", "ctypes"]) == []


def test_a_fast_shared_runs_failure_reads_as_clicks_would():
    # not root (as nobody): the same message and exit code whichever parser took the line
    said = []
    for args in (["run", "--shared", "--", "/bin/true"], ["run", "--shared", "--timeout", "5", "--", "/bin/true"]):
        p = subprocess.run(["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups",
                            sys.executable, "-m", "gatewrap", *args], capture_output=True, text=True, timeout=60)
        assert p.returncode == 125, p.stderr
        said.append(p.stderr)
    assert said[0] == said[1] and said[0].startswith("gatewrap: ") and "root" in said[0], said


def test_the_lazy_commands_are_listed_and_run_as_before():
    p = _gw("--help")
    assert p.returncode == 0
    listed = [line.split()[0] for line in p.stdout.split("Commands:")[1].splitlines() if line.strip()]
    assert listed == ["approvals", "audit", "daemon", "doctor", "gc", "policy", "ps", "reload", "run", "secrets", "stop"]
    from gatewrap import audit_schema

    p = _gw("audit", "--event", "bogus")
    choices = ", ".join(f"'{e}'" for e in audit_schema.events())
    assert p.returncode == 125 and f"'bogus' is not one of {choices}." in p.stderr, p.stderr
    p = _gw("audit", "ship", "--help")
    assert p.returncode == 0 and "[default: authpriv]" in p.stdout


def test_help_teaches_with_examples():
    p = _gw("run", "--help")
    assert p.returncode == 0
    assert "Example" in p.stdout and "--allow" in p.stdout


def test_serve_help_names_the_four_forms_of_a_page():
    p = _gw("approvals", "serve", "--help")
    assert p.returncode == 0
    assert all(form in p.stdout for form in ("Approve", "Grant", "Edit", "Reject")), p.stdout


def test_audit_lists_denials_as_json_and_table(tmp_path):
    log = tmp_path / "audit.jsonl"
    recs = [
        {"v": 1, "time": "2026-11-29T09:00:00.000000Z", "run": "gw-a", "event": "request", "decision": "allowed",
         "dst_host": "allowed.test", "dst_port": 80, "proto": "http"},
        {"v": 1, "time": "2026-11-29T09:00:01.000000Z", "run": "gw-a", "event": "request", "decision": "denied",
         "dst_host": "evil\x1b[2J.test", "dst_port": 80, "proto": "http", "reason": "policy: default deny"},
        {"v": 1, "time": "2026-11-29T09:00:02.000000Z", "run": "gw-b", "event": "direct_egress",
         "decision": "denied", "dst_ip": "198.51.100.138", "dst_port": 7, "proto": "tcp", "pid": 7, "comm": "python3"},
    ]
    log.write_text("".join(json.dumps(r) + "\n" for r in recs) + "not json\n")
    p = _gw("audit", "--denied", "--json", "--log", str(log))
    assert p.returncode == 0
    assert [json.loads(line) for line in p.stdout.splitlines()] == recs[1:]
    assert f"{log}:4: not a JSON record" in p.stderr
    p = _gw("audit", "--run", "gw-a", "--format", "table", "--log", str(log))
    lines = p.stdout.splitlines()
    assert lines[0].startswith("TIME") and len(lines) == 3
    assert "\x1b" not in p.stdout and "evil\\x1b[2J.test" in p.stdout


@pytest.mark.parametrize("rec,says,never", [
    ({"event": "request", "decision": "allowed", "would": "deny", "reason": "policy: default deny"},
     "report mode: enforce would deny", None),
    ({"event": "connect", "decision": "allowed", "inspected": True, "reason": "policy: rule p:rule[1]"},
     "TLS-inspected tunnel", None),
    ({"event": "run_end", "exit_code": 0, "allowed": 3, "denied": 0, "failed": 0, "direct_egress": 0,
      "inspected": 2, "would_deny": 3},
     "3 allowed, 0 denied, 0 failed, 0 direct egress blocked, 2 tunnels TLS-inspected, 3 would be denied",
     "TLS-inspected tunnel;"),
], ids=["a report-mode row says what enforce would do", "an inspected tunnel's row says so",
        "the run_end row has the inspected and would-deny counts"])
def test_audit_table_rows_say_report_mode_and_inspection(tmp_path, rec, says, never):
    log = tmp_path / "audit.jsonl"
    log.write_text(json.dumps({"v": 1, "time": "2026-12-01T09:00:00.000000Z", "run": "gw-a", **rec}) + "\n")
    p = _gw("audit", "--format", "table", "--log", str(log))
    assert p.returncode == 0 and says in p.stdout, p.stdout + p.stderr
    assert never is None or never not in p.stdout, p.stdout


def test_audit_without_a_log_says_so(tmp_path):
    p = _gw("audit", "--log", str(tmp_path / "none.jsonl"))
    assert p.returncode == 1
    assert "no audit log" in p.stderr


@pytest.mark.kernel
def test_doctor_passes_here_and_speaks_json():
    p = _gw("doctor", "--json")
    assert p.returncode == 0, p.stdout
    names = {c["name"]: c["status"] for c in json.loads(p.stdout)}
    assert names["root"] == "ok" and names["cgroup v2"] == "ok" and names["bcc"] == "ok"
    assert names["kernel headers"] == "ok"


def test_audit_follow_prints_records_as_they_are_written(tmp_path):
    import time

    log = tmp_path / "audit.jsonl"
    log.write_text(json.dumps({"v": 1, "run": "gw-a", "event": "request", "decision": "denied"}) + "\n")
    p = subprocess.Popen(gatewrap_cmd("audit", "--follow", "--json", "--log", str(log)),
                         stdout=subprocess.PIPE, text=True)
    try:
        assert json.loads(p.stdout.readline())["run"] == "gw-a"
        with open(log, "a") as f:
            f.write(json.dumps({"v": 1, "run": "gw-b", "event": "direct_egress", "decision": "denied"}) + "\n")
        t0 = time.monotonic()
        assert json.loads(p.stdout.readline())["run"] == "gw-b"
        assert time.monotonic() - t0 < 5
    finally:
        p.kill()
        p.wait()


def test_doctor_says_how_to_open_a_state_folder_an_older_version_closed(tmp_path):
    from gatewrap.doctor import _state_dir

    old = tmp_path / "gatewrap"
    old.mkdir(mode=0o700)
    old.chmod(0o700)
    check = _state_dir(str(old))
    assert (check.status, check.fix) == ("warn", f"chmod 0755 {old}")
    old.chmod(0o755)
    assert _state_dir(str(old)).status == "ok"
    assert _state_dir(str(tmp_path / "absent")).status == "ok"


def test_a_gate_extension_older_than_the_package_is_named_with_the_rebuild(monkeypatch, capsys):
    import gatewrap._gate_core as core
    from gatewrap import cli

    monkeypatch.delattr(core, "landlock_abi")  # as a stale build of the extension lacks a newer function
    with pytest.raises(SystemExit) as e:
        cli.main(["doctor"])
    assert e.value.code == 125
    assert "older than this checkout" in capsys.readouterr().err


def test_daemon_status_without_root_exits_125_and_says_to_use_sudo():
    # a socket the user may not connect to (as a root daemon's is, 0600): said, never a traceback
    path = f"/run/gatewrap/test-status-{os.getpid()}.sock"
    os.makedirs("/run/gatewrap", exist_ok=True)
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(path)
    os.chmod(path, 0o600)
    sock.listen()
    try:
        p = subprocess.run(["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", sys.executable,
                            "-m", "gatewrap", "daemon", "--socket", path, "--status"],
                           capture_output=True, text=True, timeout=60)
    finally:
        sock.close()
        os.unlink(path)
    assert p.returncode == 125, p.stderr
    assert p.stderr.startswith("gatewrap: gatewrap daemon --status needs root") and "sudo gatewrap daemon --status" \
        in p.stderr and "Traceback" not in p.stderr, p.stderr


def test_nsjail_is_found_where_setup_installs_it_when_path_lacks_that_folder():
    # sudo's secure_path has /usr/local/bin, a user's or a unit's PATH may not: doctor must
    # not offer to install it again where it already is
    code = ("import os; os.environ['PATH'] = '/usr/bin:/bin'; os.environ.pop('GATEWRAP_NSJAIL', None); "
            "from gatewrap.sandbox.jail import nsjail_path; from gatewrap import doctor; print(nsjail_path()); "
            "print([(c.status, c.fix) for c in doctor.checks() if c.name == 'nsjail'])")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.stdout.splitlines() == ["/usr/local/bin/nsjail", "[('ok', '')]"], p.stdout + p.stderr
