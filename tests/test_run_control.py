"""Run control: the owner's Start and Stop, hand back, pause, uncertain runs."""

import prickle
from conftest import PROJECT, REFERENCE_EVENTS, all_events, audit_entries
from helpers import P, add_passkey, ask_connect, claimed, confirm_with, confirmed, paired, person, routed

CALL = {"tool_name": "Bash", "input": {"command": "git push origin main"}}


def runner_state(server, key):
    r = server.get("/api/runner/state", headers={"Authorization": f"Bearer {key}"})
    assert r.status_code == 200, r.text
    return r.json()


# -- Start a run, Stop, hand back --------------------------------------------------------

def test_stop_ends_the_runs_credentials_withdraws_its_step_and_needs_a_new_start(mcp, server, world):
    task, device, runner, out = claimed(mcp, server, world)
    run = out["execution_credential"]["token"]
    step = mcp.ok("ren/builder", "request_step", CALL, token=run)
    ren, oj = person(server, world, "ren"), person(server, world, "oj")
    listen = mcp.ok("ren/builder", "wait_for_mention", {"timeout_seconds": 1}, token=runner)["cursor"]
    assert oj.post(f"/api/tasks/{task['id']}/stop").status_code == 403  # not the assignee's owner
    stopped = ren.post(f"/api/tasks/{task['id']}/stop")
    assert stopped.status_code == 200, stopped.text
    assert stopped.json()["credentials_ended"] == 1
    [attempt] = stopped.json()["runs"]
    assert (attempt["attempt"], attempt["state"], attempt["device"]) == (1, "stopped", "laptop")
    assert mcp.raw(run, "tools/list").status_code == 401  # at once
    woke = mcp.ok("ren/builder", "wait_for_mention", {"cursor": listen, "timeout_seconds": 1}, token=runner)
    assert [e["task"]["id"] for e in woke["events"]] == [task["id"]]
    state = runner_state(server, runner)
    assert [(r["attempt_id"], r["state"]) for r in state["runs"]] == [(out["attempt"]["attempt_id"], "stopped")]
    assert world.db.scalar("SELECT status FROM steps WHERE id = ?", (step["step_id"],)) == "withdrawn"
    assert ren.get("/api/steps").json()["steps"] == []
    [withdrawn] = audit_entries(world.db, PROJECT, "step.withdrawn")
    assert withdrawn["refs"] == {"step": step["step_id"], "attempt": out["attempt"]["attempt_id"]}
    [entry] = audit_entries(world.db, PROJECT, "task.run_stopped")
    assert entry["refs"] == {"agent": "ren/builder", "run": world.db.scalar("SELECT run_id FROM attempts"),
                             "task": task["id"], "by": "ren", "reason": "stopped", "state_before": "routed",
                             "attempt": out["attempt"]["attempt_id"], "credentials": 1}
    # the runner can't just claim it again: its owner starts the next run
    text = mcp.error("ren/builder", "claim_task", {"task_id": task["id"], "idempotency_key": "k2"}, "invalid_state",
                     token=runner)
    assert "Start a run" in text
    r = ren.post(f"/api/tasks/{task['id']}/runs")
    assert r.status_code == 403 and r.json()["error"]["code"] == "step_up_required"  # tests/test_step_up.py
    confirm_with(ren, add_passkey(ren)[0])
    started = ren.post(f"/api/tasks/{task['id']}/runs")
    assert started.status_code == 200, started.text
    run_id = started.json()["run_id"]
    assert ren.post(f"/api/tasks/{task['id']}/runs").status_code == 409  # one at a time
    [approved] = audit_entries(world.db, PROJECT, "task.run_approved")
    assert approved["refs"] == {"agent": "ren/builder", "run": run_id, "task": task["id"], "by": "ren", "step_up": True}
    second = mcp.ok("ren/builder", "claim_task", {"task_id": task["id"], "idempotency_key": "k2"}, token=runner)
    runs = ren.get(f"/api/tasks/{task['id']}").json()["runs"]
    assert [(r["attempt"], r["state"], r["run_id"]) for r in runs] == [
        (1, "stopped", runs[0]["run_id"]), (2, "running", run_id)]
    assert runs[1]["attempt_id"] == second["attempt"]["attempt_id"]
    # a run is open: no second Start, and no hand back before a Stop
    assert ren.post(f"/api/tasks/{task['id']}/runs").status_code == 409
    assert ren.post(f"/api/tasks/{task['id']}/hand-back").status_code == 409
    ren.post(f"/api/tasks/{task['id']}/stop")
    oj_wait = mcp.ok("oj/muse", "wait_for_updates", {"timeout_seconds": 1})["cursor"]
    back = ren.post(f"/api/tasks/{task['id']}/hand-back")
    assert back.status_code == 200, back.text
    assert back.json()["task"]["state"] == "returned"
    heard = mcp.ok("oj/muse", "wait_for_updates", {"cursor": oj_wait, "timeout_seconds": 1})
    assert [(u["kind"], u["task_id"]) for u in heard["updates"]] == [("task", task["id"])]
    [returned] = audit_entries(world.db, PROJECT, "task.returned")
    assert returned["refs"] == {"task": task["id"], "reason": "owner_handed_back", "agent": "ren/builder", "by": "ren"}


def test_a_new_claim_replaces_the_open_run_of_the_task(mcp, server, world):
    task, device, runner, first = claimed(mcp, server, world)
    second = mcp.ok("ren/builder", "claim_task", {"task_id": task["id"], "idempotency_key": "k2"}, token=runner)
    assert second["attempt"]["attempt_id"] != first["attempt"]["attempt_id"]
    assert mcp.raw(first["execution_credential"]["token"], "tools/list").status_code == 401
    assert [r["state"] for r in runner_state(server, runner)["runs"]] == ["running", "replaced"]
    text = mcp.error("ren/builder", "claim_task", {"task_id": task["id"], "idempotency_key": "k1"}, "invalid_state",
                     token=runner)
    assert "replaced" in text


def test_start_needs_a_connected_runner_and_a_task_that_can_run(mcp, server, world):
    task = routed(mcp, server, world)
    ren = confirmed(server, world, "ren")
    r = ren.post(f"/api/tasks/{task['id']}/runs")
    assert r.status_code == 409 and "prickle runner connect" in r.json()["error"]["message"]
    assert person(server, world, "oj").post(f"/api/tasks/{task['id']}/runs").json()["error"]["code"] == "forbidden"
    assert ren.get(f"/api/tasks/{task['id']}").json()["run_control"] == {
        "paused": None, "pause_scope": None, "runner_connected": False, "run_approved": None, "can_start": True, "can_stop": False,
        "can_hand_back": True}
    assert person(server, world, "oj").get(f"/api/tasks/{task['id']}").json()["run_control"] is None
    assert audit_entries(world.db, PROJECT, "task.run_approved") == []


def test_cancelling_a_task_stops_its_run(mcp, server, world):
    task, device, runner, out = claimed(mcp, server, world)
    assert person(server, world, "oj").post(f"/api/tasks/{task['id']}/cancel").status_code == 200
    assert [r["state"] for r in runner_state(server, runner)["runs"]] == ["stopped"]
    assert mcp.raw(out["execution_credential"]["token"], "tools/list").status_code == 401


# -- pause -------------------------------------------------------------------------------

def test_pausing_an_owners_agents_refuses_their_runs_at_the_next_call(mcp, server, world):
    task, device, runner, out = claimed(mcp, server, world)
    run = out["execution_credential"]["token"]
    ren = confirmed(server, world, "ren")
    paused = ren.post("/api/agents/pause")
    assert paused.json() == {"scope": "ren", "paused": True, "active_runs": 1}
    assert ren.post("/api/agents/pause").status_code == 409
    paused = ren.get("/api/agents/paused").json()
    assert paused == {"paused_by": "owner", "agents": [{"agent_id": "ren/builder", "name": "Builder", "by": "owner",
                                                       "scope": "owner", "since": paused["agents"][0]["since"]}]}
    text = mcp.error("ren/builder", "read_room", P | {"task_id": task["id"]}, "paused", token=run)
    assert "resumed" in text
    mcp.error("ren/builder", "claim_task", {"task_id": task["id"], "idempotency_key": "k9"}, "paused", token=runner)
    assert runner_state(server, runner)["paused_by"] == "owner"
    assert ren.post(f"/api/tasks/{task['id']}/runs").json()["error"]["code"] == "paused"
    mcp.ok("oj/muse", "read_room", P)  # oj's agents run on
    [entry] = audit_entries(world.db, PROJECT, "agents.paused")
    assert entry["refs"] == {"scope": "owner", "owner": "ren", "by": "ren", "active_runs": 1}
    assert ren.post("/api/agents/resume").json() == {"scope": "ren", "paused": False}
    assert mcp.ok("ren/builder", "read_room", P | {"task_id": task["id"]}, token=run)["messages"] == []
    [resumed] = audit_entries(world.db, PROJECT, "agents.resumed")
    assert resumed["refs"] == {"scope": "owner", "owner": "ren", "by": "ren"}


def test_the_operator_pauses_every_agent_from_the_command_line(mcp, server, world, db_path):
    from helpers import jrun, run
    task, device, runner, out = claimed(mcp, server, world)
    assert jrun(db_path, "agents", "pause", "--all") == {"scope": "all", "paused": True, "active_runs": 1}
    mcp.error("ren/builder", "checkpoint", {"task_id": task["id"], "checkpoint": {"progress": "x"}}, "paused",
              token=out["execution_credential"]["token"])
    assert runner_state(server, runner)["paused_by"] == "operator"
    assert person(server, world, "oj").get("/api/agents/paused").json()["paused_by"] == "operator"
    assert person(server, world, "ren").post("/api/agents/resume").status_code == 409  # not theirs to lift
    [entry] = audit_entries(world.db, PROJECT, "agents.paused")
    assert entry["refs"] == {"scope": "all", "active_runs": 1}
    assert audit_entries(world.db, "side", "agents.paused")[0]["refs"] == {"scope": "all", "active_runs": 0}
    code, _, err = run(db_path, "agents", "pause", ok=False)
    assert code == 1 and "--all" in err
    assert jrun(db_path, "agents", "resume", "--all") == {"scope": "all", "paused": False}
    assert runner_state(server, runner)["paused"] is False


def test_an_owner_pauses_one_agent_its_run_stops_and_everyone_sees_it(mcp, server, world):
    task, device, runner, out = claimed(mcp, server, world)
    run = out["execution_credential"]["token"]
    ren, oj = person(server, world, "ren"), person(server, world, "oj")
    r = oj.post("/api/agents/ren/builder/pause")
    assert r.status_code == 403 and r.json()["error"]["message"] == "only ren, its owner, can pause or resume ren/builder"
    assert ren.post("/api/agents/ren/nobody/pause").status_code == 404
    bad = ren.post("/api/agents/REN/Builder!/pause").json()["error"]
    assert (bad["code"], bad["message"]) == ("invalid_input",
                                             "agent_id must be an agent address like 'oj/muse', got 'REN/Builder!'")
    assert world.db.scalar("SELECT count(*) FROM pauses") == 0
    assert ren.post("/api/agents/ren/builder/pause").json() == {"scope": "ren/builder", "paused": True, "active_runs": 1}
    assert ren.post("/api/agents/ren/builder/pause").json()["error"]["message"] == "ren/builder is already paused"
    text = mcp.error("ren/builder", "read_room", P | {"task_id": task["id"]}, "paused", token=run)
    assert text.startswith("paused: ren/builder is paused by ren: nothing of ren/builder runs until it is resumed")
    state = runner_state(server, runner)
    assert (state["paused"], state["paused_by"]) == (True, "owner")
    mcp.ok("oj/muse", "read_room", P)
    # every member sees it: the task page, the project (Pulse), the owner's own list
    pause = oj.get(f"/api/tasks/{task['id']}").json()["assignee_paused"]
    assert pause == {"by": "owner", "scope": "agent", "since": pause["since"]}
    assert oj.get(f"/api/projects/{PROJECT}").json()["paused_agents"] == {"ren/builder": pause}
    assert ren.get(f"/api/tasks/{task['id']}").json()["run_control"]["pause_scope"] == "agent"
    assert ren.get("/api/agents/paused").json() == {"paused_by": None, "agents": [
        {"agent_id": "ren/builder", "name": "Builder"} | pause]}
    [entry] = audit_entries(world.db, PROJECT, "agents.paused")
    assert entry["refs"] == {"scope": "agent", "agent": "ren/builder", "by": "ren", "active_runs": 1}
    # Live views hear of it through its open task (the reference has no event for a pause).
    last = all_events(world.db)[-1]
    assert (last["type"], last["task"]["id"], last["task"]["assignee"]) == ("task.updated", task["id"], "ren/builder")
    assert ren.post("/api/agents/ren/builder/resume").json() == {"scope": "ren/builder", "paused": False}
    assert ren.post("/api/agents/ren/builder/resume").json()["error"]["message"] == "ren/builder is not paused by its owner"
    assert mcp.ok("ren/builder", "read_room", P | {"task_id": task["id"]}, token=run)["messages"] == []
    assert oj.get(f"/api/tasks/{task['id']}").json()["assignee_paused"] is None
    rooms = [r["project"] for r in world.db.rows("SELECT project FROM project_agents WHERE agent_id = 'ren/builder' "
                                                  "ORDER BY project")]
    assert PROJECT in rooms and len(rooms) == 2  # the project and ren's private room
    last = all_events(world.db)[-1]
    assert (last["type"], last["task"]["id"]) == ("task.updated", task["id"])
    assert {e["type"] for e in all_events(world.db)} <= set(REFERENCE_EVENTS)


def test_resuming_one_agent_of_an_owner_who_paused_them_all_keeps_the_others_paused(server, world):
    oj = person(server, world, "oj")
    assert oj.post("/api/agents/pause").json() == {"scope": "oj", "paused": True, "active_runs": 0}
    assert oj.post("/api/agents/oj/scout/pause").json()["error"]["code"] == "invalid_state"  # already, with all
    assert oj.post("/api/agents/oj/scout/resume").json() == {"scope": "oj/scout", "paused": False}
    paused = oj.get("/api/agents/paused").json()
    assert paused["paused_by"] is None
    assert [(a["agent_id"], a["scope"]) for a in paused["agents"]] == [("oj/muse", "agent")]
    assert prickle.agent_pause(world.db, "oj/scout") is None
    # "Resume all" lifts each one's pause too
    assert oj.post("/api/agents/resume").json() == {"scope": "oj", "paused": False}
    assert oj.get("/api/agents/paused").json() == {"paused_by": None, "agents": []}
    assert oj.post("/api/agents/resume").status_code == 409


def test_the_operator_holds_an_agent_its_owner_resumed_and_pauses_one_from_the_command_line(server, world, db_path):
    from helpers import jrun, run
    assert jrun(db_path, "agents", "pause", "--agent", "oj/muse") == {
        "scope": "oj/muse", "paused": True, "active_runs": 0}
    assert [(a["agent_id"], a["scope"]) for a in person(server, world, "oj").get("/api/agents/paused").json()["agents"]] \
        == [("oj/muse", "agent")]
    code, _, err = run(db_path, "agents", "pause", "--agent", "oj/muse", "--all", ok=False)
    assert code == 1 and "--agent OWNER/NAME" in err
    assert jrun(db_path, "agents", "pause", "--all")["scope"] == "all"
    assert person(server, world, "oj").post("/api/agents/oj/muse/resume").json() == {"scope": "oj/muse",
                                                                                  "paused": True}
    assert prickle.agent_pause(world.db, "oj/muse")["by"] == "operator"
    assert jrun(db_path, "agents", "resume", "--all") == {"scope": "all", "paused": False}
    assert prickle.agent_pause(world.db, "oj/muse") is None


# -- uncertain runs ----------------------------------------------------------------------

def test_a_runner_marks_a_run_uncertain_and_the_owner_settles_it(mcp, server, world):
    task, device, runner, out = claimed(mcp, server, world)
    attempt = out["attempt"]["attempt_id"]
    _, other_runner = paired(world)
    h = {"Authorization": f"Bearer {other_runner}"}
    assert server.post(f"/api/runner/attempts/{attempt}/uncertain", json={}, headers=h).status_code == 404
    r = server.post(f"/api/runner/attempts/{attempt}/uncertain", json={"reason": "restarted"},
                    headers={"Authorization": f"Bearer {runner}"})
    assert r.status_code == 200, r.text
    assert r.json()["attempt"]["state"] == "uncertain"
    assert mcp.raw(out["execution_credential"]["token"], "tools/list").status_code == 401
    again = server.post(f"/api/runner/attempts/{attempt}/uncertain", json={},
                        headers={"Authorization": f"Bearer {runner}"})
    assert again.status_code == 409
    text = mcp.error("ren/builder", "claim_task", {"task_id": task["id"], "idempotency_key": "k2"}, "invalid_state",
                     token=runner)
    assert "uncertain" in text
    assert audit_entries(world.db, PROJECT, "attempt.marked_uncertain")[0]["refs"] == {"attempt": attempt}
    ren = confirmed(server, world, "ren")
    assert person(server, world, "oj").post(f"/api/attempts/{attempt}/settle",
                                            {"outcome": "abandoned"}).status_code == 404
    assert ren.post(f"/api/attempts/{attempt}/settle", {"outcome": "lost"}).status_code == 400
    settled = ren.post(f"/api/attempts/{attempt}/settle", {"outcome": "abandoned"})
    assert settled.status_code == 200, settled.text
    assert [r["state"] for r in settled.json()["runs"]] == ["abandoned"]
    assert ren.post(f"/api/attempts/{attempt}/settle", {"outcome": "finished"}).status_code == 409
    assert audit_entries(world.db, PROJECT, "attempt.reconciled")[0]["refs"] == {"attempt": attempt,
                                                                                 "outcome": "abandoned"}
    # after an abandoned run the owner starts the next one
    mcp.error("ren/builder", "claim_task", {"task_id": task["id"], "idempotency_key": "k2"}, "invalid_state",
              token=runner)
    assert ren.post(f"/api/tasks/{task['id']}/runs").status_code == 200
    mcp.ok("ren/builder", "claim_task", {"task_id": task["id"], "idempotency_key": "k2"}, token=runner)


def test_asking_to_connect_is_bounded_and_marking_uncertain_keeps_a_waiting_step(mcp, server, world, monkeypatch):
    monkeypatch.setattr(prickle, "CONNECT_PER_ADDRESS", 2)
    ask_connect(server)
    ask_connect(server)
    r = server.post("/api/runner/connect", json={"name": "third", "clis": ["codex"]})
    assert r.status_code == 409 and "2 requests from this address already wait" in r.json()["error"]["message"]
    task, device, runner, out = claimed(mcp, server, world)
    step = mcp.ok("ren/builder", "request_step", CALL, token=out["execution_credential"]["token"])
    server.post(f"/api/runner/attempts/{out['attempt']['attempt_id']}/uncertain", json={},
                headers={"Authorization": f"Bearer {runner}"})
    assert world.db.scalar("SELECT status FROM steps WHERE id = ?", (step["step_id"],)) == "pending"
    assert audit_entries(world.db, PROJECT, "step.withdrawn") == []


def test_cancelling_a_task_withdraws_a_step_its_ended_run_left_waiting(mcp, server, world):
    task, device, runner, out = claimed(mcp, server, world)
    step = mcp.ok("ren/builder", "request_step", CALL, token=out["execution_credential"]["token"])
    attempt = out["attempt"]["attempt_id"]
    server.post(f"/api/runner/attempts/{attempt}/uncertain", json={}, headers={"Authorization": f"Bearer {runner}"})
    ren, oj = person(server, world, "ren"), person(server, world, "oj")
    assert [s["id"] for s in ren.get("/api/steps").json()["steps"]] == [step["step_id"]]  # the run is over
    r = oj.post(f"/api/tasks/{task['id']}/cancel", {"reason": "Not needed any more."})
    assert r.status_code == 200 and r.json()["task"]["state"] == "cancelled", r.text
    assert world.db.scalar("SELECT status FROM steps WHERE id = ?", (step["step_id"],)) == "withdrawn"
    assert ren.get("/api/steps").json()["steps"] == []
    assert [i for i in ren.get("/api/inbox").json()["items"] if i["kind"] == "step"] == []
    [withdrawn] = audit_entries(world.db, PROJECT, "step.withdrawn")
    assert withdrawn["refs"] == {"step": step["step_id"], "attempt": attempt}
    r = ren.post(f"/api/steps/{step['step_id']}", {"decision": "allow"})
    assert r.status_code == 409 and "is withdrawn, not waiting for a decision" in r.json()["error"]["message"]


def test_a_run_that_ends_with_its_task_says_so_and_a_stopped_task_waits_on_stopped(mcp, server, world):
    ren, oj = confirmed(server, world, "ren"), person(server, world, "oj")
    # Stopped: the task waits on "stopped" until a run goes on with it.
    task, device, runner, out = claimed(mcp, server, world)
    run = out["execution_credential"]["token"]
    mcp.ok("ren/builder", "accept_task", {"task_id": task["id"]}, token=run)
    assert ren.post(f"/api/tasks/{task['id']}/stop").status_code == 200
    assert mcp.ok("oj/muse", "check_inbox", {})["requested"][0]["waiting_on"] == "stopped"
    assert ren.post(f"/api/tasks/{task['id']}/runs").status_code == 200  # Start a run
    assert mcp.ok("oj/muse", "check_inbox", {})["requested"][0]["waiting_on"] == "stopped"
    again = mcp.ok("ren/builder", "claim_task", {"task_id": task["id"], "idempotency_key": "k2"}, token=runner)
    assert mcp.ok("oj/muse", "check_inbox", {})["requested"][0]["waiting_on"] == "agent"
    # Finished: its result is in.
    mcp.ok("ren/builder", "return_result", {"task_id": task["id"], "summary": "Done.", "evidence": [
        {"kind": "test_output", "summary": "Counted.", "content": "6 words", "criteria": [0, 1]}],
        "artifacts": [{"ref": "https://example.com/hero.md", "sha256": "a" * 64}]},
        token=again["execution_credential"]["token"])
    # Cancelled: a second task's run ends with it.
    other = mcp.ok("oj/muse", "handoff", P | {"to": "ren/builder", "packet": {
        "task": "Draft the footer.", "deliverable_type": "doc", "acceptance_criteria": ["Two lines."]}})
    ren.post(f"/api/approvals/{other['gate']['approval_id']}", {"decision": "approve"})
    third = mcp.ok("ren/builder", "claim_task", {"task_id": other["task"]["id"], "idempotency_key": "k3"},
                   token=runner)
    assert oj.post(f"/api/tasks/{other['task']['id']}/cancel").status_code == 200
    entries = [e["refs"] for e in audit_entries(world.db, PROJECT, "task.run_stopped")]
    runs = {r["attempt_id"]: r["run_id"] for r in world.db.rows("SELECT id AS attempt_id, run_id FROM attempts")}
    assert [(e["reason"], e["run"], e.get("by")) for e in entries] == [
        ("stopped", runs[out["attempt"]["attempt_id"]], "ren"),
        ("finished", runs[again["attempt"]["attempt_id"]], None),
        ("cancelled", runs[third["attempt"]["attempt_id"]], None)]
    assert {e["agent"] for e in entries} == {"ren/builder"}


def test_a_step_whose_agent_leaves_expires_as_its_owner_can_no_longer_decide_it(mcp, server, world):
    task, device, runner, out = claimed(mcp, server, world)
    run = out["execution_credential"]["token"]
    mcp.ok("ren/builder", "accept_task", {"task_id": task["id"]}, token=run)
    mcp.ok("ren/builder", "checkpoint", {"task_id": task["id"], "checkpoint": {"progress": "Half done."}}, token=run)
    assert mcp.ok("oj/muse", "check_inbox", {})["requested"][0]["latest_checkpoint_by"]["handed_back"] is False
    step = mcp.ok("ren/builder", "request_step", CALL, token=run)
    assert person(server, world, "oj").delete(f"/api/projects/{PROJECT}/agents/ren/builder").status_code == 200
    assert world.db.scalar("SELECT status FROM steps WHERE id = ?", (step["step_id"],)) == "expired"
    assert [e["refs"] for e in audit_entries(world.db, PROJECT, "step.expired")] == [
        {"step": step["step_id"], "attempt": out["attempt"]["attempt_id"], "kind": None,
         "why": "owner_could_not_decide"}]
    assert audit_entries(world.db, PROJECT, "step.withdrawn") == []
    assert [e["refs"]["reason"] for e in audit_entries(world.db, PROJECT, "task.run_stopped")] == ["returned"]
    # The checkpoint of an agent the task came back from says so.
    back = mcp.ok("oj/muse", "check_inbox", {})["requested"][0]
    assert (back["state"], back["latest_checkpoint_by"]) == (
        "returned", {"agent": "ren/builder", "provenance": "agent_generated", "handed_back": True})
