"""The ``gatewrap daemon`` command."""

from __future__ import annotations

import json
import os
import sys

import click

from ..errors import GatewrapError
from . import protocol

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


@click.command(context_settings=CONTEXT)
@click.option("--socket", "socket_path", metavar="PATH",
              help=f"Listen on PATH, a file in {protocol.SOCKET_DIR} (root's, mode 0600; the folder is hidden from every "
                   f"agent). Default: $GATEWRAP_DAEMON_SOCKET, else {protocol.DEFAULT_SOCKET}.")
@click.option("--status", is_flag=True,
              help="Ask the running daemon for its pid, its runs, its file descriptors (limit, open, room for "
                   "about how many more idle sandboxes) and its install (version, folder), and exit (exit 1 when "
                   "none answers).")
@click.option("--stop", is_flag=True,
              help="Stop the running daemon (SIGTERM to the process the socket's peer credentials name) and "
                   "wait for it to exit; its runs lose their gates (no egress) until they end or a daemon on "
                   "this socket takes them back within 30 s. Exit 1 when none answers.")
@click.option("--json", "as_json", is_flag=True, help="With --status: print one JSON object.")
@click.option("--review", "review", metavar="HOST:PORT", default=None,
              help="Also serve the approvals' review pages (as gatewrap approvals serve does) on HOST:PORT, a "
                   "loopback address: one long-lived gatewrap process per host for both. The list's address is "
                   "printed on the daemon's stderr.")
@click.option("--state", "state_url", metavar="URL",
              help="The approvals store the review pages show (default as gatewrap approvals serve).")
@click.option("--idle-exit", "idle_exit", metavar="DURATION", default="0", show_default=True,
              callback=lambda c, p, v: _duration(v),
              help="Exit after DURATION (90s, 10m, 2h) without a run and without a client; 0: never. A daemon "
                   "`gatewrap run` starts on demand exits after 10m; a run arriving as it exits starts a new one.")
@click.option("--quiet-if-running", is_flag=True, hidden=True,
              help="Exit 0 without a word when another daemon already serves the socket (the on-demand start).")
def daemon(socket_path: str | None, status: bool, stop: bool, as_json: bool, review: str | None,
           state_url: str | None, idle_exit: float, quiet_if_running: bool) -> None:
    """Serve the sandboxes of every `gatewrap run` on this host, in the foreground.

    \b
    One process holds the loaded hooks, one runtime for every run's gate and every run's
    ring-buffer reader; each run costs the host its netns, cgroup, listeners (made inside
    the run's netns), map entries and jail, and a waiter process of well under 1 MB that
    keeps the agent its child. `gatewrap run` starts the daemon on demand when none
    answers (its log: /var/log/gatewrap/daemon.log; it exits after 10 minutes without a
    run); a systemd unit that keeps it up is in contrib/systemd/gatewrap-daemon.service.
    `gatewrap run --own` runs without it.

    \b
    Fail closed: if the daemon dies, every sandbox keeps its hooks and loses its gate, so
    it has no egress; its agents run on and their `gatewrap run` says so. SIGTERM or SIGINT
    stop it the same way. A daemon started again on the same socket takes back every run
    whose `gatewrap run` comes back within 30 s (the gate again in its netns); the other
    stale sandboxes are removed (as gatewrap gc does).

    \b
    Examples:
      sudo gatewrap daemon
      sudo gatewrap daemon --idle-exit 1h
      sudo gatewrap run --allow pypi.org -- python agent.py
      sudo gatewrap daemon --status --json
      sudo gatewrap daemon --stop
      sudo gatewrap daemon --review 127.0.0.1:8377
    """
    path = protocol.socket_path(flag=socket_path)
    if status:
        _status(path, as_json)
        return
    if stop:
        _stop(path)
        return
    from .daemon import Daemon, DaemonRunning

    if review is not None:
        _serve_review(review, state_url)
    try:
        Daemon(path, idle_exit=idle_exit).serve()
    except DaemonRunning:
        if quiet_if_running:
            return
        raise


def _duration(value: str) -> float:
    """``--idle-exit``: seconds of a duration (``N`` + s, m, h or d), 0 for ``0`` (never)."""
    if value.strip() == "0":
        return 0
    from ..approvals.decide import seconds

    try:
        return seconds(value)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None


def _status(path: str, as_json: bool) -> None:
    from ..errors import NeedRoot
    from .client import connect

    if os.geteuid() != 0:  # the daemon answers root alone (SO_PEERCRED), its socket is root's 0600
        raise NeedRoot("gatewrap daemon --status needs root: the daemon answers root alone (its socket is root's); "
                       "run it with sudo: sudo gatewrap daemon --status")

    try:
        sock = connect(path, start=False)
    except GatewrapError as e:
        if as_json:
            click.echo(json.dumps({"running": False, "socket": path}))
        else:
            click.echo(f"gatewrap: {e}", err=True)
        sys.exit(1)
    try:  # a _socket.socket, which is no context manager
        protocol.send(sock, {"op": "status"})
        got = protocol.Reader(sock).message() or {}
    finally:
        sock.close()
    if "error" in got:
        raise GatewrapError(str(got["error"]), exit_code=int(got.get("exit_code", 125)))
    if as_json:
        click.echo(json.dumps({"running": True, "socket": path, **got}))
    else:
        runs, fds = got.get("runs", []), got.get("fds")
        click.echo(f"gatewrap daemon pid {got.get('pid')} on {path}: {len(runs)} run{'' if len(runs) == 1 else 's'}"
                   + (f" ({', '.join(runs)})" if runs else "")
                   + (f"; file descriptor limit {fds['limit']:,}, {fds['open']:,} open: room for about "
                      f"{fds['sandbox_room']:,} more idle sandboxes" if isinstance(fds, dict) else "")
                   + (f"; {protocol.shown_install(got['install'])}" if "install" in got else ""))


def _stop(path: str, patience: float = 60.0) -> None:
    """SIGTERM to the daemon serving ``path`` (its pid from the connection's SO_PEERCRED,
    unix(7): not from anything it says), then wait up to ``patience`` seconds for it to exit
    (a stopping daemon waits up to 10 s for run ends under way).

    Raises:
        NeedRoot: not root.
        GatewrapError: it did not exit in time (125).
    """
    import signal
    import socket
    import struct
    import time

    from ..errors import NeedRoot
    from .client import connect

    if os.geteuid() != 0:
        raise NeedRoot("gatewrap daemon --stop needs root (the daemon's socket is root's); "
                       "run it with sudo: sudo gatewrap daemon --stop")
    try:
        sock = connect(path, start=False)
    except GatewrapError:
        click.echo(f"gatewrap: no gatewrap daemon answers on {path}: nothing to stop", err=True)
        sys.exit(1)
    try:
        pid, _uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
        protocol.send(sock, {"op": "status"})
        runs = (protocol.Reader(sock).message() or {}).get("runs", [])
    finally:
        sock.close()
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + patience
    while _alive(pid):
        if time.monotonic() > deadline:
            raise GatewrapError(f"the gatewrap daemon (pid {pid}) did not exit within {patience:g} s of SIGTERM; "
                                f"see its log, or kill -KILL {pid}")
        time.sleep(0.05)
    lost = (f"; its {len(runs)} run{'' if len(runs) == 1 else 's'} ({', '.join(runs)}) lost their gates: no egress "
            "until they end or a daemon on this socket takes them back within 30 s") if runs else ""
    click.echo(f"gatewrap: stopped the daemon (pid {pid}) on {path}{lost}")


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, exited but not reaped by its parent, does not:
    proc(5), /proc/PID/stat's state)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _serve_review(listen: str, state_url: str | None) -> None:
    """The review pages on a thread of the daemon (``gatewrap approvals serve``'s server).

    Raises:
        click.BadParameter: not HOST:PORT, or not a loopback address.
        GatewrapError: the store cannot be opened or the address cannot be bound.
    """
    import threading

    from ..approvals import state
    from ..approvals.web import ReviewServer, is_loopback, parse_listen

    try:
        host, port = parse_listen(listen)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--review") from None
    if not is_loopback(host):
        raise click.BadParameter(f"{host} is not a loopback address (the daemon serves the review pages on "
                                 "loopback only; use gatewrap approvals serve --allow-remote)", param_hint="--review")
    store = state.open_store(state.resolve_url(state_url))
    try:
        server = ReviewServer(store, (host, port))
    except OSError as e:
        raise GatewrapError(f"cannot listen on {host}:{port}: {e.strerror}; choose another with --review") from e
    click.echo(f"gatewrap daemon: review pages at {server.base}/l/{server.list_key} (store {store.url})", err=True)
    threading.Thread(target=server.serve_forever, name="gatewrap-review", daemon=True).start()
