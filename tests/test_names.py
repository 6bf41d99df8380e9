"""Keys' names: a key keeps the name it was made with and says when it was last used, a name holding a secret
is refused, and a key that reaches further says so."""

import prickle
from conftest import PROJECT, audit_entries
from helpers import P, audit_text, jrun, person, run, written


def test_a_key_has_the_name_it_was_made_with_and_says_when_it_was_last_used(server, mcp, world):
    oj = person(server, world, "oj")
    before = written(world.db)
    r = oj.post("/api/keys", {"agent_id": "oj/muse", "label": "x" * 61})
    assert r.status_code == 400 and r.json()["error"]["message"] == "label must be text of 0 to 60 characters"
    assert written(world.db) == before
    minted = oj.post("/api/keys", {"agent_id": "oj/muse", "label": " laptop "}).json()
    assert minted["label"] == "laptop"
    key = next(k for k in oj.get("/api/keys").json()["keys"] if k["id"] == minted["id"])
    assert (key["label"], key["last_used_at"], key["revoked_at"]) == ("laptop", None, None)
    mcp.ok("oj/muse", "get_project_context", P, token=minted["token"])
    key = next(k for k in oj.get("/api/keys").json()["keys"] if k["id"] == minted["id"])
    assert key["last_used_at"] is not None and key["last_used_at"] >= key["created_at"]
    # A personal token's use on the HTTP API counts too (the first call above was made with it).
    token = next(k for k in oj.get("/api/keys").json()["keys"] if k["id"] == world.person("oj").credential_id)
    assert token["last_used_at"] is not None
    out = jrun(world.db_path, "token", "create", "--agent", "oj/scout", "--label", "ci box")
    assert out["label"] == "ci box"
    assert world.db.scalar("SELECT label FROM credentials WHERE id = ?", (out["id"],)) == "ci box"
    assert "laptop" not in audit_text(world.db) and "ci box" not in audit_text(world.db)


def test_a_key_name_holding_a_secret_is_refused_and_changes_nothing(server, world):
    oj = person(server, world, "oj")
    secret = world.keys["oj/muse"]
    before = written(world.db), world.db.scalar("SELECT count(*) FROM credentials")
    r = oj.post("/api/keys", {"agent_id": "oj/muse", "label": f"old key {secret}"})
    assert r.status_code == 400 and r.json()["error"] == {"code": "invalid_input", "message": (
        "label: that holds a Prickle secret (prk_…); give a name in plain words, e.g. 'laptop', and keep the "
        "secret out of it")}
    assert (written(world.db), world.db.scalar("SELECT count(*) FROM credentials")) == before
    assert world.db.scalar("SELECT count(*) FROM credentials WHERE label LIKE '%prk_%'") == 0
    code, out, err = run(world.db_path, "token", "create", "--agent", "oj/scout", "--label", secret, ok=False)
    assert code != 0 and secret not in out + err and "label: that holds a Prickle secret" in err
    assert world.db.scalar("SELECT count(*) FROM credentials") == before[1]
    # A runner device's name, and a computer's asking to connect, are kept in the clear too.
    r = oj.post("/api/devices", {"agent_id": "oj/muse", "name": f"laptop {secret}"})
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("name: that holds a Prickle secret")
    r = server.post("/api/runner/connect", json={"name": secret, "clis": ["claude"]})
    assert r.status_code == 400 and secret not in r.text
    assert world.db.scalar("SELECT count(*) FROM devices") == 0
    assert world.db.scalar("SELECT count(*) FROM connect_requests") == 0


def test_an_every_project_key_records_that_its_reach_grew(server, mcp, world):
    every = world.actor("sam/lone").credential_id
    scoped, _ = prickle.create_token(world.db, "client", agent_id="sam/lone", project="side")
    gone, _ = prickle.create_token(world.db, "client", agent_id="sam/lone")
    prickle.revoke_token(world.db, gone["id"])
    mcp.error("sam/lone", "read_room", P, "not_found")
    person(server, world, "oj").post(f"/api/projects/{PROJECT}/members", {"handle": "sam"})
    r = person(server, world, "sam").post(f"/api/projects/{PROJECT}/agents", {"agent_id": "sam/lone"})
    assert r.status_code == 200, r.text
    assert [e["refs"] for e in audit_entries(world.db, PROJECT, "credential.project_covered")] == [
        {"credential": every, "agent": "sam/lone"}]
    assert mcp.ok("sam/lone", "read_room", P)["messages"] == []
    # A rooms key: the room came back into its reach when its agent was added back to it.
    rooms, _ = prickle.create_token(world.db, "client", agent_id="sam/lone", project=prickle.ROOMS_SCOPE)
    room = world.db.scalar("SELECT project FROM rooms WHERE owner = 'sam'")
    world.db.execute("DELETE FROM project_agents WHERE project = ? AND agent_id = 'sam/lone'", (room,))
    jrun(world.db_path, "agent", "join", room, "sam/lone")
    assert [e["refs"] for e in audit_entries(world.db, room, "credential.room_covered")] == [
        {"credential": rooms["id"], "agent": "sam/lone"}]
    assert audit_entries(world.db, room, "credential.project_covered") == []
    assert audit_entries(world.db, "side", "credential.project_covered") == []
