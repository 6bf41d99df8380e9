"""Private rooms: discussions: claim_discussion and its credential, the room's settings (reply mode, lead),
the owner stopping or continuing a turn, and a reviewer whose runner isn't listening, skipped and retried."""

import prickle
from conftest import all_events, audit_entries
from helpers import ROOM, claim, listen, person, say, setup_room, woke


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
    assert view["room"] == {"project": ROOM, "reply_mode": "solo", "lead_agent": "oj/critic",
                            "round": {"number": 1, "stopped": False}}
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


# -- a private room's reviewer that isn't listening ---------------------------------------

def test_a_reviewer_whose_runner_isnt_listening_is_skipped_then_retried(mcp, server, world):
    runners = setup_room(world)
    asked = say(server, world, "Name for the beta?")
    d = claim(mcp, "oj/muse", runners["oj/muse"], asked["id"])
    draft = mcp.ok("oj/muse", "post_message", {"project": ROOM, "body": "Early access", "verdict": "draft"},
                   token=d["discussion_credential"]["token"])["message"]
    turn = prickle.room_view(world.db, world.person("oj"))["turn"]
    assert (turn["waiting_on"], turn["skipped"]) == ([], ["oj/critic"])  # no stall, no wake
    [skipped] = audit_entries(world.db, ROOM, "room.reviewer_skipped")
    assert skipped["refs"] == {"turn": turn["id"], "step": "review", "draft": draft["id"], "agent": "oj/critic",
                               "reason": "runner_not_listening"}
    oj = person(server, world, "oj")
    assert oj.post("/api/room/retry", {"agent": "oj/muse"}).status_code == 400
    cursor = listen(mcp, "oj/critic", runners["oj/critic"])
    retried = oj.post("/api/room/retry", {"agent": "oj/critic"})
    assert retried.status_code == 200, retried.text
    assert retried.json()["turn"]["waiting_on"] == ["oj/critic"]
    woke = mcp.ok("oj/critic", "wait_for_mention", {"cursor": cursor, "timeout_seconds": 1},
                  token=runners["oj/critic"])
    assert [(e["kind"], e["message"]["id"]) for e in woke["events"]] == [("room", draft["id"])]
    # The wake rode on the draft's own event again: no second message.posted for an old message.
    posted = [e for e in all_events(world.db) if e["type"] == "message.posted" and e["message"]["id"] == draft["id"]]
    assert len(posted) == 1
    again = mcp.ok("oj/critic", "wait_for_mention", {"cursor": woke["cursor"], "timeout_seconds": 1},
                   token=runners["oj/critic"])
    assert again["events"] == []  # handed out once
    review = claim(mcp, "oj/critic", runners["oj/critic"], draft["id"])
    assert review["role"] == "review" and review["reviewing"]["message_id"] == draft["id"]
    [entry] = audit_entries(world.db, ROOM, "room.reviewer_retried")
    assert entry["refs"] == {"turn": turn["id"], "agent": "oj/critic", "message": draft["id"], "step": "review",
                             "attempt": 1, "sessions": 0, "wakes": 0}
    mcp.ok("oj/critic", "post_message", {"project": ROOM, "body": "", "verdict": "approve"},
           token=review["discussion_credential"]["token"])
    assert prickle.room_view(world.db, world.person("oj"))["turn"] is None


def test_going_on_without_the_skipped_reviewer_still_has_the_drafter_revise(mcp, server, world):
    runners = setup_room(world)
    asked = say(server, world, "Name for the beta?")
    d = claim(mcp, "oj/muse", runners["oj/muse"], asked["id"])
    draft = mcp.ok("oj/muse", "post_message", {"project": ROOM, "body": "Early access", "verdict": "draft"},
                   token=d["discussion_credential"]["token"])["message"]
    turn = prickle.room_view(world.db, world.person("oj"))["turn"]
    assert turn["skipped"] == ["oj/critic"]
    oj = person(server, world, "oj")
    cursor = listen(mcp, "oj/muse", runners["oj/muse"])
    done = oj.post("/api/room/continue")
    assert done.status_code == 200, done.text
    # The turn carries on as if the review had come: the drafter revises, with the reply left.
    assert {k: done.json()["turn"][k] for k in ("id", "step", "waiting_on", "skipped", "replies_left")} == {
        "id": turn["id"], "step": "revise", "waiting_on": ["oj/muse"], "skipped": [], "replies_left": 1}
    [wake] = woke(mcp, "oj/muse", cursor, runners["oj/muse"])
    assert (wake["kind"], wake["message"]["id"], wake["replies_left"], wake["lead"]) == ("room", draft["id"], 1, False)
    posted = [e for e in all_events(world.db) if e["type"] == "message.posted" and e["message"]["id"] == draft["id"]]
    assert len(posted) == 1  # the wake rode on the draft's own event
    [entry] = audit_entries(world.db, ROOM, "room.turn_continued")
    assert entry["refs"] == {"turn": turn["id"], "agents": ["oj/critic"], "woken": 1, "sessions": 0, "wakes": 0}
    revise = claim(mcp, "oj/muse", runners["oj/muse"], draft["id"])
    assert (revise["role"], revise["reviewing"]["message_id"], revise["replies_left"]) == ("revise", draft["id"], 1)
    mcp.ok("oj/muse", "post_message", {"project": ROOM, "body": "Early access, for teams", "verdict": "draft"},
           token=revise["discussion_credential"]["token"])
    view = prickle.room_view(world.db, world.person("oj"))
    assert view["turn"] is None and view["last_turn"]["end_reason"] == "answered"
    assert oj.post("/api/room/continue").status_code == 409


def test_going_on_without_a_drafter_combines_the_drafts_that_came_or_ends(mcp, server, world):
    runners = setup_room(world)
    oj = person(server, world, "oj")
    oj.post("/api/room", {"reply_mode": "named"})
    cursors = {a: listen(mcp, a, k) for a, k in runners.items()}
    asked = say(server, world, "@critic @scout @muse: a tagline?")
    drafts = {}
    for agent in ("oj/scout", "oj/muse"):
        c = claim(mcp, agent, runners[agent], asked["id"])
        drafts[agent] = mcp.ok(agent, "post_message", {"project": ROOM, "body": f"By {agent}", "verdict": "draft"},
                               token=c["discussion_credential"]["token"])["message"]
    stuck = claim(mcp, "oj/critic", runners["oj/critic"], asked["id"])  # claimed, never answers
    turn = oj.get("/api/room").json()["turn"]
    assert (turn["step"], turn["waiting_on"], turn["replies_left"]) == ("draft", ["oj/critic"], 2)
    view = oj.post("/api/room/continue").json()
    # The drafts that came are combined by the room's lead (its first agent, oj/muse), which drafted,
    # woken by the last draft.
    assert {k: view["turn"][k] for k in ("step", "waiting_on", "combiner", "replies_left")} == {
        "step": "combine", "waiting_on": ["oj/muse"], "combiner": "oj/muse", "replies_left": 1}
    assert mcp.raw(stuck["discussion_credential"]["token"], "tools/list").status_code == 401
    wake = woke(mcp, "oj/muse", cursors["oj/muse"], runners["oj/muse"])[-1]
    assert (wake["message"]["id"], wake["replies_left"], wake["lead"]) == (drafts["oj/muse"]["id"], 1, True)
    [entry] = audit_entries(world.db, ROOM, "room.turn_continued")
    assert entry["refs"] == {"turn": turn["id"], "agents": ["oj/critic"], "woken": 1, "sessions": 1, "wakes": 1}
    combine = claim(mcp, "oj/muse", runners["oj/muse"], drafts["oj/muse"]["id"])
    assert combine["role"] == "combine"

    # One draft only: nothing to combine, the turn ends.
    asked = say(server, world, "@critic @muse: and the footer?")
    c = claim(mcp, "oj/muse", runners["oj/muse"], asked["id"])
    mcp.ok("oj/muse", "post_message", {"project": ROOM, "body": "Footer", "verdict": "draft"},
           token=c["discussion_credential"]["token"])
    view = oj.post("/api/room/continue").json()
    assert view["turn"] is None and view["last_turn"]["end_reason"] == "continued"
    assert audit_entries(world.db, ROOM, "room.turn_continued")[-1]["refs"] == {
        "turn": view["last_turn"]["id"], "agents": ["oj/critic"], "woken": 0, "sessions": 0, "wakes": 1}


def test_the_owner_stops_a_round_agents_post_nothing_there_until_the_owner_writes(mcp, server, world):
    runners = setup_room(world)
    oj = person(server, world, "oj")
    runner = prickle.resolve_token(world.db, runners["oj/muse"], ("runner",))
    card = prickle.propose_action(world.db, runner, "image_gen", "Make the hero image", "a hedgehog")
    waiting = prickle.propose_action(world.db, runner, "image_gen", "Make a banner", "a quiet sea")
    for c in (card, waiting):
        oj.post(f"/api/actions/{c['id']}", {"decision": "approve"})
    prickle.claim_action(world.db, runner, card["id"])  # running when the round stops
    asked = say(server, world, "Start something")
    live = claim(mcp, "oj/muse", runners["oj/muse"], asked["id"])
    turn = oj.get("/api/room").json()["turn"]
    view = oj.post("/api/room/round/stop")
    assert view.status_code == 200, view.text
    assert view.json()["room"]["round"] == {"number": 1, "stopped": True} and view.json()["turn"] is None
    assert mcp.raw(live["discussion_credential"]["token"], "tools/list").status_code == 401
    entries = [(e["type"], e["refs"]) for e in audit_entries(world.db, ROOM) if e["type"].startswith("room.")]
    assert entries == [("room.turn_stopped", {"turn": turn["id"], "credentials": 1, "wakes": 1}),
                       ("room.round_stopped", {"round": 1})]
    again = oj.post("/api/room/round/stop")
    assert again.status_code == 409 and "already stopped" in again.json()["error"]["message"]
    text = mcp.error("oj/muse", "claim_discussion", {"message_id": asked["id"], "idempotency_key": "k2",
                                                     "harness": 2}, "invalid_state", token=runners["oj/muse"])
    assert text.endswith("the owner stopped it")
    # No new card, and a running card's result is not posted: it ends as stopped.
    try:
        prickle.propose_action(world.db, runner, "image_gen", "Another", "a fox")
        raise AssertionError("a card was proposed in a stopped round")
    except prickle.InvalidState as e:
        assert "stopped this round" in str(e)
    try:  # an approved card not yet claimed runs nothing: its result could not be posted
        prickle.claim_action(world.db, runner, waiting["id"])
        raise AssertionError("a card was claimed in a stopped round")
    except prickle.InvalidState as e:
        assert "nothing runs until they write again" in str(e)
    finished = prickle.finish_action(world.db, runner, card["id"], body="Made: a hedgehog")
    assert (finished["status"], finished["failure"]) == ("failed", "stopped")
    assert [m["body"] for m in oj.get(f"/api/projects/{ROOM}/room").json()["messages"]] == [
        "Proposed: Make the hero image", "Proposed: Make a banner", "Start something"]
    # The owner's next message opens the next round.
    say(server, world, "Go on")
    assert oj.get("/api/room").json()["room"]["round"] == {"number": 2, "stopped": False}
    prickle.propose_action(world.db, runner, "image_gen", "Another", "a fox")


def test_a_listening_reviewer_is_not_skipped_within_the_grace(mcp, server, world):
    runners = setup_room(world)
    listen(mcp, "oj/critic", runners["oj/critic"])
    asked = say(server, world, "Name?")
    d = claim(mcp, "oj/muse", runners["oj/muse"], asked["id"])
    mcp.ok("oj/muse", "post_message", {"project": ROOM, "body": "A", "verdict": "draft"},
           token=d["discussion_credential"]["token"])
    assert prickle.room_view(world.db, world.person("oj"))["turn"]["waiting_on"] == ["oj/critic"]
    assert audit_entries(world.db, ROOM, "room.reviewer_skipped") == []
    # past the grace, a runner that stopped calling counts as gone
    listening = server.state.db.listening
    assert listening["oj/critic"][0] == 0 and prickle.runner_listening(server.state.db, "oj/critic")
    listening["oj/critic"][1] -= prickle.LISTEN_GRACE + 1
    assert not prickle.runner_listening(server.state.db, "oj/critic")
    assert not prickle.runner_listening(server.state.db, "oj/scout")  # never waited


def test_an_agent_taken_out_of_its_owners_room_and_added_back_brings_its_rooms_key_back_into_reach(
        mcp, server, world):
    oj = person(server, world, "oj")
    rooms_key, secret = prickle.create_token(world.db, "client", agent_id="oj/scout", project=prickle.ROOMS_SCOPE)
    assert {a["agent_id"]: a["in_room"] for a in oj.get("/api/room").json()["agents"]} == {
        "oj/muse": True, "oj/scout": True}
    assert oj.delete(f"/api/projects/{ROOM}/agents/oj/scout").status_code == 200
    assert {a["agent_id"]: a["in_room"] for a in oj.get("/api/room").json()["agents"]}["oj/scout"] is False
    mcp.error("oj/scout", "read_room", {"project": ROOM}, "not_found", token=secret)
    assert person(server, world, "ren").delete(f"/api/projects/{ROOM}/agents/oj/scout").status_code == 404
    assert oj.post(f"/api/projects/{ROOM}/agents", {"agent_id": "oj/scout"}).status_code == 200
    assert mcp.ok("oj/scout", "read_room", {"project": ROOM}, token=secret)["messages"] == []
    assert [e["refs"] for e in audit_entries(world.db, ROOM, "credential.room_covered")] == [
        {"credential": rooms_key["id"], "agent": "oj/scout"}]
    assert audit_entries(world.db, ROOM, "agent.added")[-1]["refs"] == {
        "agent": "oj/scout", "with_owner": False, "ended_removal": True}


def test_a_runner_refused_as_too_old_shows_as_needing_an_update_until_it_claims_again(mcp, server, world):
    runners = setup_room(world)
    oj = person(server, world, "oj")
    asked = say(server, world, "Hello agents")
    mcp.error("oj/muse", "claim_discussion", {"message_id": asked["id"], "idempotency_key": "k"}, "forbidden",
              token=runners["oj/muse"])
    needs = {a["agent_id"]: a["needs_update"] for a in oj.get("/api/agents").json()["agents"]}
    assert needs == {"oj/critic": False, "oj/muse": True, "oj/scout": False}
    claim(mcp, "oj/muse", runners["oj/muse"], asked["id"])  # the updated runner answers
    assert {a["agent_id"]: a["needs_update"] for a in oj.get("/api/agents").json()["agents"]}["oj/muse"] is False


def test_prickle_runner_status_says_an_agent_needs_an_update():
    config = prickle.RunnerConfig(server="http://127.0.0.1:8321", agents={
        "oj/muse": prickle.RunnerAgent(key="prk_rk_x", client="claude")})
    lines = prickle.runner_status_lines(config, {"running": True, "pid": 7, "agents": {"oj/muse": {
        "connected": True, "listening": True, "runs": {}, "last_failure": None,
        "needs_update": "harness: this runner speaks harness 1; ... update prickle-runner"}}})
    assert lines[-1] == "  needs an update: harness: this runner speaks harness 1; ... update prickle-runner"


def test_stopping_a_round_before_the_owner_ever_wrote_is_refused_and_writes_nothing(server, world):
    setup_room(world)
    oj = person(server, world, "oj")
    r = oj.post("/api/room/round/stop")
    assert (r.status_code, r.json()["error"]["message"]) == (
        409, "nothing to stop: no round has started in your room; one starts when you write there")
    assert [e for e in audit_entries(world.db, ROOM) if e["type"] == "room.round_stopped"] == []
    assert oj.get("/api/room").json()["room"]["round"] == {"number": 0, "stopped": False}
