"""Escape suite, the SSRF guard and a rule that names a private address for some requests
only: ``host = "10.20.30.40"`` with a ``path`` (the one metadata route a policy opens, say)
names that address for the requests the rule matches, never for every request that reaches
it. Private address 10.20.30.40 in the fake internet; both modes."""

from __future__ import annotations

import json

import pytest

from fakenet import FakeInternet

pytestmark = pytest.mark.kernel

PRIVATE = "10.20.30.40"


@pytest.fixture(scope="module")
def net():
    with FakeInternet(extra_names={"alias.test": PRIVATE}, private_addrs=[PRIVATE]) as n:
        yield n


NAMED = f'[[rule]]\nhost = "{PRIVATE}"\nport = 80\npath = "/status/204"\naction = "allow"\n'
POLICIES = {
    "default allow, the private address opened for one path": 'default = "allow"\n\n' + NAMED,
    "an allowed name that resolves to it (DNS the agent's side controls)":
        'default = "deny"\n\n' + NAMED + '\n[[rule]]\nhost = "alias.test"\naction = "allow"\n',
}

AGENT = """
import json, sys, urllib.request, urllib.error
for url in sys.argv[1:]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            print(json.dumps([url, r.status]))
    except urllib.error.HTTPError as e:
        print(json.dumps([url, e.code]))
"""


@pytest.mark.parametrize("policy", list(POLICIES.values()), ids=list(POLICIES))
def test_a_rule_naming_a_private_address_for_one_path_opens_no_other(gatewrap, tmp_path, policy, outcome):
    f = tmp_path / "policy.toml"
    f.write_text(policy)
    urls = [f"http://{PRIVATE}/status/204", f"http://{PRIVATE}/echo", "http://alias.test/echo"]
    r = gatewrap(["/usr/bin/python3", "-c", AGENT, *urls], extra=["--policy", str(f)])
    assert r.returncode == 0, r.stderr
    got = dict(json.loads(x) for x in r.stdout.splitlines() if x.startswith("["))
    opened = [u for u in urls[1:] if got[u] == 200]
    outcome("gate (SSRF guard)", f"reached {PRIVATE} through {opened}" if opened else "refused 403",
            "OPEN" if opened else "held")
    assert got[urls[0]] == 204, got  # the route the rule names
    assert got[urls[1]] == got[urls[2]] == 403, got
    reasons = [x["reason"] for x in r.records(event="request") if x.get("decision") == "denied"]
    assert all(x.startswith(("ssrf: ", "policy")) or "default" in x for x in reasons), reasons
