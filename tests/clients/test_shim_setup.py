"""The shims' set-up without a sandbox: aiohttp is patched only once the agent imports it, and
the Node shim is appended to the agent's NODE_OPTIONS."""

from __future__ import annotations

import subprocess

import pytest

from gatewrap import shims

AIOHTTP = """
import sys
print("aiohttp" in sys.modules)
import asyncio, aiohttp
async def main():
    async with aiohttp.ClientSession() as default, aiohttp.ClientSession(trust_env=False) as explicit:
        print(default.trust_env, explicit.trust_env)
asyncio.run(main())
"""


def test_aiohttp_sessions_trust_the_environment_once_aiohttp_is_imported(agent_python):
    p = subprocess.run([agent_python, "-c", AIOHTTP], capture_output=True, text=True, timeout=60,
                       env={"PYTHONPATH": str(shims.PYTHON_SHIM), "PATH": "/usr/bin:/bin"})
    assert p.stdout.split("\n")[:2] == ["False", "True False"], p.stderr


@pytest.mark.parametrize("user, want", [
    (None, "--require /s/node/gatewrap-proxy.js"),
    ("--max-old-space-size=64", "--max-old-space-size=64 --require /s/node/gatewrap-proxy.js"),
], ids=["without NODE_OPTIONS of the user's", "after the user's NODE_OPTIONS"])
def test_the_node_shim_is_preloaded(user, want):
    env = {} if user is None else {"NODE_OPTIONS": user}
    shims.add_node_shim(env, "/s/node")
    assert env["NODE_OPTIONS"] == want


def test_a_node_shim_path_with_a_space_is_quoted():
    env: dict[str, str] = {}
    shims.add_node_shim(env, "/a b/node")
    assert env["NODE_OPTIONS"] == '--require "/a b/node/gatewrap-proxy.js"'
