"""The inbox: everything waiting on a person across their projects, read positions and unread counts.

Agents act over MCP, people over the HTTP API; each kind of item is checked whole in
``GET /api/inbox`` and in the domain function ``inbox``, and acting on it takes it out.
"""

import json

import httpx

import prickle
from conftest import PROJECT, Served, World
from helpers import PACKET, P, _database_at_version, evidence, handoff, person, submit, working


def items(server, world, handle):
    """The person's inbox through the API; it must be what the domain function says."""
    r = person(server, world, handle).get("/api/inbox")
    assert r.status_code == 200, r.text
    out = r.json()
    assert out == prickle.inbox(world.db, world.person(handle))
    assert out["count"] == len(out["items"])
    return out["items"]


def kinds(server, world, handle):
    return [(i["kind"], i["id"]) for i in items(server, world, handle)]


def test_a_held_handoff_waits_on_the_assignees_owner_until_decided(mcp, server, world):
    out = handoff(mcp)
    task, approval_id = out["task"], out["gate"]["approval_id"]
    assert kinds(server, world, "oj") == []
    [item] = items(server, world, "ren")
    approval = person(server, world, "ren").get("/api/approvals").json()["approvals"][0]
    assert item == {
        "id": f"approval:{approval_id}", "kind": "approval", "action": "approve", "project": PROJECT,
        "project_name": "Website v2", "task_id": task["id"], "message_id": None, "title": approval["approval"]["summary"],
        "since": approval["approval"]["created_at"], "approval": approval["approval"], "task": approval["task"]}
    r = person(server, world, "ren").post(f"/api/approvals/{approval_id}", {"decision": "approve"})
    assert r.status_code == 200, r.text
    assert kinds(server, world, "ren") == []


def test_a_question_waits_on_the_person_who_asked_until_they_answer_in_the_thread(mcp, server, world):
    task = working(mcp, server, world)
    out = mcp.ok("ren/builder", "checkpoint", {"task_id": task["id"], "checkpoint": {
        "progress": "Two headlines drafted.", "open_questions": ["Formal or casual?"], "needs_answer": True}})
    asked_at = world.db.scalar("SELECT created_at FROM checkpoints WHERE task_id = ?", (task["id"],))
    assert kinds(server, world, "ren") == []  # the assignee's owner is not the one asked
    [item] = items(server, world, "oj")  # oj/muse asked for the task, so its owner answers
    assert item == {
        "id": f"question:{task['id']}", "kind": "question", "action": "answer", "project": PROJECT,
        "project_name": "Website v2", "task_id": task["id"], "message_id": None, "title": "Draft the hero copy.",
        "since": asked_at, "task": out["task"], "questions": ["Formal or casual?"], "progress": "Two headlines drafted."}
    # Someone else's message in the thread is no answer from oj.
    mcp.ok("oj/muse", "post_message", P | {"task_id": task["id"], "body": "Thinking about it."})
    assert [i["kind"] for i in items(server, world, "oj")] == ["question"]
    r = person(server, world, "oj").post(f"/api/projects/{PROJECT}/messages",
                                         {"body": "Casual, please.", "task_id": task["id"]})
    assert r.status_code == 200, r.text
    assert kinds(server, world, "oj") == []
    # Asked again later, it waits again.
    mcp.ok("ren/builder", "checkpoint", {"task_id": task["id"], "checkpoint": {
        "progress": "Casual it is.", "open_questions": ["Emoji too?"], "needs_answer": True}})
    assert [(i["kind"], i["questions"]) for i in items(server, world, "oj")] == [("question", ["Emoji too?"])]
    mcp.ok("ren/builder", "checkpoint", {"task_id": task["id"], "checkpoint": {"progress": "No emoji."}})
    assert kinds(server, world, "oj") == []  # the agent went on without an answer


def test_a_returned_task_waits_on_its_requesters_owner_until_handed_on(mcp, server, world):
    task = working(mcp, server, world)
    prickle.remove_member(world.db, PROJECT, "ren", by="oj")  # ren/builder leaves: the task comes back
    returned = person(server, world, "oj").get(f"/api/tasks/{task['id']}").json()["task"]
    assert returned["state"] == "returned"
    [item] = items(server, world, "oj")
    assert (item.pop("task")["id"], item) == (task["id"], {
        "id": f"returned:{task['id']}", "kind": "returned", "action": "reassign", "project": PROJECT,
        "project_name": "Website v2", "task_id": task["id"], "message_id": None, "title": "Draft the hero copy.",
        "since": returned["updated_at"]})
    assert kinds(server, world, "ren") == []
    r = person(server, world, "oj").post(f"/api/tasks/{task['id']}/reassign", {"to": "oj/scout"})
    assert r.status_code == 200, r.text
    assert kinds(server, world, "oj") == []


def test_a_verified_result_waits_for_final_acceptance_until_accepted(mcp, server, world):
    task = working(mcp, server, world)
    sub = submit(mcp, task["id"])["submission"]
    # oj/muse verifies first; no runner of it listens, so oj is told the result waits on it
    assert kinds(server, world, "oj") == [("verify", f"verify:{task['id']}")]
    verdicts = [{"criterion": 0, "accepted": True}, {"criterion": 1, "accepted": True}]
    verified = mcp.ok("oj/muse", "accept_result", {"task_id": task["id"], "submission_id": sub["submission_id"],
                                                   "revision": sub["revision"], "verdicts": verdicts,
                                                   "artifacts": sub["artifacts"]})["task"]
    verified_at = world.db.scalar("SELECT verified_at FROM tasks WHERE id = ?", (task["id"],))
    [item] = items(server, world, "oj")
    assert item == {
        "id": f"final_acceptance:{task['id']}", "kind": "final_acceptance", "action": "accept", "project": PROJECT,
        "project_name": "Website v2", "task_id": task["id"], "message_id": None, "title": "Draft the hero copy.",
        "since": verified_at, "task": verified, "evidence": {"complete": True, "uncovered": [], "stale": []},
        "criteria_evidence": {"revision": 1, "complete": True, "general": [], "criteria": [
            {"criterion": 0, "text": "Headline has at most 8 words.", "standing": "covered", "evidence": [0],
             "verdict": {"accepted": True, "note": None}},
            {"criterion": 1, "text": "Include a clear call to action.", "standing": "covered", "evidence": [1],
             "verdict": {"accepted": True, "note": None}}], "evidence": [
            {"evidence": 0, "kind": "test_output", "summary": "Counted the words.", "url": None, "content": "6 words",
             "criteria": [0], "artifact": None, "observed_at": None, "verifier": None, "stale": None,
             "artifact_ref": None, "preview": None},
            {"evidence": 1, "kind": "note", "summary": "CTA: try the demo.", "url": None, "content": "",
             "criteria": [1], "artifact": None, "observed_at": None, "verifier": None, "stale": None,
             "artifact_ref": None, "preview": None}]}}
    assert kinds(server, world, "ren") == []
    assert person(server, world, "oj").post(f"/api/tasks/{task['id']}/accept").status_code == 200
    assert kinds(server, world, "oj") == []


def test_a_persons_own_request_waits_on_them_with_its_evidence_gaps(mcp, server, world):
    r = person(server, world, "oj").post(f"/api/projects/{PROJECT}/task-requests",
                                         {"agent": "oj/scout", "packet": PACKET})
    task = r.json()["task"]
    mcp.ok("oj/scout", "accept_task", {"task_id": task["id"]})
    back = mcp.ok("oj/scout", "return_result", {"task_id": task["id"], "summary": "Half done.",
                                                "evidence": [evidence([1])]})
    [item] = [i for i in items(server, world, "oj") if i["kind"] == "final_acceptance"]
    assert (item["task"]["state"], item["since"]) == ("verifying", back["task"]["result"]["returned_at"])
    assert item["evidence"] == {"complete": False, "uncovered": [0], "stale": []}
    r = person(server, world, "oj").post(f"/api/tasks/{task['id']}/send-back", {"reason": "Cover the headline."})
    assert r.status_code == 200, r.text
    assert [i["kind"] for i in items(server, world, "oj")] == []


def test_a_step_and_a_card_wait_on_the_agents_owner_until_decided(mcp, server, world):
    task = working(mcp, server, world)
    runner = prickle.pair_device(world.db, "ren", "ren/builder")[1]
    claim = mcp.ok("ren/builder", "claim_task", {"task_id": task["id"], "idempotency_key": "k"}, token=runner)
    run = claim["execution_credential"]["token"]
    asked = mcp.ok("ren/builder", "request_step", {"tool_name": "Bash", "input": {"command": "git push"},
                                                   "kind": "outbound", "reason": "Publish."}, token=run)
    [step] = person(server, world, "ren").get("/api/steps").json()["steps"]
    [item] = items(server, world, "ren")
    assert item == {
        "id": f"step:{asked['step_id']}", "kind": "step", "action": "allow", "project": PROJECT,
        "project_name": "Website v2", "task_id": task["id"], "message_id": None, "title": "Draft the hero copy.",
        "since": step["created_at"], "step": step}
    assert person(server, world, "ren").post(f"/api/steps/{asked['step_id']}", {"decision": "deny"}).status_code == 200
    assert kinds(server, world, "ren") == []

    room_runner = prickle.pair_device(world.db, "oj", "oj/muse")[1]
    r = server.post("/api/runner/actions", json={"tool": "image_gen", "action": "Draw the hero", "prompt": "a fox"},
                    headers={"Authorization": f"Bearer {room_runner}"})
    assert r.status_code == 200, r.text
    [card] = person(server, world, "oj").get("/api/actions").json()["actions"]
    [item] = items(server, world, "oj")
    assert item == {
        "id": f"action:{card['id']}", "kind": "action", "action": "approve", "project": "oj-room",
        "project_name": "Oj Okafor's room", "task_id": None, "message_id": card["message_id"],
        "title": "Draw the hero", "since": card["created_at"], "action_card": card}
    assert person(server, world, "oj").post(f"/api/actions/{card['id']}", {"decision": "decline"}).status_code == 200
    assert kinds(server, world, "oj") == []


def test_a_mention_waits_until_its_room_or_thread_is_read_past_it(mcp, server, world):
    task = working(mcp, server, world)
    oj = person(server, world, "oj")
    general = mcp.ok("ren/builder", "post_message", P | {"body": "@oj can you look at the hero?"})["message"]
    threaded = mcp.ok("ren/builder", "post_message", P | {"task_id": task["id"], "body": "@oj and this one"})["message"]
    own = oj.post(f"/api/projects/{PROJECT}/messages", {"body": "Noting it here, @oj."}).json()["message"]
    assert own["mentions"] == ["oj"]  # a person's own mention of themselves waits on nobody
    assert items(server, world, "oj") == [
        {"id": f"mention:{threaded['id']}", "kind": "mention", "action": "open", "project": PROJECT,
         "project_name": "Website v2", "task_id": task["id"], "message_id": threaded["id"],
         "title": "Draft the hero copy.", "since": threaded["created_at"], "message": threaded},
        {"id": f"mention:{general['id']}", "kind": "mention", "action": "open", "project": PROJECT,
         "project_name": "Website v2", "task_id": None, "message_id": general["id"], "title": None,
         "since": general["created_at"], "message": general},
    ]
    assert kinds(server, world, "ren") == []
    # Reading general chat takes out its mention only; the thread's waits until the thread is read.
    r = oj.post(f"/api/projects/{PROJECT}/read", {"message_id": general["id"]})
    # oj's own later message never counts
    assert r.json() == {"project": PROJECT, "task_id": None, "unread": 0, "first_unread": None}
    assert kinds(server, world, "oj") == [("mention", f"mention:{threaded['id']}")]
    r = oj.post(f"/api/projects/{PROJECT}/read", {"message_id": threaded["id"], "task_id": task["id"]})
    assert r.json() == {"project": PROJECT, "task_id": task["id"], "unread": 0, "first_unread": None}
    assert kinds(server, world, "oj") == []


def test_unread_counts_per_project_and_thread_follow_the_read_position(mcp, server, world):
    task = working(mcp, server, world)
    oj, ren = person(server, world, "oj"), person(server, world, "ren")
    assert [p for p in oj.get("/api/unread").json()["projects"] if p["project"] == PROJECT] == [
        {"project": PROJECT, "unread": 0, "general": 0, "threads": {}}]
    first = mcp.ok("ren/builder", "post_message", P | {"body": "One."})["message"]
    second = mcp.ok("ren/builder", "post_message", P | {"body": "Two."})["message"]
    mcp.ok("ren/builder", "post_message", P | {"task_id": task["id"], "body": "In the thread."})
    ren.post(f"/api/projects/{PROJECT}/messages", {"body": "Three, from ren."})
    oj.post(f"/api/projects/{PROJECT}/messages", {"body": "Mine never counts."})

    def mine():
        return [p for p in oj.get("/api/unread").json()["projects"] if p["project"] == PROJECT][0]

    assert mine() == {"project": PROJECT, "unread": 4, "general": 3, "threads": {task["id"]: 1}}
    assert oj.post(f"/api/projects/{PROJECT}/read", {"message_id": second["id"]}).json()["unread"] == 1
    assert mine() == {"project": PROJECT, "unread": 2, "general": 1, "threads": {task["id"]: 1}}
    # The read position never goes back; ren's position is ren's own.
    assert oj.post(f"/api/projects/{PROJECT}/read", {"message_id": first["id"]}).json()["unread"] == 1
    assert [p for p in ren.get("/api/unread").json()["projects"] if p["project"] == PROJECT][0]["general"] == 3
    # A message of another room or thread, or a project out of reach, changes nothing.
    r = oj.post(f"/api/projects/{PROJECT}/read", {"message_id": first["id"], "task_id": task["id"]})
    assert r.status_code == 404 and "message_id" in r.json()["error"]["message"]
    assert person(server, world, "sam").post(f"/api/projects/{PROJECT}/read",
                                             {"message_id": first["id"]}).status_code == 404
    r = oj.post(f"/api/projects/{PROJECT}/read", {"message_id": first["id"], "thread": "x"})
    assert r.status_code == 400 and "thread" in r.json()["error"]["message"]
    assert mine() == {"project": PROJECT, "unread": 2, "general": 1, "threads": {task["id"]: 1}}


def test_marking_a_message_unread_takes_the_read_position_back_to_it(mcp, server, world):
    task = working(mcp, server, world)
    oj = person(server, world, "oj")
    first = mcp.ok("ren/builder", "post_message", P | {"body": "One."})["message"]
    mention = mcp.ok("ren/builder", "post_message", P | {"body": "@oj two."})["message"]
    third = mcp.ok("ren/builder", "post_message", P | {"body": "Three."})["message"]
    oj.post(f"/api/projects/{PROJECT}/messages", {"body": "Mine."})

    def marker():
        return oj.get(f"/api/projects/{PROJECT}/room?latest=1").json()["read"]

    # The room's page says where the unread messages start.
    assert marker() == {"unread": 3, "first_unread": first["id"]}
    assert oj.post(f"/api/projects/{PROJECT}/read", {"message_id": third["id"]}).json() == {
        "project": PROJECT, "task_id": None, "unread": 0, "first_unread": None}
    assert marker() == {"unread": 0, "first_unread": None} and kinds(server, world, "oj") == []
    # Unread again from the mention on: the mention is back in the inbox.
    assert oj.post(f"/api/projects/{PROJECT}/unread", {"message_id": mention["id"]}).json() == {
        "project": PROJECT, "task_id": None, "unread": 2, "first_unread": mention["id"]}
    assert marker() == {"unread": 2, "first_unread": mention["id"]}
    assert kinds(server, world, "oj") == [("mention", f"mention:{mention['id']}")]
    # A thread keeps its own marker; a message of another room is refused and changes nothing.
    thread = mcp.ok("ren/builder", "post_message", P | {"task_id": task["id"], "body": "In the thread."})["message"]
    r = oj.get(f"/api/projects/{PROJECT}/room?latest=1&task_id={task['id']}")
    assert r.json()["read"] == {"unread": 1, "first_unread": thread["id"]}
    r = oj.post(f"/api/projects/{PROJECT}/unread", {"message_id": first["id"], "task_id": task["id"]})
    assert r.status_code == 404 and "message_id" in r.json()["error"]["message"]
    r = oj.post(f"/api/projects/{PROJECT}/unread", {"message": first["id"]})
    assert r.status_code == 400 and "message" in r.json()["error"]["message"]
    assert marker() == {"unread": 2, "first_unread": mention["id"]}


def test_the_persons_stream_carries_events_of_every_project_of_theirs(db_path):
    world = World(db_path)
    prickle.create_project(world.db, "elsewhere", "Elsewhere", "web", "oj")
    with Served(db_path) as served:
        headers = {"Authorization": f"Bearer {world.tokens['oj']}"}
        with httpx.Client(base_url=served.info["url"], timeout=30) as http:
            with http.stream("GET", "/api/stream", headers=headers) as stream:
                lines = stream.iter_lines()
                ready = next(line for line in lines if line.startswith("data:"))
                start = json.loads(ready[5:])["seq"]
                for project, handle in (("side", "sam"), (PROJECT, "oj"), ("elsewhere", "oj")):  # oj is not in side
                    r = http.post(f"/api/projects/{project}/messages", json={"body": f"hello {project}"},
                                  headers={"Authorization": f"Bearer {world.tokens[handle]}"})
                    assert r.status_code == 200, (project, r.text)
                got = []
                for line in lines:
                    if line.startswith("data:"):
                        event = json.loads(line[5:])
                        assert event["seq"] > start
                        if event["type"] == "message.posted":
                            got.append(event["message"]["body"])
                    if len(got) == 2:
                        break
                assert got == [f"hello {PROJECT}", "hello elsewhere"]
    world.db.close()


def test_the_persons_events_endpoint_long_polls_every_project_of_theirs(mcp, server, world):
    oj = person(server, world, "oj")
    head = oj.get(f"/api/events?after={2**62}&wait=0").json()
    assert (head["events"], head["resync"]) == ([], "ahead")
    person(server, world, "sam").post("/api/projects/side/messages", {"body": "not for oj"})
    posted = mcp.ok("ren/builder", "post_message", P | {"body": "for oj"})["message"]
    page = oj.get(f"/api/events?after={head['last_seq']}&wait=5").json()
    assert [(e["type"], e["message"]["id"]) for e in page["events"]] == [("message.posted", posted["id"])]
    assert page["resync"] is None and page["last_seq"] == page["events"][-1]["seq"]
    assert oj.get(f"/api/events?after={page['last_seq']}&wait=0").json() == {
        "events": [], "resync": None, "last_seq": page["last_seq"]}


def test_the_upgrade_indexes_the_mentions_of_people_already_written(db_path):
    inbox_migration = next(i for i, m in enumerate(prickle.MIGRATIONS)
                           if any("CREATE TABLE read_positions" in s for s in m))
    conn = _database_at_version(db_path, inbox_migration)
    with conn:
        for h in ("oj", "ren"):
            conn.execute("INSERT INTO people (handle, display_name, created_at) VALUES (?, ?, 'x')", (h, h.upper()))
        conn.execute("INSERT INTO projects (slug, team, name, created_by, created_at, kind) VALUES "
                     "('p1', 'web', 'P1', 'oj', '2026-01-01T00:00:00Z', 'team')")
        for h in ("oj", "ren"):
            conn.execute("INSERT INTO members VALUES ('p1', ?, 'member', 1, '2026-01-01T00:00:00Z')", (h,))
        for seq, author, mentions in ((1, "ren", ["oj"]), (2, "oj", ["oj", "ren"]), (3, "ren", ["oj/muse"])):
            conn.execute("INSERT INTO messages (seq, id, project, author_kind, author, body, mentions, created_at) "
                         "VALUES (?, ?, 'p1', 'person', ?, 'hi', ?, '2026-01-02T00:00:00Z')",
                         (seq, f"msg-{seq:x}-{seq:012x}", author, json.dumps(mentions)))
    conn.close()
    db = prickle.Database(db_path)
    assert db.rows("SELECT * FROM person_mentions ORDER BY seq, handle") == [
        {"handle": "oj", "seq": 1, "project": "p1", "task_id": None},
        {"handle": "ren", "seq": 2, "project": "p1", "task_id": None}]
    oj = prickle.Actor("person", "", "cli", handle="oj")
    assert [i["id"] for i in prickle.inbox(db, oj)["items"]] == [f"mention:msg-1-{1:012x}"]
    db.close()


# ---- triage: done, snooze, undo ------------------------------------------------------------------------


def mark(server, world, handle, body):
    return person(server, world, handle).post("/api/inbox/mark", body)


def test_one_mark_read_on_a_mention_used_to_clear_every_earlier_one_and_done_clears_that_one_only(mcp, server, world):
    oj = person(server, world, "oj")
    posted = [mcp.ok("ren/builder", "post_message", P | {"body": f"@oj look at number {n}"})["message"]
              for n in range(12)]
    assert [i["id"] for i in items(server, world, "oj")] == [f"mention:{m['id']}" for m in reversed(posted)]
    unread = oj.get("/api/unread").json()
    # The page's old "Mark read" moved the room's read position to the message: all 12 went at once.
    snapshot = world.db.rows("SELECT * FROM read_positions")
    r = oj.post(f"/api/projects/{PROJECT}/read", {"message_id": posted[-1]["id"]})
    assert (r.status_code, kinds(server, world, "oj")) == (200, [])
    world.db.execute("DELETE FROM read_positions")
    for row in snapshot:
        world.db.insert("read_positions", row)
    assert len(items(server, world, "oj")) == 12
    # Done on one mention takes out that one alone, and moves no read position.
    r = mark(server, world, "oj", {"item_id": f"mention:{posted[-1]['id']}", "mark": "done"})
    assert r.json() == {"item_id": f"mention:{posted[-1]['id']}", "mark": "done", "until": None}
    assert [i["id"] for i in items(server, world, "oj")] == [f"mention:{m['id']}" for m in reversed(posted[:-1])]
    assert oj.get("/api/unread").json() == unread
    assert world.db.rows("SELECT * FROM read_positions") == snapshot
    assert items(server, world, "ren") == []  # and nobody else's list changes


def test_done_hides_an_item_until_undone_and_a_decision_waiting_anew_shows_again(mcp, server, world):
    task = working(mcp, server, world)
    oj = person(server, world, "oj")

    def ask(question):
        mcp.ok("ren/builder", "checkpoint", {"task_id": task["id"], "checkpoint": {
            "progress": "Drafting.", "open_questions": [question], "needs_answer": True}})

    ask("Formal or casual?")
    assert kinds(server, world, "oj") == [("question", f"question:{task['id']}")]
    r = mark(server, world, "oj", {"item_id": f"question:{task['id']}", "mark": "done"})
    assert r.status_code == 200, r.text
    out = oj.get("/api/inbox").json()
    assert (out["items"], out["count"], out["snoozed"], out["next_return"]) == ([], 0, 0, None)
    # Undo: the mark comes off and the item is back as it was.
    r = oj.post("/api/inbox/unmark", {"item_ids": [f"question:{task['id']}"]})
    assert r.json() == {"item_ids": [f"question:{task['id']}"]}
    assert [i["questions"] for i in items(server, world, "oj")] == [["Formal or casual?"]]
    # Done again; then the agent asks again: the same item ID waits since a new moment and shows again.
    assert mark(server, world, "oj", {"item_id": f"question:{task['id']}", "mark": "done"}).status_code == 200
    assert kinds(server, world, "oj") == []
    ask("Emoji too?")
    assert [(i["id"], i["questions"]) for i in items(server, world, "oj")] == [(f"question:{task['id']}", ["Emoji too?"])]
    # Done decides nothing: the task still waits on oj's answer.
    assert oj.get(f"/api/tasks/{task['id']}").json()["task"]["state"] == "waiting"


def test_a_snoozed_item_comes_back_when_its_time_comes(mcp, server, world, clock):
    oj = person(server, world, "oj")
    first = mcp.ok("ren/builder", "post_message", P | {"body": "@oj first"})["message"]
    second = mcp.ok("ren/builder", "post_message", P | {"body": "@oj second"})["message"]
    hour = prickle.iso(clock.now + prickle._dt.timedelta(hours=1))
    r = mark(server, world, "oj", {"item_id": f"mention:{first['id']}", "mark": "snoozed",
                                   "until": "2026-12-01T11:00:00+00:00"})
    assert r.json() == {"item_id": f"mention:{first['id']}", "mark": "snoozed", "until": hour}
    out = oj.get("/api/inbox").json()
    assert ([i["id"] for i in out["items"]], out["count"], out["snoozed"], out["next_return"]) == (
        [f"mention:{second['id']}"], 1, 1, hour)
    assert "snoozed_items" not in out
    listed = oj.get("/api/inbox?snoozed=1").json()
    assert [(i["id"], i["snoozed_until"]) for i in listed["snoozed_items"]] == [(f"mention:{first['id']}", hour)]
    assert listed == prickle.inbox(world.db, world.person("oj"), snoozed=True)
    clock.now += prickle._dt.timedelta(minutes=59, seconds=59)
    assert oj.get("/api/inbox").json()["count"] == 1
    clock.now += prickle._dt.timedelta(seconds=1)
    out = oj.get("/api/inbox").json()
    assert (sorted(i["id"] for i in out["items"]), out["snoozed"], out["next_return"]) == (
        sorted([f"mention:{second['id']}", f"mention:{first['id']}"]), 0, None)  # both posted at T0
    # Snoozed again and unsnoozed from the list of snoozed items: back at once.
    later = prickle.iso(clock.now + prickle._dt.timedelta(days=3))
    assert mark(server, world, "oj", {"item_id": f"mention:{second['id']}", "mark": "snoozed",
                                      "until": later}).status_code == 200
    assert oj.get("/api/inbox").json()["snoozed"] == 1
    assert oj.post("/api/inbox/unmark", {"item_ids": [f"mention:{second['id']}"]}).status_code == 200
    assert oj.get("/api/inbox").json()["count"] == 2


def test_mark_all_mentions_read_dismisses_every_mention_and_its_undo_brings_them_back(mcp, server, world):
    task = working(mcp, server, world)
    oj = person(server, world, "oj")
    mcp.ok("ren/builder", "checkpoint", {"task_id": task["id"], "checkpoint": {
        "progress": "Drafting.", "open_questions": ["Formal?"], "needs_answer": True}})
    mentions = [mcp.ok("ren/builder", "post_message", P | {"body": f"@oj note {n}"})["message"]["id"] for n in range(3)]
    mentions.append(mcp.ok("ren/builder", "post_message", P | {"task_id": task["id"], "body": "@oj here"})["message"]["id"])
    unread = oj.get("/api/unread").json()
    r = oj.post("/api/inbox/mentions/done")
    assert sorted(r.json()["item_ids"]) == sorted(f"mention:{m}" for m in mentions)
    assert kinds(server, world, "oj") == [("question", f"question:{task['id']}")]
    assert oj.get("/api/unread").json() == unread  # no room or thread was read
    assert oj.post("/api/inbox/mentions/done").json() == {"item_ids": []}  # nothing left to dismiss
    assert oj.post("/api/inbox/unmark", {"item_ids": r.json()["item_ids"]}).status_code == 200
    assert len(items(server, world, "oj")) == 5
    # A mention that arrives after "mark all" waits as usual.
    oj.post("/api/inbox/mentions/done")
    later = mcp.ok("ren/builder", "post_message", P | {"body": "@oj one more"})["message"]["id"]
    assert [i["id"] for i in items(server, world, "oj") if i["kind"] == "mention"] == [f"mention:{later}"]


def test_a_done_mention_is_forgotten_once_its_room_is_read_past_it(mcp, server, world):
    oj = person(server, world, "oj")
    old = mcp.ok("ren/builder", "post_message", P | {"body": "@oj old"})["message"]["id"]
    assert mark(server, world, "oj", {"item_id": f"mention:{old}", "mark": "done"}).status_code == 200
    fresh = mcp.ok("ren/builder", "post_message", P | {"body": "@oj fresh"})["message"]["id"]
    assert mark(server, world, "oj", {"item_id": f"mention:{fresh}", "mark": "done"}).status_code == 200
    assert world.db.rows("SELECT item_id FROM inbox_marks ORDER BY item_id") == [
        {"item_id": f"mention:{m}"} for m in sorted([old, fresh])]
    oj.post(f"/api/projects/{PROJECT}/read", {"message_id": old})
    newest = mcp.ok("ren/builder", "post_message", P | {"body": "@oj newest"})["message"]["id"]
    assert mark(server, world, "oj", {"item_id": f"mention:{newest}", "mark": "done"}).status_code == 200
    assert world.db.rows("SELECT item_id FROM inbox_marks ORDER BY item_id") == [
        {"item_id": f"mention:{m}"} for m in sorted([fresh, newest])]


def test_bad_marks_name_their_field_and_change_nothing(mcp, server, world, clock):
    oj = person(server, world, "oj")
    posted = mcp.ok("ren/builder", "post_message", P | {"body": "@oj hello"})["message"]["id"]
    item_id = f"mention:{posted}"
    cases = [
        ({"item_id": item_id, "mark": "archived"}, 400, "mark must be one of done, snoozed"),
        ({"item_id": item_id}, 400, "mark must be one of"),
        ({"item_id": "nonsense", "mark": "done"}, 400, "item_id must be an inbox item's id"),
        ({"item_id": "party:x1", "mark": "done"}, 400, "item_id must be"),
        ({"item_id": 7, "mark": "done"}, 400, "item_id must be"),
        ({"item_id": "mention:msg-9-000000000009", "mark": "done"}, 404, "item_id: nothing waits on you"),
        ({"item_id": item_id, "mark": "snoozed"}, 400, "until is required"),
        ({"item_id": item_id, "mark": "snoozed", "until": "tomorrow"}, 400, "until must be an ISO 8601 time"),
        ({"item_id": item_id, "mark": "snoozed", "until": "2026-12-01T12:00:00"}, 400, "until must be an ISO 8601"),
        ({"item_id": item_id, "mark": "snoozed", "until": "2026-12-01T09:59:59Z"}, 400, "until must be a time after now"),
        ({"item_id": item_id, "mark": "snoozed", "until": "2026-12-01T10:00:00Z"}, 400, "until must be a time after now"),
        ({"item_id": item_id, "mark": "snoozed", "until": "2028-01-01T00:00:00Z"}, 400, "until must be within 366 days"),
        ({"item_id": item_id, "mark": "done", "until": "2026-12-02T00:00:00Z"}, 400, "until is only for mark 'snoozed'"),
        ({"item_id": item_id, "mark": "done", "note": "x"}, 400, "unknown field note"),
    ]
    for body, status, words in cases:
        r = oj.post("/api/inbox/mark", body)
        assert (r.status_code, words in r.json()["error"]["message"]) == (status, True), (body, r.text)
    # Someone else's item is not found for oj; nothing was marked.
    assert person(server, world, "ren").post("/api/inbox/mark", {"item_id": item_id, "mark": "done"}).status_code == 404
    assert world.db.rows("SELECT * FROM inbox_marks") == []
    for body, status, words in [({"item_ids": []}, 400, "item_ids must be a list of 1 to 500"),
                                ({"item_ids": item_id}, 400, "item_ids must be a list"),
                                ({"item_ids": ["x"]}, 400, "item_id must be"),
                                ({"item_ids": [item_id]}, 404, f"item_ids: you have no mark on '{item_id}'"),
                                ({"item_id": item_id}, 400, "unknown field item_id")]:
        r = oj.post("/api/inbox/unmark", body)
        assert (r.status_code, words in r.json()["error"]["message"]) == (status, True), (body, r.text)
    assert oj.get("/api/inbox?snoozed=yes").status_code == 400
    assert len(items(server, world, "oj")) == 1
