"""Escape suite, the TLS inspection CA: the agent can read the CA certificate (it must trust
it) but never the CA's key, in the jail and as a root agent without the jail (uid 0 owns
the key file; the launcher's mount namespace covers ``private/`` with an empty mode-000
tmpfs, and the agent has no CAP_DAC_OVERRIDE to pass it)."""

from __future__ import annotations

import pytest

from .helpers import assert_bounded, attempts, python_argv

pytestmark = pytest.mark.kernel

#: gatewrap's default CA directory, made on the first run that inspects.
CA_DIR = "/var/lib/gatewrap/ca"

POLICY = """
[[rule]]
host = "allowed.test"
action = "allow"
inspect = true
"""

READS = f"""
attempt("read the CA certificate", lambda: open("{CA_DIR}/ca.crt").read().count("BEGIN CERTIFICATE"))
attempt("list the key directory", lambda: os.listdir("{CA_DIR}/private"))
attempt("read the CA key", lambda: open("{CA_DIR}/private/ca.key").read())
"""


@pytest.mark.parametrize("who", [[], ["--user", "root", "--jail", "none"]], ids=[
    "the agent reads the CA certificate but not its key in the jail",
    "a root agent without the jail reads the CA certificate but not its key"])
def test_the_ca_key_is_hidden_from_the_agent(gatewrap, quiet_net, outcome, tmp_path, who):
    from gatewrap import _gate_core as core

    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY)
    # The jail's view has no /var/lib: the test shows the CA folder, as a user could.
    core.ensure_ca(CA_DIR)
    shown = [] if who else ["--ro-bind", CA_DIR]
    r = gatewrap(python_argv(READS), extra=["--policy", str(policy), "--ca-dir", CA_DIR, *shown, *who],
                 user_env=not who, timeout=30)
    got = {a["step"]: a for a in attempts(r.stdout)}
    assert len(got) == 3, r.stderr
    cert, listing, key = got["read the CA certificate"], got["list the key directory"], got["read the CA key"]
    outcome("mount ns: private/ hidden under an empty mode-000 tmpfs" if who
            else "file modes (0700/0600 root), the CA folder bound with --ro-bind",
            f"cert: {cert['errno'] or 'read'}; key dir: {listing['errno'] or 'listed'}; key: {key['errno'] or 'READ'}",
            "OPEN" if key["errno"] is None or listing["errno"] is None else "held")
    assert (cert["errno"], cert["result"]) == (None, 1), cert
    assert listing["errno"] == "EACCES", listing
    assert key["errno"] == "EACCES", key
    for a in got.values():
        assert_bounded(a)
