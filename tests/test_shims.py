"""The agent's environment table: the README shows exactly agent_shims/env.toml, and every
variable reaches the agent with the gate's address filled in."""

from __future__ import annotations

import json
import re
import tomllib

import pytest

from conftest import ROOT


def _table() -> dict[str, str]:
    with open(ROOT / "agent_shims" / "env.toml", "rb") as f:
        return tomllib.load(f)["env"]


def test_the_readme_table_is_the_env_toml():
    readme = (ROOT / "README.md").read_text()
    block = readme.split("<!-- env-table:start -->")[1].split("<!-- env-table:end -->")[0]
    rows = dict(re.findall(r"^\| `([^`]+)` \| `([^`]*)` \|$", block, re.M))
    # a | inside a table cell is written \| (GitHub-flavoured Markdown)
    assert {k: v.replace("\\|", "|") for k, v in rows.items()} == _table()


@pytest.mark.kernel
def test_every_variable_reaches_the_agent_filled_in(gatewrap):
    r = gatewrap(python="import json, os; print(json.dumps(dict(os.environ)))",
                 env={"HTTPS_PROXY": "http://elsewhere:8080"})
    env = json.loads(r.stdout)
    for name, template in _table().items():
        want = (template.replace("{proxy}", "http://127.0.0.1:3128").replace("{host}", "127.0.0.1")
                .replace("{port}", "3128"))
        assert env[name] == want, name
    assert "replaced your HTTPS_PROXY" in r.stderr
