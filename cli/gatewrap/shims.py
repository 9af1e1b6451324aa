"""The agent's environment, from the table in ``agent_shims/env.toml``."""

from __future__ import annotations

import tomllib
from pathlib import Path

ENV_TABLE = Path(__file__).resolve().parent / "_shims" / "env.toml"


def env_table() -> dict[str, str]:
    """The variables gatewrap sets, with ``{proxy}`` unexpanded (name -> template)."""
    with open(ENV_TABLE, "rb") as f:
        return dict(tomllib.load(f)["env"])


def agent_env(base: dict[str, str], proxy_url: str) -> tuple[dict[str, str], list[str]]:
    """Return (the agent's environment, names of user variables that were overridden).

    ``base`` is copied; every variable of the table replaces the user's value, since a
    proxy variable that points elsewhere would only make the agent fail at the kernel.
    """
    env = dict(base)
    overridden = []
    for name, template in env_table().items():
        value = template.replace("{proxy}", proxy_url)
        if name in env and env[name] != value:
            overridden.append(name)
        env[name] = value
    return env, overridden
