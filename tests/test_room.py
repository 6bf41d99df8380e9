"""The room: reading it with read_room: a key's reach, paging and cursors, general chat and the threads listed."""

import pytest

import prickle
from conftest import PROJECT
from helpers import P, make_task, person, post, working


def test_project_key_is_forbidden_elsewhere(mcp, world):
    prickle.add_member(world.db, "side", "oj", by="sam")
    prickle.add_agent_to_project(world.db, "side", "oj/muse")
    _, scoped = prickle.create_token(world.db, "client", agent_id="oj/muse", project=PROJECT)
    assert mcp.ok("oj/muse", "read_room", {"project": PROJECT}, token=scoped)
    text = mcp.error("oj/muse", "read_room", {"project": "side"}, "forbidden", token=scoped)
    assert "'website-v2' only" in text
    assert mcp.ok("oj/muse", "read_room", {"project": "side"})  # the full-reach key


def test_project_key_with_a_mistyped_project_names_only_the_keys_own(mcp, world):
    _, scoped = prickle.create_token(world.db, "client", agent_id="oj/muse", project=PROJECT)
    for slug in ("website-v3", "side"):  # one that does not exist, one the agent is not in
        text = mcp.error("oj/muse", "read_room", {"project": slug}, "not_found", token=scoped)
        assert text.endswith(f"your agent is in no project '{slug}'; this key is for project '{PROJECT}' only: "
                             "check the project's slug"), text


def test_read_room_pages_oldest_first(mcp, world):
    bodies = [f"m{i}" for i in range(7)]
    for b in bodies:
        post(mcp, "oj/muse", b)
    page = mcp.ok("ren/builder", "read_room", P | {"limit": 3})
    assert [m["body"] for m in page["messages"]] == bodies[:3]
    page2 = mcp.ok("ren/builder", "read_room", P | {"limit": 3, "cursor": page["next_cursor"]})
    assert [m["body"] for m in page2["messages"]] == bodies[3:6]
    page3 = mcp.ok("ren/builder", "read_room", P | {"limit": 3, "cursor": page2["next_cursor"]})
    assert [m["body"] for m in page3["messages"]] == bodies[6:] and page3["next_cursor"] is None
    assert len(mcp.ok("ren/builder", "read_room", P)["messages"]) == 7  # default limit 50


def test_read_room_cursor_from_elsewhere_is_invalid_input(mcp, world):
    for b in ("a", "b"):
        post(mcp, "oj/muse", b)
    cursor = mcp.ok("ren/builder", "read_room", P | {"limit": 1})["next_cursor"]
    text = mcp.error("oj/scout", "read_room", P | {"limit": 1, "cursor": cursor}, "invalid_input")
    assert text.startswith("invalid_input: cursor:")
    mcp.error("ren/builder", "read_room", P | {"cursor": "garbage"}, "invalid_input")


def test_read_room_cursor_past_a_restored_database_is_refused_not_skipping_messages(world, tmp_path):
    reader = world.actor("ren/builder")
    for i in range(3):
        prickle.post_message(world.db, reader, PROJECT, f"kept {i}")
    backup = str(tmp_path / "backup.db")
    world.db.backup_to(backup)
    for i in range(5):
        prickle.post_message(world.db, reader, PROJECT, f"lost {i}")
    cursor = prickle.read_room(world.db, reader, PROJECT, limit=6)["next_cursor"]  # seen up to "lost 2"
    restored = prickle.Database(backup)
    again = prickle.resolve_token(restored, world.keys["ren/builder"], ("client",))
    for i in range(2):  # the restored room is still short of the seq the reader last saw
        prickle.post_message(restored, again, PROJECT, f"after the restore {i}")
    with pytest.raises(prickle.InvalidInput, match="^cursor: it is past the newest message here"):
        prickle.read_room(restored, again, PROJECT, cursor=cursor)
    assert [m["body"] for m in prickle.read_room(restored, again, PROJECT)["messages"]] == [
        "kept 0", "kept 1", "kept 2", "after the restore 0", "after the restore 1"]


def test_general_chat_excludes_threads_and_lists_visible_threads(mcp, world):
    t1 = make_task(world)
    t2 = make_task(world, "oj/scout", "oj/muse")
    post(mcp, "oj/muse", "general")
    post(mcp, "ren/builder", "in thread 1", task_id=t1)
    post(mcp, "oj/muse", "in thread 1 again", task_id=t1)
    page = mcp.ok("ren/builder", "read_room", P)
    assert [m["body"] for m in page["messages"]] == ["general"]
    assert [t["task_id"] for t in page["threads"]] == [t1]  # t2 is not builder's
    thread = page["threads"][0]
    assert thread | {"last_activity_at": None} == {
        "task_id": t1, "title": "Draft the hero copy.", "state": "routed", "requester": "oj/muse",
        "assignee": "ren/builder", "reply_count": 2, "last_activity_at": None, "parent_task_id": None}
    muse = mcp.ok("oj/muse", "read_room", P)
    assert [t["task_id"] for t in muse["threads"]] == [t1, t2]  # newest activity first
    # a thread's replies are counted through the room index, not by reading every message
    plan = world.db.rows("EXPLAIN QUERY PLAN SELECT count(*) FROM messages WHERE project = ? AND task_id = ?",
                         (PROJECT, t1))
    assert "USING COVERING INDEX messages_by_room (project=? AND task_id=?)" in plan[0]["detail"]


def test_read_room_lists_task_threads_with_state_and_parties(mcp, server, world):
    task = working(mcp, server, world)
    mcp.ok("ren/builder", "post_message", P | {"body": "Started", "task_id": task["id"]})
    thread = mcp.ok("oj/muse", "read_room", P)["threads"][0]
    assert (thread["task_id"], thread["state"], thread["requester"], thread["assignee"], thread["reply_count"]) == (
        task["id"], "accepted", "oj/muse", "ren/builder", 1)
    board = person(server, world, "oj").get(f"/api/projects/{PROJECT}/tasks").json()["tasks"]
    assert [t["id"] for t in board] == [task["id"]]


def test_only_twenty_threads_are_listed(mcp, world):
    tasks = [make_task(world) for _ in range(22)]
    page = mcp.ok("ren/builder", "read_room", P)
    assert len(page["threads"]) == 20
    assert set(t["task_id"] for t in page["threads"]) <= set(tasks)


def test_whole_number_floats_are_integers_and_broken_text_is_invalid(mcp, world):
    post(mcp, "oj/muse", "one")
    assert len(mcp.ok("oj/muse", "read_room", P | {"limit": 5.0})["messages"]) == 1
    text = mcp.error("oj/muse", "post_message", P | {"body": "\ud800 x"}, "invalid_input")
    assert text.startswith("invalid_input: body:")
    text = mcp.error("oj/muse", "discover_team_agents", {"project": PROJECT + "\n"}, "invalid_input")
    assert text.startswith("invalid_input: project:")
