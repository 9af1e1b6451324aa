"""examples/agent.py under gatewrap: the allowed fetch, the 403 and the EPERM, all audited."""

from __future__ import annotations

import pytest

from conftest import AGENT_PYTHON

pytestmark = pytest.mark.kernel


def test_the_example_agent_fetches_gets_403_and_eperm(gatewrap, net, examples_dir):
    net.clear_logs()
    r = gatewrap([AGENT_PYTHON, f"{examples_dir}/agent.py"], allow=["allowed.test"],
                 extra=["--ro-bind", examples_dir])
    assert r.returncode == 0, r.stderr
    out = r.stdout.splitlines()
    assert out[0] == "agent: fetched https://allowed.test/: 200 hello from allowed.test over https"
    assert out[1].startswith("agent: http://denied.test/ answered 403: gatewrap: egress to denied.test:80")
    # the Python shim turns the kernel's EPERM into a PermissionError that names gatewrap
    assert out[2].startswith("agent: direct connection to 198.51.100.148:80 failed: [Errno 1] egress to "
                             "198.51.100.148:80 was blocked by gatewrap: only the gate (http://127.0.0.1:3128)")
    assert "blocked direct egress" in r.stderr and "run " in r.stderr and "1 allowed, 1 denied by the gate, 1 direct egress blocked" in r.stderr
    denied = [rec for rec in r.audit() if rec.get("decision") == "denied"]
    assert [(d["event"], d.get("dst_host") or d.get("dst_ip")) for d in denied] == [
        ("request", "denied.test"), ("direct_egress", "198.51.100.148")]
    assert net.access_entries(local="198.51.100.148") == []
