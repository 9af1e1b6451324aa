"""gatewrap's own failures. Each carries a message that says what to do next.

Exit codes follow ``docker run`` and env(1): 125 when gatewrap itself fails, 126 when the
command cannot be executed, 127 when it is not found, 124 when --timeout killed it;
otherwise the agent's own code.
"""

from __future__ import annotations

import os

EXIT_GATEWRAP = 125
EXIT_CANNOT_EXEC = 126
EXIT_NOT_FOUND = 127
#: The agent ran out of its --timeout (timeout(1)'s convention).
EXIT_TIMEOUT = 124


class GatewrapError(Exception):
    """A failure of gatewrap (not of the agent). ``exit_code`` defaults to 125."""

    exit_code = EXIT_GATEWRAP

    def __init__(self, message: str, exit_code: int | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class NeedRoot(GatewrapError):
    """The command needs root (cgroups, netns and BPF)."""


class BpfError(GatewrapError):
    """Compiling, loading, pinning or attaching the cgroup hooks failed."""


class SandboxError(GatewrapError):
    """Creating or removing a run's netns or cgroup failed."""


def require_root(command: str = "run") -> None:
    """Raises NeedRoot unless the effective uid is 0; the message names ``gatewrap COMMAND``."""
    if os.geteuid() != 0:
        hint = " (the agent still runs as you)" if command == "run" else ""
        raise NeedRoot(
            "gatewrap needs root to manage sandboxes (netns, cgroup, BPF hooks); "
            f"run it with sudo: sudo gatewrap {command} ...{hint}"
        )
