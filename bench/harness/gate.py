"""The gate run directly (``gatewrap._gate_core.Gate``), as ``gatewrap run`` starts it: it
listens on 127.0.0.1 inside a netns this harness creates and dials from the host netns,
where the upstream (nginx on 127.0.0.1) is. Its policy allows exactly the upstream's
address and ports (the SSRF guard keeps a loopback address only when a rule names it)."""

from __future__ import annotations

import os
import subprocess

from gatewrap import _gate_core as core

from .upstream import HTTP_PORT, TLS_PORT

PLAIN_PORT, INSPECT_PORT = 3128, 3129


class Netns:
    """``with Netns(name) as ns``: a named netns (ip-netns(8)) with ``lo`` up; ``ns.path``."""

    def __init__(self, name: str) -> None:
        self.name, self.path = name, f"/run/netns/{name}"

    def __enter__(self) -> "Netns":
        subprocess.run(["ip", "netns", "add", self.name], check=True)
        subprocess.run(["ip", "-n", self.name, "link", "set", "lo", "up"], check=True)
        return self

    def exec(self, argv: list[str]) -> list[str]:
        """``argv`` run inside the netns."""
        return ["ip", "netns", "exec", self.name, *argv]

    def __exit__(self, *exc: object) -> None:
        subprocess.run(["ip", "netns", "delete", self.name], check=False)


def policy(inspect: bool) -> core.Policy:
    """Allow 127.0.0.1 on the upstream's ports; ``inspect``: TLS-inspect its TLS port."""
    text = f'version = 1\n[[rule]]\nhost = "127.0.0.1"\nports = [{HTTP_PORT}]\naction = "allow"\n'
    text += f'[[rule]]\nhost = "127.0.0.1"\nports = [{TLS_PORT}]\naction = "allow"\n'
    if inspect:
        text += "inspect = true\n"
    return core.Policy.from_toml(text, "bench-policy.toml")


class Gate:
    """``with Gate(ns, tmp, inspect) as g: g.port``: a gate in ``ns`` writing its audit log
    (hash-chained and signed, as a run's) under ``tmp``; the log is removed afterwards."""

    def __init__(self, ns: Netns, tmp: str, inspect: bool, upstream_ca: str) -> None:
        self.ns, self.tmp, self.inspect, self.upstream_ca = ns, tmp, inspect, upstream_ca
        self.port = INSPECT_PORT if inspect else PLAIN_PORT
        self.audit_path = os.path.join(tmp, f"gate-audit-{self.port}.jsonl")

    def __enter__(self) -> "Gate":
        self.audit = core.AuditLog(self.audit_path)
        self.gate = core.Gate(run_id=f"bench-{self.port}", netns_path=self.ns.path, policy=policy(self.inspect),
                              audit=self.audit, listen_port=self.port,
                              ca_dir=os.path.join(self.tmp, "ca") if self.inspect else None,
                              upstream_ca=[self.upstream_ca])
        return self

    def counts(self) -> dict[str, int]:
        return self.gate.counts()

    def __exit__(self, *exc: object) -> None:
        self.gate.stop()
        del self.gate, self.audit
        for suffix in ("", ".lock"):
            try:
                os.unlink(self.audit_path + suffix)
            except FileNotFoundError:
                pass
