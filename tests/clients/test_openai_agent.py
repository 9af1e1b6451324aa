"""examples/openai_agent.py (the `openai` SDK, a tool call) under ``gatewrap run --policy
examples/agent-policy.toml``, against the fake OpenAI-compatible API on api.openai.test."""

from __future__ import annotations

import pytest

from conftest import ROOT

from .conftest import AGENT_VENV

pytestmark = pytest.mark.kernel

TASK = "Fetch https://allowed.test/ and http://denied.test/ and say what they said."


def test_the_openai_agents_model_call_and_tool_fetches_cross_the_gate(gatewrap, net, examples_dir, agent_python):
    net.clear_logs()
    r = gatewrap([agent_python, f"{examples_dir}/openai_agent.py", TASK],
                 extra=["--policy", str(ROOT / "examples" / "agent-policy.toml"), "--ro-bind", examples_dir, "--ro-bind", AGENT_VENV],
                 env={"OPENAI_BASE_URL": "https://api.openai.test/v1", "OPENAI_API_KEY": "sk-dummy"})
    assert r.returncode == 0, r.stderr
    out = r.stdout.splitlines()
    assert out[0] == "agent: fetch_url(https://allowed.test/) -> 200 hello from allowed.test over https"
    # the denied fetch: the gate's 403 and its explanation, handed to the model as the page
    assert out[1].startswith("agent: fetch_url(http://denied.test/) -> 403 gatewrap: egress to denied.test:80 "
                             "was denied (default deny)"), out
    assert out[2].startswith("agent: model: The pages said: 200 hello from allowed.test over https | 403 gatewrap:")
    # two model calls (the tool call, then the answer), both through the gate's tunnel
    assert [e["tools"] for e in net.access_entries(event="chat")] == [0, 2]
    policy = str(ROOT / "examples" / "agent-policy.toml")
    allowed = {(x["dst_host"], x["rule"]) for x in r.records(event="connect", decision="allowed")}
    assert allowed == {("api.openai.test", f"{policy}:rule[2]"), ("allowed.test", f"{policy}:rule[3]")}, r.audit()
    assert [(d["event"], d["dst_host"], d["dst_port"]) for d in r.records(decision="denied")] == [
        ("request", "denied.test", 80)]
    assert net.access_entries(host="denied.test") == []
