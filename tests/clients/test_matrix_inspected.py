"""The client matrix under TLS inspection: every client of ``test_matrix.py``, unchanged and
given no CA of the test's, against a host whose rules say ``inspect = true``.

The policy allows ``GET`` on the host and denies its ``/forbidden`` path, a rule only an
inspected tunnel can apply. The client trusts the gate's leaf through what gatewrap sets (the
CA variables, Java's trust store, wget's startup file); the gate verifies the fake internet
with ``--upstream-ca``. One sandbox per client runs it twice: on the site (the body arrives;
each request inside the tunnel has an allowed audit record with ``proto`` = ``https``) and
under ``/forbidden`` (the gate's ``403``, as the client reports it; a denied ``https`` record
naming the deny rule).
"""

from __future__ import annotations

import re
import shlex

import pytest

from conftest import run_gatewrap

from .conftest import AGENT_VENV
from .test_matrix import CLIENTS, Client, Ctx

pytestmark = pytest.mark.kernel

FORBIDDEN = "/forbidden"
POLICY = """
[[rule]]
host = "{host}"
path = "{forbidden}"
inspect = true
action = "deny"

[[rule]]
host = "{host}"
methods = ["GET"]
inspect = true
action = "allow"
"""
#: The gate's 403 for a request inside an inspected tunnel, as each client reports it.
GATE_403 = r"gatewrap: egress to [^\s]+ was denied \(rule [^)\s]+:rule\[1\]\)"
INNER_DENIED = {
    "curl": GATE_403,
    "wget": r"ERROR 403: Forbidden",
    "Python urllib": rf"403 {GATE_403}",
    "requests": rf"403 {GATE_403}",
    "httpx": rf"403 {GATE_403}",
    "httpx (async)": rf"403 {GATE_403}",
    "aiohttp": rf"403 {GATE_403}",
    "Node fetch": rf"403 {GATE_403}",
    "Node https.get": rf"403 {GATE_403}",
    "pip download": r"Could not fetch URL [^\s]+: 403 Client Error: Forbidden",
    "git clone": r"The requested URL returned error: 403",
    "npm view": r"npm (?:error|ERR!) 403[^\n]*",  # npm 10 says "npm error", Debian's npm 9 "npm ERR!"
    "Go net/http": rf"403 {GATE_403}",
    "Java HttpClient": rf"403 {GATE_403}",
}
#: Runs each of the two commands (shell words) with its stderr on its stdout, a line
#: ``GWT_NEXT`` between them; their timing lines go to stderr.
TWICE = ('t() { s=$(date +%s%N); sh -c "$1" 2>&1; rc=$?; e=$(date +%s%N); '
         'echo "GWT_RC=$rc GWT_MS=$(( (e - s) / 1000000 ))" >&2; }; t "$1"; echo GWT_NEXT; t "$2"')


def test_every_client_has_an_inner_denial_to_look_for():
    assert sorted(INNER_DENIED) == sorted(c.name for c in CLIENTS)


@pytest.fixture(scope="module")
def inspected(net, progs, agent_python, tmp_path_factory):
    """``inspected(client)``: (the run, its two outputs, their (exit status, ms)), one
    sandbox per client, made on first use. One CA folder for the module, so Java's trust
    store is made once."""
    d = tmp_path_factory.mktemp("inspected")
    ctx = Ctx(progs, agent_python, None, None)
    runs: dict[str, tuple] = {}

    def _get(client: Client):
        if client.name not in runs:
            slug = re.sub(r"\W+", "-", client.name)
            (d / slug).mkdir()
            policy = d / slug / "policy.toml"
            policy.write_text(POLICY.format(host=client.site, forbidden=FORBIDDEN))
            base = f"https://{client.site}"
            argv = ["sh", "-c", TWICE, "sh", shlex.join(client.argv(ctx, base)),
                    shlex.join(client.argv(ctx, base + FORBIDDEN))]
            r = run_gatewrap(net, d / f"audit-{slug}.jsonl", argv, env=client.env(ctx), timeout=180,
                             extra=["--ro-bind", progs, "--ro-bind", AGENT_VENV, "--policy", str(policy), "--upstream-ca", net.ca_path,
                                    "--ca-dir", str(d / "ca")])
            outs = r.stdout.split("GWT_NEXT\n")
            times = [(int(rc), int(ms)) for rc, ms in re.findall(r"GWT_RC=(\d+) GWT_MS=(\d+)", r.stderr)]
            assert len(outs) == 2 and len(times) == 2, f"{r.stdout}\n{r.stderr}"
            runs[client.name] = (r, outs, times)
        return runs[client.name]

    return _get


def _inner(r, client: Client, forbidden: bool) -> list[dict]:
    """The audit records of requests inside the client's inspected tunnels, on the site
    (``forbidden`` False) or under /forbidden."""
    under = f"https://{client.site}{FORBIDDEN}"
    return [x for x in r.records(event="request", proto="https")
            if x["target"].startswith(f"https://{client.site}/") and x["target"].startswith(under) == forbidden]


@pytest.mark.parametrize("client", CLIENTS, ids=[c.name for c in CLIENTS])
def test_a_client_trusts_the_gates_leaf_and_each_inner_request_is_audited(inspected, matrix, client):
    r, (out, _), ((rc, ms), _) = inspected(client)
    assert rc == 0 and client.body in out, f"{out}\n{r.stderr}"
    assert r.records(event="connect", decision="allowed", dst_host=client.site), r.audit()
    inner = _inner(r, client, forbidden=False)
    assert inner, r.audit()
    assert all(x["decision"] == "allowed" and x["rule"].endswith(".toml:rule[2]") for x in inner), inner
    paths = sorted({x["target"].removeprefix(f"https://{client.site}") for x in inner})
    matrix(client.name, "allowed", f"body received in {ms / 1000:.1f} s; {len(inner)} https record(s), "
           f"allowed: {', '.join(paths)}", CLIENTS.index(client), tls="inspected")


@pytest.mark.parametrize("client", CLIENTS, ids=[c.name for c in CLIENTS])
def test_a_client_gets_the_gates_403_for_a_path_the_inspected_tunnel_denies(inspected, matrix, client):
    r, (_, out), _ = inspected(client)
    said = re.search(INNER_DENIED[client.name], out)
    assert said, f"{out}\n{r.stderr}"
    denied = _inner(r, client, forbidden=True)
    assert denied, r.audit()
    assert all((x["decision"], x["status"]) == ("denied", 403) and x["rule"].endswith(".toml:rule[1]")
               for x in denied), denied
    # the test's folder is not the README's business; our programs print the status first
    said = re.sub(r"/\S*/(policy\.toml:)", r"\1", said.group(0)).removeprefix("403 ")
    matrix(client.name, "denied", f"403: {said}", CLIENTS.index(client), tls="inspected")
