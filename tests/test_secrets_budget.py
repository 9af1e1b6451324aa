"""A secret's budget (issue 20): ``budget = N`` on a ``[[secret]]`` lets N requests of a run
carry it; the next that would is refused 403 with a record saying so (reason ``budget: secret
NAME ...``, ``secret`` naming it), while requests that carry no secret go on."""

from __future__ import annotations

import subprocess

import pytest

from test_secrets import POLICY, no_value_written, run_agent

pytestmark = pytest.mark.kernel


def test_the_request_past_a_secrets_budget_is_refused_and_recorded(gatewrap, net, tmp_path, monkeypatch):
    import test_secrets

    budgeted = POLICY.replace('placeholder_env = "GITHUB_TOKEN"\n', 'placeholder_env = "GITHUB_TOKEN"\nbudget = 2\n')
    assert budgeted != POLICY
    monkeypatch.setattr(test_secrets, "POLICY", budgeted)
    r, lines = run_agent(gatewrap, net, tmp_path, [
        ["https://allowed.test/echo", {"Authorization": "Bearer PH"}],
        ["http://other.allowed.test/echo", {"Authorization": "BASIC:alice"}],
        ["https://allowed.test/echo", {}],
        ["https://other.allowed.test/echo", {}],
    ])
    assert r.returncode == 0, r.stderr
    assert [x["status"] for x in lines[1:]] == [200, 200, 403, 200], lines
    assert "secret github may be carried in 2 requests per run" in lines[3]["body"], lines[3]
    recs = [x for x in r.records(event="request") if x.get("dst_host") in ("allowed.test", "other.allowed.test")]
    assert [(x["decision"], x.get("secret"), x["status"]) for x in recs] == [
        ("allowed", "github", 200), ("allowed", "github", 200), ("denied", "github", 403), ("allowed", None, 200)], recs
    assert recs[2]["reason"] == "budget: secret github carried in 2 requests of this run, its budget", recs[2]
    no_value_written(r, tmp_path)


@pytest.mark.parametrize("budget,error", [
    ("0", "invalid budget 0: expected a whole number of requests from 1 to 4294967295"),
    ("-1", "invalid budget -1: expected a whole number of requests from 1 to 4294967295"),
    ('"10"', 'invalid type: string "10", expected i64'),
], ids=["zero", "negative", "a string"])
def test_a_budget_that_is_not_a_positive_count_is_refused_with_its_line(tmp_path, budget, error):
    from conftest import gatewrap_cmd

    policy = tmp_path / "policy.toml"
    policy.write_text(f'[[secret]]\nname = "s"\nfrom_env = "X"\nbudget = {budget}\n')
    p = subprocess.run(gatewrap_cmd("policy", "check", str(policy)), capture_output=True, text=True)
    assert (p.returncode, p.stderr.strip()) == (1, f"gatewrap: {policy}:4: {error}"), p
