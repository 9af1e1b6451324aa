"""The client matrix: every common client, unchanged, in a real sandbox against the fake internet.

For each client: an allowed HTTPS host answers with its body, through the gate (an allowed
``connect`` record); a denied host gets the gate's 403 as the client reports it, and a
denied record; and with the proxy variables removed (``env -u``), a direct attempt at an IP
literal fails in under 2 seconds with the kernel's EPERM (or the shim's message naming
gatewrap) and a ``direct_egress`` record, never a timeout.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from datetime import datetime
from typing import Callable

import pytest

from conftest import ROOT

from . import site_content
from .conftest import AGENT_VENV

pytestmark = pytest.mark.kernel

DIRECT_IP = "198.51.100.138"
#: An unwrapped client must fail within this many seconds of the kernel's refusal (the
#: issue's bound: no timeout, no retry loop) ...
FAIL_FAST_S = 2.0
#: ... and within this many of its start (interpreter or JVM start-up included).
START_AND_FAIL_S = 5.0
HELLO = "hello from allowed.test over https"


def _proxy_variables() -> list[str]:
    """Every variable of the environment table that points a client at the gate."""
    with open(ROOT / "agent_shims" / "env.toml", "rb") as f:
        table = tomllib.load(f)["env"]
    return [k for k, v in table.items() if "{proxy}" in v or "{host}" in v or k == "NODE_USE_ENV_PROXY"]


@dataclass
class Ctx:
    """What a client's command line may need."""

    progs: str
    python: str
    #: The fake internet's CA as a PEM file and as a Java trust store; None under TLS
    #: inspection, where a client trusts only what gatewrap points it at.
    ca: str | None
    truststore: str | None


@dataclass
class Client:
    """One client of the matrix.

    ``argv(ctx, base)``: the command fetching from ``base`` (``https://host``, no slash);
    ``site``: its allowed host; ``body``: what its output holds on success; ``denied``,
    ``unwrapped``: a regex its own output matches in those cases; ``env``: extra variables.
    """

    name: str
    argv: Callable[[Ctx, str], list[str]]
    denied: str
    unwrapped: str
    site: str = "allowed.test"
    body: str = HELLO
    env: Callable[[Ctx], dict[str, str]] = field(default=lambda ctx: {})


SHIM_MSG = rf"egress to {re.escape(DIRECT_IP)}:443 was blocked by gatewrap"
#: The Node shim's error for a refused tunnel carries the gate's explanation.
NODE_DENIED = r"the gate answered 403 to CONNECT denied.test:443: gatewrap: egress to denied.test:443 was denied[^\n]*"
CURL_REFUSED = rf"Failed to connect to {re.escape(DIRECT_IP)} port 443 after \d+ ms: Could(?:n't| not) connect to server"


def _fake_ca(ctx: Ctx, *names: str) -> dict[str, str]:
    """``names`` set to the fake internet's CA, or nothing under TLS inspection."""
    return {n: ctx.ca for n in names} if ctx.ca else {}


def _py(name: str) -> Callable[[Ctx, str], list[str]]:
    return lambda ctx, base: [ctx.python, f"{ctx.progs}/client_{name}.py", f"{base}/"]


def _node(name: str) -> Callable[[Ctx, str], list[str]]:
    return lambda ctx, base: ["/usr/bin/node", f"{ctx.progs}/client_{name}.js", f"{base}/"]


CLIENTS = [
    Client("curl", lambda ctx, base: ["curl", "-sS", "--max-time", "10", f"{base}/"],
           denied=r"CONNECT tunnel failed, response 403", unwrapped=CURL_REFUSED),
    Client("wget", lambda ctx, base: ["wget", "-nv", "-O", "-", *([f"--ca-certificate={ctx.ca}"] if ctx.ca else []),
                                      "--tries=1", "--timeout=10", f"{base}/"],
           denied=r"Proxy tunneling failed: Forbidden", unwrapped=r"Operation not permitted"),
    Client("Python urllib", _py("urllib"), denied=r"Tunnel connection failed: 403", unwrapped=SHIM_MSG),
    Client("requests", _py("requests"), denied=r"Tunnel connection failed: 403", unwrapped=SHIM_MSG),
    Client("httpx", _py("httpx"), denied=r"ProxyError: 403", unwrapped=SHIM_MSG),
    Client("httpx (async)", _py("httpx-async"), denied=r"ProxyError: 403", unwrapped=SHIM_MSG),
    Client("aiohttp", _py("aiohttp"), denied=r"403, message='Forbidden'", unwrapped=SHIM_MSG),
    Client("Node fetch", _node("fetch"), denied=NODE_DENIED,
           unwrapped=SHIM_MSG, env=lambda ctx: _fake_ca(ctx, "NODE_EXTRA_CA_CERTS")),
    Client("Node https.get", _node("https.get"), denied=NODE_DENIED,
           unwrapped=SHIM_MSG, env=lambda ctx: _fake_ca(ctx, "NODE_EXTRA_CA_CERTS")),
    # pip: the host's pip configuration (find-links) is left out; -vv, since pip tells why an
    # index could not be fetched only at debug level (by default just "No matching distribution").
    Client("pip download",
           lambda ctx, base: ["env", "-u", "PIP_FIND_LINKS", "PIP_CONFIG_FILE=/dev/null",
                              ctx.python, "-m", "pip", "download", "-vv", "--no-deps", "--no-cache-dir",
                              "--disable-pip-version-check", "--retries", "0", "--timeout", "10", "-d",
                              "dl", "--index-url", f"{base}/simple/", "gwdemo"],
           site="pypi.test", body=f"Saved ./dl/{site_content.WHEEL}",
           denied=r"Tunnel connection failed: 403", unwrapped=SHIM_MSG,
           env=lambda ctx: _fake_ca(ctx, "PIP_CERT")),
    Client("git clone", lambda ctx, base: ["sh", "-c", f"d=$(mktemp -d) && git clone -q {base}/demo.git $d/c && cat $d/c/README"],
           site="git.test", body=site_content.GIT_README, denied=r"CONNECT tunnel failed, response 403",
           unwrapped=rf"Failed to connect to {re.escape(DIRECT_IP)} port 443",
           env=lambda ctx: {**_fake_ca(ctx, "GIT_SSL_CAINFO"), "GIT_TERMINAL_PROMPT": "0"}),
    Client("npm view", lambda ctx, base: ["/usr/bin/npm", "view", "gwdemo", "description", "--registry", f"{base}/"],
           site="npm.test", body=site_content.NPM_DESCRIPTION, denied=r"[^\n]*403[^\n]*", unwrapped=SHIM_MSG,
           env=lambda ctx: {**_fake_ca(ctx, "npm_config_cafile"), "npm_config_cache": "/tmp/npm-cache",
                            "npm_config_fetch_retries": "0", "npm_config_update_notifier": "false",
                            "npm_config_loglevel": "error"}),
    Client("Go net/http", lambda ctx, base: [f"{ctx.progs}/goget", f"{base}/"],
           denied=r"Forbidden", unwrapped=r"connect: operation not permitted"),
    Client("Java HttpClient", lambda ctx, base: ["/usr/bin/java", "-Xshare:auto", "-XX:TieredStopAtLevel=1",
                                                 *([f"-Djavax.net.ssl.trustStore={ctx.truststore}",
                                                    "-Djavax.net.ssl.trustStorePassword=changeit"]
                                                   if ctx.truststore else []),
                                                 "-cp", ctx.progs, "Get", f"{base}/"],
           denied=r"[^\n]*403[^\n]*", unwrapped=r"[^\n]*(ConnectException|Operation not permitted)[^\n]*"),
]

#: Runs the client with its stderr on its stdout (gatewrap's own notices share stderr, and a
#: client writing a line in pieces would be cut by them), then prints its timing on stderr.
TIMED = ('s=$(date +%s%N); "$@" 2>&1; rc=$?; e=$(date +%s%N); '
         'echo "GWT_RC=$rc GWT_MS=$(( (e - s) / 1000000 )) GWT_END_NS=$e" >&2; exit $rc')


def _agent_output(run) -> str:
    """The client's own output (stdout and stderr)."""
    return run.stdout


def _timing(run) -> re.Match:
    m = re.search(r"GWT_RC=(\d+) GWT_MS=(\d+) GWT_END_NS=(\d+)", run.stderr)
    assert m, f"no timing line: {run.stderr}"
    return m


def _elapsed_s(run) -> float:
    """The client's run time in the sandbox, seconds."""
    return int(_timing(run).group(2)) / 1000


def _after_refusal_s(run, refusal: dict) -> float:
    """Seconds from the kernel's first refusal (its audit record's time) to the client's exit."""
    refused = datetime.fromisoformat(refusal["time"].replace("Z", "+00:00")).timestamp()
    return int(_timing(run).group(3)) / 1e9 - refused


@pytest.fixture
def ctx(progs, agent_python, net, java_truststore) -> Ctx:
    return Ctx(progs, agent_python, net.ca_path, java_truststore)


def _run(gatewrap, client: Client, ctx: Ctx, argv: list[str], allow: list[str]):
    return gatewrap(["sh", "-c", TIMED, "sh", *argv], allow=allow, env=client.env(ctx),
                    extra=["--ro-bind", ctx.progs, "--ro-bind", AGENT_VENV],
                    timeout=120)


@pytest.mark.parametrize("client", CLIENTS, ids=[c.name for c in CLIENTS])
def test_a_client_gets_the_allowed_hosts_body_through_the_gate(gatewrap, ctx, matrix, client):
    r = _run(gatewrap, client, ctx, client.argv(ctx, f"https://{client.site}"), [client.site])
    out = _agent_output(r)
    assert r.returncode == 0 and client.body in out, f"{out}\n{r.stderr}"
    assert r.records(event="connect", decision="allowed", dst_host=client.site), r.audit()
    matrix(client.name, "allowed", f"body received in {_elapsed_s(r):.1f} s", CLIENTS.index(client))


@pytest.mark.parametrize("client", CLIENTS, ids=[c.name for c in CLIENTS])
def test_a_client_gets_the_gates_403_for_a_denied_host(gatewrap, ctx, matrix, client):
    r = _run(gatewrap, client, ctx, client.argv(ctx, "https://denied.test"), [client.site])
    out = _agent_output(r)
    assert r.returncode != 0 and re.search(client.denied, out), f"{out}\n{r.stderr}"
    assert r.records(event="connect", decision="denied", dst_host="denied.test"), r.audit()
    matrix(client.name, "denied", "403: " + re.search(client.denied, out).group(0), CLIENTS.index(client))


@pytest.mark.parametrize("client", CLIENTS, ids=[c.name for c in CLIENTS])
def test_a_client_without_the_proxy_variables_fails_fast_with_eperm(gatewrap, ctx, matrix, client):
    unset = [a for v in _proxy_variables() for a in ("-u", v)]
    r = _run(gatewrap, client, ctx, ["env", *unset, *client.argv(ctx, f"https://{DIRECT_IP}")], [client.site])
    out = _agent_output(r)
    assert r.returncode != 0, f"{out}\n{r.stderr}"
    assert re.search(client.unwrapped, out, re.M), f"{out}\n{r.stderr}"
    # Java dials from an IPv6 socket: the v4-mapped form of the address
    refusals = [x for x in r.records(event="direct_egress", dst_port=443)
                if x["dst_ip"] in (DIRECT_IP, f"::ffff:{DIRECT_IP}")]
    assert refusals, r.audit()
    took, after = _elapsed_s(r), _after_refusal_s(r, refusals[0])
    assert after < FAIL_FAST_S and took < START_AND_FAIL_S, f"{after:.1f} s after the refusal, {took:.1f} s in all: {out}"
    said = re.search(client.unwrapped, out, re.M).group(0)
    said = f"the shim's message: {said}" if "blocked by gatewrap" in said else f"kernel EPERM; it says: {said}"
    matrix(client.name, "unwrapped", f"fails {after:.1f} s after the refusal ({took:.1f} s in all); {said}",
           CLIENTS.index(client))
