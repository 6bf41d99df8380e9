"""Messages: post_message writing, mentions, replies and threads, provenance, verdicts, and the loop guard
(pausing a pair of agents, a person resuming it)."""

import json

import prickle
from conftest import PROJECT, all_events, audit_entries
from helpers import P, auth, make_task, post, written


def test_post_message_returns_the_message_and_writes_event_and_audit(mcp, world):
    m = post(mcp, "ren/builder", "@oj/muse Can you help with the hero copy?")
    assert m["author"] == {"kind": "agent", "agent_id": "ren/builder", "owner": "ren", "display_name": "Builder"}
    assert m["body"] == "@oj/muse Can you help with the hero copy?"
    assert m["mentions"] == ["oj/muse"]
    assert m["provenance"] == "agent_generated" and "provenance_status" not in m
    assert m["in_reply_to"] is None and m["task_id"] is None and m["project"] == PROJECT
    event = all_events(world.db)[-1]
    assert event["type"] == "message.posted" and event["message"] == m
    entry = audit_entries(world.db, PROJECT, "message.posted")[-1]
    assert entry["refs"] == {"message": m["id"], "author": "ren/builder", "mentions": 1,
                             "provenance": "agent_generated", "task": None}
    assert "hero" not in json.dumps(entry)  # never the text
    wakes = world.db.rows("SELECT agent_id, kind FROM wakes WHERE seq = ?", (event["seq"],))
    assert wakes == [{"agent_id": "oj/muse", "kind": "mention"}]


def test_mentions_resolve_names_handles_and_ignore_strangers(mcp, world):
    m = post(mcp, "ren/builder", "@muse and @oj/scout, ask @oj; not @sam/lone, @nobody, mail a@b.com, "
                                 "@MUSE again")
    assert m["mentions"] == ["oj/muse", "oj/scout", "oj"]


def test_a_name_several_agents_share_names_none(mcp, world):
    prickle.add_agent(world.db, "ren/muse", "Muse too", "gpt-5", "codex", "", [], [PROJECT])
    m = post(mcp, "oj/scout", "@muse hello, and @ren/muse directly")
    assert m["mentions"] == ["ren/muse"]


def test_at_most_twenty_mentions(mcp, world):
    for i in range(25):
        prickle.add_person(world.db, f"p{i}", f"P {i}")
        prickle.add_member(world.db, PROJECT, f"p{i}")
    m = post(mcp, "oj/muse", " ".join(f"@p{i}" for i in range(25)))
    assert m["mentions"] == [f"p{i}" for i in range(20)]


def test_author_is_not_woken_by_own_mention(mcp, world):
    post(mcp, "oj/muse", "@muse note to self")
    assert world.db.scalar("SELECT count(*) FROM wakes") == 0


def test_empty_body_is_refused_and_nothing_written(mcp, world):
    before = world.db.scalar("SELECT count(*) FROM outbox")
    text = mcp.error("oj/muse", "post_message", P | {"body": "   "}, "invalid_input")
    assert "body" in text
    assert world.db.scalar("SELECT count(*) FROM outbox") == before
    assert world.db.scalar("SELECT count(*) FROM messages") == 0


def test_verdict_needs_a_discussion_credential(mcp, world):
    text = mcp.error("oj/muse", "post_message", P | {"body": "ok", "verdict": "approve"}, "invalid_input")
    assert text.startswith("invalid_input: verdict:")
    assert world.db.scalar("SELECT count(*) FROM messages") == 0


def test_provenance_claims_are_marked_claimed(mcp, world):
    m = post(mcp, "oj/muse", "Per the owner: ship Friday.", provenance="owner_instruction")
    assert m["provenance"] == "owner_instruction" and m["provenance_status"] == "claimed"
    m = post(mcp, "oj/muse", "From memory: Astro.", provenance="from_approved_context")
    assert m["provenance_status"] == "claimed"
    mcp.error("oj/muse", "post_message", P | {"body": "x", "provenance": "owner_approved"}, "invalid_input")


def test_person_messages_have_no_provenance(server, world):
    r = server.post(f"/api/projects/{PROJECT}/messages", json={"body": "Hello @muse"},
                    headers={"Authorization": f"Bearer {world.tokens['oj']}"})
    assert r.status_code == 200
    m = r.json()["message"]
    assert m["author"] == {"kind": "person", "handle": "oj", "display_name": "Oj Okafor"}
    assert m["provenance"] is None and m["mentions"] == ["oj/muse"]


def test_unknown_project_and_non_member_are_not_found(mcp, world):
    for project in ("nope", "side"):
        text = mcp.error("oj/muse", "post_message", {"project": project, "body": "hi"}, "not_found")
        assert f"project '{project}'" in text
    assert world.db.scalar("SELECT count(*) FROM messages") == 0


def test_reply_stays_in_parent_thread(mcp, world):
    task = make_task(world)
    parent = post(mcp, "ren/builder", "Started.", task_id=task)
    reply = post(mcp, "oj/muse", "Thanks", in_reply_to=parent["id"])
    assert reply["task_id"] == task and reply["in_reply_to"] == parent["id"]
    text = mcp.error("oj/muse", "post_message", P | {"body": "x", "in_reply_to": parent["id"], "task_id": "other"},
                     "invalid_input")
    assert f"thread of task '{task}'" in text
    general = post(mcp, "oj/muse", "General")
    mcp.error("ren/builder", "post_message", P | {"body": "x", "in_reply_to": general["id"], "task_id": task},
              "invalid_input")
    assert post(mcp, "ren/builder", "re", in_reply_to=general["id"])["task_id"] is None
    mcp.error("oj/muse", "post_message", P | {"body": "x", "in_reply_to": "msg_missing"}, "not_found")


def test_thread_is_not_found_for_outsiders_until_a_person_mentions_them(mcp, server, world):
    task = make_task(world)
    post(mcp, "oj/muse", "Brief inside the thread", task_id=task)
    for tool, args in (("read_room", P | {"task_id": task}), ("post_message", P | {"body": "hi", "task_id": task})):
        text = mcp.error("oj/scout", tool, args, "not_found")
        assert task in text
    # an agent mentioning scout in the thread grants nothing
    post(mcp, "oj/muse", "@scout look", task_id=task)
    mcp.error("oj/scout", "read_room", P | {"task_id": task}, "not_found")
    # a person mentioning scout after routing does
    r = server.post(f"/api/projects/{PROJECT}/messages", json={"body": "@scout please help", "task_id": task},
                    headers={"Authorization": f"Bearer {world.tokens['oj']}"})
    assert r.status_code == 200
    page = mcp.ok("oj/scout", "read_room", P | {"task_id": task})
    assert [m["body"] for m in page["messages"]] == ["Brief inside the thread", "@scout look", "@scout please help"]
    assert post(mcp, "oj/scout", "On it", task_id=task)["task_id"] == task


def test_person_mention_before_routing_grants_nothing(mcp, server, world):
    task = make_task(world, state="approval")
    server.post(f"/api/projects/{PROJECT}/messages", json={"body": "@scout later", "task_id": task},
                headers={"Authorization": f"Bearer {world.tokens['oj']}"})
    mcp.error("oj/scout", "read_room", P | {"task_id": task}, "not_found")


def test_reply_to_a_message_in_a_hidden_thread_is_not_found(mcp, world):
    task = make_task(world)
    parent = post(mcp, "ren/builder", "secret", task_id=task)
    mcp.error("oj/scout", "post_message", P | {"body": "x", "in_reply_to": parent["id"]}, "not_found")


def _ping_pong(mcp, n, a="oj/muse", b="ren/builder"):
    for i in range(n):
        sender, other = (a, b) if i % 2 == 0 else (b, a)
        post(mcp, sender, f"@{other} round {i}")


def test_loop_guard_pauses_after_ten_alternating_messages(mcp, server, world):
    _ping_pong(mcp, 10)
    text = mcp.error("oj/muse", "post_message", P | {"body": "@ren/builder one more"}, "paused")
    assert "ren/builder" in text
    mcp.error("ren/builder", "post_message", P | {"body": "@muse and me"}, "paused")
    assert post(mcp, "oj/muse", "a general note naming nobody")["mentions"] == []
    assert post(mcp, "oj/muse", "@scout you are fine")["mentions"] == ["oj/scout"]
    entry = audit_entries(world.db, PROJECT, "room.loop_paused")
    assert [e["refs"] for e in entry] == [{"agents": ["oj/muse", "ren/builder"], "count": 10}]
    r = server.get(f"/api/projects/{PROJECT}", headers={"Authorization": f"Bearer {world.tokens['oj']}"})
    assert r.json()["paused"] == [{"agents": ["oj/muse", "ren/builder"], "count": 10}]
    # a person's message resumes both
    r = server.post(f"/api/projects/{PROJECT}/messages", json={"body": "Carry on."},
                    headers={"Authorization": f"Bearer {world.tokens['ren']}"})
    resumed = audit_entries(world.db, PROJECT, "room.loop_resumed")
    assert [e["refs"] for e in resumed] == [{"person": "ren", "agents": ["oj/muse", "ren/builder"],
                                             "message": r.json()["message"]["id"]}]
    post(mcp, "oj/muse", "@ren/builder resumed")


def test_loop_guard_nine_then_person_resets(mcp, server, world):
    _ping_pong(mcp, 9)
    server.post(f"/api/projects/{PROJECT}/messages", json={"body": "ok"},
                headers={"Authorization": f"Bearer {world.tokens['oj']}"})
    _ping_pong(mcp, 9)
    post(mcp, "oj/muse", "@ren/builder still allowed")
    assert audit_entries(world.db, PROJECT, "room.loop_paused") == []


def test_messages_in_one_direction_never_pause(mcp, world):
    for i in range(15):
        post(mcp, "oj/muse", f"@ren/builder {i}")
    assert audit_entries(world.db, PROJECT, "room.loop_paused") == []


def test_thread_posts_count_for_the_loop_guard(mcp, world):
    task = make_task(world)
    for i in range(10):
        post(mcp, "ren/builder" if i % 2 == 0 else "oj/muse", f"step {i}", task_id=task)
    mcp.error("ren/builder", "post_message", P | {"body": "more", "task_id": task}, "paused")


def test_a_second_message_in_the_same_direction_does_not_dodge_the_loop_guard(mcp, world):
    for i in range(9):
        sender, other = ("oj/muse", "ren/builder") if i % 2 == 0 else ("ren/builder", "oj/muse")
        post(mcp, sender, f"@{other} turn {i}")
        if i % 2 == 0:
            post(mcp, sender, f"@{other} and another thought {i}")
    post(mcp, "ren/builder", "@oj/muse tenth turn")
    mcp.error("oj/muse", "post_message", P | {"body": "@ren/builder eleventh"}, "paused")


def test_mention_names_must_end_where_the_name_ends(mcp, world):
    m = post(mcp, "oj/muse", "@builder_x @ren/builder/extra @builde\u0301r @builder-bot @scout.")
    assert m["mentions"] == ["oj/scout"]


def test_a_reply_into_a_hidden_thread_says_nothing_about_it(mcp, world):
    task = make_task(world)
    hidden = post(mcp, "ren/builder", "secret", task_id=task)
    text = mcp.error("oj/scout", "post_message", P | {"body": "x", "in_reply_to": hidden["id"]}, "not_found")
    assert task not in text
    assert text == mcp.error("oj/scout", "post_message", P | {"body": "x", "in_reply_to": "msg_nope"}, "not_found") \
        .replace("msg_nope", hidden["id"])


def test_resume_pair_checks_the_pause_in_its_own_transaction(mcp, world):
    ren, sam = world.person("ren"), world.person("sam")
    messages = world.db.scalar("SELECT count(*) FROM messages")
    try:
        prickle.resume_pair(world.db, ren, PROJECT, ["oj/muse", "ren/builder"])
    except prickle.InvalidState as e:
        assert e.message == "oj/muse and ren/builder are not paused in 'website-v2'"
    else:
        raise AssertionError("a pair that is not paused was resumed")
    assert world.db.scalar("SELECT count(*) FROM messages") == messages
    _ping_pong(mcp, 10)
    for who, pair, error in ((sam, ["oj/muse", "ren/builder"], prickle.NotFound),
                             (world.actor("oj/scout"), ["oj/muse", "ren/builder"], prickle.Forbidden),
                             (ren, ["oj/muse"], prickle.InvalidInput)):
        try:
            prickle.resume_pair(world.db, who, PROJECT, pair)
        except error:
            pass
        else:
            raise AssertionError(f"{who.address} resumed {pair}")
    assert world.db.scalar("SELECT count(*) FROM messages") == messages + 10
    message = prickle.resume_pair(world.db, ren, PROJECT, ["ren/builder", "oj/muse"])
    assert message["author"]["handle"] == "ren"
    assert message["body"] == "Resumed @ren/builder and @oj/muse: carry on, and keep it short."
    assert prickle.paused_pairs(world.db, PROJECT) == []
    assert [e["refs"] for e in audit_entries(world.db, PROJECT, "room.loop_resumed")] == [
        {"person": "ren", "agents": ["oj/muse", "ren/builder"], "message": message["id"]}]


def test_one_click_resume_of_a_paused_pair(server, mcp, world):
    for i in range(10):
        sender, other = ("oj/muse", "ren/builder") if i % 2 == 0 else ("ren/builder", "oj/muse")
        mcp.ok(sender, "post_message", {"project": PROJECT, "body": f"@{other} {i}"})
    r = server.post(f"/api/projects/{PROJECT}/resume", json={"agents": ["ren/builder", "oj/muse"]},
                    headers=auth(world, "ren"))
    assert r.status_code == 200 and r.json()["message"]["author"]["handle"] == "ren"
    assert server.get(f"/api/projects/{PROJECT}", headers=auth(world, "ren")).json()["paused"] == []
    again = server.post(f"/api/projects/{PROJECT}/resume", json={"agents": ["ren/builder", "oj/muse"]},
                        headers=auth(world, "ren"))
    assert again.status_code == 409


def test_a_body_that_nests_deeper_than_the_page_can_show_is_refused_and_nothing_is_written(mcp, world):
    before = written(world.db)
    text = mcp.error("oj/muse", "post_message", {"project": "website-v2", "body": "> " * 3995}, "invalid_input")
    assert text == ("invalid_input: body nests quotes or lists 3995 levels deep; at most 32 can be shown: "
                    "flatten it, or put it in a code block")
    text = mcp.error("oj/muse", "handoff", {"project": "website-v2", "to": "oj/scout", "packet": {
        "task": "Sort it.", "deliverable_type": "doc", "acceptance_criteria": ["Sorted."],
        "context": "1. " * 100}}, "invalid_input")
    assert text.startswith("invalid_input: packet.context nests quotes or lists 100 levels deep")
    assert written(world.db) == before
    quoted = "> a quote\n>> in a quote\n- a list\n  - in a list\n\n```\n" + ">" * 200 + "\n```"
    assert mcp.ok("oj/muse", "post_message", {"project": "website-v2", "body": quoted})["message"]["body"] == quoted


def test_both_owners_of_a_paused_pair_are_told_in_their_inboxes_until_a_person_posts(mcp, server, world):
    _ping_pong(mcp, 10)
    told = {h: [i for i in server.get("/api/inbox", headers=auth(world, h)).json()["items"]
                if i["kind"] == "paused_pair"] for h in ("oj", "ren", "sam")}
    assert {h: [(i["title"], i["agents"], i["count"], i["action"]) for i in items] for h, items in told.items()} == {
        "oj": [("oj/muse and ren/builder are paused", ["oj/muse", "ren/builder"], 10, "resume")],
        "ren": [("oj/muse and ren/builder are paused", ["oj/muse", "ren/builder"], 10, "resume")], "sam": []}
    assert told["oj"][0]["id"] == f"paused_pair:{PROJECT}:oj/muse:ren/builder" and told["oj"][0]["since"]
    r = server.post(f"/api/projects/{PROJECT}/resume", json={"agents": ["oj/muse", "ren/builder"]},
                    headers=auth(world, "ren"))
    assert r.status_code == 200, r.text
    assert [i for h in ("oj", "ren") for i in server.get("/api/inbox", headers=auth(world, h)).json()["items"]
            if i["kind"] == "paused_pair"] == []
