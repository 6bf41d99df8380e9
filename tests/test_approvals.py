"""Approvals and final acceptance, the people's side of tasks: approving or denying a held handoff, standing
approvals, approvals lapsing, final acceptance, sending back and cancelling, a person's own request, and
renaming a task or setting what a sub-task waits on."""

import datetime as dt

import prickle
from conftest import PROJECT, all_events, audit_entries
from helpers import (PACKET, P, audit_text, handoff, jrun, person, routed, sha, start, submit, wait_kinds, working,
                     written)


# -- approving or denying a held handoff ---------------------------------------


def test_teammate_handoff_waits_for_the_owner_who_approves_over_http(mcp, server, world):
    builder = start(mcp, "ren/builder", "wait_for_mention")
    muse = start(mcp, "oj/muse")
    out = handoff(mcp)
    task, gate = out["task"], out["gate"]
    assert (task["state"], task["waiting_on"], gate["decision"]) == ("approval", "owner_approval",
                                                                     "approval_required")
    assert wait_kinds(mcp, "ren/builder", builder, "wait_for_mention") == []  # not yet
    approvals = person(server, world, "ren").get("/api/approvals").json()["approvals"]
    assert [(a["approval"]["id"], a["approval"]["status"], a["task"]["id"]) for a in approvals] == [
        (gate["approval_id"], "pending", task["id"])]
    assert approvals[0]["approval"]["summary"] == "Draft the hero copy."
    assert person(server, world, "oj").get("/api/approvals").json()["approvals"] == []
    r = person(server, world, "oj").post(f"/api/approvals/{gate['approval_id']}", {"decision": "approve"})
    assert r.status_code == 404  # not oj's to decide
    r = person(server, world, "ren").post(f"/api/approvals/{gate['approval_id']}", {"decision": "approve"})
    assert r.status_code == 200
    assert (r.json()["task"]["state"], r.json()["approval"]["status"]) == ("routed", "approved")
    assert wait_kinds(mcp, "ren/builder", builder, "wait_for_mention") == [("task", task["id"])]
    assert wait_kinds(mcp, "oj/muse", muse) == [("decision", task["id"])]
    types = [e["type"] for e in all_events(world.db)][-4:]
    assert types == ["approval.updated", "task.updated", "approval.updated", "task.updated"]
    r = person(server, world, "ren").post(f"/api/approvals/{gate['approval_id']}", {"decision": "deny"})
    assert r.status_code == 409 and "already approved" in r.json()["error"]["message"]


def test_denied_handoff_is_rejected(mcp, server, world):
    out = handoff(mcp)
    r = person(server, world, "ren").post(f"/api/approvals/{out['gate']['approval_id']}", {"decision": "deny"})
    assert r.json()["task"]["state"] == "rejected" and r.json()["task"]["waiting_on"] is None


# -- standing approvals --------------------------------------------------------


def test_standing_approval_lets_like_requests_through_up_to_its_cap(mcp, server, world):
    first = handoff(mcp)
    r = person(server, world, "ren").post(f"/api/approvals/{first['gate']['approval_id']}",
                                          {"decision": "approve", "standing": {"uses": 2, "days": 7}})
    standing_id = r.json()["standing_approval_id"]
    for count in (1, 2):
        out = handoff(mcp)
        assert out["gate"]["decision"] == "allow" and out["task"]["state"] == "routed"
        assert out["gate"]["approval_id"]
        used = audit_entries(world.db, PROJECT, "standing_approval.used")[-1]["refs"]
        assert (used["standing_approval"], used["count"], used["cap"]) == (standing_id, count, 2)
    assert handoff(mcp)["gate"]["decision"] == "approval_required"      # cap reached
    other_kind = mcp.ok("oj/muse", "handoff", P | {"to": "ren/builder",
                                                   "packet": PACKET | {"deliverable_type": "code"}})
    assert other_kind["gate"]["decision"] == "approval_required"
    created = audit_entries(world.db, PROJECT, "standing_approval.created")[0]["refs"]
    assert (created["requester"], created["assignee"], created["kind"], created["cap"]) == (
        "oj/muse", "ren/builder", "doc", 2)


def test_revoking_a_standing_approval_asks_again_for_unstarted_work(mcp, server, world):
    first = handoff(mcp)
    r = person(server, world, "ren").post(f"/api/approvals/{first['gate']['approval_id']}",
                                          {"decision": "approve", "standing": {"uses": 5, "days": 7}})
    standing_id = r.json()["standing_approval_id"]
    through = handoff(mcp)["task"]
    out = person(server, world, "ren").delete(f"/api/standing-approvals/{standing_id}").json()
    assert out == {"id": standing_id, "revoked": True, "voided": 1}  # the clicked first one stands
    again = prickle.task_out(world.db, through["id"])
    assert (again["state"], again["waiting_on"]) == ("approval", "owner_approval")
    assert {e["refs"]["reason"] for e in audit_entries(world.db, PROJECT, "approval.invalidated")} == {
        "standing_approval_revoked"}


def test_a_standing_approval_gives_what_an_approval_rule_asks_for(mcp, server, world):
    ren = person(server, world, "ren")
    ren.post("/api/rules", {"decision": "approval_required"})
    first = handoff(mcp)
    assert ren.post(f"/api/approvals/{first['gate']['approval_id']}",
                    {"decision": "approve", "standing": {"uses": True, "days": 1}}).status_code == 400
    ren.post(f"/api/approvals/{first['gate']['approval_id']}", {"decision": "approve",
                                                                "standing": {"uses": 1, "days": 1}})
    assert handoff(mcp)["gate"]["decision"] == "allow"
    assert handoff(mcp)["gate"]["decision"] == "approval_required"
    ren.post("/api/rules", {"decision": "never"})
    assert handoff(mcp)["gate"]["decision"] == "never"


# -- an approval lapses after 24 hours -----------------------------------------


def test_approvals_lapse_after_24_hours_and_are_asked_again(mcp, server, world):
    pending = handoff(mcp)
    approved = routed(mcp, server, world)
    later = prickle.utcnow() + dt.timedelta(hours=25)
    assert prickle.sweep_approvals(world.db, later) == 2
    lapsed = audit_entries(world.db, PROJECT, "approval.invalidated")
    assert [e["refs"]["task"] for e in lapsed] == [pending["task"]["id"], approved["id"]]
    assert all(e["refs"]["reason"] == "24_hours" for e in lapsed)
    assert prickle.task_out(world.db, approved["id"])["state"] == "approval"
    listed = person(server, world, "ren").get("/api/approvals").json()["approvals"]
    assert sorted(a["task"]["id"] for a in listed) == sorted([pending["task"]["id"], approved["id"]])
    r = person(server, world, "ren").post(f"/api/approvals/{pending['gate']['approval_id']}", {"decision": "approve"})
    assert r.status_code == 409 and "lapsed" in r.json()["error"]["message"]


def test_an_approval_counts_24_hours_from_when_it_was_given(mcp, server, world):
    out = handoff(mcp)
    world.db.execute("UPDATE approvals SET created_at = ?, expires_at = ? WHERE id = ?", (
        prickle.iso(prickle.utcnow() - dt.timedelta(hours=23)), prickle.iso(prickle.utcnow() + dt.timedelta(hours=1)),
        out["gate"]["approval_id"]))
    person(server, world, "ren").post(f"/api/approvals/{out['gate']['approval_id']}", {"decision": "approve"})
    assert prickle.sweep_approvals(world.db, prickle.utcnow() + dt.timedelta(hours=2)) == 0
    assert prickle.sweep_approvals(world.db, prickle.utcnow() + dt.timedelta(hours=25)) == 1


# -- final acceptance, sending back, cancelling --------------------------------


def test_owner_sends_a_verified_result_back(mcp, server, world):
    task = working(mcp, server, world)
    sub = submit(mcp, task["id"])["submission"]
    mcp.ok("oj/muse", "accept_result", {"task_id": task["id"], "submission_id": sub["submission_id"], "revision": 1,
                                        "verdicts": [{"criterion": 0, "accepted": True},
                                                     {"criterion": 1, "accepted": True}],
                                        "artifacts": sub["artifacts"]})
    oj = person(server, world, "oj")
    assert oj.post(f"/api/tasks/{task['id']}/send-back", {}).status_code == 400
    out = oj.post(f"/api/tasks/{task['id']}/send-back", {"reason": "Make it warmer."}).json()["task"]
    assert out["state"] == "working" and out["result"]["status"] == "rejected"


def test_auto_accept_policy_completes_at_once(mcp, server, world):
    assert person(server, world, "oj").post("/api/policy", {"auto_accept": True}).json()["auto_accept"] is True
    task = working(mcp, server, world)
    sub = submit(mcp, task["id"])["submission"]
    out = mcp.ok("oj/muse", "accept_result", {"task_id": task["id"], "submission_id": sub["submission_id"],
                                              "revision": 1, "verdicts": [{"criterion": 0, "accepted": True},
                                                                          {"criterion": 1, "accepted": True}],
                                              "artifacts": sub["artifacts"]})["task"]
    assert out["state"] == "completed"
    assert out["result"]["decided_by_policy"] == "auto_accept" and out["result"]["decided_by"] == {"kind": "system"}
    assert out["result"]["provenance"] == "agent_generated"  # only a person makes owner_approved


def test_cancel_by_the_requesters_owner_or_a_project_owner(mcp, server, world):
    task = routed(mcp, server, world)
    builder = start(mcp, "ren/builder", "wait_for_mention")
    assert person(server, world, "sam").post(f"/api/tasks/{task['id']}/cancel").status_code == 404
    assert person(server, world, "ren").post(f"/api/tasks/{task['id']}/cancel").status_code == 403
    out = person(server, world, "oj").post(f"/api/tasks/{task['id']}/cancel").json()["task"]
    assert out["state"] == "cancelled"
    assert wait_kinds(mcp, "ren/builder", builder, "wait_for_mention") == [("task", task["id"])]


def test_a_cancel_keeps_the_words_it_was_given_for_the_task_page_and_never_in_the_audit(mcp, server, world):
    task = routed(mcp, server, world)
    oj = person(server, world, "oj")
    for body, message in (({"reason": ""}, "reason must be text of 1 to 1000 characters"),
                          ({"reason": "x" * 1001}, "reason must be text of 1 to 1000 characters"),
                          ({"reason": ["no"]}, "reason must be text"),
                          ({"note": "no"}, "unknown field note: send nothing, or a reason")):
        r = oj.post(f"/api/tasks/{task['id']}/cancel", body)
        assert (r.status_code, r.json()["error"]["message"]) == (400, message)
    assert oj.get(f"/api/tasks/{task['id']}").json()["task"]["state"] == "routed"  # nothing changed
    assert oj.post(f"/api/tasks/{task['id']}/cancel", {"reason": "Plans changed: no hero this month."}).status_code == 200
    last = oj.get(f"/api/tasks/{task['id']}").json()["timeline"][-1]
    assert (last["kind"], last["to"], last["by"], last["reason"], last["why"]) == (
        "state", "cancelled", {"kind": "person", "handle": "oj"}, "Plans changed: no hero this month.", None)
    assert "Plans changed" not in audit_text(world.db)


def test_cancelling_a_held_handoff_wakes_nobody_and_ends_its_approval(mcp, server, world):
    out = handoff(mcp)
    builder = start(mcp, "ren/builder", "wait_for_mention")
    person(server, world, "oj").post(f"/api/tasks/{out['task']['id']}/cancel")
    assert wait_kinds(mcp, "ren/builder", builder, "wait_for_mention") == []
    last = [e for e in all_events(world.db) if e["type"] == "approval.updated"][-1]
    assert last["approval"]["status"] == "denied"
    r = person(server, world, "ren").post(f"/api/approvals/{out['gate']['approval_id']}", {"decision": "approve"})
    assert r.status_code == 409 and "cancelled" in r.json()["error"]["message"]


# -- a person asks their own agent ---------------------------------------------


def test_a_person_asks_their_own_agent_for_a_task(mcp, server, world):
    builder = start(mcp, "ren/builder", "wait_for_mention")
    ren = person(server, world, "ren")
    r = ren.post(f"/api/projects/{PROJECT}/task-requests", {"agent": "ren/builder", "packet": PACKET})
    assert r.status_code == 200, r.text
    task, message = r.json()["task"], r.json()["message"]
    assert (task["state"], task["requester"], task["requested_by"]) == ("routed", None,
                                                                      {"kind": "person", "handle": "ren"})
    assert task["origin_message_id"] == message["id"] and message["task_request"] == {"task_id": task["id"]}
    kinds = wait_kinds(mcp, "ren/builder", builder, "wait_for_mention")
    assert ("task", task["id"]) in kinds
    assert audit_entries(world.db, PROJECT, "task.requested")[0]["refs"]["agent"] == "ren/builder"
    assert ren.post(f"/api/projects/{PROJECT}/task-requests", {"agent": "oj/muse", "packet": PACKET}).status_code == 403
    bad = ren.post(f"/api/projects/{PROJECT}/task-requests", {"agent": "ren/builder", "packet": {"task": "x"}})
    assert bad.status_code == 400
    # the person who asked gives final acceptance straight after the result
    mcp.ok("ren/builder", "accept_task", {"task_id": task["id"]})
    submit(mcp, task["id"])
    assert ren.post(f"/api/tasks/{task['id']}/accept").json()["task"]["state"] == "completed"


# -- renaming a task, and what a sub-task waits on -----------------------------


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


def test_a_standing_approval_records_the_grade_of_the_work_it_lets_through(mcp, server, world):
    first = handoff(mcp)
    r = person(server, world, "ren").post(f"/api/approvals/{first['gate']['approval_id']}",
                                          {"decision": "approve", "standing": {"uses": 3, "days": 2}})
    [created] = audit_entries(world.db, PROJECT, "standing_approval.created")
    assert created["refs"] == {
        "standing_approval": r.json()["standing_approval_id"], "approval": first["gate"]["approval_id"],
        "requester": "oj/muse", "assignee": "ren/builder", "kind": "doc", "grade": "reversible", "cap": 3,
        "expires_at": created["refs"]["expires_at"]}
    data = prickle.request_grade({"route": None, "packet": '{"deliverable_type": "data"}'})
    deploy = prickle.request_grade({"route": '{"via": "request_capability", "capability": {"kind": "deploy", '
                                             '"name": "prod"}}', "packet": '{"deliverable_type": "code"}'})
    assert (data, deploy) == ("hard_to_undo", "outbound")
