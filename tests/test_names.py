"""Names change, addresses don't; keys that reach further say so; a project's default lead."""

import prickle
from conftest import PROJECT, all_events, audit_entries
from helpers import PACKET, P, audit_text, jrun, person, run, sha, written


# -- renaming projects and tasks -----------------------------------------------


def _pair_task(mcp, server, world):
    """oj/muse hands ren/builder a task, which ren approves: requester's owner oj, assignee's owner ren."""
    out = mcp.ok("oj/muse", "handoff", P | {"to": "ren/builder", "packet": PACKET})
    person(server, world, "ren").post(f"/api/approvals/{out['gate']['approval_id']}", {"decision": "approve"})
    return out["task"]


def test_a_tasks_display_title_is_set_by_its_parties_owners_and_cleared_back_to_its_words(server, mcp, world):
    task = _pair_task(mcp, server, world)
    packet = world.db.scalar("SELECT packet FROM tasks WHERE id = ?", (task["id"],))
    prickle.add_member(world.db, PROJECT, "sam", by="oj")
    oj, ren, sam = (person(server, world, h) for h in ("oj", "ren", "sam"))
    before = written(world.db)
    r = sam.post(f"/api/tasks/{task['id']}/title", {"title": "Hero copy"})
    assert r.status_code == 403 and r.json()["error"]["message"] == (
        "only the requester's owner, the assignee's owner or a project owner renames a task")
    r = ren.post(f"/api/tasks/{task['id']}/title", {"title": "x" * 501})
    assert r.status_code == 400 and r.json()["error"]["message"] == "title must be text of 0 to 500 characters"
    assert written(world.db) == before
    # The assignee's owner renames it: the packet stays as it was.
    r = ren.post(f"/api/tasks/{task['id']}/title", {"title": "Hero copy, v1"})
    assert r.json()["task"]["display_title"] == "Hero copy, v1"
    assert r.json()["task"]["packet"]["task"] == "Draft the hero copy."
    event = all_events(world.db)[-1]
    assert (event["type"], event["task"]["display_title"]) == ("task.updated", "Hero copy, v1")
    assert world.db.scalar("SELECT count(*) FROM wakes WHERE seq = ?", (event["seq"],)) == 0
    assert mcp.ok("ren/builder", "check_inbox", P)["assigned"][0]["display_title"] == "Hero copy, v1"
    found = oj.get("/api/search?q=v1").json()["results"]
    assert [(f["kind"], f["task_id"]) for f in found] == [("task", task["id"])]  # search finds the new title
    threads = mcp.ok("oj/muse", "read_room", P)["threads"]
    assert [(t["task_id"], t["title"]) for t in threads] == [(task["id"], "Hero copy, v1")]
    # The requester's owner renames it again, then clears it: the task's own words show again.
    oj.post(f"/api/tasks/{task['id']}/title", {"title": "Hero"})
    r = oj.post(f"/api/tasks/{task['id']}/title", {"title": None})
    assert r.json()["task"]["display_title"] is None
    assert mcp.ok("oj/muse", "read_room", P)["threads"][0]["title"] == "Draft the hero copy."
    assert oj.get("/api/search?q=v1").json()["results"] == []
    assert [e["refs"] for e in audit_entries(world.db, PROJECT, "task.renamed")] == [
        {"task": task["id"], "from": None, "to": sha("Hero copy, v1"), "by": "ren"},
        {"task": task["id"], "from": sha("Hero copy, v1"), "to": sha("Hero"), "by": "oj"},
        {"task": task["id"], "from": sha("Hero"), "to": None, "by": "oj"}]
    assert "Hero" not in audit_text(world.db)
    # The command line sets it for whoever holds the file.
    assert jrun(world.db_path, "task", "title", task["id"], "Copy")["task"]["display_title"] == "Copy"
    assert world.db.scalar("SELECT packet FROM tasks WHERE id = ?", (task["id"],)) == packet


def _family(mcp):
    """oj/scout accepts a task from oj/muse and hands three sub-tasks of it back to oj/muse."""
    parent = mcp.ok("oj/muse", "handoff", P | {"to": "oj/scout", "packet": PACKET})["task"]
    mcp.ok("oj/scout", "accept_task", {"task_id": parent["id"]})
    kids = [mcp.ok("oj/scout", "handoff", P | {"to": "oj/muse", "packet": PACKET | {"task": f"Part {i}."},
                                               "parent_task_id": parent["id"]})["task"] for i in (1, 2, 3)]
    return parent, [k["id"] for k in kids]


def test_a_sub_task_waits_on_its_siblings_and_the_parent_lists_them(server, mcp, world):
    parent, (a, b, c) = _family(mcp)
    oj, ren = person(server, world, "oj"), person(server, world, "ren")
    before = written(world.db)
    refusals = [
        (ren, b, [a], 403, "only the requester's owner, the assignee's owner or a project owner sets what a task "
                           "waits on"),
        (oj, b, [parent["id"]], 400, f"blocked_by[0]: '{parent['id']}' is not another sub-task of parent "
                                     f"'{parent['id']}'"),
        (oj, b, [b], 400, f"blocked_by[0]: '{b}' is not another sub-task of parent '{parent['id']}'"),
        (oj, parent["id"], [a], 409, f"task '{parent['id']}' is not a sub-task: only a sub-task waits on its siblings"),
        (oj, b, "nope", 400, "blocked_by must be a list of up to 20 task IDs (sub-tasks of the same parent), [] for none"),
    ]
    for who, task, blockers, status, message in refusals:
        r = who.post(f"/api/tasks/{task}/blocked-by", {"blocked_by": blockers})
        assert (r.status_code, r.json()["error"]["message"]) == (status, message)
    assert written(world.db) == before
    r = oj.post(f"/api/tasks/{b}/blocked-by", {"blocked_by": [a, a]})
    assert (r.json()["blocked_by"], r.json()["blocked"]) == ([a], [a])
    assert all_events(world.db)[-1]["type"] == "task.updated"
    # c waits on b, which waits on a: a waiting on c would block all three for ever.
    assert oj.post(f"/api/tasks/{c}/blocked-by", {"blocked_by": [b]}).status_code == 200
    r = oj.post(f"/api/tasks/{a}/blocked-by", {"blocked_by": [c]})
    assert r.status_code == 400 and "already wait (in turn) on this one" in r.json()["error"]["message"]
    detail = oj.get(f"/api/tasks/{parent['id']}").json()
    assert [(s["id"], s["title"], s["state"], s["blocked"]) for s in detail["subtasks"]] == [
        (a, "Part 1.", "routed", []), (b, "Part 2.", "routed", [a]), (c, "Part 3.", "routed", [b])]
    assert oj.get(f"/api/tasks/{b}").json()["siblings"] == [
        {"id": a, "title": "Part 1.", "state": "routed"}, {"id": c, "title": "Part 3.", "state": "routed"}]
    assert oj.get(f"/api/projects/{PROJECT}/tasks").json()["blocked"] == {b: [a], c: [b]}
    # Once a is closed, b waits on nothing open.
    oj.post(f"/api/tasks/{a}/cancel")
    assert oj.get(f"/api/projects/{PROJECT}/tasks").json()["blocked"] == {c: [b]}
    assert oj.get(f"/api/tasks/{b}").json()["blocked"] == []
    out = jrun(world.db_path, "task", "blocked-by", c)
    assert (out["blocked_by"], out["blocked"]) == ([], [])
    assert [e["refs"] for e in audit_entries(world.db, PROJECT, "task.blocked_by_set")] == [
        {"task": b, "blocked_by": [a], "count": 1, "by": "oj"},
        {"task": c, "blocked_by": [b], "count": 1, "by": "oj"},
        {"task": c, "blocked_by": [], "count": 0, "by": None}]
    # The reference's task objects are unchanged: the parent is named as before, nothing more.
    assert mcp.ok("oj/muse", "check_inbox", P)["assigned"][0]["parent_task_id"] == parent["id"]


# -- keys: names, last use, reach that grows -----------------------------------


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
