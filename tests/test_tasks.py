"""Tasks: handoff and the gate (the gate keeps a task from its assignee until it lets it through), the
assignee accepting and checkpointing, check_inbox and request_capability."""

import datetime as dt
import json

import pytest

import prickle
from conftest import PROJECT, audit_entries
from helpers import PACKET, SHA, P, evidence, handoff, person, routed, start, wait_kinds, working


# -- handoff and the gate ----------------------------------------------------


def test_same_owner_handoff_is_routed_and_wakes_the_assignee(mcp, world):
    cursor = start(mcp, "oj/scout", "wait_for_mention")
    out = handoff(mcp, "oj/muse", "oj/scout", turn_budget=12)
    task, gate = out["task"], out["gate"]
    assert gate == {"decision": "allow", "reason": "oj/scout belongs to the same owner as the request",
                    "approval_id": None}
    assert (task["state"], task["waiting_on"], task["requester"], task["assignee"]) == (
        "routed", "agent", "oj/muse", "oj/scout")
    assert task["packet"] == PACKET | {"depends_on": []}
    assert task["requested_by"] == {"kind": "agent", "agent_id": "oj/muse"}
    assert task["route"] == {"via": "handoff"} and task["turn_budget"] == 12
    assert task["result"] is None and task["latest_checkpoint"] is None and task["parent_task_id"] is None
    woke = mcp.ok("oj/scout", "wait_for_mention", {"cursor": cursor, "timeout_seconds": 1})
    assert woke["events"] == [{"kind": "task", "task": task}]
    assert [e["refs"]["to"] for e in audit_entries(world.db, PROJECT, "task.transitioned")] == ["routed"]
    decided = audit_entries(world.db, PROJECT, "gate.decided")[-1]["refs"]
    assert decided == {"task": task["id"], "decision": "allow", "basis": "same_owner", "rule": None,
                       "approval": None}
    requested = audit_entries(world.db, PROJECT, "handoff.requested")[-1]["refs"]
    assert requested == {"task": task["id"], "to": "oj/scout", "by": "oj/muse", "deliverable_type": "doc",
                         "criteria": 2, "files": 0, "depends_on": 0, "context_chars": 37, "parent": None,
                         "via": "handoff"}
    assert "hero" not in str(audit_entries(world.db, PROJECT))


def test_idempotent_handoff_replays_the_same_task(mcp, world):
    a = handoff(mcp, "oj/muse", "oj/scout", idempotency_key="k-1")
    b = handoff(mcp, "oj/muse", "oj/scout", idempotency_key="k-1")
    assert a == b
    assert world.db.scalar("SELECT count(*) FROM tasks") == 1
    text = mcp.error("oj/muse", "handoff", P | {"to": "oj/scout", "packet": PACKET | {"task": "Other"},
                                               "idempotency_key": "k-1"}, "conflict")
    assert "k-1" in text


def test_an_idempotency_key_replays_only_the_same_request(mcp, world):
    handoff(mcp, "oj/muse", "oj/scout", idempotency_key="k", turn_budget=3)
    mcp.error("oj/muse", "handoff", P | {"to": "oj/scout", "packet": PACKET, "idempotency_key": "k",
                                        "turn_budget": 4}, "conflict")
    ask = P | {"capability": {"kind": "other", "name": "Docs"}, "packet": PACKET, "idempotency_key": "c"}
    first = mcp.ok("oj/scout", "request_capability", ask)
    assert mcp.ok("oj/scout", "request_capability", ask)["task"]["id"] == first["task"]["id"]
    mcp.error("oj/scout", "request_capability", ask | {"capability": {"name": "Other"}}, "conflict")


def test_handoff_input_rules(mcp, server, world):
    mcp.error("oj/muse", "handoff", P | {"to": "oj/muse", "packet": PACKET}, "invalid_input")
    mcp.error("oj/muse", "handoff", P | {"to": "sam/lone", "packet": PACKET}, "not_found")
    mcp.error("oj/muse", "handoff", P | {"to": "oj/scout", "packet": PACKET | {"acceptance_criteria": []}},
              "invalid_input")
    mcp.error("oj/muse", "handoff", {"project": "side", "to": "sam/lone", "packet": PACKET}, "not_found")
    parent = handoff(mcp, "oj/muse", "oj/scout")["task"]
    text = mcp.error("oj/muse", "handoff", P | {"to": "ren/builder", "packet": PACKET,
                                               "parent_task_id": parent["id"]}, "forbidden")
    assert "only the assignee" in text
    text = mcp.error("oj/scout", "handoff", P | {"to": "oj/muse", "packet": PACKET, "parent_task_id": parent["id"]},
                     "invalid_state")
    assert "accept it" in text
    mcp.ok("oj/scout", "accept_task", {"task_id": parent["id"]})
    child = mcp.ok("oj/scout", "handoff", P | {"to": "oj/muse", "packet": PACKET, "parent_task_id": parent["id"]})
    assert child["task"]["parent_task_id"] == parent["id"]
    assert world.db.scalar("SELECT count(*) FROM tasks") == 2


# -- the lifecycle -----------------------------------------------------------


def test_only_the_assignee_accepts_and_illegal_moves_name_the_state(mcp, server, world):
    task = routed(mcp, server, world)
    muse = start(mcp, "oj/muse")
    text = mcp.error("oj/muse", "accept_task", {"task_id": task["id"]}, "forbidden")
    assert "assignee" in text
    mcp.error("oj/scout", "accept_task", {"task_id": task["id"]}, "not_found")
    out = mcp.ok("ren/builder", "accept_task", {"task_id": task["id"]})["task"]
    assert (out["state"], out["waiting_on"]) == ("accepted", "agent")
    assert wait_kinds(mcp, "oj/muse", muse) == [("task", task["id"])]
    text = mcp.error("ren/builder", "accept_task", {"task_id": task["id"]}, "invalid_state")
    assert text == (f"invalid_state: task '{task['id']}' is accepted: accept_task is not allowed now; what can "
                    "happen: cancel (by a person), checkpoint, checkpoint with needs_answer, "
                    "hand back (the assignee's owner), return_result")


def test_checkpoints_and_waiting_on_a_person(mcp, server, world):
    task = working(mcp, server, world)
    muse = start(mcp, "oj/muse")
    out = mcp.ok("ren/builder", "checkpoint", {"task_id": task["id"], "checkpoint": {
        "progress": "First draft written.", "next_steps": ["Check the headline length."],
        "files_touched": ["docs/hero.md"]}})["task"]
    assert out["state"] == "working"
    assert out["latest_checkpoint"] == {"progress": "First draft written.", "decisions": [],
                                        "files_touched": ["docs/hero.md"], "next_steps": ["Check the headline length."],
                                        "open_questions": []}
    assert out["latest_checkpoint_by"] == {"agent": "ren/builder", "provenance": "agent_generated",
                                           "handed_back": False}
    mcp.error("ren/builder", "checkpoint", {"task_id": task["id"], "checkpoint": {
        "progress": "Stuck.", "needs_answer": True}}, "invalid_input")
    out = mcp.ok("ren/builder", "checkpoint", {"task_id": task["id"], "checkpoint": {
        "progress": "Stuck.", "open_questions": ["Formal or casual?"], "needs_answer": True}})["task"]
    assert (out["state"], out["waiting_on"]) == ("waiting", "human")
    assert out["latest_checkpoint"]["needs_answer"] is True
    assert wait_kinds(mcp, "oj/muse", muse) == []  # a checkpoint wakes no one
    out = mcp.ok("ren/builder", "accept_task", {"task_id": task["id"]})["task"]
    assert (out["state"], out["waiting_on"]) == ("working", "agent")
    refs = audit_entries(world.db, PROJECT, "task.checkpointed")[0]["refs"]
    assert (refs["files"], refs["next_steps"], refs["needs_answer"]) == (1, 1, False)
    assert "First draft" not in str(audit_entries(world.db, PROJECT))


def test_check_inbox(mcp, server, world):
    mine = handoff(mcp, "oj/muse", "oj/scout")["task"]
    theirs = routed(mcp, server, world)
    closed = handoff(mcp, "oj/muse", "oj/scout")["task"]
    person(server, world, "oj").post(f"/api/tasks/{closed['id']}/cancel")
    inbox = mcp.ok("oj/muse", "check_inbox", P)
    assert inbox["assigned"] == []
    assert [t["id"] for t in inbox["requested"]] == [theirs["id"], mine["id"]]
    with_closed = mcp.ok("oj/muse", "check_inbox", {"include_closed": True})
    assert [t["id"] for t in with_closed["requested"]] == [closed["id"], theirs["id"], mine["id"]]
    scout = mcp.ok("oj/scout", "check_inbox", {})
    assert [t["id"] for t in scout["assigned"]] == [mine["id"]]
    since = prickle.iso(prickle.utcnow())
    assert mcp.ok("oj/muse", "check_inbox", {"project_unchanged_since": since}) == {"assigned": [], "requested": []}
    pending = mcp.ok("oj/scout", "check_inbox", {"pending_wakes_only": True})
    assert [t["id"] for t in pending["assigned"]] == [mine["id"]]
    mcp.ok("oj/scout", "wait_for_mention", {"timeout_seconds": 1, "cursor": prickle.wake_cursor(
        world.db, "oj/scout|wait_for_mention|*", 0)})
    assert mcp.ok("oj/scout", "check_inbox", {"pending_wakes_only": True})["assigned"] == []
    mcp.error("oj/muse", "check_inbox", {"project": "side"}, "not_found")


def _inbox_task_by_task(db, agent, include_closed=False):
    """check_inbox's answer made as it was before its Task objects were kept: task_out of each task, in order."""
    out = {}
    for key, column in (("assigned", "assignee"), ("requested", "requester")):
        rows = db.rows(f"SELECT * FROM tasks t WHERE {column} = :agent AND {prickle.AGENT_SEES_TASK} "
                       "ORDER BY last_activity_at DESC, rowid", {"agent": agent})  # at the same time: as handed off
        out[key] = [prickle.task_out(db, t) for t in rows if include_closed or t["state"] not in prickle.CLOSED_STATES]
    return out


def test_check_inbox_with_many_open_tasks_answers_every_task_as_task_out_makes_it(mcp, server, world):
    scouts = [handoff(mcp, "oj/muse", "oj/scout", packet=PACKET | {"task": f"Task {n} ✓"})["task"]["id"]
              for n in range(60)]
    held = [handoff(mcp, "oj/muse", "ren/builder")["task"]["id"] for _ in range(5)]
    back = [handoff(mcp, "oj/scout", "oj/muse")["task"]["id"] for _ in range(5)]
    for task_id in scouts[:12]:
        mcp.ok("oj/scout", "accept_task", {"task_id": task_id})
    for task_id in scouts[:4]:
        mcp.ok("oj/scout", "checkpoint", {"task_id": task_id, "checkpoint": {"progress": "Half done."}})
    mcp.ok("oj/scout", "checkpoint", {"task_id": scouts[4], "checkpoint": {
        "progress": "Stuck.", "open_questions": ["Which tone?"], "needs_answer": True}})
    results = [mcp.ok("oj/scout", "return_result", {
        "task_id": task_id, "summary": "Done.", "evidence": [evidence([0, 1])],
        "artifacts": [{"ref": "docs/hero.md", "sha256": SHA}]})["task"]["result"] for task_id in scouts[5:8]]
    mcp.ok("oj/muse", "reject_result", {"task_id": scouts[5], "submission_id": results[0]["submission_id"],
                                        "revision": 1, "reason": "Too long."})
    for task_id in scouts[8:10]:
        assert person(server, world, "oj").post(f"/api/tasks/{task_id}/cancel").status_code == 200

    def same_as_before():
        for agent in ("oj/muse", "oj/scout", "ren/builder"):
            for closed in (False, True):
                answer = mcp.ok(agent, "check_inbox", {"include_closed": closed})
                assert answer == _inbox_task_by_task(world.db, agent, closed), (agent, closed)
        return mcp.ok("oj/scout", "check_inbox", {})

    inbox = same_as_before()
    assert len(inbox["assigned"]) == 58 and inbox["requested"] == [prickle.task_out(world.db, t) for t in back[::-1]]
    muse = mcp.ok("oj/muse", "check_inbox", {})
    assert [t["id"] for t in muse["requested"]][-3:] == scouts[12:15][::-1]  # no news of these since handed off
    assert {t["id"] for t in muse["requested"]} >= set(held) and len(muse["requested"]) == 63
    # What changes after a call is in the next answer (a kept Task object is made again).
    mcp.ok("oj/scout", "checkpoint", {"task_id": scouts[0], "checkpoint": {"progress": "Nearly there."}})
    mcp.ok("oj/scout", "return_result", {"task_id": scouts[1], "summary": "Done.", "evidence": [evidence([0, 1])],
                                        "artifacts": [{"ref": "docs/hero.md", "sha256": SHA}]})
    assert person(server, world, "oj").post(f"/api/tasks/{scouts[2]}/cancel").status_code == 200
    inbox = same_as_before()
    assert inbox["assigned"][0]["result"]["summary"] == "Done."
    assert inbox["assigned"][1]["latest_checkpoint"]["progress"] == "Nearly there."
    assert scouts[2] not in {t["id"] for t in inbox["assigned"]}
    # In a session of the handshake era (where /mcp puts no kept text in) and called directly: the same.
    headers = {"Authorization": f"Bearer {world.keys['oj/scout']}", "Accept": "application/json, text/event-stream"}
    r = server.post("/mcp", headers=headers, json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}})
    headers |= {"Mcp-Session-Id": r.headers["mcp-session-id"], "MCP-Protocol-Version": "2025-11-25"}
    assert server.post("/mcp", headers=headers, json={"jsonrpc": "2.0", "method": "notifications/initialized"}) \
        .status_code == 202
    r = server.post("/mcp", headers=headers, json={"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                                                   "params": {"name": "check_inbox", "arguments": {}}})
    answer = [json.loads(line[5:]) for line in r.text.splitlines() if line.startswith("data:")][-1]
    assert answer["result"]["structuredContent"] == inbox
    assert json.loads(answer["result"]["content"][0]["text"]) == inbox
    assert prickle.check_inbox(world.db, world.actor("oj/scout")) == inbox


def test_request_capability(mcp, server, world):
    prickle.add_agent(world.db, "ren/writer", "Writer", "m", "c", "", [{"kind": "other", "name": "Docs"}], [PROJECT])
    ask = P | {"capability": {"kind": "other", "name": "Docs"}, "packet": PACKET}
    choose = mcp.ok("oj/scout", "request_capability", ask)
    assert choose["status"] == "choose"
    assert [(c["agent_id"], c["permission"], c["evidence"]) for c in choose["candidates"]] == [
        ("oj/muse", "allow", "owner_declared"), ("ren/writer", "approval_required", "owner_declared")]
    picked = mcp.ok("oj/scout", "request_capability", ask | {"prefer": {"agent": "ren/writer"}})
    assert picked["status"] == "handed_off" and picked["task"]["assignee"] == "ren/writer"
    assert picked["task"]["route"] == {"via": "request_capability", "capability": {"kind": "other", "name": "Docs"}}
    assert picked["gate"]["decision"] == "approval_required"
    by_owner = mcp.ok("oj/scout", "request_capability", ask | {"prefer": {"owner": "oj"}})
    assert by_owner["task"]["assignee"] == "oj/muse" and by_owner["gate"]["decision"] == "allow"
    assert mcp.ok("oj/scout", "request_capability", P | {"capability": {"name": "Nothing"}, "packet": PACKET}) == {
        "status": "none"}
    prickle.set_rule(world.db, "ren", "never")
    one = mcp.ok("oj/scout", "request_capability", P | {"capability": {"name": "Docs"}, "packet": PACKET})
    assert one["status"] == "handed_off" and one["task"]["assignee"] == "oj/muse"   # ren's refuses
    refs = [e["refs"] for e in audit_entries(world.db, PROJECT, "capability.requested")]
    assert [(r["kind"], r["matched"], r["eligible"], r["outcome"]) for r in refs] == [
        ("other", 2, 2, "choose"), (None, 0, 0, "none")]


def test_times_with_any_zone_compare_as_times(mcp, server, world):
    ren = person(server, world, "ren")
    far_west = (prickle.utcnow() + dt.timedelta(hours=3)).astimezone(dt.timezone(dt.timedelta(hours=-12)))
    r = ren.post("/api/rules", {"decision": "never", "agent": "oj/muse", "expires_at": far_west.isoformat()})
    assert r.status_code == 200 and r.json()["rule"]["expires_at"].endswith("Z")
    assert handoff(mcp)["gate"]["decision"] == "never"  # still in force: it lapses in 3 hours
    for bad in ("2027-01-01T00:00:00", "2027-01-01", "soon"):
        r = ren.post("/api/rules", {"decision": "allow", "expires_at": bad})
        assert r.status_code == 400 and "with its zone" in r.json()["error"]["message"]
    task = handoff(mcp, "oj/muse", "oj/scout")["task"]
    before = (prickle.parse_iso(task["updated_at"]) - dt.timedelta(hours=2)).astimezone(
        dt.timezone(dt.timedelta(hours=14))).isoformat()
    listed = mcp.ok("oj/muse", "check_inbox", {"project_unchanged_since": before})
    assert [t["id"] for t in listed["requested"]] == [task["id"]]
    mcp.error("oj/muse", "check_inbox", {"project_unchanged_since": "2026-01-01T00:00:00"}, "invalid_input")


def test_pending_wakes_only_counts_each_wake_handed_out(mcp, world):
    task = handoff(mcp, "oj/muse", "oj/scout")["task"]
    mcp.ok("oj/muse", "post_message", P | {"body": "@oj/scout ping"})
    start_at = prickle.wake_cursor(world.db, "oj/scout|wait_for_updates|*", 0)
    out = mcp.ok("oj/scout", "wait_for_updates", {"cursor": start_at, "kinds": ["mention"], "timeout_seconds": 1})
    assert [u["kind"] for u in out["updates"]] == ["mention"]
    pending = mcp.ok("oj/scout", "check_inbox", {"pending_wakes_only": True})
    assert [t["id"] for t in pending["assigned"]] == [task["id"]]  # its task wake was never handed out


def test_a_task_out_of_reach_is_not_found_whatever_the_reason(mcp, world):
    task = handoff(mcp, "oj/muse", "oj/scout")["task"]
    prickle.add_member(world.db, "side", "ren", by="sam")
    _, side_key = prickle.create_token(world.db, "client", agent_id="sam/lone", project="side")
    for agent, token in (("sam/lone", None), ("sam/lone", side_key), ("ren/builder", None)):
        text = mcp.error(agent, "accept_task", {"task_id": task["id"]}, "not_found", token=token)
        assert text == f"not_found: task_id: no task '{task['id']}' that you can see"
    assert mcp.error("ren/builder", "accept_task", {"task_id": "task_made_up"}, "not_found").endswith("that you can see")


# -- the gate keeps a task from its assignee until it lets it through ----------


def assignee_sees(mcp, task_id, agent="ren/builder"):
    """What ``agent`` can learn of a task: in check_inbox, in read_room's threads, and a task_id read."""
    inbox = mcp.ok(agent, "check_inbox", {"include_closed": True})
    listed = task_id in [t["id"] for t in inbox["assigned"] + inbox["requested"]]
    threaded = task_id in [t["task_id"] for t in mcp.ok(agent, "read_room", P)["threads"]]
    is_error, out = mcp.call(agent, "read_room", P | {"task_id": task_id})
    if is_error:
        assert out == f"not_found: task_id: no task '{task_id}' in '{PROJECT}' that you can see", out
    return listed, threaded, not is_error


def test_a_held_task_is_not_the_assignees_until_its_owner_approves(mcp, server, world):
    mention = start(mcp, "ren/builder", "wait_for_mention")
    updates = start(mcp, "ren/builder")
    out = handoff(mcp)
    task_id = out["task"]["id"]
    assert out["task"]["state"] == "approval"
    asked = mcp.ok("oj/muse", "post_message", P | {"task_id": task_id, "body": "@ren/builder start on this now"})
    assert asked["message"]["mentions"] == ["ren/builder"]
    mcp.ok("oj/muse", "update_pulse", P | {"doing": "Waiting on the hero copy", "task_id": task_id})
    assert assignee_sees(mcp, task_id) == (False, False, False)
    for tool, args in (("accept_task", {"task_id": task_id}),
                       ("checkpoint", {"task_id": task_id, "checkpoint": {"progress": "Peeked."}}),
                       ("return_result", {"task_id": task_id, "summary": "x", "evidence": [evidence([0, 1])]})):
        assert mcp.error("ren/builder", tool, args, "not_found") == (
            f"not_found: task_id: no task '{task_id}' that you can see")
    mcp.error("ren/builder", "update_pulse", P | {"doing": "x", "task_id": task_id}, "not_found")
    _, runner = prickle.pair_device(world.db, "ren", "ren/builder", "laptop")
    mcp.error("ren/builder", "claim_task", {"task_id": task_id, "idempotency_key": "k"}, "not_found", token=runner)
    pulses = mcp.ok("ren/builder", "get_project_context", P)["pulse"]
    assert [(p["agent_id"], p["task_id"]) for p in pulses] == [("oj/muse", None)]
    assert [(p["agent_id"], p["task_id"]) for p in mcp.ok("oj/muse", "get_project_context", P)["pulse"]] == [
        ("oj/muse", task_id)]
    assert wait_kinds(mcp, "ren/builder", mention, "wait_for_mention") == []
    assert wait_kinds(mcp, "ren/builder", updates) == []
    assert world.db.scalar("SELECT count(*) FROM wakes WHERE agent_id = 'ren/builder'") == 0
    # The assignee's owner sees what waits for their approval, packet and thread included.
    ren = person(server, world, "ren")
    held = ren.get("/api/approvals").json()["approvals"]
    assert [(a["task"]["id"], a["task"]["packet"]["context"]) for a in held] == [(task_id, PACKET["context"])]
    thread = ren.get(f"/api/projects/{PROJECT}/room", params={"task_id": task_id}).json()["messages"]
    assert [m["id"] for m in thread] == [asked["message"]["id"]]

    ren.post(f"/api/approvals/{out['gate']['approval_id']}", {"decision": "approve"})
    assert wait_kinds(mcp, "ren/builder", mention, "wait_for_mention") == [("task", task_id)]
    assert wait_kinds(mcp, "ren/builder", updates) == [("task", task_id)]
    assert assignee_sees(mcp, task_id) == (True, True, True)
    read = mcp.ok("ren/builder", "read_room", P | {"task_id": task_id})["messages"]
    assert [m["body"] for m in read] == ["@ren/builder start on this now"]
    assert [(p["agent_id"], p["task_id"]) for p in mcp.ok("ren/builder", "get_project_context", P)["pulse"]] == [
        ("oj/muse", task_id)]
    mention = start(mcp, "ren/builder", "wait_for_mention")
    mcp.ok("oj/muse", "post_message", P | {"task_id": task_id, "body": "@ren/builder thanks"})
    woke = mcp.ok("ren/builder", "wait_for_mention", {"cursor": mention, "timeout_seconds": 1})["events"]
    assert [(e["kind"], e["message"]["task_id"], e["message"]["body"]) for e in woke] == [
        ("mention", task_id, "@ren/builder thanks")]
    assert mcp.ok("ren/builder", "accept_task", {"task_id": task_id})["task"]["state"] == "accepted"


@pytest.mark.parametrize("how", ["rule_never", "owner_denies"])
def test_a_task_the_gate_refused_never_becomes_the_assignees(mcp, server, world, how):
    ren = person(server, world, "ren")
    if how == "rule_never":
        ren.post("/api/rules", {"decision": "never"})
    mention = start(mcp, "ren/builder", "wait_for_mention")
    updates = start(mcp, "ren/builder")
    out = handoff(mcp)
    task_id = out["task"]["id"]
    if how == "owner_denies":
        ren.post(f"/api/approvals/{out['gate']['approval_id']}", {"decision": "deny"})
    assert prickle.task_out(world.db, task_id)["state"] == "rejected"
    mcp.ok("oj/muse", "post_message", P | {"task_id": task_id, "body": "@ren/builder do it anyway"})
    mcp.ok("oj/muse", "post_message", P | {"task_id": task_id, "body": "Still there?"})
    ren.post(f"/api/projects/{PROJECT}/messages", {"task_id": task_id, "body": "@ren/builder look"})
    assert assignee_sees(mcp, task_id) == (False, False, False)
    assert wait_kinds(mcp, "ren/builder", mention, "wait_for_mention") == []
    assert wait_kinds(mcp, "ren/builder", updates) == []
    assert world.db.scalar("SELECT count(*) FROM thread_access") == 0
    inbox = mcp.ok("oj/muse", "check_inbox", {"include_closed": True})
    assert [t["id"] for t in inbox["requested"]] == [task_id]  # the requester still has its refused task


def test_a_lapsed_approval_takes_the_task_back_from_the_assignee(mcp, server, world):
    task = routed(mcp, server, world)
    updates = start(mcp, "ren/builder")
    mcp.ok("oj/muse", "post_message", P | {"task_id": task["id"], "body": "@ren/builder any news?"})
    assert prickle.sweep_approvals(world.db, prickle.utcnow() + dt.timedelta(hours=25)) == 1
    assert prickle.task_out(world.db, task["id"])["state"] == "approval"
    assert assignee_sees(mcp, task["id"]) == (False, False, False)
    assert wait_kinds(mcp, "ren/builder", updates) == []  # the mention queued before the lapse is not handed out
    again = person(server, world, "ren").get("/api/approvals").json()["approvals"][0]["approval"]
    person(server, world, "ren").post(f"/api/approvals/{again['id']}", {"decision": "approve"})
    assert assignee_sees(mcp, task["id"]) == (True, True, True)
    # Its own again: what was said to it while it was routed, and the task handed over once more.
    assert wait_kinds(mcp, "ren/builder", updates) == [("mention", task["id"]), ("task", task["id"])]
