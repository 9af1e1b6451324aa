"""The breakpoint example end to end: a fake internet with a fake e-mail API (mail.test), the
agent run under gatewrap with policy.toml, and a human answering its approval from the CLI.

    sudo .venv/bin/python examples/breakpoint/run.py                  # approve
    sudo .venv/bin/python examples/breakpoint/run.py --reject 'not to all customers'
    sudo .venv/bin/python examples/breakpoint/run.py --edit           # edit the recipient, then approve
    sudo .venv/bin/python examples/breakpoint/run.py --by-hand        # you answer, from another terminal

It prints the session as a terminal would show it (``$ command`` then its output). With
``--by-hand`` it answers nothing: it prints the approval's line and the ``export
GATEWRAP_STATE=...`` to type in a second terminal (as root), then waits while you answer with
``gatewrap approvals list|show|edit|approve|reject`` or the review pages (``gatewrap approvals
serve``), until the run ends (the rule's timeout is 10 minutes: then the send is denied).
Nothing leaves the machine (tests/fakenet: documentation addresses, its own DNS). The approvals
store is a fresh SQLite file in a temporary folder (GATEWRAP_STATE), not the host's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from fakenet import FakeInternet, cleanup_leftovers, hold_host_lock  # noqa: E402

#: mail.test lives on the fake internet's web server.
NAMES = {"mail.test": ["198.51.100.138", "2001:db8:100::10"]}


def shown(cmd: list[str], env: dict[str, str], **kw) -> subprocess.CompletedProcess:
    """Print ``$ cmd`` and run it, its output going to ours."""
    print("$ " + shlex.join(cmd), flush=True)
    return subprocess.run(cmd, env=env, **kw)


def wait_pending(env: dict[str, str], timeout: float = 120) -> dict:
    """The first pending approval in the store (polled: the example has no webhook)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        out = subprocess.run(["gatewrap", "approvals", "list", "--status", "pending", "--json"], env=env,
                             capture_output=True, text=True)
        if out.returncode == 0 and json.loads(out.stdout)["approvals"]:
            return json.loads(out.stdout)["approvals"][0]
        time.sleep(0.2)
    raise SystemExit("example: no approval appeared; see the run's output above")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reject", metavar="REASON", help="reject instead of approving")
    ap.add_argument("--edit", action="store_true", help="edit the recipient to one person, then approve")
    ap.add_argument("--by-hand", action="store_true",
                    help="answer nothing: wait while a human answers from another terminal")
    args = ap.parse_args()
    if args.by_hand and (args.reject or args.edit):
        ap.error("--by-hand answers nothing itself: it takes neither --reject nor --edit")
    lock = hold_host_lock("example")  # noqa: F841 (held until the example exits)
    cleanup_leftovers()
    work = tempfile.mkdtemp(prefix="gatewrap-breakpoint-")
    os.chmod(work, 0o755)
    for name in ("agent.py", "policy.toml"):
        shutil.copy(HERE / name, work)
        os.chmod(os.path.join(work, name), 0o644)
    env = dict(os.environ, GATEWRAP_STATE=f"sqlite:{work}/state.db", PATH=f"{ROOT}/.venv/bin:{os.environ['PATH']}")
    with FakeInternet(extra_names=NAMES) as net:
        site = os.path.join(net.sites_dir, "mail.test")
        os.makedirs(site, exist_ok=True)
        Path(site, ".mail").touch()
        cmd = ["gatewrap", "run", "--policy", f"{work}/policy.toml", "--resolver", net.dns_server,
               "--audit-log", f"{work}/audit.jsonl", "--public-range", "198.51.100.128/25",
               "--public-range", "2001:db8:100::/48", "--ro-bind", work, "--workdir", "/tmp",
               "--", "/usr/bin/python3", f"{work}/agent.py"]
        print("$ " + " ".join(cmd) + " &", flush=True)
        run = subprocess.Popen(cmd, env=env)
        with contextlib.ExitStack() as stack:
            stack.callback(lambda: run.poll() is None and run.terminate())
            a = wait_pending(env)
            time.sleep(0.2)  # let the gate's line reach the terminal before ours
            print(flush=True)
            if args.by_hand:
                code = by_hand(run, a, env)
            else:
                code = answer(run, a, env, args)
        print(flush=True)
        shown(["gatewrap", "audit", "--log", f"{work}/audit.jsonl", "--format", "table"], env)
        mails = net.access_entries(event="mail")
        print(f"\n(the fake e-mail API received {len(mails)} message(s): "
              f"{', '.join(m['to'] for m in mails) or 'none'})")
    shutil.rmtree(work, ignore_errors=True)
    return code


def by_hand(run: subprocess.Popen, a: dict, env: dict[str, str]) -> int:
    """Wait for the run to end while a human answers approval ``a`` from another terminal;
    the run's exit code."""
    until = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(a["deadline"]))
    print(f"example: approval {a['id']} waits for you until {until}. In another terminal, as root:\n"
          f"    export GATEWRAP_STATE={shlex.quote(env['GATEWRAP_STATE'])} PATH={shlex.quote(str(ROOT))}/.venv/bin:$PATH\n"
          f"    gatewrap approvals list\n"
          f"    gatewrap approvals show {a['id']}\n"
          f"    gatewrap approvals approve {a['id']}    # or edit ID, reject ID --reason TEXT, serve\n"
          "example: waiting for the run to end (Ctrl-C ends it)", flush=True)
    return run.wait()


def answer(run: subprocess.Popen, a: dict, env: dict[str, str], args: argparse.Namespace) -> int:
    """Answer approval ``a`` as ``args`` say (approve; ``--edit`` first; or ``--reject``),
    each command shown; the run's exit code."""
    shown(["gatewrap", "approvals", "list"], env)
    shown(["gatewrap", "approvals", "show", a["id"]], env)
    # --yes: this script has shown the request itself; a human at a terminal, without it, is
    # shown the request the store holds and asked y/N
    if args.reject:
        shown(["gatewrap", "approvals", "reject", a["id"], "--reason", args.reject, "--yes"], env)
    else:
        if args.edit:
            editor = "sed -i s/all-customers@example.com/pricing-team@example.com/"
            shown(["gatewrap", "approvals", "edit", a["id"]], {**env, "EDITOR": editor})
        shown(["gatewrap", "approvals", "approve", a["id"], "--yes"], env)
    return run.wait(timeout=120)


if __name__ == "__main__":
    sys.exit(main())
