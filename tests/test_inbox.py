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
    assert r.json() == {"project": PROJECT, "task_id": None, "unread": 0}  # oj's own later message never counts
    assert kinds(server, world, "oj") == [("mention", f"mention:{threaded['id']}")]
    r = oj.post(f"/api/projects/{PROJECT}/read", {"message_id": threaded["id"], "task_id": task["id"]})
    assert r.json() == {"project": PROJECT, "task_id": task["id"], "unread": 0}
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
