"""The client's last steps, for tests/test_waiter.py: become a subreaper, block the signals,
spawn the agent, then exec the waiter (``gatewrap.shared.waiter.exec_waiter``).

    python waiter_driver.py --control-fd FD --cgroup DIR [--timeout S] [--join-cgroup] -- CMD...

Prints ``agent PID`` on stdout once the agent runs CMD (the signals are blocked by then, so
a signal sent to this process after that line reaches the waiter). ``--join-cgroup`` puts the
agent into DIR before it runs CMD (as the launcher's pre-exec join does).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import sys

from gatewrap.shared import waiter

PR_SET_CHILD_SUBREAPER = 36
BLOCKED = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGCHLD}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--control-fd", type=int, required=True)
    parser.add_argument("--cgroup", required=True)
    parser.add_argument("--timeout", type=float)
    parser.add_argument("--join-cgroup", action="store_true")
    parser.add_argument("command", nargs="+")
    opts = parser.parse_args()

    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        sys.exit(f"prctl: {os.strerror(ctypes.get_errno())}")
    signal.pthread_sigmask(signal.SIG_BLOCK, BLOCKED)
    # The agent's end of this pipe closes when it execs (os.pipe is close-on-exec): read to
    # end of file, the driver knows it has joined the cgroup and runs CMD.
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            signal.pthread_sigmask(signal.SIG_SETMASK, set())
            os.close(opts.control_fd)
            os.close(ready_r)
            if opts.join_cgroup:
                with open(os.path.join(opts.cgroup, "cgroup.procs"), "w") as f:
                    f.write("0")
            os.execvp(opts.command[0], opts.command)
        finally:
            os._exit(127)
    os.close(ready_w)
    os.read(ready_r, 1)
    os.close(ready_r)
    print(f"agent {pid}", flush=True)
    waiter.exec_waiter(pid, opts.control_fd, opts.timeout, opts.cgroup)


if __name__ == "__main__":
    main()
