"""An agent built on the `openai` SDK: the model may call one tool, ``fetch_url``, which the
agent runs with httpx; results go back to the model until it answers.

Under gatewrap every byte of it crosses the gate: the model call (OPENAI_BASE_URL, by default
https://api.openai.com/v1) and each fetch. A fetch the policy denies comes back as the gate's
403 and its explanation, which the tool hands to the model like any other page:

    sudo gatewrap run --policy examples/agent-policy.toml -- python3 examples/openai_agent.py \\
        "Fetch https://allowed.test/ and http://denied.test/ and say what they said."

The tests run it against a fake OpenAI-compatible server (tests/clients/test_openai_agent.py).
"""

from __future__ import annotations

import json
import sys

import httpx
from openai import OpenAI

MODEL = "gpt-4o-mini"
TOOLS = [{
    "type": "function",
    "function": {
        "name": "fetch_url",
        "description": "Fetch a URL with GET and return its status and the start of its body.",
        "parameters": {"type": "object", "properties": {"url": {"type": "string"}}, "required": ["url"]},
    },
}]


def fetch_url(url: str) -> str:
    """The tool: ``"<status> <first 2000 characters of the body>"``, or the error."""
    try:
        r = httpx.get(url, timeout=10, follow_redirects=True)
    except httpx.HTTPError as e:
        return f"error: {e}"
    return f"{r.status_code} {r.text[:2000]}"


def main(task: str) -> None:
    client = OpenAI()  # OPENAI_API_KEY and OPENAI_BASE_URL from the environment
    messages = [{"role": "user", "content": task}]
    for _ in range(5):
        reply = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS).choices[0].message
        if not reply.tool_calls:
            print(f"agent: model: {reply.content}")
            return
        messages.append(reply.model_dump(exclude_none=True))
        for call in reply.tool_calls:
            url = json.loads(call.function.arguments)["url"]
            result = fetch_url(url)
            print(f"agent: fetch_url({url}) -> {result.strip().splitlines()[0] if result.strip() else ''}")
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    print("agent: no answer after 5 turns")


if __name__ == "__main__":
    main(" ".join(sys.argv[1:]) or "Fetch https://allowed.test/ and say what it said.")
