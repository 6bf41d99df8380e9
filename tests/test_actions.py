"""Make-or-spend actions: a runner proposes an Approve card in its owner's private room, the owner approves or
declines it, the runner claims it once and finishes it with a result."""

import prickle
from conftest import all_events, audit_entries
from helpers import ROOM, claim, listen, person, say, setup_room, woke


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
