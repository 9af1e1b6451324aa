"""`gatewrap approvals` on a store whose approvals were made through the store's own API
(`ApprovalStore.ask`, as the gate makes them): every subcommand, --json, the exit codes
(0 done, 1 refused with the why, 125 gatewrap's own failure). SQLite and PostgreSQL."""

from __future__ import annotations

import datetime as dt
import json
import time

import pytest

from .held import cli

RUN = "gw-00000000a1"
BODY = b'{"to": "all-customers@example.com", "subject": "prices"}'
HEADERS = [("Content-Type", "application/json"), ("Authorization", "Bearer sk-secret-1"), ("X-Trace", "t1")]


@pytest.fixture
def asked(store):
    store.start_run(RUN)
    a, new = store.ask(RUN, rule="policy.toml:rule[2]", method="POST", url="https://mail.test/v3/mail/send",
                       headers=HEADERS, body=BODY)
    assert new
    return a


def test_list_and_show_print_the_request_with_credentials_redacted(store_url, asked):
    r = cli("list", "--state", store_url)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0].split() == ["ID", "STATUS", "RUN", "EXPIRES", "REQUEST"]
    assert f"{asked['id']} pending" in r.stdout and "POST https://mail.test/v3/mail/send (rule policy.toml:rule[2])" in r.stdout
    doc = json.loads(cli("list", "--state", store_url, "--json").stdout)
    assert [a["id"] for a in doc["approvals"]] == [asked["id"]] and "token" not in doc["approvals"][0]
    s = cli("show", asked["id"], "--state", store_url)
    assert "  POST /v3/mail/send HTTP/1.1\n  Host: mail.test\n  Content-Type: application/json\n" \
           "  Authorization: [redacted]\n  X-Trace: t1\n  \n  " + BODY.decode() in s.stdout
    assert "sk-secret-1" not in s.stdout
    j = json.loads(cli("show", asked["id"], "--state", store_url, "--json").stdout)
    assert j["body"] == BODY.decode() and j["version"] == 1 and j["diff"] is None


def test_approve_records_the_sudo_user_and_a_second_answer_is_refused_naming_them(store_url, asked, store):
    r = cli("approve", asked["id"], "--yes", "--state", store_url)
    assert r.returncode == 0, r.stderr
    a = store.get(asked["id"])
    assert (a["status"], a["decided_by"]) == ("approved", "alice")
    again = cli("reject", asked["id"], "--reason", "no", "--version", "1", "--digest", asked["digest"],
                "--state", store_url)
    assert again.returncode == 1 and "refused as stale" in again.stderr and "alice" in again.stderr, again.stderr
    j = cli("approve", asked["id"], "--yes", "--state", store_url, "--json")
    assert j.returncode == 1 and json.loads(j.stdout)["ok"] is False


def test_reject_needs_a_reason_and_keeps_it(store_url, asked, store):
    assert cli("reject", asked["id"], "--yes", "--state", store_url).returncode == 125  # a usage error
    r = cli("reject", asked["id"], "--reason", "not to customers", "--yes", "--state", store_url, "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["approval"]["reason"] == "not to customers"
    assert store.get(asked["id"])["status"] == "rejected"


@pytest.mark.parametrize("case, version, digest, why", [
    ("an older version", 0, None, ("edited", "digest", "decided")),
    ("another digest", None, "0" * 64, ("digest",)),
])
def test_a_decision_on_what_is_no_longer_there_is_stale(store_url, asked, store, case, version, digest, why):
    r = cli("approve", asked["id"], "--version", str(asked["version"] if version is None else version),
            "--digest", digest or asked["digest"], "--state", store_url, "--json")
    assert r.returncode == 1, case
    assert json.loads(r.stdout)["why"] in why
    assert store.get(asked["id"])["status"] == "pending"


def test_edit_makes_a_new_version_and_show_prints_the_diff(store_url, asked, store):
    r = cli("edit", asked["id"], "--state", store_url,
            env={"EDITOR": "sed -i -e s/all-customers@/pricing-team@/ -e s/^X-Trace:.*/X-Trace:\\ reviewed/"})
    assert r.returncode == 0, r.stderr
    a = store.get(asked["id"])
    assert a["version"] == 2 and a["edited"] and a["body"] == BODY.replace(b"all-customers@", b"pricing-team@")
    hint = r.stdout.splitlines()[-1]  # the command to paste: as root no sudo, and this store named
    assert hint.startswith(f"gatewrap: edited {a['id']}: now version 2; approve it with: gatewrap approvals approve "), hint
    assert f"--digest {a['digest']}" in hint and "--state" in hint, hint
    assert ["X-Trace", "reviewed"] in [list(h) for h in a["headers"]]
    assert ["Authorization", "[redacted]"] in [list(h) for h in a["headers"]]
    s = cli("show", asked["id"], "--state", store_url).stdout
    assert "edited: the diff from the agent's request:" in s
    assert '  -{"to": "all-customers@example.com", "subject": "prices"}' in s and "  +X-Trace: reviewed" in s
    stale = cli("approve", asked["id"], "--version", "1", "--digest", asked["digest"], "--state", store_url)
    assert stale.returncode == 1
    assert cli("approve", asked["id"], "--version", "2", "--digest", a["digest"], "--state", store_url).returncode == 0


def test_an_unchanged_edit_changes_nothing_and_a_credential_cannot_be_added(store_url, asked, store):
    r = cli("edit", asked["id"], "--state", store_url, env={"EDITOR": "true"})
    assert r.returncode == 0 and "unchanged" in r.stdout
    r = cli("edit", asked["id"], "--state", store_url, env={"EDITOR": "sed -i s/^X-Trace:/Cookie:/"})
    assert r.returncode == 1 and "Cookie cannot be edited" in r.stderr
    assert store.get(asked["id"])["version"] == 1


def test_an_approval_with_a_grant_lists_it_and_revoke_ends_it(store_url, asked, store):
    wide = cli("approve", asked["id"], "--grant", "POST evil.test/", "--for", "30m", "--yes", "--state", store_url)
    assert wide.returncode == 1 and "own host only" in wide.stderr
    r = cli("approve", asked["id"], "--grant", "POST mail.test/v3/", "--for", "30m", "--yes", "--state", store_url)
    assert r.returncode == 0, r.stderr
    (g,) = json.loads(cli("grants", "--state", store_url, "--json").stdout)["grants"]
    assert (g["run_id"], g["method"], g["host"], g["path_prefix"], g["created_by"]) == \
        (RUN, "POST", "mail.test", "/v3/", "alice")
    span = dt.datetime.fromisoformat(g["expires"]) - dt.datetime.fromisoformat(g["created"])
    assert 1790 <= span.total_seconds() <= 1810
    assert g["id"] in cli("grants", "--state", store_url).stdout
    assert cli("revoke", g["id"], "--state", store_url).returncode == 0
    assert json.loads(cli("grants", "--state", store_url, "--json").stdout)["grants"] == []
    (old,) = json.loads(cli("grants", "--all", "--state", store_url, "--json").stdout)["grants"]
    assert old["revoked_by"] == "alice"
    assert cli("revoke", "gr-nosuchgrant", "--state", store_url).returncode == 1


def test_a_decision_after_the_run_ended_or_the_deadline_is_refused(store_url, asked, store):
    store.end_run(RUN)
    r = cli("approve", asked["id"], "--yes", "--state", store_url, "--json")
    assert r.returncode == 1 and json.loads(r.stdout)["why"] in ("run ended", "decided")
    store.start_run("gw-00000000a2")
    late, _ = store.ask("gw-00000000a2", rule="r", method="POST", url="https://mail.test/x", headers=[], body=b"",
                        timeout=0.001)
    time.sleep(0.01)  # past its deadline (not a timing assertion: any later moment is as past)
    r = cli("approve", late["id"], "--yes", "--state", store_url, "--json")
    assert r.returncode == 1 and json.loads(r.stdout)["why"] == "expired"


def test_an_unknown_id_exits_1_and_a_store_that_cannot_open_exits_125(store_url, store, tmp_path):
    r = cli("show", "ap-aaaaaaaaaaaaaaaaaaaa", "--state", store_url)
    assert r.returncode == 1 and "no approval ap-aaaaaaaaaaaaaaaaaaaa" in r.stderr
    (tmp_path / "file").write_text("")
    bad = cli("list", "--state", f"sqlite:{tmp_path}/file/state.db")
    assert bad.returncode == 125 and "cannot open the approvals store" in bad.stderr


def test_json_gives_times_in_rfc_3339_as_the_audit_log_does(store_url, asked):
    import re

    stamp = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")
    (listed,) = json.loads(cli("list", "--state", store_url, "--json").stdout)["approvals"]
    shown = json.loads(cli("show", asked["id"], "--state", store_url, "--json").stdout)
    for doc in (listed, shown):
        assert stamp.fullmatch(doc["created"]) and stamp.fullmatch(doc["deadline"]), doc
        assert doc["decided_at"] is None and doc["sent_at"] is None
    ok = json.loads(cli("approve", asked["id"], "--yes", "--grant", "POST mail.test/v3/", "--for", "30m",
                        "--state", store_url, "--json").stdout)
    assert stamp.fullmatch(ok["approval"]["decided_at"]), ok
    (g,) = json.loads(cli("grants", "--state", store_url, "--json").stdout)["grants"]
    assert stamp.fullmatch(g["created"]) and stamp.fullmatch(g["expires"]) and g["revoked"] is None, g


#: Runs of one store whose ids share a start.
RUN_A, RUN_B, RUN_C = "gw-0123456789", "gw-0123abcdef", "gw-fedcba9876"
STORE_RUN_CASES = [
    ("a whole id", RUN_B, 0, [RUN_B]),
    ("a start of one run's id", "gw-fed", 0, [RUN_C]),
    ("a start of one run's id without gw-", "01234", 0, [RUN_A]),
    ("a start of two runs' ids: both listed", "0123", 125,
     f"0123 starts the id of more than one run in the approvals store ({RUN_A}, {RUN_B}): give more of it"),
    ("a start of none: nothing listed, and the text says what to do", "gw-abcd", 0, []),
]


@pytest.mark.parametrize("given,code,expected", [c[1:] for c in STORE_RUN_CASES], ids=[c[0] for c in STORE_RUN_CASES])
def test_list_and_grants_take_a_unique_start_of_a_run_id_as_stop_and_audit_do(store_url, store, given, code, expected):
    for run in (RUN_A, RUN_B, RUN_C):
        store.start_run(run)
        a, _ = store.ask(run, rule="policy.toml:rule[1]", method="POST", url="https://mail.test/v3/mail/send",
                         headers=HEADERS, body=BODY)
        store.decide(a["id"], version=a["version"], digest=a["digest"], verdict="approve", by="alice",
                     grant={"method": "POST", "host": "mail.test", "path_prefix": "/v3/", "seconds": 600})
    for cmd, key in (("list", "approvals"), ("grants", "grants")):
        r = cli(cmd, "--run", given, "--state", store_url, "--json")
        assert r.returncode == code, r.stderr
        if code == 0:
            assert [x["run_id"] for x in json.loads(r.stdout)[key]] == expected
        if expected == []:
            said = " ".join(cli(cmd, "--run", given, "--state", store_url).stderr.split())
            assert f"of run {given}: the approvals store has no run of that id or starting with it" in said, said
            assert "--state names another store" in said
        if code != 0:
            assert expected in " ".join(r.stderr.split())
