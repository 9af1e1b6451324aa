"""The agent's environment table: the docs (docs/reference/environment.md) show exactly
agent_shims/env.toml, and every variable reaches the agent with the gate's address filled in."""

from __future__ import annotations

import json
import os
import re
import tomllib

import pytest

from conftest import ROOT


def _table(name: str = "env") -> dict[str, str]:
    with open(ROOT / "agent_shims" / "env.toml", "rb") as f:
        return tomllib.load(f)[name]


@pytest.mark.parametrize("table,marker", [("env", "env-table"), ("env_inspect", "env-inspect-table")],
                         ids=["the docs' table is env.toml's [env]",
                              "the docs' TLS inspection table is env.toml's [env_inspect]"])
def test_the_docs_table_is_the_env_toml(table, marker):
    readme = (ROOT / "docs" / "reference" / "environment.md").read_text()
    block = readme.split(f"<!-- {marker}:start -->")[1].split(f"<!-- {marker}:end -->")[0]
    rows = dict(re.findall(r"^\| `([^`]+)` \| `([^`]*)` \|$", block, re.M))
    # a | inside a table cell is written \| (GitHub-flavoured Markdown)
    assert {k: v.replace("\\|", "|") for k, v in rows.items()} == _table(table)


@pytest.mark.kernel
def test_every_variable_reaches_the_agent_filled_in(gatewrap):
    # the caller's own proxy variable does not ride in (nothing unnamed does): nothing to replace
    r = gatewrap(python="import json, os; print(json.dumps(dict(os.environ)))",
                 unnamed={"HTTPS_PROXY": "http://elsewhere:8080"})
    env = json.loads(r.stdout)
    for name, template in _table().items():
        want = (template.replace("{proxy}", "http://127.0.0.1:3128").replace("{host}", "127.0.0.1")
                .replace("{port}", "3128"))
        assert env[name] == want, name
    assert "elsewhere" not in r.stdout + r.stderr


def test_the_staged_bundle_is_the_system_roots_then_the_gates_ca(tmp_path):
    from gatewrap import shims

    ca_cert = tmp_path / "ca.crt"
    ca_cert.write_text("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    staged = tmp_path / "staged"
    staged.mkdir()
    ca, bundle = shims.stage_ca(str(staged), str(ca_cert))
    with open(shims.SYSTEM_ROOTS) as f:
        roots = f.read()
    assert open(ca).read() == ca_cert.read_text()
    assert open(bundle).read() == roots.rstrip("\n") + "\n" + ca_cert.read_text()
    assert [oct(os.stat(p).st_mode & 0o777) for p in (ca, bundle)] == ["0o644", "0o644"]
    env = {"SSL_CERT_FILE": "/mine.pem", "NODE_EXTRA_CA_CERTS": ca}
    replaced = shims.add_ca_env(env, ca, bundle)
    assert replaced == ["SSL_CERT_FILE"], "a value equal to gatewrap's is not reported"
    assert env["SSL_CERT_FILE"] == bundle and env["DENO_CERT"] == ca
