"""Credentials: random, shown once, stored hashed, revocable; /mcp needs one; identity from it."""

import pytest

import prickle
from conftest import PROJECT, audit_entries


def test_tokens_are_random_prefixed_and_stored_only_as_hashes(world):
    record, secret = prickle.create_token(world.db, "client", agent_id="oj/muse", project=PROJECT)
    assert secret.startswith("prk_ck_") and len(secret) > 40
    row = world.db.one("SELECT * FROM credentials WHERE id = ?", (record["id"],))
    assert row["secret_hash"] == prickle.sha256_hex(secret)
    dump = "\n".join(str(r) for r in world.db.rows("SELECT * FROM credentials"))
    assert secret not in dump and all(s not in dump for s in world.keys.values())
    entry = audit_entries(world.db, PROJECT, "token.created")[-1]
    assert prickle.create_token(world.db, "client", agent_id="oj/muse")[1] != secret
    assert entry["refs"] == {"credential": record["id"], "kind": "client", "agent": "oj/muse", "person": None,
                             "scope": PROJECT}
    assert secret not in str(audit_entries(world.db, PROJECT))


def test_full_reach_key_is_audited_in_each_project_of_its_agent(world):
    prickle.add_member(world.db, "side", "oj", by="sam")
    prickle.add_agent_to_project(world.db, "side", "oj/muse")
    record, _ = prickle.create_token(world.db, "client", agent_id="oj/muse")
    for chain in (PROJECT, "side"):
        assert audit_entries(world.db, chain, "token.created")[-1]["refs"]["credential"] == record["id"]


def test_mcp_without_or_with_a_bad_token_is_401(mcp, world):
    for token in (None, "prk_ck_wrong", "not-even-a-key", world.tokens["oj"]):
        r = mcp.raw(token, "tools/list")
        assert r.status_code == 401
        assert r.headers["www-authenticate"].startswith("Bearer")
        error = r.json()["error"]
        assert error["code"] == prickle.MCP_REFUSED and error["data"]["code"] == "unauthorized"


def test_revoked_key_stops_at_once(mcp, world):
    assert mcp.ok("oj/muse", "read_room", {"project": PROJECT})
    record_id = world.db.scalar("SELECT id FROM credentials WHERE secret_hash = ?",
                                (prickle.sha256_hex(world.keys["oj/muse"]),))
    prickle.revoke_token(world.db, record_id)
    r = mcp.raw(world.keys["oj/muse"], "tools/list")
    assert r.status_code == 401 and "revoked" in r.json()["error"]["message"]
    entry = audit_entries(world.db, PROJECT, "token.revoked")[-1]
    assert entry["refs"]["credential"] == record_id


def test_a_key_revoked_from_another_connection_stops_at_once(mcp, world, db_path):
    # The server has just looked the key up (and keeps what it read); the CLI revokes it from its own connection.
    assert mcp.ok("oj/muse", "read_room", {"project": PROJECT})
    cli = prickle.Database(db_path)
    record_id = cli.scalar("SELECT id FROM credentials WHERE secret_hash = ?",
                           (prickle.sha256_hex(world.keys["oj/muse"]),))
    prickle.revoke_token(cli, record_id)
    cli.close()
    r = mcp.raw(world.keys["oj/muse"], "tools/list")
    assert r.status_code == 401 and "revoked" in r.json()["error"]["message"]
    with pytest.raises(prickle.Unauthorized, match="revoked"):
        prickle.resolve_token(world.db, world.keys["oj/muse"], ("client",))


@pytest.fixture
def unnoticed(server, monkeypatch):
    """Hold back the server's background watch for other writers, so a revocation another connection
    makes stays unnoticed until a request itself looks: the cached-key path these tests are about."""
    monkeypatch.setattr(server.state.hub, "watch_other_writers", lambda: False)


def _revoke_from_another_connection(db_path, secret):
    cli = prickle.Database(db_path)
    prickle.revoke_token(cli, cli.scalar("SELECT id FROM credentials WHERE secret_hash = ?",
                                         (prickle.sha256_hex(secret),)))
    cli.close()


def test_a_post_let_in_on_the_cached_key_is_refused_at_its_transaction(mcp, world, db_path, unnoticed):
    # post_message checks the key in its own transaction, so /mcp lets it in on the cached credential;
    # a revocation another process made since is seen there, and nothing is written.
    assert mcp.ok("oj/muse", "post_message", {"project": PROJECT, "body": "first"})
    messages = world.db.scalar("SELECT count(*) FROM messages")
    _revoke_from_another_connection(db_path, world.keys["oj/muse"])
    assert mcp.error("oj/muse", "post_message", {"project": PROJECT, "body": "second"}, "unauthorized") == (
        "unauthorized: this credential was revoked: ask its owner for a new one")
    assert world.db.scalar("SELECT count(*) FROM messages") == messages
    # the server now knows: the next request stops at the door
    r = mcp.raw(world.keys["oj/muse"], "tools/call", {"name": "post_message", "arguments": {
        "project": PROJECT, "body": "third"}}, "post_message")
    assert r.status_code == 401 and "revoked" in r.json()["error"]["message"]


def test_a_handoff_let_in_on_the_cached_key_is_refused_at_its_transaction(mcp, world, db_path, unnoticed):
    assert mcp.ok("oj/muse", "read_room", {"project": PROJECT})
    _revoke_from_another_connection(db_path, world.keys["oj/muse"])
    packet = {"task": "Draft the hero copy.", "deliverable_type": "doc", "acceptance_criteria": ["Short."],
              "context": "", "files": []}
    assert mcp.error("oj/muse", "handoff", {"project": PROJECT, "to": "ren/builder", "packet": packet},
                     "unauthorized").startswith("unauthorized: this credential was revoked")
    assert world.db.scalar("SELECT count(*) FROM tasks") == 0


def test_a_revoked_key_gets_unauthorized_before_any_other_refusal(mcp, world, db_path, unnoticed):
    assert mcp.ok("oj/muse", "post_message", {"project": PROJECT, "body": "first"})
    _revoke_from_another_connection(db_path, world.keys["oj/muse"])
    # let in on the cached key; its input is bad too, but the key is what it hears about
    assert mcp.error("oj/muse", "post_message", {"project": PROJECT, "body": "x" * 9000}, "unauthorized") == (
        "unauthorized: this credential was revoked: ask its owner for a new one")


def test_handshake_era_requests_are_checked_at_the_door_whatever_their_headers_say(mcp, world, db_path):
    assert mcp.ok("oj/muse", "read_room", {"project": PROJECT})
    _revoke_from_another_connection(db_path, world.keys["oj/muse"])
    # a session-era protocol: the SDK does not hold Mcp-Name to the body, so the header earns nothing
    r = mcp.raw(world.keys["oj/muse"], "tools/list", name="post_message",
                headers={"MCP-Protocol-Version": "2025-03-26", "Mcp-Method": "tools/call"})
    assert r.status_code == 401 and "revoked" in r.json()["error"]["message"]


def test_a_call_whose_headers_name_another_tool_still_has_its_key_checked(mcp, world, db_path, unnoticed):
    assert mcp.ok("oj/muse", "read_room", {"project": PROJECT})
    _revoke_from_another_connection(db_path, world.keys["oj/muse"])
    # The headers say post_message (checked inside), the body calls read_room: the SDK refuses the mismatch,
    # so headers can't let a call in on the cached key (the dispatcher would check it before read_room too).
    r = mcp.raw(world.keys["oj/muse"], "tools/call", {"name": "read_room", "arguments": {"project": PROJECT}},
                "post_message")
    assert r.status_code == 400
    assert "header does not match" in r.json()["error"]["message"] and "result" not in r.json()
    r = mcp.raw(world.keys["oj/muse"], "tools/call", {"name": "read_room", "arguments": {"project": PROJECT}},
                "read_room")
    assert r.status_code == 401 and "revoked" in r.json()["error"]["message"]


def test_expired_credential_is_refused(world):
    _, secret = prickle.create_token(world.db, "person", person="oj", ttl=prickle._dt.timedelta(seconds=-1))
    try:
        prickle.resolve_token(world.db, secret, ("person",))
    except prickle.Unauthorized as e:
        assert "expired" in e.message
    else:
        raise AssertionError("an expired credential was accepted")


def test_identity_comes_from_the_token_not_the_arguments(mcp, world):
    m = mcp.ok("oj/muse", "post_message", {"project": PROJECT, "body": "hi", "author": "ren/builder"},
               token=world.keys["oj/muse"])["message"]
    assert m["author"]["agent_id"] == "oj/muse"


def test_runner_key_works_on_mcp_and_person_token_does_not(mcp, world):
    _, runner = prickle.create_token(world.db, "runner", agent_id="ren/builder")
    out = mcp.ok("ren/builder", "read_room", {"project": PROJECT}, token=runner)
    assert out["messages"] == []


def test_token_rules(world):
    import pytest
    with pytest.raises(prickle.NotFound, match="not in project 'side'"):
        prickle.create_token(world.db, "client", agent_id="oj/muse", project="side")
    with pytest.raises(prickle.InvalidInput):
        prickle.create_token(world.db, "runner", agent_id="oj/muse", project=PROJECT)
    with pytest.raises(prickle.NotFound):
        prickle.create_token(world.db, "client", agent_id="oj/ghost")
    record, _ = prickle.create_token(world.db, "person", person="ren")
    with pytest.raises(prickle.NotFound):
        prickle.revoke_token(world.db, record["id"], by="oj")  # not oj's to revoke
    prickle.revoke_token(world.db, record["id"], by="ren")
    with pytest.raises(prickle.InvalidState, match="already revoked"):
        prickle.revoke_token(world.db, record["id"])


def test_dns_rebinding_and_origin_are_refused(mcp, server, world):
    r = mcp.raw(world.keys["oj/muse"], "tools/list", headers={"Host": "evil.example"})
    assert r.status_code == 421
    r = mcp.raw(world.keys["oj/muse"], "tools/list", headers={"Origin": "http://evil.example"})
    assert r.status_code == 403
    r = server.get("/api/me", headers={"Host": "evil.example", "Authorization": f"Bearer {world.tokens['oj']}"})
    assert r.status_code == 421
    assert mcp.raw(world.keys["oj/muse"], "tools/list", headers={"Origin": "http://127.0.0.1:8321"}).status_code == 200


def test_public_url_and_extra_hosts_are_allowed():
    s = prickle.Settings(public_url="https://prickle.example.org", allowed_hosts=["10.0.0.5:8321"])
    assert "prickle.example.org" in s.host_allowlist(8321) and "10.0.0.5:8321" in s.host_allowlist(8321)
    assert "https://prickle.example.org" in s.origin_allowlist(8321)


def test_oversized_bodies_are_refused_before_the_database(mcp, server, world):
    before = world.db.scalar("SELECT count(*) FROM outbox")
    big = "x" * 300_000
    r = mcp.raw(world.keys["oj/muse"], "tools/call", {"name": "post_message",
                                                      "arguments": {"project": PROJECT, "body": big}}, "post_message")
    assert r.status_code == 413
    r = server.post(f"/api/projects/{PROJECT}/messages", json={"body": big},
                    headers={"Authorization": f"Bearer {world.tokens['oj']}"})
    assert r.status_code == 413
    assert world.db.scalar("SELECT count(*) FROM outbox") == before
    text = mcp.error("oj/muse", "post_message", {"project": PROJECT, "body": "x" * 8001}, "invalid_input")
    assert text.startswith("invalid_input: body:")


def test_the_owner_of_an_agent_is_the_part_before_the_slash():
    assert prickle.owner_of("oj/muse") == "oj"
    assert prickle.owner_of(prickle.check_agent_id("team-lead/a-b")) == "team-lead"
    assert prickle.owner_of("") == ""


def test_one_function_makes_credentials_and_one_revokes_them():
    import inspect
    import re
    source = inspect.getsource(prickle)
    makers = [m.start() for m in re.finditer(r"INSERT INTO credentials\b|insert\(\"credentials\"", source)]
    revokers = [m.start() for m in re.finditer(r"UPDATE credentials SET revoked_at\b", source)]
    assert len(makers) == 1 and 'db.insert("credentials"' in inspect.getsource(prickle.mint_credential)
    assert len(revokers) == 1 and "UPDATE credentials SET revoked_at" in inspect.getsource(prickle.revoke_credentials)
