"""A small agent: fetches from an allowed host, then tries a denied host and a direct connection.

Run it in a sandbox (the demo, scripts/setup.sh demo, does this against a fake internet):

    sudo gatewrap run --allow allowed.test -- python3 examples/agent.py

Targets can be changed with AGENT_ALLOWED_URL, AGENT_DENIED_URL and AGENT_DIRECT (ip:port).
"""

from __future__ import annotations

import os
import socket

import requests

ALLOWED_URL = os.environ.get("AGENT_ALLOWED_URL", "https://allowed.test/")
DENIED_URL = os.environ.get("AGENT_DENIED_URL", "http://denied.test/")
DIRECT = os.environ.get("AGENT_DIRECT", "198.51.100.148:80")


def main() -> None:
    r = requests.get(ALLOWED_URL, timeout=10)
    print(f"agent: fetched {ALLOWED_URL}: {r.status_code} {r.text.strip()}")

    r = requests.get(DENIED_URL, timeout=10)
    print(f"agent: {DENIED_URL} answered {r.status_code}: {r.text.strip().splitlines()[0]}")

    host, _, port = DIRECT.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=5)
        print(f"agent: direct connection to {DIRECT} SUCCEEDED (this should not happen)")
    except OSError as e:
        print(f"agent: direct connection to {DIRECT} failed: {e}")


if __name__ == "__main__":
    main()
