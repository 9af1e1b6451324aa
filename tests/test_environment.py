"""The agent's environment: a short set of the caller's, then what is named (``--env NAME``,
``--env NAME=VALUE``, ``--env-file FILE``, the policy's ``[sandbox] env``), later entries
winning; ``run_start`` lists the names passed, never their values. What must not reach the
agent is the escape suite's (tests/escape/test_environment.py)."""

from __future__ import annotations

import json

import pytest

from gatewrap.errors import GatewrapError
from gatewrap.sandbox import environment
from gatewrap.sandbox.user import Target

AGENT = "import json, os; print(json.dumps(dict(os.environ)))"
TARGET = Target(uid=1000, gid=1000, groups=(1000,), name="alice", home="/home/alice")

#: (case, the file's text, the entries read: (name, value or None for the caller's)).
FILES = [
    ("NAME=VALUE takes the rest of the line verbatim", "A=1\nB= two  words \nC=x=y\n",
     [("A", "1"), ("B", " two  words "), ("C", "x=y")]),
    ("quotes are kept, nothing is expanded (docker's rule)", "Q=\"a b\"\nS='$HOME'\n", [("Q", '"a b"'), ("S", "'$HOME'")]),
    ("a NAME alone takes the caller's value", "TOKEN\n", [("TOKEN", None)]),
    ("comments, blank lines and leading spaces are skipped", "# c\n\n   \n  D=4\n\t# e\n", [("D", "4")]),
    ("CR LF line ends and a byte-order mark are dropped", "\ufeffE=5\r\nF=6\r\n", [("E", "5"), ("F", "6")]),
    ("an empty value is a value", "G=\n", [("G", "")]),
]


@pytest.mark.parametrize("text,want", [c[1:] for c in FILES], ids=[c[0] for c in FILES])
def test_an_env_file_is_read_as_docker_reads_one(text, want):
    assert [(e.name, e.value) for e in environment.parse_file(text, "a.env")] == want


#: (case, the file's text, the message).
BAD_FILES = [
    ("a name with a space", "A=1\nMY VAR=2\n", "a.env:2: 'MY VAR' is not a variable name"),
    ("a name starting with a digit", "\n\n1A=x\n", "a.env:3: '1A' is not a variable name"),
    ("export as in a shell", "export A=1\n", "a.env:1: 'export A' is not a variable name"),
    ("no name", "=x\n", "a.env:1: '' is not a variable name"),
    ("gatewrap's own setting", "GATEWRAP_CONFIG=/etc/x\n", "a.env:1: GATEWRAP_CONFIG: gatewrap's own settings"),
    ("a proxy variable", "https_proxy=http://x\n", "a.env:1: https_proxy: gatewrap sets https_proxy in every run"),
    ("PWD", "PWD=/\n", "a.env:1: PWD: gatewrap sets PWD"),
]


@pytest.mark.parametrize("text,said", [c[1:] for c in BAD_FILES], ids=[c[0] for c in BAD_FILES])
def test_a_bad_env_file_line_is_named_by_file_and_line_without_its_value(text, said):
    with pytest.raises(GatewrapError) as e:
        environment.parse_file(text, "a.env")
    assert str(e.value).startswith(said), str(e.value)
    assert "/etc/x" not in str(e.value) and "http://x" not in str(e.value)


def test_the_agent_keeps_a_short_set_of_the_callers_and_its_users_identity():
    caller = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "LC_TIME": "de_DE.UTF-8", "TERM": "xterm", "TZ": "UTC",
              "COLORTERM": "truecolor", "LANGUAGE": "de", "HOME": "/root", "USER": "root", "LOGNAME": "root",
              "GITHUB_TOKEN": "t", "EDITOR": "vi", "SHELL": "/bin/zsh", "SUDO_UID": "1000", "TMPDIR": "/var/tmp",
              "LC_SECRET_TOKEN": "carried by ssh's AcceptEnv LC_*"}
    env, passed, notes = environment.build(caller, TARGET, [])
    assert env == {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "LC_TIME": "de_DE.UTF-8", "TERM": "xterm", "TZ": "UTC",
                   "COLORTERM": "truecolor", "LANGUAGE": "de", "HOME": "/home/alice", "USER": "alice",
                   "LOGNAME": "alice"}
    assert (passed, notes) == ([], [])
    assert environment.build({}, TARGET, [])[0]["PATH"] == environment.DEFAULT_PATH


def test_named_entries_apply_in_order_and_a_missing_one_is_said():
    entries = [environment.parse_entry(t, s) for t, s in
               (("A=policy", "p"), ("B", "p"), ("A=file", "f"), ("TERM=dumb", "--env"), ("GONE", "--env"))]
    env, passed, notes = environment.build({"B": "callers", "TERM": "xterm"}, TARGET, entries)
    assert (env["A"], env["B"], env["TERM"]) == ("file", "callers", "dumb")
    assert passed == ["A", "B", "TERM"] and "GONE" not in env
    assert notes == ["gatewrap: note: --env GONE: not in gatewrap's environment, so not passed "
                     "(sudo keeps few variables: sudo --preserve-env=GONE, or --env-file)"]


@pytest.mark.kernel
@pytest.mark.parametrize("mode", [[], ["--jail", "none"]], ids=["in the jail", "without the jail"])
def test_what_is_named_reaches_the_agent_and_run_start_lists_the_names(gatewrap, open_dir, mode):
    d = open_dir  # the file is read as the user who ran sudo (here: nobody)
    (d / "agent.env").write_text("# the agent's\nFROM_FILE=file value\nOVERRIDDEN=file\nCALLERS_IN_FILE\n")
    (d / "policy.toml").write_text('default = "deny"\n[sandbox]\nenv = ["FROM_POLICY=p=1", "OVERRIDDEN=policy"]\n')
    r = gatewrap(python=AGENT, extra=[*mode, "--policy", str(d / "policy.toml"), "--env-file", str(d / "agent.env"),
                                      "--env", "OVERRIDDEN=command line", "--env", "LITERAL=a b"],
                 env={"CALLERS": "callers value"}, unnamed={"CALLERS_IN_FILE": "callers, by the file"})
    assert r.returncode == 0, r.stderr
    env = json.loads(r.stdout)
    got = {k: env.get(k) for k in ("CALLERS", "CALLERS_IN_FILE", "FROM_FILE", "FROM_POLICY", "OVERRIDDEN", "LITERAL")}
    assert got == {"CALLERS": "callers value", "CALLERS_IN_FILE": "callers, by the file", "FROM_FILE": "file value",
                   "FROM_POLICY": "p=1", "OVERRIDDEN": "command line", "LITERAL": "a b"}
    start = r.records(event="run_start")[0]
    assert set(start["env"]) >= set(got) and start["env"] == sorted(start["env"])
    assert not [v for v in got.values() if v in json.dumps(start)], "run_start holds names, never values"


@pytest.mark.kernel
def test_an_env_file_that_does_not_parse_stops_the_run_naming_its_line(gatewrap, open_dir):
    f = open_dir / "bad.env"
    f.write_text("A=1\nexport B=2\n")
    r = gatewrap(["/bin/true"], extra=["--env-file", str(f)])
    assert r.returncode == 125
    assert f"gatewrap: {f}:2: 'export B' is not a variable name" in r.stderr
