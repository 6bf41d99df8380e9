"""State machines: every lifecycle is a table, and every move goes through one guarded helper."""

import pytest

import prickle
from conftest import PROJECT, audit_entries
from helpers import decided_step, handoff, person, routed, say, setup_room, submit, working


def test_a_handoff_moves_out_of_requested_by_the_table(mcp, world):
    task = handoff(mcp, "oj/muse", "oj/scout")["task"]  # same owner: the gate allows it
    assert (task["state"], task["waiting_on"]) == ("routed", "agent")
    moved = [e["refs"] for e in audit_entries(world.db, PROJECT, "task.transitioned")]
    assert moved == [{"task": task["id"], "from": "requested", "to": "routed", "move": "allow", "by": "gate"}]
    assert prickle.CLOSED_STATES == ("completed", "rejected", "cancelled")
    # A returned task is not over: it leaves only for another agent, through that agent's owner's gate.
    assert prickle.TASK_MOVES["returned"] == {"reassign": "requested"}


def test_move_refuses_a_move_its_table_does_not_allow_and_writes_nothing(mcp, server, world):
    task = routed(mcp, server, world)
    mcp.ok("ren/builder", "accept_task", {"task_id": task["id"]})
    before = world.db.one("SELECT * FROM tasks WHERE id = ?", (task["id"],))
    with world.db.transaction(), pytest.raises(prickle.InvalidState) as e:
        prickle.move(world.db, "task", task["id"], "approve")
    assert str(e.value) == (f"task '{task['id']}' is accepted: the owner's approval is not allowed now; what can "
                            "happen: cancel (by a person), checkpoint, checkpoint with needs_answer, hand back (the assignee's owner), return_result")
    assert world.db.one("SELECT * FROM tasks WHERE id = ?", (task["id"],)) == before


def test_move_checks_the_state_it_read_in_the_update(mcp, server, world):
    task = routed(mcp, server, world)
    stale = world.db.one("SELECT * FROM tasks WHERE id = ?", (task["id"],))
    mcp.ok("ren/builder", "accept_task", {"task_id": task["id"]})
    # Allowed from the state read (routed) and from the state now (accepted): the row moved meanwhile.
    with world.db.transaction(), pytest.raises(prickle.Conflict) as e:
        prickle.move(world.db, "task", task["id"], "cancel", stale)
    assert str(e.value) == f"task '{task['id']}' changed while this call ran: read it again"
    # Allowed from the state read, not from the state now: refused naming the state now.
    with world.db.transaction(), pytest.raises(prickle.InvalidState) as e:
        prickle.move(world.db, "task", task["id"], "lapse", stale)
    assert str(e.value).startswith(f"task '{task['id']}' is accepted: lapse is not allowed now")
    assert world.db.scalar("SELECT state FROM tasks WHERE id = ?", (task["id"],)) == "accepted"


def test_an_approval_moves_once_and_then_is_closed(mcp, server, world):
    out = handoff(mcp)
    approval_id = out["gate"]["approval_id"]
    r = server.post(f"/api/approvals/{approval_id}", json={"decision": "deny"},
                    headers={"Authorization": f"Bearer {world.tokens['ren']}"})
    assert r.status_code == 200, r.text
    assert world.db.scalar("SELECT status FROM approvals WHERE id = ?", (approval_id,)) == "denied"
    with world.db.transaction(), pytest.raises(prickle.InvalidState) as e:
        prickle.move(world.db, "approval", approval_id, "approve")
    assert str(e.value) == f"approval '{approval_id}' is denied: approve is not allowed now; it is closed"
    assert world.db.scalar("SELECT status FROM approvals WHERE id = ?", (approval_id,)) == "denied"


def test_a_newer_return_supersedes_the_submission_which_then_is_closed(mcp, server, world):
    task = working(mcp, server, world)
    first = submit(mcp, task["id"])["submission"]
    second = submit(mcp, task["id"])["submission"]
    rows = world.db.rows("SELECT id, status FROM submissions WHERE task_id = ? ORDER BY revision", (task["id"],))
    assert rows == [{"id": first["submission_id"], "status": "superseded"},
                    {"id": second["submission_id"], "status": "submitted"}]
    with world.db.transaction(), pytest.raises(prickle.InvalidState) as e:
        prickle.move(world.db, "submission", first["submission_id"], "accept")
    assert str(e.value) == f"submission '{first['submission_id']}' is superseded: accept is not allowed now; it is closed"
    assert world.db.scalar("SELECT status FROM submissions WHERE id = ?", (first["submission_id"],)) == "superseded"


def test_a_consumed_step_is_closed(mcp, server, world):
    call = {"tool_name": "Bash", "input": {"command": "git push origin main"}}
    run, step = decided_step(mcp, server, world, call, "allow")
    used = mcp.ok("ren/builder", "request_step", call | {"tool_use_id": "toolu_1"}, token=run)
    assert used["status"] == "consumed"
    with world.db.transaction(), pytest.raises(prickle.InvalidState) as e:
        prickle.move(world.db, "step", step["step_id"], "expire")
    assert str(e.value) == f"step '{step['step_id']}' is consumed: expire is not allowed now; it is closed"
    assert world.db.scalar("SELECT status FROM steps WHERE id = ?", (step["step_id"],)) == "consumed"


def test_a_declined_action_is_closed(mcp, server, world):
    runner = {"Authorization": f"Bearer {setup_room(world)['oj/muse']}"}
    card = server.post("/api/runner/actions", json={"tool": "image_gen", "action": "Draw the hero", "prompt": "p"},
                       headers=runner).json()["action"]
    assert person(server, world, "oj").post(f"/api/actions/{card['id']}", {"decision": "decline"}).status_code == 200
    with world.db.transaction(), pytest.raises(prickle.InvalidState) as e:
        prickle.move(world.db, "action", card["id"], "claim")
    assert str(e.value) == f"action '{card['id']}' is declined: claim is not allowed now; it is closed"
    assert world.db.scalar("SELECT status FROM actions WHERE id = ?", (card["id"],)) == "declined"


def test_a_stopped_turn_is_ended_and_moves_no_more(mcp, server, world):
    setup_room(world)
    say(server, world, "What should the hero headline say?")
    turn = world.db.one("SELECT id, step FROM turns")
    assert turn["step"] == "draft"
    assert person(server, world, "oj").post("/api/room/stop").status_code == 200
    row = world.db.one("SELECT step, end_reason, waiting_on FROM turns WHERE id = ?", (turn["id"],))
    assert row == {"step": "ended", "end_reason": "stopped", "waiting_on": "[]"}
    with world.db.transaction(), pytest.raises(prickle.InvalidState) as e:
        prickle.move(world.db, "turn", turn["id"], "draft")
    assert str(e.value) == f"turn '{turn['id']}' is ended: draft is not allowed now; it is closed"


def test_a_turn_ended_before_ended_was_a_step_is_ended(mcp, server, world):
    setup_room(world)
    say(server, world, "What should the hero headline say?")
    turn_id = world.db.scalar("SELECT id FROM turns")
    world.db.execute("UPDATE turns SET ended_at = '2026-01-01T00:00:00.000Z', end_reason = 'answered' WHERE id = ?",
                     (turn_id,))
    with world.db.transaction(), pytest.raises(prickle.InvalidState) as e:
        prickle.move(world.db, "turn", turn_id, "stopped")
    assert str(e.value) == f"turn '{turn_id}' is ended: stopped is not allowed now; it is closed"
    assert world.db.scalar("SELECT end_reason FROM turns WHERE id = ?", (turn_id,)) == "answered"


def test_every_lifecycle_is_a_table_whose_moves_lead_to_its_states():
    for kind, life in prickle.LIFECYCLES.items():
        targets = {to for moves in life.moves.values() for to in moves.values()}
        # A task's approval is one stored state, kept apart in two entries by lifecycle_state.
        assert targets - set(life.moves) == ({"approval"} if kind == "task" else set()), kind
    task_states = {prickle.lifecycle_state({"state": s, "verified_at": None, "requester": None})
                   for s in prickle.TASK_STATE["enum"]}
    assert task_states | {"approval_final", "verifying_by_agent"} == set(prickle.TASK_MOVES)
    assert {k: sorted(v.moves) for k, v in prickle.LIFECYCLES.items() if k != "task"} == {
        "approval": ["approved", "denied", "pending"],
        "submission": ["accepted", "cancelled", "rejected", "submitted", "superseded"],
        "step": ["approved", "consumed", "expired", "pending", "refused", "withdrawn"],
        "action": ["approved", "declined", "done", "expired", "failed", "proposed", "running"],
        "turn": ["combine", "draft", "ended", "review", "revise"],
        "round": ["open", "stopped"],
        "attempt": ["abandoned", "failed", "finished", "replaced", "running", "stopped", "uncertain"],
        "connect": ["approved", "collected", "expired", "pending", "refused"],
        "oauth": ["approved", "expired", "pending", "redeemed", "refused"],
        "invite": ["accepted", "declined", "expired", "open", "revoked", "spent"],
        "lead": ["agreed", "none", "proposed"],
        "start": ["approved", "none"],
        "account": ["erased", "open"],
        "schedule": ["active", "deleted", "paused", "stopped"],
        "project": ["deleted", "erasing", "live", "purged", "purging"],
    }


def test_the_default_lead_and_the_start_flag_move_only_as_their_tables_say(world):
    db = world.db
    with db.transaction(), pytest.raises(prickle.InvalidState) as e:
        prickle.move(db, "lead", "website-v2", "agree")
    assert str(e.value) == "default lead 'website-v2' is none: agree is not allowed now; what can happen: pick"
    with db.transaction():
        assert prickle.move(db, "lead", "website-v2", "pick", lead_agent="ren/builder", lead_picked_by="oj") == "proposed"
        assert prickle.move(db, "lead", "website-v2", "agree") == "agreed"
    assert prickle.lead_out(db, "website-v2") == {"agent_id": "ren/builder", "state": "agreed", "picked_by": "oj"}
    with db.transaction():
        assert prickle.move(db, "lead", "website-v2", "step_down", lead_agent=None, lead_picked_by=None) == "none"
    assert db.scalar("SELECT lead_state FROM projects WHERE slug = 'website-v2'") is None
    task = prickle.handoff(db, world.actor("oj/muse"), "website-v2", "oj/scout", {
        "task": "Count the links.", "deliverable_type": "doc", "acceptance_criteria": ["A number."],
        "context": "", "files": []})["task"]
    with db.transaction():
        assert prickle.move(db, "start", task["id"], "start", value="run_1") == "approved"
    assert db.scalar("SELECT run_approved FROM tasks WHERE id = ?", (task["id"],)) == "run_1"
    with db.transaction(), pytest.raises(prickle.InvalidState) as e:
        prickle.move(db, "start", task["id"], "start", value="run_2")
    assert str(e.value) == (f"Start flag '{task['id']}' is approved: start is not allowed now; "
                            "what can happen: claim, drop, stop")
    with db.transaction():
        assert prickle.move(db, "start", task["id"], "claim") == "none"
    assert db.scalar("SELECT run_approved FROM tasks WHERE id = ?", (task["id"],)) is None


def test_a_project_lives_until_deleted_or_erased_and_is_restored_only_before_its_purge(world):
    assert prickle.PROJECT_MOVES == {
        "live": {"delete": "deleted", "erase": "erasing"},
        "deleted": {"restore": "live", "purge": "purging"},
        "erasing": {"purge": "purging"},
        "purging": {"finish": "purged"},
        "purged": {},
    }
    prickle.erase_project(world.db, PROJECT, "oj")
    assert world.db.scalar("SELECT state FROM projects WHERE slug = ?", (PROJECT,)) == "erasing"
    with world.db.transaction(), pytest.raises(prickle.InvalidState) as e:
        prickle.move(world.db, "project", PROJECT, "restore")
    assert str(e.value) == (f"project '{PROJECT}' is erasing: restore (an owner when it was deleted, within its "
                            "recovery window) is not allowed now; it is closed")
    assert world.db.scalar("SELECT state FROM projects WHERE slug = ?", (PROJECT,)) == "erasing"
