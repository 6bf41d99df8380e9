"""Tasks: handoff through the gate, the lifecycle, results with evidence, final acceptance."""

import datetime as dt

import pytest

import prickle
from conftest import PROJECT, all_events, audit_entries
from helpers import PACKET, SHA, P, evidence, handoff, person, routed, start, submit, wait_kinds, working

COMMIT = "b" * 40


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


def test_rules_allow_never_and_specificity(mcp, server, world):
    ren = person(server, world, "ren")
    assert ren.post("/api/rules", {"decision": "never"}).status_code == 200          # all teammates
    out = handoff(mcp)
    assert out["gate"]["decision"] == "never" and out["task"]["state"] == "rejected"
    assert out["gate"]["reason"] == "ren's rule for all teammates: never"
    ren.post("/api/rules", {"decision": "allow", "owner": "oj"})                      # oj's agents
    assert handoff(mcp)["task"]["state"] == "routed"
    ren.post("/api/rules", {"decision": "approval_required", "agent": "oj/muse"})     # one agent
    assert handoff(mcp)["gate"]["decision"] == "approval_required"
    assert handoff(mcp, "oj/scout")["gate"]["decision"] == "allow"
    rules = ren.get("/api/rules").json()["rules"]
    assert sorted((r["for"], r["decision"]) for r in rules) == [
        ("agent", "approval_required"), ("all", "never"), ("owner", "allow")]
    agent_rule = next(r for r in rules if r["for"] == "agent")
    assert ren.delete(f"/api/rules/{agent_rule['id']}").json() == {"id": agent_rule["id"], "revoked": True}
    assert handoff(mcp)["gate"]["decision"] == "allow"
    assert [e["refs"]["decision"] for e in audit_entries(world.db, PROJECT, "delegation.set")] == [
        "never", "allow", "approval_required"]
    assert [e["refs"]["reason"] for e in audit_entries(world.db, PROJECT, "delegation.revoked")] == ["revoked"]


def test_an_expired_rule_no_longer_decides(mcp, world):
    rule = prickle.set_rule(world.db, "ren", "allow", expires_at="2099-01-01T00:00:00Z")
    assert handoff(mcp)["gate"]["decision"] == "allow"
    world.db.execute("UPDATE delegation_rules SET expires_at = '2020-01-01T00:00:00.000Z' WHERE id = ?", (rule["id"],))
    assert handoff(mcp)["gate"]["decision"] == "approval_required"
    with pytest.raises(prickle.InvalidInput, match="in the future"):
        prickle.set_rule(world.db, "ren", "allow", expires_at="2020-01-01T00:00:00Z")


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


def test_idempotent_handoff_replays_the_same_task(mcp, world):
    a = handoff(mcp, "oj/muse", "oj/scout", idempotency_key="k-1")
    b = handoff(mcp, "oj/muse", "oj/scout", idempotency_key="k-1")
    assert a == b
    assert world.db.scalar("SELECT count(*) FROM tasks") == 1
    text = mcp.error("oj/muse", "handoff", P | {"to": "oj/scout", "packet": PACKET | {"task": "Other"},
                                               "idempotency_key": "k-1"}, "conflict")
    assert "k-1" in text


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


def test_return_result_rules(mcp, server, world):
    task = working(mcp, server, world)
    base = {"task_id": task["id"], "summary": "Done."}
    cases = [
        ({"evidence": [{"kind": "link", "summary": "See it"}]}, "evidence[0]: a link needs a url or content"),
        ({"evidence": [evidence([2])]}, "evidence[0].criteria: the task has 2 acceptance criteria"),
        ({"evidence": [evidence([0], artifact=1)], "artifacts": [{"ref": "a", "sha256": SHA}]},
         "evidence[0].artifact: there is no artifacts[1]"),
        ({"evidence": [evidence([0])], "artifacts": [{"ref": "a"}]}, "artifacts[0]: pin 'a' by sha256 or commit_sha"),
        ({"evidence": [evidence([0], observed_at="2999-01-01T00:00:00Z")]}, "is in the future"),
    ]
    for extra, message in cases:
        text = mcp.error("ren/builder", "return_result", base | extra, "invalid_input")
        assert message in text, text
    mcp.error("ren/builder", "return_result", base | {"evidence": [evidence([0])], "provenance": "owner_approved"},
              "invalid_input")
    mcp.error("oj/muse", "return_result", base | {"evidence": [evidence([0])]}, "forbidden")
    assert world.db.scalar("SELECT count(*) FROM submissions") == 0


def test_code_needs_a_commit(mcp, world):
    packet = PACKET | {"deliverable_type": "code"}
    task = mcp.ok("oj/muse", "handoff", P | {"to": "oj/scout", "packet": packet})["task"]
    mcp.ok("oj/scout", "accept_task", {"task_id": task["id"]})
    args = {"task_id": task["id"], "summary": "Built.", "evidence": [evidence([0, 1])]}
    text = mcp.error("oj/scout", "return_result", args | {"artifacts": [{"ref": "a.py", "sha256": SHA}]},
                     "invalid_input")
    assert "code needs a commit" in text
    out = mcp.ok("oj/scout", "return_result", args | {"artifacts": [{"ref": "main", "commit_sha": COMMIT}]})
    assert out["submission"]["artifacts"] == [{"ref": "main", "sha256": None, "commit_sha": COMMIT}]


def test_evidence_report(mcp, server, world):
    task = working(mcp, server, world)
    old = (prickle.utcnow() - dt.timedelta(days=8)).strftime("%Y-%m-%dT%H:%M:%SZ")
    out = submit(mcp, task["id"], [evidence([0], observed_at=old), evidence(), evidence([0, 0])])
    result = out["task"]["result"]
    assert result["evidence_report"] == {
        "coverage": [{"criterion": 0, "evidence": [0, 2]}, {"criterion": 1, "evidence": []}],
        "general": [1], "uncovered": [1], "stale": [{"evidence": 0, "why": "older_than_7_days"}],
        "complete": False}
    first_returned = result["returned_at"]
    second = submit(mcp, task["id"], [evidence([0], observed_at=first_returned[:-5] + "Z"), evidence([1])])
    report = second["task"]["result"]["evidence_report"]
    assert report["stale"] == [{"evidence": 0, "why": "before_previous_revision"}] or report["stale"] == []
    third = submit(mcp, task["id"], [evidence([0, 1])])["task"]["result"]
    assert third["evidence_report"] == {"coverage": [{"criterion": 0, "evidence": [0]},
                                                     {"criterion": 1, "evidence": [0]}],
                                        "general": [], "uncovered": [], "stale": [], "complete": True}


def test_untagged_evidence_covers_the_only_criterion(mcp, world):
    packet = PACKET | {"acceptance_criteria": ["One thing."]}
    task = mcp.ok("oj/muse", "handoff", P | {"to": "oj/scout", "packet": packet})["task"]
    mcp.ok("oj/scout", "accept_task", {"task_id": task["id"]})
    out = mcp.ok("oj/scout", "return_result", {"task_id": task["id"], "summary": "Done.",
                                               "evidence": [{"kind": "note", "summary": "Checked."}]})
    assert out["task"]["result"]["evidence_report"]["coverage"] == [{"criterion": 0, "evidence": [0]}]
    assert out["task"]["result"]["evidence_report"]["complete"] is True


def test_full_life_with_rejection_resubmission_and_final_acceptance(mcp, server, world):
    task = working(mcp, server, world)
    muse = start(mcp, "oj/muse")
    first = submit(mcp, task["id"])
    assert (first["task"]["state"], first["submission"]["revision"]) == ("verifying", 1)
    assert first["task"]["result"]["status"] == "submitted"
    assert wait_kinds(mcp, "oj/muse", muse) == [("result", task["id"])]
    builder = start(mcp, "ren/builder", "wait_for_mention")
    sub1 = first["submission"]
    out = mcp.ok("oj/muse", "reject_result", {"task_id": task["id"], "submission_id": sub1["submission_id"],
                                              "revision": 1, "reason": "The headline has 11 words; the limit is 8.",
                                              "verdicts": [{"criterion": 0, "accepted": False, "note": "11 words."}]})
    assert out["task"]["state"] == "working"
    assert out["task"]["result"]["status"] == "rejected"
    assert out["task"]["result"]["reason"] == "The headline has 11 words; the limit is 8."
    assert wait_kinds(mcp, "ren/builder", builder, "wait_for_mention") == [("task", task["id"])]
    verdicts = [{"criterion": 0, "accepted": True}, {"criterion": 1, "accepted": True}]
    text = mcp.error("oj/muse", "accept_result", {"task_id": task["id"], "submission_id": sub1["submission_id"],
                                                  "revision": 1, "verdicts": verdicts, "artifacts": sub1["artifacts"]},
                     "stale_submission")
    assert "was rejected and can never be accepted" in text
    second = submit(mcp, task["id"])
    sub2 = second["submission"]
    assert sub2["revision"] == 2
    args = {"task_id": task["id"], "submission_id": sub2["submission_id"], "revision": 2, "verdicts": verdicts,
            "artifacts": sub2["artifacts"]}
    text = mcp.error("oj/muse", "accept_result", args | {"submission_id": sub1["submission_id"], "revision": 1},
                     "stale_submission")
    assert "can never be accepted" in text
    mcp.error("oj/muse", "accept_result", args | {"revision": 1}, "stale_submission")
    mcp.error("oj/muse", "accept_result", args | {"artifacts": [{"ref": "docs/hero.md", "sha256": "c" * 64}]},
              "stale_submission")
    mcp.error("oj/muse", "accept_result", args | {"verdicts": verdicts[:1]}, "invalid_input")
    text = mcp.error("oj/muse", "accept_result", args | {"verdicts": [verdicts[0], {"criterion": 1,
                                                                                   "accepted": False}]},
                     "invalid_input")
    assert "reject_result" in text
    mcp.error("ren/builder", "accept_result", args, "forbidden")
    refused = audit_entries(world.db, PROJECT, "result.acceptance_refused")
    assert [e["refs"]["reason"] for e in refused] == ["rejected", "rejected", "not_latest", "artifacts_changed",
                                                      "not_yours"]
    verified = mcp.ok("oj/muse", "accept_result", args)["task"]
    assert (verified["state"], verified["waiting_on"]) == ("approval", "owner_approval")
    assert verified["result"]["verified_by"] == {"kind": "agent", "agent_id": "oj/muse"}
    assert verified["result"]["verdicts"] == verdicts and verified["result"]["status"] == "submitted"
    oj, ren = person(server, world, "oj"), person(server, world, "ren")
    assert ren.post(f"/api/tasks/{task['id']}/accept").status_code == 403      # not the requester's owner
    done = oj.post(f"/api/tasks/{task['id']}/accept")
    assert done.status_code == 200, done.text
    final = done.json()["task"]
    assert (final["state"], final["waiting_on"]) == ("completed", None)
    assert final["result"]["status"] == "accepted" and final["result"]["provenance"] == "owner_approved"
    assert final["result"]["decided_by"] == {"kind": "person", "handle": "oj"}
    assert [e["refs"]["to"] for e in audit_entries(world.db, PROJECT, "task.transitioned")
            if e["refs"]["task"] == task["id"]] == [
        "approval", "routed", "accepted", "verifying", "working", "verifying", "approval", "completed"]
    assert [e["refs"]["step"] for e in audit_entries(world.db, PROJECT, "result.accepted")] == [
        "verified", "owner_accepted"]
    detail = oj.get(f"/api/tasks/{task['id']}").json()
    assert [s["status"] for s in detail["submissions"]] == ["rejected", "accepted"]
    assert oj.post(f"/api/tasks/{task['id']}/cancel").status_code == 409


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


def test_an_evidence_url_must_be_a_uri(mcp, server, world):
    task = working(mcp, server, world)
    text = mcp.error("ren/builder", "return_result", {"task_id": task["id"], "summary": "x", "evidence": [
        {"kind": "link", "summary": "l", "url": "not a url", "criteria": [0, 1]}]}, "invalid_input")
    assert text.startswith("invalid_input: evidence[0].url:")


def test_a_task_out_of_reach_is_not_found_whatever_the_reason(mcp, world):
    task = handoff(mcp, "oj/muse", "oj/scout")["task"]
    prickle.add_member(world.db, "side", "ren", by="sam")
    _, side_key = prickle.create_token(world.db, "client", agent_id="sam/lone", project="side")
    for agent, token in (("sam/lone", None), ("sam/lone", side_key), ("ren/builder", None)):
        text = mcp.error(agent, "accept_task", {"task_id": task["id"]}, "not_found", token=token)
        assert text == f"not_found: task_id: no task '{task['id']}' that you can see"
    assert mcp.error("ren/builder", "accept_task", {"task_id": "task_made_up"}, "not_found").endswith("that you can see")


def test_an_approval_counts_24_hours_from_when_it_was_given(mcp, server, world):
    out = handoff(mcp)
    world.db.execute("UPDATE approvals SET created_at = ?, expires_at = ? WHERE id = ?", (
        prickle.iso(prickle.utcnow() - dt.timedelta(hours=23)), prickle.iso(prickle.utcnow() + dt.timedelta(hours=1)),
        out["gate"]["approval_id"]))
    person(server, world, "ren").post(f"/api/approvals/{out['gate']['approval_id']}", {"decision": "approve"})
    assert prickle.sweep_approvals(world.db, prickle.utcnow() + dt.timedelta(hours=2)) == 0
    assert prickle.sweep_approvals(world.db, prickle.utcnow() + dt.timedelta(hours=25)) == 1


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


def test_cancelling_a_held_handoff_wakes_nobody_and_ends_its_approval(mcp, server, world):
    out = handoff(mcp)
    builder = start(mcp, "ren/builder", "wait_for_mention")
    person(server, world, "oj").post(f"/api/tasks/{out['task']['id']}/cancel")
    assert wait_kinds(mcp, "ren/builder", builder, "wait_for_mention") == []
    last = [e for e in all_events(world.db) if e["type"] == "approval.updated"][-1]
    assert last["approval"]["status"] == "denied"
    r = person(server, world, "ren").post(f"/api/approvals/{out['gate']['approval_id']}", {"decision": "approve"})
    assert r.status_code == 409 and "cancelled" in r.json()["error"]["message"]


def test_an_idempotency_key_replays_only_the_same_request(mcp, world):
    handoff(mcp, "oj/muse", "oj/scout", idempotency_key="k", turn_budget=3)
    mcp.error("oj/muse", "handoff", P | {"to": "oj/scout", "packet": PACKET, "idempotency_key": "k",
                                        "turn_budget": 4}, "conflict")
    ask = P | {"capability": {"kind": "other", "name": "Docs"}, "packet": PACKET, "idempotency_key": "c"}
    first = mcp.ok("oj/scout", "request_capability", ask)
    assert mcp.ok("oj/scout", "request_capability", ask)["task"]["id"] == first["task"]["id"]
    mcp.error("oj/scout", "request_capability", ask | {"capability": {"name": "Other"}}, "conflict")


def test_the_uri_check_holds_without_a_format_library(mcp, server, world):
    task = working(mcp, server, world)
    with pytest.raises(prickle.InvalidInput, match=r"^evidence\[0\]\.url: 'not a url' is not an absolute URI"):
        prickle.return_result(world.db, world.actor("ren/builder"), task["id"], "x",
                              [{"kind": "link", "summary": "l", "url": "not a url"}])


def test_a_result_for_a_person_waits_on_that_person(mcp, server, world):
    r = person(server, world, "ren").post(f"/api/projects/{PROJECT}/task-requests",
                                          {"agent": "ren/builder", "packet": PACKET})
    task = r.json()["task"]
    mcp.ok("ren/builder", "accept_task", {"task_id": task["id"]})
    out = submit(mcp, task["id"])["task"]
    assert (out["state"], out["waiting_on"]) == ("verifying", "owner_approval")


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


# -- no acceptance without evidence ----------------------------------------------


def all_accepted(mcp, task_id, sub, code=None):
    args = {"task_id": task_id, "submission_id": sub["submission_id"], "revision": sub["revision"],
            "verdicts": [{"criterion": 0, "accepted": True}, {"criterion": 1, "accepted": True}],
            "artifacts": sub["artifacts"]}
    return mcp.error("oj/muse", "accept_result", args, code) if code else mcp.ok("oj/muse", "accept_result", args)


@pytest.mark.parametrize("auto_accept", [False, True])
def test_a_result_with_uncovered_or_stale_criteria_cant_be_verified(mcp, server, world, auto_accept):
    person(server, world, "oj").post("/api/policy", {"auto_accept": auto_accept})
    task = working(mcp, server, world)
    old = (prickle.utcnow() - dt.timedelta(days=8)).strftime("%Y-%m-%dT%H:%M:%SZ")
    cases = [  # evidence, what the refusal names, its refs
        ([evidence([0])], "no evidence covers criterion 1", [1], []),
        ([{"kind": "note", "summary": "Looks fine."}], "no evidence covers criterion 0, 1", [0, 1], []),
        ([evidence([0]), evidence([1], observed_at=old)], "evidence 1 is stale (for criterion 1)", [], [1]),
        ([evidence([0, 1], observed_at=old), evidence()], "evidence 0 is stale "
         "(for criterion 0, 1)", [], [0, 1]),
    ]
    for items, named, uncovered, stale in cases:
        sub = submit(mcp, task["id"], items)["submission"]
        before = len(audit_entries(world.db, PROJECT))
        text = all_accepted(mcp, task["id"], sub, "evidence_incomplete")
        assert text == (f"evidence_incomplete: submission '{sub['submission_id']}' revision {sub['revision']} can't "
                        f"be verified: its evidence report is not complete ({named}); send it back with "
                        "reject_result and ask for fresh evidence tagged with each criterion it supports")
        # Only the refusal's entry was written; the task and the submission are as they were.
        entries = audit_entries(world.db, PROJECT)[before:]
        assert [(e["type"], e["refs"]) for e in entries] == [("result.acceptance_refused", {
            "task": task["id"], "action": "accept", "reason": "evidence_incomplete",
            "asked": {"submission": sub["submission_id"], "revision": sub["revision"]},
            "latest": {"submission": sub["submission_id"], "revision": sub["revision"]},
            "uncovered": uncovered, "stale": stale})]
        now = prickle.task_out(world.db, task["id"])
        assert (now["state"], now["waiting_on"], now["result"]["status"]) == ("verifying", "agent", "submitted")
        assert (now["result"]["verdicts"], now["result"]["verified_by"], now["result"]["decided_by"]) == ([], None, None)
    assert audit_entries(world.db, PROJECT, "result.accepted") == []
    # Sending it back still works; a complete report is verified (and, with the policy, completed).
    sub = submit(mcp, task["id"], [evidence([0]), evidence([1])])["submission"]
    out = all_accepted(mcp, task["id"], sub)["task"]
    assert out["state"] == ("completed" if auto_accept else "approval")
    assert [e["refs"]["step"] for e in audit_entries(world.db, PROJECT, "result.accepted")] == (
        ["verified", "policy"] if auto_accept else ["verified"])


def test_a_rule_for_an_agent_or_person_that_does_not_exist_is_refused_and_nothing_is_written(server, world):
    ren = person(server, world, "ren")
    before = (world.db.scalar("SELECT count(*) FROM delegation_rules"), world.db.scalar("SELECT count(*) FROM audit"))
    r = ren.post("/api/rules", {"decision": "allow", "agent": "oj/ghost"})
    assert r.status_code == 400 and r.json()["error"] == {
        "code": "invalid_input", "message": "agent: there is no agent 'oj/ghost'; give an existing agent as owner/name"}
    r = ren.post("/api/rules", {"decision": "never", "owner": "zed"})
    assert r.status_code == 400 and r.json()["error"]["message"] == (
        "owner: there is no person 'zed'; give the handle of the teammate whose agents the rule is for")
    with pytest.raises(prickle.InvalidInput, match="^agent: there is no agent 'sam/nope'"):
        prickle.set_rule(world.db, "ren", "allow", agent="sam/nope")
    assert (world.db.scalar("SELECT count(*) FROM delegation_rules"), world.db.scalar("SELECT count(*) FROM audit")) \
        == before
    assert ren.post("/api/rules", {"decision": "allow", "agent": "oj/muse"}).status_code == 200  # a real one saves
