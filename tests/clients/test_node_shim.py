"""The Node shim beyond the matrix: plain-http requests go to the gate in absolute form (so
a denial shows the gate's explanation), NO_PROXY hosts are dialled directly, and the user's
own NODE_OPTIONS still apply."""

from __future__ import annotations

import re

import pytest

pytestmark = pytest.mark.kernel

HTTP_GET = """
const http = require('node:http');
http.get(process.argv[1], (r) => {
  let body = '';
  r.on('data', (d) => { body += d; });
  r.on('end', () => console.log(r.statusCode, body.trim().split('\\n')[0]));
}).on('error', (e) => console.log(`error: ${e.code}: ${e.message}`));
"""


@pytest.mark.parametrize("url, first_line", [
    ("http://allowed.test/", "200 hello from allowed.test over http"),
    ("http://denied.test/", "403 gatewrap: egress to denied.test:80 was denied (default deny)"),
], ids=["an allowed host answers", "a denied host gets the gate's explanation"])
def test_http_get_goes_to_the_gate_in_absolute_form(gatewrap, url, first_line):
    r = gatewrap(["/usr/bin/node", "-e", HTTP_GET, url], allow=["allowed.test"])
    assert r.stdout.startswith(first_line), r.stderr
    host = url.split("/")[2]
    [rec] = r.records(event="request", dst_host=host)
    assert (rec["method"], rec["target"], rec["proto"]) == ("GET", url, "http")


def test_a_no_proxy_host_is_dialled_directly_and_its_eperm_names_gatewrap(gatewrap):
    # the jail's /etc/hosts names localhost 127.0.0.1 and ::1 whatever the host's says; Node 20
    # tries both (autoSelectFamily) and reports the last refusal, Debian 12's Node 18 one
    r = gatewrap(["/usr/bin/node", "-e", HTTP_GET, "http://localhost:8000/"], allow=["allowed.test"])
    assert re.match(r"error: EPERM: connect EPERM: egress to (127\.0\.0\.1|\[::1\]):8000 was blocked by gatewrap",
                    r.stdout), r.stdout + r.stderr
    assert re.search(r"was blocked by gatewrap: only the gate \(http://127\.0\.0\.1:3128\) is reachable; clients skip "
                     r"it for loopback \(NO_PROXY\): to send this through it, to the host's (127\.0\.0\.1|\[::1\]):8000 "
                     r"if the policy allows that address, unset NO_PROXY \(curl: --noproxy ''\); the audit record: ",
                     r.stdout), r.stdout
    assert r.records(event="request") == []
    tried = {rec["dst_ip"] for rec in r.records(event="direct_egress", dst_port=8000)}
    assert tried and tried <= {"127.0.0.1", "::1"}, tried


def test_the_users_node_options_are_kept(gatewrap):
    code = ("const mb = require('v8').getHeapStatistics().heap_size_limit / 2 ** 20;"
            "console.log(mb < 200, require('node:http').globalAgent.constructor.name, process.env.NODE_OPTIONS)")
    r = gatewrap(["/usr/bin/node", "-e", code], env={"NODE_OPTIONS": "--max-old-space-size=64"})
    assert r.stdout == ("true GateHttpAgent --max-old-space-size=64 "
                        "--require /run/gatewrap-shims/node/gatewrap-proxy.js\n"), r.stderr
