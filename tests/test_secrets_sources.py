"""Secrets' sources, resolved on the host before the agent starts (gatewrap.secrets), and the
policy's checks of ``inject`` (``gatewrap policy check``, ``gatewrap secrets list/check``): each
failure names the secret and the source, never a value, and fails closed (125 at a run's start)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from gatewrap import secrets as sec
from gatewrap.errors import GatewrapError

VALUE = "s3cr3t-value-0123456789"


def definition(kind, where, name="github"):
    return {"name": name, "source": (kind, where), "placeholder_env": None, "origin": "p.toml:1"}


def private(tmp_path, text, mode=0o600, name="tok"):
    p = tmp_path / name
    p.write_text(text)
    os.chmod(p, mode)
    return str(p)


def test_each_source_gives_its_value_without_one_trailing_newline(tmp_path):
    assert sec.resolve_one(definition("file", private(tmp_path, VALUE + "\n")), {}) == VALUE
    assert sec.resolve_one(definition("env", "GH"), {"GH": VALUE}) == VALUE
    assert sec.resolve_one(definition("command", ["/bin/echo", VALUE]), {"PATH": "/usr/bin:/bin"}) == VALUE


@pytest.mark.parametrize("case,make,want", [
    ("a missing file", lambda t: definition("file", str(t / "none")), "cannot open"),
    ("a file others may read", lambda t: definition("file", private(t, VALUE, 0o644)), "is mode 0644"),
    ("a link to a file", lambda t: (os.symlink(private(t, VALUE), t / "ln"), definition("file", str(t / "ln")))[1], "cannot open"),
    ("a missing variable", lambda t: definition("env", "NOPE"), "from_env NOPE is not in gatewrap's environment"),
    ("a failing command", lambda t: definition("command", ["/bin/sh", "-c", f"echo {VALUE}; echo no login >&2; exit 3"]),
     "from_command /bin/sh exited 3: no login"),
    ("a missing command", lambda t: definition("command", ["/nonexistent/gh"]), "/nonexistent/gh not found"),
    ("an empty value", lambda t: definition("command", ["/bin/true"]), "empty value"),
    ("two lines", lambda t: definition("command", ["/bin/printf", f"{VALUE}\\n{VALUE}\\n"]), "line breaks"),
], ids=lambda x: x if isinstance(x, str) and " " in x else "")
def test_a_source_that_does_not_resolve_says_why_without_the_value(tmp_path, case, make, want):
    with pytest.raises(GatewrapError) as e:
        sec.resolve_one(make(tmp_path), {"PATH": "/usr/bin:/bin"})
    assert want in str(e.value) and "secret github (p.toml:1)" in str(e.value), str(e.value)
    assert VALUE not in str(e.value)
    assert e.value.exit_code == 125


def test_placeholders_are_fresh_and_the_agent_env_never_holds_a_value():
    a, b = sec.placeholder(), sec.placeholder()
    assert a != b and a.startswith("gwsecret_") and len(a) == 41
    r = [sec.Resolved("github", VALUE, a, "GITHUB_TOKEN")]
    assert sec.agent_env({"GITHUB_TOKEN": VALUE, "PATH": "/bin"}, r) == {"GITHUB_TOKEN": a, "PATH": "/bin"}
    with pytest.raises(GatewrapError, match="OTHER holds the value of secret github"):
        sec.agent_env({"OTHER": "x" + VALUE}, r)
    assert VALUE not in repr(r)


POLICY = """
[[secret]]
name = "github"
from_env = "GW_T_SECRET"

[[rule]]
host = "api.github.com"
action = "allow"
{extra}
inject = {{ secret = "{name}", as = "bearer" }}
"""


def gatewrap(*args, env=None):
    return subprocess.run([sys.executable, "-m", "gatewrap", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})})


@pytest.mark.parametrize("case,extra,name,code,want", [
    ("inspected https injects", "inspect = true", "github", 0, ""),
    ("https without inspection is an error", "", "github", 1, "`inject` on https needs `inspect = true`"),
    ("an unknown secret is an error", "inspect = true", "gh", 1, "injects secret \"gh\", which no [[secret]] defines"),
])
def test_policy_check_says_what_is_wrong_with_an_inject(tmp_path, case, extra, name, code, want):
    p = tmp_path / "p.toml"
    p.write_text(POLICY.format(extra=extra, name=name))
    r = gatewrap("policy", "check", str(p))
    assert r.returncode == code, r.stderr
    assert want in r.stderr
    if code == 0:  # the rule's summary names the secret and its place
        assert "inject [secret github] into header authorization" in r.stdout, r.stdout


def test_secrets_list_and_check_never_print_a_value(tmp_path):
    p = tmp_path / "p.toml"
    p.write_text(POLICY.format(extra="inspect = true", name="github"))
    listed = gatewrap("secrets", "list", "--policy", str(p), "--json")
    assert listed.returncode == 0, listed.stderr
    (s,) = json.loads(listed.stdout)["secrets"]
    assert (s["name"], s["source"], [r["place"] for r in s["rules"]]) == (
        "github", {"kind": "env", "from": "GW_T_SECRET"}, ["header authorization"])
    bad = gatewrap("secrets", "check", "--policy", str(p))
    assert bad.returncode == 1 and "github: does not resolve" in bad.stdout, bad.stdout
    good = gatewrap("secrets", "check", "--policy", str(p), "--json", env={"GW_T_SECRET": VALUE})
    assert good.returncode == 0 and json.loads(good.stdout)["ok"] is True, good.stdout
    assert all(VALUE not in x for x in (listed.stdout, bad.stdout, good.stdout, good.stderr))


def test_a_rotation_reads_each_source_again_and_keeps_the_placeholders(tmp_path):
    from gatewrap import _gate_core as core

    p = core.Policy.from_toml(POLICY.format(extra="inspect = true", name="github")
                              .replace('from_env = "GW_T_SECRET"', 'from_env = "GW_T_SECRET"\nplaceholder_env = "GH"'), "p.toml")
    p.add_host_secrets(None)
    (first,) = sec.resolve(p, {"GW_T_SECRET": "old-value-1"})
    (again,) = sec.resolve_again(p, {"GW_T_SECRET": "new-value-2"}, [first])
    assert (again.value, again.placeholder, again.placeholder_env) == ("new-value-2", first.placeholder, "GH")
    with pytest.raises(GatewrapError, match="from_env GW_T_SECRET is not in"):
        sec.resolve_again(p, {}, [first])


def test_a_process_that_resolved_a_secret_can_no_longer_dump_its_memory(tmp_path):
    """A core of gatewrap (or the daemon) would hold the values: resolving the first secret
    makes the process non-dumpable (PR_GET_DUMPABLE 0), and an exec'd child is dumpable again."""
    policy = tmp_path / "p.toml"
    policy.write_text('[[secret]]\nname = "k"\nfrom_env = "K"\n\n[[rule]]\nhost = "api.test"\nschemes = ["http"]\n'
                      'action = "allow"\ninject = { secret = "k", as = "bearer" }\n')
    code = ("import ctypes, subprocess, sys\n"
            "from gatewrap import secrets\nfrom gatewrap.policy import build_policy\n"
            "libc = ctypes.CDLL(None)\nbefore = libc.prctl(3, 0, 0, 0, 0)\n"
            f"secrets.resolve(build_policy({str(policy)!r}, [], []), {{'K': 'v4lue'}})\n"
            "child = subprocess.run([sys.executable, '-c', 'import ctypes; print(ctypes.CDLL(None).prctl(3, 0, 0, 0, 0))'],"
            " capture_output=True, text=True).stdout.strip()\n"
            "print(before, libc.prctl(3, 0, 0, 0, 0), child)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.stdout.split() == ["1", "0", "1"], p.stderr
