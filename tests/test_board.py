"""The board and the task page: the task lists the page builds them from come from the server (every state,
the ones a task can be cancelled in, the deliverable types, and the board's columns), and so does what a
person may do to a task or a default lead (the ``can_*`` fields): the page decides nothing itself."""

import datetime as dt

import prickle
from conftest import PROJECT
from helpers import T0, auth, paired, person, submit


def test_meta_gives_the_page_its_task_lists_from_the_server(server, world):
    r = server.get("/api/meta", headers=auth(world, "ren"))
    assert r.json() == {"tasks": {
        "states": ["requested", "routed", "accepted", "working", "waiting", "verifying", "approval",
                   "completed", "rejected", "cancelled", "returned"],
        "cancellable": ["routed", "accepted", "working", "waiting", "verifying", "approval"],
        "deliverable_types": ["code", "doc", "answer", "screenshots", "reviewed_pr", "design", "data", "other"],
        "board": [{"title": "Needs a person", "states": ["approval", "waiting", "returned"]},
                  {"title": "Queued", "states": ["requested", "routed"]},
                  {"title": "In progress", "states": ["accepted", "working"]},
                  {"title": "Verifying", "states": ["verifying"]},
                  {"title": "Done", "states": ["completed"]},
                  {"title": "Closed", "states": ["rejected", "cancelled"]}]}}
    assert r.json()["tasks"]["states"] == prickle.SCHEMAS["check_inbox"][1]["properties"]["assigned"]["items"][
        "properties"]["state"]["enum"]
    assert server.get("/api/meta").status_code == 401


def _api(server, world, handle):
    h = {"Authorization": f"Bearer {world.tokens[handle]}"}
    return lambda method, path, body=None: server.request(method, path, headers=h, json=body)


def _board(api):
    return {t["id"]: t for t in api("GET", f"/api/projects/{PROJECT}/tasks").json()["tasks"]}


def test_a_task_says_who_may_cancel_it_and_hand_it_on_once_returned(mcp, server, world):
    oj, ren = _api(server, world, "oj"), _api(server, world, "ren")
    packet = {"task": "Draft the footer.", "deliverable_type": "doc", "acceptance_criteria": ["Two lines."],
              "context": "", "files": []}
    # ren's agent asks oj's: ren (the requester's person) and oj (a project owner) may cancel.
    held = mcp.ok("ren/builder", "handoff", {"project": PROJECT, "to": "oj/muse", "packet": packet})
    task_id = held["task"]["id"]
    assert oj("POST", f"/api/approvals/{held['gate']['approval_id']}", {"decision": "approve"}).status_code == 200
    steer = {k: _board(api)[task_id][k] for api in (oj, ren) for k in ("can_cancel", "can_reassign")}
    assert steer == {"can_cancel": True, "can_reassign": False}
    # oj's agent asks ren's: ren is only a member and the assignee's owner, so ren may not cancel.
    mine = mcp.ok("oj/muse", "handoff", {"project": PROJECT, "to": "ren/builder", "packet": packet})["task"]
    assert (_board(ren)[mine["id"]]["can_cancel"], _board(oj)[mine["id"]]["can_cancel"]) == (False, True)
    detail = ren("GET", f"/api/tasks/{mine['id']}").json()["task"]
    assert (detail["can_cancel"], detail["can_reassign"]) == (False, False)
    # Handed back, it may be handed on by its requester's person only, and cancelled by nobody.
    assert oj("POST", f"/api/tasks/{task_id}/hand-back").status_code == 200
    back = {h: {k: _board(api)[task_id][k] for k in ("state", "can_cancel", "can_reassign")}
            for h, api in (("oj", oj), ("ren", ren))}
    assert back == {"oj": {"state": "returned", "can_cancel": False, "can_reassign": True},
                    "ren": {"state": "returned", "can_cancel": False, "can_reassign": True}}
    # What the page was told matches what the server does.
    assert ren("POST", f"/api/tasks/{mine['id']}/cancel").status_code == 403
    assert oj("POST", f"/api/tasks/{task_id}/cancel").status_code == 409


def test_a_project_says_who_may_pick_answer_for_and_step_down_its_default_lead(server, world):
    oj, ren = _api(server, world, "oj"), _api(server, world, "ren")
    view = lambda api: api("GET", f"/api/projects/{PROJECT}").json()  # noqa: E731
    assert (view(oj)["can_pick_lead"], view(ren)["can_pick_lead"], view(oj)["lead"]) == (True, False, None)
    assert oj("POST", f"/api/projects/{PROJECT}/lead", {"agent_id": "ren/builder"}).status_code == 200
    assert view(ren)["lead"] == {"agent_id": "ren/builder", "state": "proposed", "picked_by": "oj",
                                 "can_answer": True, "can_step_down": False}
    assert view(oj)["lead"] == {"agent_id": "ren/builder", "state": "proposed", "picked_by": "oj",
                                     "can_answer": False, "can_step_down": False}
    assert view(oj)["can_pick_lead"] is True  # a pick not yet agreed may be replaced
    assert ren("POST", f"/api/projects/{PROJECT}/lead/answer", {"decision": "agree"}).status_code == 200
    assert (view(ren)["lead"]["can_answer"], view(ren)["lead"]["can_step_down"]) == (False, True)
    assert (view(oj)["can_pick_lead"], view(oj)["lead"]["can_step_down"]) == (False, False)


def test_a_task_says_who_gives_final_acceptance_and_who_may_set_what_it_waits_on(mcp, server, world):
    oj, ren = _api(server, world, "oj"), _api(server, world, "ren")
    packet = {"task": "Count the words.", "deliverable_type": "doc", "acceptance_criteria": ["A number."],
              "context": "", "files": []}
    task = mcp.ok("oj/muse", "handoff", {"project": PROJECT, "to": "oj/scout", "packet": packet})["task"]
    mcp.ok("oj/scout", "accept_task", {"task_id": task["id"]})
    sub = mcp.ok("oj/scout", "return_result", {"task_id": task["id"], "summary": "42.", "evidence": [
        {"kind": "test_output", "summary": "Counted.", "content": "42", "criteria": [0]}],
        "artifacts": [{"ref": "count.txt", "sha256": "a" * 64}]})["submission"]
    mcp.ok("oj/muse", "accept_result", {"task_id": task["id"], "submission_id": sub["submission_id"],
                                        "revision": sub["revision"], "verdicts": [{"criterion": 0, "accepted": True}],
                                        "artifacts": sub["artifacts"]})
    given = {h: (_board(api)[task["id"]]["awaiting_final"], _board(api)[task["id"]]["can_give_final"])
             for h, api in (("oj", oj), ("ren", ren))}
    assert given == {"oj": (True, True), "ren": (True, False)}
    detail = oj("GET", f"/api/tasks/{task['id']}").json()
    assert (detail["can_rename"], detail["can_set_waits"]) == (True, False)  # not a sub-task
    assert ren("GET", f"/api/tasks/{task['id']}").json()["can_rename"] is False
    assert ren("POST", f"/api/tasks/{task['id']}/accept").status_code == 403


def test_a_task_page_has_one_timeline_in_time_order_with_whose_turn_and_why(mcp, server, world, clock):
    at = lambda minutes: T0 + dt.timedelta(minutes=minutes)  # noqa: E731
    oj, ren = person(server, world, "oj"), person(server, world, "ren")
    packet = {"task": "Draft the hero copy.", "deliverable_type": "doc", "acceptance_criteria": ["Eight words."]}
    held = mcp.ok("oj/muse", "handoff", {"project": PROJECT, "to": "ren/builder", "packet": packet})
    task_id = held["task"]["id"]
    clock.now = at(1)
    assert ren.post(f"/api/approvals/{held['gate']['approval_id']}", {"decision": "approve"}).status_code == 200
    clock.now = at(2)
    runner = paired(world)[1]
    run = mcp.ok("ren/builder", "claim_task", {"task_id": task_id, "idempotency_key": "k"}, token=runner)
    mcp.ok("ren/builder", "accept_task", {"task_id": task_id}, token=run["execution_credential"]["token"])
    clock.now = at(3)
    message = mcp.ok("ren/builder", "post_message", {"project": PROJECT, "task_id": task_id,
                                                     "body": "Starting   on the\nheadline."})["message"]
    clock.now = at(4)
    mcp.ok("ren/builder", "checkpoint", {"task_id": task_id, "checkpoint": {"progress": "Two drafted."}},
           token=run["execution_credential"]["token"])
    cp_id = world.db.scalar("SELECT id FROM checkpoints WHERE task_id = ?", (task_id,))
    clock.now = at(5)
    sub = submit(mcp, task_id, items=[{"kind": "note", "summary": "Seven words.", "criteria": [0]}],
                 artifacts=[])["submission"]
    clock.now = at(6)
    mcp.ok("oj/muse", "reject_result", {"task_id": task_id, "submission_id": sub["submission_id"],
                                        "revision": 1, "reason": "Too long by one word."})
    clock.now = at(7)
    assert ren.post(f"/api/tasks/{task_id}/stop").status_code == 200
    clock.now = at(8)
    assert ren.post(f"/api/tasks/{task_id}/hand-back", {"reason": 7}).json()["error"] == {
        "code": "invalid_input", "message": "reason must be text"}
    assert ren.post(f"/api/tasks/{task_id}/hand-back", {"why": "x"}).json()["error"]["message"] == (
        "unknown field why: send nothing, or a reason")
    assert ren.post(f"/api/tasks/{task_id}/hand-back",
                    {"reason": "Wrong agent: it needs a copywriter."}).status_code == 200
    timeline = oj.get(f"/api/tasks/{task_id}").json()["timeline"]
    iso = lambda minutes: prickle.iso(at(minutes))  # noqa: E731
    muse, builder = {"kind": "agent", "agent_id": "oj/muse"}, {"kind": "agent", "agent_id": "ren/builder"}
    attempt = run["attempt"]["attempt_id"]
    assert timeline == [
        {"at": iso(0), "kind": "created", "by": muse},
        {"at": iso(0), "kind": "state", "from": "requested", "to": "approval", "move": "approval_required",
         "by": {"kind": "system"}, "reason": None, "why": None},
        {"at": iso(1), "kind": "decision", "decision": "approved", "by": {"kind": "person", "handle": "ren"},
         "revision": None, "reason": None},
        {"at": iso(1), "kind": "state", "from": "approval", "to": "routed", "move": "approve",
         "by": {"kind": "person", "handle": "ren"}, "reason": None, "why": None},
        {"at": iso(2), "kind": "run", "by": builder, "run": attempt, "purpose": "work", "event": "started"},
        {"at": iso(2), "kind": "state", "from": "routed", "to": "accepted", "move": "accept", "by": builder,
         "reason": None, "why": None},
        {"at": iso(3), "kind": "message", "by": builder, "message_id": message["id"],
         "excerpt": "Starting on the headline."},
        {"at": iso(4), "kind": "checkpoint", "by": builder, "checkpoint_id": cp_id,
         "excerpt": "Two drafted.", "needs_answer": False},
        {"at": iso(4), "kind": "state", "from": "accepted", "to": "working", "move": "checkpoint", "by": builder,
         "reason": None, "why": None},
        {"at": iso(5), "kind": "submission", "by": builder, "revision": 1, "excerpt": "Headline and CTA drafted."},
        {"at": iso(5), "kind": "state", "from": "working", "to": "verifying", "move": "return",
         "by": builder, "reason": None, "why": None},
        {"at": iso(6), "kind": "decision", "decision": "rejected", "by": muse, "revision": 1,
         "reason": "Too long by one word."},
        {"at": iso(6), "kind": "state", "from": "verifying", "to": "working", "move": "reject", "by": muse,
         "reason": "Too long by one word.", "why": None},
        {"at": iso(7), "kind": "run", "by": builder, "run": attempt, "purpose": "work", "event": "ended",
         "state": "stopped", "failure": None},
        {"at": iso(8), "kind": "state", "from": "working", "to": "returned", "move": "hand_back",
         "by": {"kind": "person", "handle": "ren"}, "reason": "Wrong agent: it needs a copywriter.",
         "why": "owner_handed_back"}]
    assert [e["at"] for e in timeline] == sorted(e["at"] for e in timeline)
    assert ren.get(f"/api/tasks/{task_id}").json()["timeline"] == timeline  # the same for everyone who sees it
