"""The demo: a fake internet in a netns, examples/agent.py run under gatewrap, the audit table.

Run as root after installing (scripts/setup.sh demo does both). Nothing leaves the
machine: the fake internet (tests/fakenet) uses documentation addresses routed only to
its own veth, and its own DNS server answers for the *.test names.

``--keep``: after the demo, leave the fake internet up (until Enter or Ctrl-C) and print
the options a ``gatewrap run`` of yours needs to use it (the README's tour).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from fakenet import AddressConflict, FakeInternet, cleanup_leftovers, hold_host_lock  # noqa: E402


def main(keep: bool = False) -> int:
    lock = hold_host_lock("demo")  # noqa: F841 (held until the demo exits)
    cleanup_leftovers()
    work = tempfile.mkdtemp(prefix="gatewrap-demo-")
    audit = os.path.join(work, "audit.jsonl")
    # The agent may run as another user (nobody, when root runs the demo without sudo), who
    # cannot read a clone under /root: give it a copy it can read.
    shown = tempfile.mkdtemp(prefix="gatewrap-demo-agent-")
    os.chmod(shown, 0o755)
    agent = shutil.copy(ROOT / "examples" / "agent.py", shown)
    os.chmod(agent, 0o644)
    net = FakeInternet()
    try:
        net.start()
    except AddressConflict as e:
        print(f"demo: cannot start the fake internet: {e}. The demo needs 198.51.100.0/24 "
              "(TEST-NET-2), 2001:db8:1::/64 and 2001:db8:100::/48 free on this host.", file=sys.stderr)
        return 1
    with contextlib.closing(net):
        # the gatewrap of this checkout's .venv first, as examples/breakpoint/run.py does
        env = dict(os.environ, REQUESTS_CA_BUNDLE=net.ca_path,
                   PATH=f"{ROOT}/.venv/bin:{os.environ['PATH']}")
        # The fake internet's CA is under /tmp, which the jail replaces: show it read-only.
        cmd = ["gatewrap", "run", "--allow", "allowed.test", "--resolver", net.dns_server,
               "--ro-bind", net.tmpdir, "--audit-log", audit,
               # the fake internet uses documentation addresses: count them as public
               "--public-range", "198.51.100.128/25", "--public-range", "2001:db8:100::/48",
               "--ro-bind", shown, "--workdir", "/tmp", "--env", "REQUESTS_CA_BUNDLE",
               "--", "/usr/bin/python3", agent]
        print("$ " + " ".join(cmd), flush=True)
        rc = subprocess.run(cmd, env=env).returncode
        print(f"\n$ gatewrap audit --format table --log {audit}", flush=True)
        subprocess.run(["gatewrap", "audit", "--format", "table", "--log", audit], env=env)
        print(f"\n$ gatewrap audit --denied --json --log {audit}", flush=True)
        subprocess.run(["gatewrap", "audit", "--denied", "--json", "--log", audit], env=env)
        print(f"\nnext: read the run again with sudo gatewrap audit --log {audit} (--help: its filters); "
              "wrap an agent of yours: docs/tutorials/wrap-an-agent.md", flush=True)
        if keep:
            _wait_with_the_fake_internet_up(net)
    shutil.rmtree(shown, ignore_errors=True)
    return rc


def _wait_with_the_fake_internet_up(net: FakeInternet) -> None:
    """Say how to use the fake internet from another terminal, then wait for Enter/Ctrl-C."""
    print("\nThe fake internet stays up until you press Enter (or Ctrl-C). From another terminal,\n"
          "as root, add these options to a gatewrap run (the README's tour leaves them out):\n\n"
          f"  --resolver {net.dns_server} --public-range 198.51.100.128/25 --public-range 2001:db8:100::/48"
          f" --ro-bind {net.tmpdir}\n\n"
          "e.g. sudo gatewrap run --resolver ... --allow allowed.test -- curl -sS http://allowed.test/\n"
          f"(https: its CA is {net.ca_path}; name it with --env CURL_CA_BUNDLE after setting it)", flush=True)
    with contextlib.suppress(KeyboardInterrupt, EOFError):
        input()


if __name__ == "__main__":
    if {"-h", "--help"} & set(sys.argv[1:]):
        print(f"usage: sudo .venv/bin/python examples/demo.py [--keep]\n\n{__doc__}")
        sys.exit(0)
    sys.exit(main(keep="--keep" in sys.argv[1:]))
