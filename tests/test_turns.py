"""Private rooms: turns: each person's room with their own agents, and a turn's steps (draft, review, revise)."""

import prickle
from conftest import audit_entries
from helpers import ROOM, claim, listen, say, setup_room, woke


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
