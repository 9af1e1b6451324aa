"""git over HTTPS with Basic auth through the gate (issue 20): the agent's git clones and
pushes with the placeholder in the remote's URL, as docs/guide/secrets.md tells users, and the
test git server on the fake internet (``git http-backend`` behind Basic auth, see
fakenet/sites.py) gets the real token from the gate's ``inject = {..., as = "basic"}``."""

from __future__ import annotations

import os
import subprocess

import pytest

from fakenet import FakeInternet
from test_secrets import VALUE, no_value_written

pytestmark = pytest.mark.kernel

HOST = "gitauth.test"

POLICY = f"""
[[secret]]
name = "git"
from_env = "GW_TEST_SECRET"
placeholder_env = "GITHUB_TOKEN"

[[rule]]
host = "{HOST}"
inspect = true
action = "allow"
inject = {{ secret = "git", as = "basic" }}
"""

AGENT = f"""set -e
cd "$(mktemp -d)"
git clone -q "https://x-access-token:$GITHUB_TOKEN@{HOST}/demo.git" c
cat c/README
cd c
git -c user.name=agent -c user.email=agent@example.test commit -q --allow-empty -m "pushed by the agent"
git push -q origin HEAD:main
echo PUSHED
"""


@pytest.fixture(scope="module")
def net():
    """The fake internet with gitauth.test (a smart-HTTP git server asking for the secret's
    value as the Basic password) on allowed.test's addresses."""
    with FakeInternet(extra_names={HOST: ["198.51.100.138", "2001:db8:100::10"]}) as n:
        site = os.path.join(n.sites_dir, HOST)
        os.makedirs(site)
        with open(os.path.join(site, ".git-http"), "w") as f:
            f.write(VALUE)
        work = os.path.join(n.sites_dir, ".git-work-auth")
        os.makedirs(work)
        with open(os.path.join(work, "README"), "w") as f:
            f.write("hello from the private repository\n")
        env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@t")
        for argv in (["git", "init", "-q", "-b", "main", work], ["git", "-C", work, "add", "README"],
                     ["git", "-C", work, "commit", "-qm", "demo"],
                     ["git", "clone", "-q", "--bare", work, os.path.join(site, "demo.git")]):
            subprocess.run(argv, check=True, env=env, capture_output=True)
        yield n


def test_git_clones_and_pushes_with_the_placeholder_and_the_server_gets_the_token(gatewrap, net, tmp_path):
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY)
    extra = ["--policy", str(policy), "--upstream-ca", net.ca_path, "--ca-dir", str(tmp_path / "ca")]
    r = gatewrap(["/bin/sh", "-c", AGENT], extra=extra, unnamed={"GW_TEST_SECRET": VALUE}, timeout=120)
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert r.stdout.splitlines() == ["hello from the private repository", "PUSHED"], r.stdout
    log = subprocess.run(["git", "-C", os.path.join(net.sites_dir, HOST, "demo.git"), "log", "-1", "--format=%s", "main"],
                         capture_output=True, text=True, check=True)
    assert log.stdout.strip() == "pushed by the agent", "the push did not reach the server"
    recs = r.records(event="request", proto="https")
    assert recs and all((x["decision"], x.get("secret")) == ("allowed", "git") for x in recs), recs
    assert any(x["method"] == "POST" and x["target"].endswith("/git-receive-pack") for x in recs), recs
    no_value_written(r, tmp_path)
