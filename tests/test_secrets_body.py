"""Request bodies carry no secret (issue 20): the placeholder or the value in a body the gate
sees (plain http, inspected https) is refused with a ``secret_misuse`` record naming the secret
``in the body``: 403 before anything is sent when it is in the body's first bytes, else the
upstream request aborted before the secret's bytes leave. A clean 10 MB body streams through
whole. Both modes (shared daemon, a gate of the run's own) through the ``gatewrap`` fixture."""

from __future__ import annotations

import json

import pytest

from test_secrets import POLICY, VALUE, no_value_written

pytestmark = pytest.mark.kernel

# The agent: each case POSTs a body (the placeholder filled in, encoded as the case says) and
# prints one JSON line: the status and upstream's echo of the body's length, or the error.
AGENT = """
import base64, json, os, sys, time, urllib.parse, urllib.request, urllib.error
ph = os.environ["GITHUB_TOKEN"]
def body(kind):
    if kind == "json": return json.dumps({"token": ph}).encode()
    if kind == "percent": return ("t=" + "".join("%%%02X" % b for b in ph.encode())).encode()
    if kind == "base64": return base64.b64encode(b"user:" + ph.encode())
    if kind == "late": return iter([b"a" * 65536] * 16 + [b"a" * 100 + ph[:7].encode(), ph[7:].encode() + b"b" * 1000])
    if kind == "clean": return iter([b"a" * 65536] * 160)
for url, kind in json.loads(sys.argv[1]):
    start = time.monotonic()
    req = urllib.request.Request(url, data=body(kind), method="POST")
    try:
        with urllib.request.urlopen(req, timeout=20) as r:
            got = json.loads(r.read())
            out = {"status": r.status, "len": len(got["body"])}
    except urllib.error.HTTPError as e:
        out = {"status": e.code, "body": e.read().decode()}
    except OSError as e:
        out = {"error": str(e)}
    out.update(kind=kind, seconds=round(time.monotonic() - start, 3))
    print(json.dumps(out), flush=True)
"""


def run_bodies(gatewrap, net, tmp_path, cases):
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY.replace("PLACE", 'as = "basic"'))
    extra = ["--policy", str(policy), "--upstream-ca", net.ca_path, "--ca-dir", str(tmp_path / "ca")]
    r = gatewrap(["/usr/bin/python3", "-c", AGENT, json.dumps(cases)], extra=extra, unnamed={"GW_TEST_SECRET": VALUE})
    return r, [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]


def test_the_placeholder_in_a_body_is_refused_before_anything_is_sent(gatewrap, net, tmp_path):
    r, lines = run_bodies(gatewrap, net, tmp_path, [
        ["https://allowed.test/echo", "json"],
        ["http://other.allowed.test/echo", "percent"],
        ["https://other.allowed.test/echo", "base64"],
    ])
    assert r.returncode == 0, r.stderr
    assert [x.get("status") for x in lines] == [403, 403, 403], lines
    assert "the placeholder of secret github was sent in the body" in lines[0]["body"], lines[0]
    recs = [x for x in r.records(event="request") if x.get("method") == "POST"]
    assert [(x["decision"], x.get("secret"), x["status"]) for x in recs] == [("denied", "github", 403)] * 3, recs
    assert [x["reason"] for x in recs] == [
        "secret_misuse: the placeholder of secret github in the body to allowed.test:443",
        "secret_misuse: the placeholder of secret github in the body to other.allowed.test:80",
        "secret_misuse: the placeholder of secret github in the body to other.allowed.test:443",
    ], recs
    assert not r.records(event="admit", method="POST"), "a refused body was admitted: something was sent"
    no_value_written(r, tmp_path)


@pytest.mark.parametrize("url", ["http://other.allowed.test/echo", "https://other.allowed.test/echo"])
def test_the_placeholder_late_in_a_streamed_body_aborts_the_request_and_a_clean_body_streams_whole(gatewrap, net, tmp_path, url):
    r, lines = run_bodies(gatewrap, net, tmp_path, [[url, "late"], [url, "clean"]])
    assert r.returncode == 0, r.stderr
    late, clean = lines
    assert late.get("status") == 403 or "error" in late, late
    assert clean["status"] == 200 and clean["len"] == 160 * 65536, clean
    recs = [x for x in r.records(event="request") if x.get("method") == "POST"]
    aborted, whole = recs
    assert (aborted["decision"], aborted.get("secret")) == ("denied", "github"), aborted
    assert aborted["reason"].startswith("secret_misuse: the placeholder of secret github in the body to other.allowed.test:"), aborted
    assert "aborted" in aborted["error"], aborted
    assert whole["decision"] == "allowed" and whole.get("bytes_up", 160 * 65536) == 160 * 65536, whole
    print(f"10 MiB clean upload {url}: {clean['seconds']} s")
