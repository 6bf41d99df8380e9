"""Private rooms: turns: each person's room with their own agents, and a turn's steps (draft, review, revise)."""

import datetime as dt

import prickle
from conftest import audit_entries
from helpers import ROOM, T0, claim, listen, person, say, setup_room, woke


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


# -- combine: several drafts merged into one answer ------------------------------------------

def _post(mcp, agent, claimed, body, verdict="draft"):
    return mcp.ok(agent, "post_message", {"project": ROOM, "body": body, "verdict": verdict},
                  token=claimed["discussion_credential"]["token"])["message"]


def test_several_named_drafts_are_combined_by_the_lead_into_one_answer(mcp, server, world):
    runners = setup_room(world)
    oj = person(server, world, "oj")
    oj.post("/api/room", {"reply_mode": "named", "lead": "oj/scout"})
    cursors = {a: listen(mcp, a, k) for a, k in runners.items()}
    asked = say(server, world, "@muse and @scout: a name for the beta?")
    [m], [s] = (woke(mcp, a, cursors[a], runners[a]) for a in ("oj/muse", "oj/scout"))
    assert [(e["message"]["id"], e["replies_left"], e["lead"]) for e in (m, s)] == [
        (asked["id"], 3, True), (asked["id"], 3, False)]  # two drafts and the combined answer
    first = _post(mcp, "oj/muse", claim(mcp, "oj/muse", runners["oj/muse"], asked["id"]), "Early access")
    turn = prickle.room_view(world.db, world.person("oj"))["turn"]
    assert (turn["step"], turn["waiting_on"], turn["replies_left"]) == ("draft", ["oj/scout"], 2)
    second = _post(mcp, "oj/scout", claim(mcp, "oj/scout", runners["oj/scout"], asked["id"]), "Beta club")
    # Both drafted: the lead combines them, woken by the last draft.
    c = woke(mcp, "oj/scout", cursors["oj/scout"], runners["oj/scout"])[-1]
    assert (c["kind"], c["message"]["id"], c["replies_left"], c["lead"]) == ("room", second["id"], 1, True)
    assert [e["message"]["id"] for e in woke(mcp, "oj/muse", cursors["oj/muse"], runners["oj/muse"])] == [
        asked["id"]]  # the drafter that doesn't combine is not woken again
    turn = prickle.room_view(world.db, world.person("oj"))["turn"]
    assert (turn["step"], turn["waiting_on"], turn["combiner"]) == ("combine", ["oj/scout"], "oj/scout")
    combine = claim(mcp, "oj/scout", runners["oj/scout"], second["id"])
    assert (combine["role"], combine["reviewing"], combine["lead"], combine["replies_left"]) == (
        "combine", None, True, 1)
    # It sees the drafts in the room it may read, and answers once with its verdict.
    seen = mcp.ok("oj/scout", "read_room", {"project": ROOM}, token=combine["discussion_credential"]["token"])
    assert [(x["body"], x.get("verdict")) for x in seen["messages"]] == [
        (asked["body"], None), ("Early access", "draft"), ("Beta club", "draft")]
    mcp.error("oj/scout", "post_message", {"project": ROOM, "body": "x", "verdict": "approve"}, "invalid_input",
              token=combine["discussion_credential"]["token"])
    answer = _post(mcp, "oj/scout", combine, "Early access club")
    assert answer["verdict"] == "draft"
    view = prickle.room_view(world.db, world.person("oj"))
    assert view["turn"] is None and view["last_turn"]["end_reason"] == "answered"
    assert [(e["refs"]["agent"]) for e in audit_entries(world.db, ROOM, "discussion.claimed")] == [
        "oj/muse", "oj/scout", "oj/scout"]
    roles = world.db.rows("SELECT agent_id, role, reply_id FROM discussions ORDER BY claimed_at, rowid")
    assert [(r["agent_id"], r["role"], r["reply_id"]) for r in roles] == [
        ("oj/muse", "draft", first["id"]), ("oj/scout", "draft", second["id"]), ("oj/scout", "combine", answer["id"])]


def test_one_named_agent_answers_alone_and_an_ask_owner_draft_ends_a_combined_turn(mcp, server, world):
    runners = setup_room(world)
    person(server, world, "oj").post("/api/room", {"reply_mode": "named"})
    asked = say(server, world, "@critic alone")
    only = claim(mcp, "oj/critic", runners["oj/critic"], asked["id"])
    assert (only["role"], only["replies_left"], only["lead"]) == ("draft", 1, True)
    _post(mcp, "oj/critic", only, "Done.")
    assert prickle.room_view(world.db, world.person("oj"))["turn"] is None
    asked = say(server, world, "@muse @scout which font?")
    _post(mcp, "oj/muse", claim(mcp, "oj/muse", runners["oj/muse"], asked["id"]), "Which brand?", "ask_owner")
    view = prickle.room_view(world.db, world.person("oj"))
    assert view["turn"] is None and view["last_turn"]["end_reason"] == "ask_owner"  # nothing to combine


# -- a turn's time limit -------------------------------------------------------------------------

def test_a_turn_runs_out_of_time_its_claims_are_refused_and_its_queued_wakes_end(mcp, server, world, clock):
    runners = setup_room(world)
    prickle.keep_turn_minutes(world.db, 5)  # the server's turn_minutes
    prickle.set_room(world.db, world.person("oj"), lead="oj/muse")
    cursor = listen(mcp, "oj/critic", runners["oj/critic"])
    asked = say(server, world, "Name for the beta?")
    turn = prickle.room_view(world.db, world.person("oj"))["turn"]
    assert turn["expires_at"] == prickle.iso(T0 + dt.timedelta(minutes=5))
    draft = _post(mcp, "oj/muse", claim(mcp, "oj/muse", runners["oj/muse"], asked["id"]), "Early access")
    [wake] = woke(mcp, "oj/critic", cursor, runners["oj/critic"])
    review = claim(mcp, "oj/critic", runners["oj/critic"], draft["id"])
    clock.now = T0 + dt.timedelta(minutes=5)
    # The reviewer's live credential ends with the turn; a claim again is refused with the reason.
    text = mcp.error("oj/critic", "claim_discussion", {"message_id": draft["id"], "idempotency_key": "k",
                                                       "harness": 2}, "invalid_state", token=runners["oj/critic"])
    assert text == "invalid_state: this turn no longer waits on your agent: it ran out of time"
    assert mcp.raw(review["discussion_credential"]["token"], "tools/list").status_code == 401
    view = prickle.room_view(world.db, world.person("oj"))
    assert view["turn"] is None
    assert view["last_turn"] | {"ended_at": None} == {"id": turn["id"], "end_reason": "out_of_time",
                                                     "ended_at": None, "missed": ["oj/critic"]}
    [entry] = audit_entries(world.db, ROOM, "room.turn_timed_out")
    assert entry["refs"] == {"turn": turn["id"], "step": "review", "agents": ["oj/critic"], "credentials": 1,
                             "wakes": 1}
    assert world.db.one("SELECT end_reason, step FROM turns WHERE id = ?", (turn["id"],)) == {
        "end_reason": "out_of_time", "step": "ended"}

    # A wake nobody picked up ends when the time is up (the background sweep's expiry).
    asked = say(server, world, "And the tagline?")
    second = prickle.room_view(world.db, world.person("oj"))["turn"]
    clock.now += dt.timedelta(minutes=4, seconds=59)
    assert prickle.expire_due(world.db, "turn") == 0
    clock.now += dt.timedelta(seconds=1)
    assert prickle.expire_due(world.db, "turn") == 1
    assert audit_entries(world.db, ROOM, "room.turn_timed_out")[-1]["refs"] == {
        "turn": second["id"], "step": "draft", "agents": ["oj/muse"], "credentials": 0, "wakes": 1}
    assert woke(mcp, "oj/muse", listen(mcp, "oj/muse", runners["oj/muse"]), runners["oj/muse"]) == []
    text = mcp.error("oj/muse", "claim_discussion", {"message_id": asked["id"], "idempotency_key": "k",
                                                     "harness": 2}, "invalid_state", token=runners["oj/muse"])
    assert text.endswith("it ran out of time")


def test_a_reply_after_the_time_limit_is_refused_and_the_turn_ends(mcp, server, world, clock):
    runners = setup_room(world)
    prickle.keep_turn_minutes(world.db, 5)
    prickle.set_room(world.db, world.person("oj"), lead="oj/muse")
    asked = say(server, world, "Quick one")
    drafting = claim(mcp, "oj/muse", runners["oj/muse"], asked["id"])
    clock.now = T0 + dt.timedelta(minutes=6)  # the credential's 10 minutes aren't up; the turn's 5 are
    text = mcp.error("oj/muse", "post_message", {"project": ROOM, "body": "Late", "verdict": "draft"},
                     "unauthorized", token=drafting["discussion_credential"]["token"])
    assert text == ("unauthorized: this discussion credential ended with its turn: it ran out of time; nothing "
                    "more is posted for it")
    assert mcp.raw(drafting["discussion_credential"]["token"], "tools/list").status_code == 401
    [entry] = audit_entries(world.db, ROOM, "room.turn_timed_out")
    assert entry["refs"]["credentials"] == 1
    assert [m["body"] for m in prickle.read_room(world.db, world.person("oj"), ROOM)["messages"]] == ["Quick one"]
