"""The webhook from a real run: `gatewrap run --notify-webhook URL` posts the approval the
gate asked for to a loopback receiver, signed with the secret of the config file, and writes
an `approval_notified` record. SQLite and PostgreSQL."""

from __future__ import annotations

import base64

import pytest
from standardwebhooks import Webhook

from . import held
from .held import cli

pytestmark = pytest.mark.kernel

SECRET = "whsec_" + base64.b64encode(b"gatewrap-test-secret-32-bytes!!!").decode()


def test_the_webhook_carries_the_request_and_a_valid_signature(net, tmp_path, store_url, receiver):
    (tmp_path / "secret").write_text(SECRET + "\n")
    (tmp_path / "config.toml").write_text(f'[notify]\nsecret_file = "{tmp_path}/secret"\n'
                                          'review_url = "http://127.0.0.1:8377"\n')
    run = held.start(net, tmp_path, store_url, extra=("--notify-webhook", receiver.url),
                     env={"GATEWRAP_CONFIG": str(tmp_path / "config.toml")})
    try:
        a = run.pending()
        (got,) = receiver.wait(1)
        doc = Webhook(SECRET).verify(got.body, {k: got.headers[k] for k in
                                                ("webhook-id", "webhook-timestamp", "webhook-signature")})
        assert got.headers["webhook-id"] == f"{a['id']}.v1"
        assert doc["text"].startswith(f"gatewrap: run {a['run_id']} asks to send POST http://allowed.test/echo")
        section = doc["blocks"][1]
        assert section["text"]["text"] == "*POST http://allowed.test/echo*"
        assert "all-customers@example.com" in doc["blocks"][2]["text"]["text"]
        assert doc["blocks"][3]["elements"][0]["url"] == "http://127.0.0.1:8377" + a["review_path"]
        assert "sk-secret-1" not in got.body.decode()
        assert cli("approve", a["id"], "--yes", "--state", store_url).returncode == 0
        assert run.finish()["agent"]["status"] == 200
        (rec,) = run.records(event="approval_notified")
        assert (rec["approval"], rec["channel"], rec["ok"], rec["version"]) == (a["id"], "webhook", True, 1)
    finally:
        run.stop()
