"""Private rooms: each person's room with their own agents, turns by reply mode, claim_discussion."""

import prickle
from conftest import all_events, audit_entries
from helpers import ROOM, claim, listen, person, say, setup_room, woke


def test_every_person_gets_a_private_room_with_their_agents(mcp, world):
    assert world.db.one("SELECT * FROM rooms WHERE owner = 'oj'")["project"] == ROOM
    agents = [r["agent_id"] for r in world.db.rows("SELECT agent_id FROM project_agents WHERE project = ?", (ROOM,))]
    assert agents == ["oj/muse", "oj/scout"]
    mcp.error("oj/muse", "read_room", {"project": ROOM}, "not_found")  # a full-reach key doesn't reach it
    _, rooms_key = prickle.create_token(world.db, "client", agent_id="oj/muse", project=prickle.ROOMS_SCOPE)
    assert mcp.ok("oj/muse", "read_room", {"project": ROOM}, token=rooms_key)["messages"] == []
    mcp.error("oj/muse", "read_room", {"project": "website-v2"}, "not_found", token=rooms_key)
    mcp.error("oj/muse", "post_message", {"project": ROOM, "body": "hi"}, "forbidden", token=rooms_key)
    mcp.error("ren/builder", "read_room", {"project": ROOM}, "not_found")


def test_draft_review_revise(mcp, server, world):
    runners = setup_room(world)
    cursors = {a: listen(mcp, a, k) for a, k in runners.items()}
    asked = say(server, world, "What should the hero headline say?")
    [event] = woke(mcp, "oj/muse", cursors["oj/muse"], runners["oj/muse"])
    assert (event["kind"], event["message"]["id"], event["replies_left"], event["lead"]) == (
        "room", asked["id"], 3, True)
    assert woke(mcp, "oj/critic", cursors["oj/critic"], runners["oj/critic"]) == []
    draft_claim = claim(mcp, "oj/muse", runners["oj/muse"], asked["id"])
    assert (draft_claim["role"], draft_claim["reviewing"], draft_claim["project"]) == ("draft", None, ROOM)
    assert draft_claim["discussion_credential"]["allowed_tools"] == ["read_room", "post_message"]
    cred = draft_claim["discussion_credential"]["token"]
    assert mcp.ok("oj/muse", "read_room", {"project": ROOM}, token=cred)["messages"][0]["id"] == asked["id"]
    mcp.error("oj/muse", "read_room", {"project": "website-v2"}, "forbidden", token=cred)
    mcp.error("oj/muse", "get_project_context", {"project": ROOM}, "forbidden", token=cred)
    mcp.error("oj/muse", "post_message", {"project": ROOM, "body": "x"}, "invalid_input", token=cred)
    mcp.error("oj/muse", "post_message", {"project": ROOM, "body": "x", "verdict": "approve"}, "invalid_input",
              token=cred)
    draft = mcp.ok("oj/muse", "post_message", {"project": ROOM, "body": "Work together, calmly.",
                                               "verdict": "draft"}, token=cred)["message"]
    assert draft["verdict"] == "draft"
    text = mcp.error("oj/muse", "post_message", {"project": ROOM, "body": "again", "verdict": "draft"},
                     "invalid_state", token=cred)
    assert "one reply" in text  # one post only
    [review_wake] = woke(mcp, "oj/critic", cursors["oj/critic"], runners["oj/critic"])
    assert (review_wake["message"]["id"], review_wake["replies_left"], review_wake["lead"]) == (draft["id"], 2, False)
    review_claim = claim(mcp, "oj/critic", runners["oj/critic"], draft["id"])
    assert review_claim["role"] == "review"
    assert review_claim["reviewing"] | {"provenance_status": None} == {
        "message_id": draft["id"], "author": "oj/muse", "body": "Work together, calmly.",
        "provenance": "agent_generated", "provenance_status": None}
    changes = mcp.ok("oj/critic", "post_message", {"project": ROOM, "body": "Too vague: name the product.",
                                                   "verdict": "changes"},
                     token=review_claim["discussion_credential"]["token"])["message"]
    [revise_wake] = woke(mcp, "oj/muse", cursors["oj/muse"], runners["oj/muse"])[-1:]
    assert revise_wake["message"]["id"] == changes["id"] and revise_wake["replies_left"] == 1
    revise = claim(mcp, "oj/muse", runners["oj/muse"], changes["id"])
    assert revise["role"] == "revise" and revise["reviewing"]["message_id"] == draft["id"]
    mcp.ok("oj/muse", "post_message", {"project": ROOM, "body": "Prickle: your team and its agents, together.",
                                       "verdict": "draft"}, token=revise["discussion_credential"]["token"])
    assert prickle.room_view(world.db, world.person("oj"))["turn"] is None  # the turn is over
    claimed = audit_entries(world.db, ROOM, "discussion.claimed")
    assert [e["refs"]["agent"] for e in claimed] == ["oj/muse", "oj/critic", "oj/muse"]


def test_an_approving_review_ends_the_turn(mcp, server, world):
    runners = setup_room(world)
    listen(mcp, "oj/critic", runners["oj/critic"])  # the reviewer's runner listens
    asked = say(server, world, "Name for the beta?")
    d = claim(mcp, "oj/muse", runners["oj/muse"], asked["id"])
    draft = mcp.ok("oj/muse", "post_message", {"project": ROOM, "body": "Early access", "verdict": "draft"},
                   token=d["discussion_credential"]["token"])["message"]
    r = claim(mcp, "oj/critic", runners["oj/critic"], draft["id"])
    mcp.ok("oj/critic", "post_message", {"project": ROOM, "body": "", "verdict": "approve"},
           token=r["discussion_credential"]["token"])
    assert prickle.room_view(world.db, world.person("oj"))["turn"] is None


def test_claims_need_harness_2_and_a_turn_that_waits_on_the_agent(mcp, server, world):
    runners = setup_room(world)
    asked = say(server, world, "Hello agents")
    text = mcp.error("oj/muse", "claim_discussion", {"message_id": asked["id"], "idempotency_key": "k"}, "forbidden",
                     token=runners["oj/muse"])
    assert "harness" in text
    assert audit_entries(world.db, ROOM, "discussion.refused")[0]["refs"]["reason"] == "harness"
    mcp.error("oj/scout", "claim_discussion", {"message_id": asked["id"], "idempotency_key": "k", "harness": 2},
              "invalid_state", token=runners["oj/scout"])  # the turn waits on muse, not scout
    first = claim(mcp, "oj/muse", runners["oj/muse"], asked["id"])
    again = claim(mcp, "oj/muse", runners["oj/muse"], asked["id"])  # replay: a fresh credential
    assert again["discussion_credential"]["token"] != first["discussion_credential"]["token"]
    assert mcp.raw(first["discussion_credential"]["token"], "tools/list").status_code == 401
    say(server, world, "Never mind, new question")  # the owner's next message replaces the turn
    mcp.error("oj/muse", "claim_discussion", {"message_id": asked["id"], "idempotency_key": "k", "harness": 2},
              "invalid_state", token=runners["oj/muse"])
    assert mcp.raw(again["discussion_credential"]["token"], "tools/list").status_code == 401
    mcp.error("ren/builder", "claim_discussion", {"message_id": asked["id"], "idempotency_key": "k", "harness": 2},
              "forbidden")  # a client key for team projects


def test_the_owner_stops_a_turn_and_sets_the_reply_mode_and_lead(mcp, server, world):
    runners = setup_room(world)
    oj = person(server, world, "oj")
    asked = say(server, world, "Start something")
    live = claim(mcp, "oj/muse", runners["oj/muse"], asked["id"])
    stopped = oj.post("/api/room/stop").json()
    assert stopped["stopped"] is True and stopped["credentials_ended"] == 1
    assert mcp.raw(live["discussion_credential"]["token"], "tools/list").status_code == 401
    assert oj.post("/api/room/stop").status_code == 409
    view = oj.post("/api/room", {"reply_mode": "solo", "lead": "oj/critic"}).json()
    assert view["room"] == {"project": ROOM, "reply_mode": "solo", "lead_agent": "oj/critic"}
    cursor = listen(mcp, "oj/critic", runners["oj/critic"])
    asked = say(server, world, "Alone please")
    [event] = woke(mcp, "oj/critic", cursor, runners["oj/critic"])
    assert event["replies_left"] == 1
    oj.post("/api/room", {"reply_mode": "named"})
    cursors = {a: listen(mcp, a, k) for a, k in runners.items()}
    say(server, world, "@scout and @muse, both of you")
    assert [len(woke(mcp, a, cursors[a], runners[a])) for a in ("oj/muse", "oj/scout", "oj/critic")] == [1, 1, 0]
    say(server, world, "nobody named")
    assert prickle.room_view(world.db, world.person("oj"))["turn"] is None
    assert oj.post("/api/room", {"reply_mode": "chaos"}).status_code == 400
    assert oj.post("/api/room", {"lead": "ren/builder"}).status_code == 404
    assert oj.post("/api/room", {"default_agent": "oj/scout"}).json()["room"]["lead_agent"] == "oj/scout"
    types = [e["type"] for e in audit_entries(world.db, ROOM) if e["type"].startswith("room.")]
    assert types == ["room.turn_stopped", "room.lead_set", "room.reply_mode_set", "room.reply_mode_set",
                     "room.default_agent_set"]


def test_make_or_spend_actions(mcp, server, world):
    runners = setup_room(world)
    runner = {"Authorization": f"Bearer {runners['oj/muse']}"}
    cursor = listen(mcp, "oj/muse", runners["oj/muse"])
    r = server.post("/api/runner/actions", json={"tool": "image_gen", "action": "Draw the hero illustration",
                                                 "prompt": "A calm team of robots and people", "cost_estimate": "$0.04"},
                    headers=runner)
    assert r.status_code == 200, r.text
    card = r.json()["action"]
    assert (card["status"], card["tool"], card["inputs"]) == ("proposed", "image_gen",
                                                              {"prompt": "A calm team of robots and people"})
    room = mcp.ok("oj/muse", "read_room", {"project": ROOM}, token=prickle.create_token(
        world.db, "client", agent_id="oj/muse", project=prickle.ROOMS_SCOPE)[1])
    assert room["messages"][-1]["make_action"]["id"] == card["id"]
    assert woke(mcp, "oj/muse", cursor, runners["oj/muse"]) == []  # a proposal wakes no one
    assert server.post(f"/api/runner/actions/{card['id']}/claim", headers=runner).status_code == 409
    oj = person(server, world, "oj")
    assert [a["id"] for a in oj.get("/api/actions").json()["actions"]] == [card["id"]]
    assert person(server, world, "ren").post(f"/api/actions/{card['id']}", {"decision": "approve"}).status_code == 404
    approved = oj.post(f"/api/actions/{card['id']}", {"decision": "approve"}).json()["action"]
    assert approved["status"] == "approved" and approved["decided_by"] == "oj"
    [event] = woke(mcp, "oj/muse", cursor, runners["oj/muse"])
    assert event == {"kind": "action", "action_id": card["id"], "project": ROOM, "tool": "image_gen"}
    other = {"Authorization": f"Bearer {runners['oj/scout']}"}
    assert server.post(f"/api/runner/actions/{card['id']}/claim", headers=other).status_code == 404
    assert server.post(f"/api/runner/actions/{card['id']}/claim", headers=runner).json()["action"]["status"] == "running"
    assert server.post(f"/api/runner/actions/{card['id']}/claim", headers=runner).status_code == 409  # once
    done = server.post(f"/api/runner/actions/{card['id']}/finish", json={"body": "Here it is: hero.png"},
                       headers=runner).json()["action"]
    assert done["status"] == "done" and done["result_message_id"]
    result = prickle.get_message(world.db, done["result_message_id"])
    assert result["made_by_action"]["action_id"] == card["id"]
    types = [e["type"] for e in audit_entries(world.db, ROOM) if e["type"].startswith("action.")]
    assert types == ["action.proposed", "action.approved", "action.claimed", "action.finished"]
    # a declined card wakes nobody and cannot be claimed
    second = server.post("/api/runner/actions", json={"tool": "image_gen", "action": "Another", "prompt": "p"},
                         headers=runner).json()["action"]
    assert oj.post(f"/api/actions/{second['id']}", {"decision": "decline"}).json()["action"]["status"] == "declined"
    assert woke(mcp, "oj/muse", cursor, runners["oj/muse"])[1:] == []
    assert server.post(f"/api/runner/actions/{second['id']}/claim", headers=runner).status_code == 409
    assert server.post("/api/runner/actions", json={"tool": "video_gen", "action": "x", "prompt": "p"},
                       headers=runner).status_code == 400
    assert server.post("/api/runner/actions", json={"tool": "image_gen", "action": "x", "prompt": "p"},
                       headers={"Authorization": f"Bearer {world.keys['oj/muse']}"}).status_code == 401


def test_an_actions_card_and_result_are_posted_with_their_audit_entries(server, world):
    runners = setup_room(world)
    runner = {"Authorization": f"Bearer {runners['oj/muse']}"}
    card = server.post("/api/runner/actions", json={"tool": "image_gen", "action": "Draw the hero", "prompt": "p"},
                       headers=runner).json()["action"]
    card_message = world.db.scalar("SELECT message_id FROM actions WHERE id = ?", (card["id"],))
    posted = all_events(world.db)[-2]
    assert posted["type"] == "message.posted" and posted["message"] == prickle.get_message(world.db, card_message)
    assert posted["message"]["make_action"] == card and posted["message"]["body"] == "Proposed: Draw the hero"
    person(server, world, "oj").post(f"/api/actions/{card['id']}", {"decision": "approve"})
    server.post(f"/api/runner/actions/{card['id']}/claim", headers=runner)
    done = server.post(f"/api/runner/actions/{card['id']}/finish", json={"body": "Here it is: hero.png"},
                       headers=runner).json()["action"]
    result = [e for e in all_events(world.db) if e["type"] == "message.posted"][-1]
    assert result["message"] == prickle.get_message(world.db, done["result_message_id"])
    assert result["message"]["made_by_action"] == {
        "action_id": card["id"], "approval_audit_id": world.db.scalar(
            "SELECT approval_audit_id FROM actions WHERE id = ?", (card["id"],))}
    entries = [(e["type"], e["refs"]) for e in audit_entries(world.db, ROOM)
               if e["type"] in ("message.posted", "action.proposed", "action.finished")]
    common = {"author": "oj/muse", "mentions": 0, "provenance": "agent_generated", "task": None}
    assert [(t, r.get("message")) for t, r in entries] == [
        ("message.posted", card_message), ("action.proposed", card_message),
        ("message.posted", done["result_message_id"]), ("action.finished", done["result_message_id"])]
    assert entries[0][1] == common | {"message": card_message}
    assert entries[2][1] == common | {"message": done["result_message_id"]}
    assert prickle.verify_audit(world.db, ROOM)[0]["ok"] is True


def test_revoking_a_rooms_key_ends_the_discussions_it_claimed(mcp, server, world):
    setup_room(world)
    record, rooms_key = prickle.create_token(world.db, "client", agent_id="oj/muse", project=prickle.ROOMS_SCOPE)
    listen(mcp, "oj/muse", rooms_key)
    asked = say(server, world, "Which font for the headline?")
    cred = claim(mcp, "oj/muse", rooms_key, asked["id"])["discussion_credential"]["token"]
    assert mcp.ok("oj/muse", "read_room", {"project": ROOM}, token=cred)["messages"][-1]["id"] == asked["id"]
    r = person(server, world, "oj").delete(f"/api/keys/{record['id']}")
    assert r.status_code == 200 and r.json()["revoked"] is True
    for token in (rooms_key, cred):
        assert mcp.raw(token, "tools/list").status_code == 401
    row = world.db.one("SELECT revoked_at, issued_by FROM credentials WHERE secret_hash = ?",
                       (prickle.sha256_hex(cred),))
    assert row["revoked_at"] is not None and row["issued_by"] == record["id"]


def test_only_the_runner_finishes_an_action(mcp, server, world):
    runners = setup_room(world)
    runner = {"Authorization": f"Bearer {runners['oj/muse']}"}
    card = server.post("/api/runner/actions", json={"tool": "image_gen", "action": "Draw the hero", "prompt": "p"},
                       headers=runner).json()["action"]
    person(server, world, "oj").post(f"/api/actions/{card['id']}", {"decision": "approve"})
    assert server.post(f"/api/runner/actions/{card['id']}/claim", headers=runner).json()["action"]["status"] == "running"
    asked = say(server, world, "A caption for the hero illustration?")
    discussion = claim(mcp, "oj/muse", runners["oj/muse"], asked["id"])["discussion_credential"]["token"]
    r = server.post(f"/api/runner/actions/{card['id']}/finish", json={"body": "not from here"},
                    headers={"Authorization": f"Bearer {discussion}"})
    assert r.status_code == 403 and "runner device" in r.json()["error"]["message"]
    assert world.db.scalar("SELECT status FROM actions WHERE id = ?", (card["id"],)) == "running"
    done = server.post(f"/api/runner/actions/{card['id']}/finish", json={"failure": "error"}, headers=runner)
    assert done.json()["action"]["status"] == "failed"


def test_a_retried_discussion_claim_ends_the_old_credential_everywhere_and_records_it(mcp, server, world):
    runners = setup_room(world)
    asked = say(server, world, "Which colour for the button?")
    runner = prickle.resolve_token(world.db, runners["oj/muse"], ("runner",))
    first = prickle.claim_discussion(world.db, runner, asked["id"], "k", 2)
    old = world.db.one("SELECT id, device_id FROM credentials WHERE secret_hash = ?",
                       (prickle.sha256_hex(first["discussion_credential"]["token"]),))
    told = []
    world.db.revoked_listeners.append(lambda: told.append("revoked"))
    again = prickle.claim_discussion(world.db, runner, asked["id"], "k", 2)
    assert told == ["revoked"]  # open waits and MCP sessions of the old credential end at once
    discussion = world.db.scalar("SELECT id FROM discussions WHERE message_id = ?", (asked["id"],))
    assert [e["refs"] for e in audit_entries(world.db, ROOM, "token.revoked")] == [{
        "credential": old["id"], "kind": "discussion", "agent": "oj/muse", "device": old["device_id"],
        "discussion": discussion, "reason": "claim_retried"}]
    assert mcp.raw(first["discussion_credential"]["token"], "tools/list").status_code == 401
    assert mcp.ok("oj/muse", "read_room", {"project": ROOM}, token=again["discussion_credential"]["token"])
