"""Runs: devices, claims and steps: paired devices, claim_task, a woken run's limits, request_step."""

import datetime as dt

import prickle
from conftest import PROJECT, audit_entries
from helpers import PACKET, P, claimed, decided_step, evidence, paired, person, routed, submit


def test_pairing_a_device_gives_a_runner_key_once_and_is_audited(world, server):
    device, key = paired(world)
    assert key.startswith("prk_rk_") and device["agent_id"] == "ren/builder"
    assert prickle.resolve_token(world.db, key, ("runner",)).credential_kind == "runner"
    entry = audit_entries(world.db, PROJECT, "device.paired")[0]["refs"]
    assert entry == {"device": device["id"], "agent": "ren/builder", "credential": device["credential_id"]}
    r = person(server, world, "ren").post("/api/devices", {"agent_id": "oj/muse"})
    assert r.status_code == 404  # not ren's agent
    devices = person(server, world, "ren").get("/api/devices").json()["devices"]
    assert [d["id"] for d in devices] == [device["id"]]


def test_claim_task_gives_an_attempt_and_an_execution_credential(mcp, server, world):
    task, device, runner, out = claimed(mcp, server, world)
    attempt, cred = out["attempt"], out["execution_credential"]
    assert attempt["task_id"] == task["id"] and attempt["attempt_id"].startswith("att_")
    assert cred["token"].startswith("prk_ex_") and cred["allowed_tools"] == list(prickle.RUN_TOOLS)
    expires = prickle.parse_iso(cred["expires_at"]) - prickle.parse_iso(attempt["claimed_at"])
    assert dt.timedelta(minutes=59) < expires <= dt.timedelta(minutes=60)
    claimed_entry = audit_entries(world.db, PROJECT, "attempt.claimed")[0]["refs"]
    assert claimed_entry["attempt"] == attempt["attempt_id"] and claimed_entry["device"] == device["id"]
    created = [e["refs"] for e in audit_entries(world.db, PROJECT, "token.created") if e["refs"]["kind"] == "execution"]
    assert created[0]["task"] == task["id"] and created[0]["attempt"] == attempt["attempt_id"]
    assert cred["token"] not in str(audit_entries(world.db, PROJECT))


def test_only_a_paired_runner_claims_and_only_its_agents_tasks(mcp, server, world):
    task = routed(mcp, server, world)
    text = mcp.error("ren/builder", "claim_task", {"task_id": task["id"], "idempotency_key": "x"}, "forbidden")
    assert "runner" in text
    _, muse_runner = paired(world, "oj/muse")
    mcp.error("oj/muse", "claim_task", {"task_id": task["id"], "idempotency_key": "x"}, "forbidden",
              token=muse_runner)
    _, runner = paired(world)
    text = mcp.error("ren/builder", "claim_task", {"task_id": task["id"], "idempotency_key": "x",
                                                   "wake": {"message_id": "msg_some_mention"}}, "invalid_input",
                     token=runner)
    assert "a mention is never a run's cause" in text
    assert world.db.scalar("SELECT count(*) FROM attempts") == 0


def test_a_retried_claim_replays_with_a_fresh_credential_and_revokes_the_old(mcp, server, world):
    task, device, runner, first = claimed(mcp, server, world)
    again = mcp.ok("ren/builder", "claim_task", {"task_id": task["id"], "idempotency_key": "k1"}, token=runner)
    assert again["attempt"] == first["attempt"]
    assert again["execution_credential"]["token"] != first["execution_credential"]["token"]
    assert mcp.raw(first["execution_credential"]["token"], "tools/list").status_code == 401
    assert mcp.ok("ren/builder", "check_inbox", {}, token=again["execution_credential"]["token"])
    revoked = [e["refs"] for e in audit_entries(world.db, PROJECT, "token.revoked") if e["refs"]["kind"] == "execution"]
    assert revoked[0]["attempt"] == first["attempt"]["attempt_id"] and revoked[0]["reason"] == "claim_retried"


def test_a_task_request_is_the_runs_cause(mcp, server, world):
    r = person(server, world, "ren").post(f"/api/projects/{PROJECT}/task-requests",
                                          {"agent": "ren/builder", "packet": PACKET})
    task, message = r.json()["task"], r.json()["message"]
    _, runner = paired(world)
    out = mcp.ok("ren/builder", "claim_task", {"task_id": task["id"], "idempotency_key": "k",
                                               "wake": {"message_id": message["id"]}}, token=runner)
    run = out["execution_credential"]["token"]
    mcp.ok("ren/builder", "accept_task", {"task_id": task["id"]}, token=run)
    posted = mcp.ok("ren/builder", "post_message", P | {"body": "On it", "task_id": task["id"]}, token=run)["message"]
    assert posted["lineage"]["cause"] == {"kind": "owner_message", "message_id": message["id"], "author": "ren"}


def test_a_woken_runs_limits(mcp, server, world):
    prickle.set_memory(world.db, PROJECT, "tone", "Warm.", "oj")
    task, device, runner, out = claimed(mcp, server, world)
    run = out["execution_credential"]["token"]
    # only the tools it was given
    text = mcp.error("ren/builder", "handoff", P | {"to": "oj/muse", "packet": PACKET}, "forbidden", token=run)
    assert "may call only" in text
    mcp.error("ren/builder", "wait_for_mention", {"timeout_seconds": 1}, "forbidden", token=run)
    # only its own task's thread
    mcp.error("ren/builder", "read_room", P, "forbidden", token=run)
    mcp.ok("ren/builder", "accept_task", {"task_id": task["id"]}, token=run)
    thread = mcp.ok("ren/builder", "read_room", P | {"task_id": task["id"]}, token=run)
    assert thread["messages"] == []
    assert audit_entries(world.db, PROJECT, "thread.read")[0]["refs"] == {
        "task": task["id"], "attempt": out["attempt"]["attempt_id"], "messages": 0}
    # pulse: availability, its task and an intent only
    pulse = mcp.ok("ren/builder", "update_pulse", P | {"availability": "working",
                                                       "intent": {"kind": "change", "paths": ["docs/hero.md"]}},
                   token=run)["pulse"]
    assert pulse["task_id"] == task["id"] and pulse["doing"] == ""
    text = mcp.error("ren/builder", "update_pulse", P | {"doing": "sneaky", "branch": "x"}, "invalid_input", token=run)
    assert "leave out branch, doing" in text
    mcp.error("ren/builder", "update_pulse", P | {"run_failure": {"class": "auth", "step": "codex_sign_in"}},
              "invalid_input", token=run)
    # memory facts served to a run are recorded, never their contents
    mcp.ok("ren/builder", "get_project_context", P, token=run)
    delivered = audit_entries(world.db, PROJECT, "context.delivered")
    assert [e["refs"] for e in delivered] == [{"delivery": 1, "attempt": out["attempt"]["attempt_id"]}]
    # posts and results carry lineage
    msg = mcp.ok("ren/builder", "post_message", P | {"body": "Working", "task_id": task["id"]}, token=run)["message"]
    lineage = msg["lineage"]
    assert lineage["cause"]["kind"] == "task" and lineage["cause"]["basis"] == "approval"
    assert {c["kind"] for c in lineage["context"]} == {"packet", "memory_fact"}
    assert lineage["context"][1] == {"kind": "memory_fact", "key": "tone", "sha256": prickle.sha256_hex("Warm.")}
    result = mcp.ok("ren/builder", "return_result", {"task_id": task["id"], "summary": "Done.",
                                                     "evidence": [evidence([0, 1])]}, token=run)
    assert result["task"]["result"]["lineage"]["cause"] == lineage["cause"]
    assert audit_entries(world.db, PROJECT, "attempt.finished")[0]["refs"] == {
        "attempt": out["attempt"]["attempt_id"]}


def test_request_step_allow_once(mcp, server, world):
    task, device, runner, out = claimed(mcp, server, world)
    run = out["execution_credential"]["token"]
    call = {"tool_name": "Bash", "input": {"command": "git push origin main"}, "kind": "outbound",
            "target": "origin", "reason": "Publish the reviewed branch."}
    mcp.error("ren/builder", "request_step", call, "forbidden")  # not a run
    first = mcp.ok("ren/builder", "request_step", call, token=run)
    assert (first["status"], first["behavior"]) == ("pending", "deny")
    other = mcp.ok("ren/builder", "request_step", call | {"input": {"command": "rm -rf build"}}, token=run)
    assert other["step_id"] == first["step_id"] and "one at a time" in other["message"]
    still = mcp.ok("ren/builder", "request_step", call, token=run)
    assert still["status"] == "pending" and still["step_id"] == first["step_id"]
    ren = person(server, world, "ren")
    assert person(server, world, "oj").post(f"/api/steps/{first['step_id']}", {"decision": "allow"}).status_code == 404
    steps = ren.get("/api/steps").json()["steps"]
    assert [(s["id"], s["tool_name"], s["input"]) for s in steps] == [
        (first["step_id"], "Bash", {"command": "git push origin main"})]
    builder = mcp.ok("ren/builder", "wait_for_mention", {"timeout_seconds": 1})["cursor"]
    decided = ren.post(f"/api/steps/{first['step_id']}", {"decision": "allow"}).json()["step"]
    assert decided["status"] == "approved"
    woke = mcp.ok("ren/builder", "wait_for_mention", {"cursor": builder, "timeout_seconds": 1})
    assert [e["task"]["id"] for e in woke["events"]] == [task["id"]]  # resumed
    used = mcp.ok("ren/builder", "request_step", call | {"tool_use_id": "toolu_1"}, token=run)
    assert used == {"step_id": first["step_id"], "status": "consumed", "behavior": "allow",
                    "message": "Allowed once: make exactly this call now.",
                    "updatedInput": {"command": "git push origin main"}}
    again = mcp.ok("ren/builder", "request_step", call, token=run)
    assert again["status"] == "pending" and again["step_id"] != first["step_id"]  # used once: a new step
    refs = [e["type"] for e in audit_entries(world.db, PROJECT) if e["type"].startswith("step.")]
    assert refs == ["step.requested", "step.decided", "step.consumed", "step.requested"]
    assert "git push" not in str(audit_entries(world.db, PROJECT))


def test_request_step_refused_and_expiries(mcp, server, world):
    call = {"tool_name": "Bash", "input": {"command": "deploy"}}
    run, step = decided_step(mcp, server, world, call, "deny")
    refused = mcp.ok("ren/builder", "request_step", call, token=run)
    assert (refused["status"], refused["behavior"]) == ("refused", "deny") and "don't try it again" in refused["message"]
    # allowed but not used within 15 minutes
    call2 = {"tool_name": "Bash", "input": {"command": "publish"}}
    step2 = mcp.ok("ren/builder", "request_step", call2, token=run)
    person(server, world, "ren").post(f"/api/steps/{step2['step_id']}", {"decision": "allow"})
    world.db.execute("UPDATE steps SET decided_at = '2020-01-01T00:00:00.000Z' WHERE id = ?", (step2["step_id"],))
    late = mcp.ok("ren/builder", "request_step", call2, token=run)
    assert (late["status"], late["behavior"]) == ("expired", "deny")
    # undecided for 24 hours
    call3 = {"tool_name": "Bash", "input": {"command": "spend"}}
    step3 = mcp.ok("ren/builder", "request_step", call3, token=run)
    world.db.execute("UPDATE steps SET created_at = '2020-01-01T00:00:00.000Z' WHERE id = ?", (step3["step_id"],))
    assert person(server, world, "ren").get("/api/steps").json()["steps"] == []
    # Only an undecided step expires in the reference's sense; an allowance that lapsed unused just ends.
    whys = [e["refs"]["why"] for e in audit_entries(world.db, PROJECT, "step.expired")]
    assert whys == ["undecided_24_hours"]
    assert world.db.scalar("SELECT status FROM steps WHERE id = ?", (step2["step_id"],)) == "expired"


def test_revoking_a_device_ends_its_credentials(mcp, server, world):
    task, device, runner, out = claimed(mcp, server, world)
    r = person(server, world, "ren").delete(f"/api/devices/{device['id']}")
    assert r.json() == {"id": device["id"], "revoked": True, "reason": "owner", "credentials_ended": 2,
                        "runs_stopped": 1}
    assert world.db.scalar("SELECT state FROM attempts WHERE device_id = ?", (device["id"],)) == "stopped"
    assert mcp.raw(runner, "tools/list").status_code == 401
    assert mcp.raw(out["execution_credential"]["token"], "tools/list").status_code == 401
    assert audit_entries(world.db, PROJECT, "device.revoked")[0]["refs"]["credentials"] == 2


def test_revoking_a_runner_key_ends_its_device_and_the_runs_it_claimed(mcp, server, world):
    task, device, runner, out = claimed(mcp, server, world)
    execution = out["execution_credential"]["token"]
    assert mcp.ok("ren/builder", "read_room", P | {"task_id": task["id"]}, token=execution)
    key_id = world.db.scalar("SELECT id FROM credentials WHERE secret_hash = ?", (prickle.sha256_hex(runner),))
    assert person(server, world, "ren").delete(f"/api/keys/{key_id}").json()["revoked"] is True
    for token in (runner, execution):
        assert mcp.raw(token, "tools/list").status_code == 401
    [listed] = [d for d in person(server, world, "ren").get("/api/devices").json()["devices"] if d["id"] == device["id"]]
    assert listed["revoked_at"] is not None and listed["revoked_reason"] == "key_revoked"
    assert world.db.scalar("SELECT state FROM attempts WHERE id = ?", (out["attempt"]["attempt_id"],)) == "stopped"
    assert audit_entries(world.db, PROJECT, "task.run_stopped")[-1]["refs"]["reason"] == "device_revoked"
    assert audit_entries(world.db, PROJECT, "device.revoked")[-1]["refs"] == {
        "device": device["id"], "agent": "ren/builder", "reason": "key_revoked", "credentials": 1}


def test_a_secret_given_where_an_id_belongs_is_not_repeated(world, server):
    _, runner = paired(world)
    for token in (runner, world.keys["ren/builder"]):
        r = person(server, world, "ren").delete(f"/api/keys/{token}")
        assert r.status_code == 400 and token not in r.text and "not a credential id" in r.text
    assert world.db.scalar("SELECT count(*) FROM credentials WHERE revoked_at IS NOT NULL") == 0


def test_a_run_ends_when_its_tasks_approval_lapses_and_the_gate_holds_it_again(mcp, server, world):
    task, device, runner, out = claimed(mcp, server, world)
    run = out["execution_credential"]["token"]
    call = {"tool_name": "Bash", "input": {"command": "git push origin main"}, "kind": "outbound",
            "target": "origin", "reason": "Publish the reviewed branch."}
    assert prickle.sweep_approvals(world.db, prickle.utcnow() + dt.timedelta(hours=25)) == 1
    assert prickle.visible_task(world.db, world.actor("oj/muse"), PROJECT, task["id"])["state"] == "approval"
    # The task is not the assignee's any more: its run can ask for no step, and is over.
    assert prickle.not_live_because(world.db.one(
        "SELECT * FROM credentials WHERE attempt_id = ?", (out["attempt"]["attempt_id"],))) is not None
    r = server.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                                  "params": {"name": "request_step", "arguments": call}},
                    headers={"Authorization": f"Bearer {run}", "Accept": "application/json, text/event-stream"})
    assert r.status_code == 401 and r.json()["error"]["message"] == (
        "this credential was revoked: ask its owner for a new one")
    attempt = world.db.one("SELECT state FROM attempts WHERE id = ?", (out["attempt"]["attempt_id"],))
    assert attempt == {"state": "stopped"}
    assert world.db.scalar("SELECT count(*) FROM steps") == 0


def test_a_requesting_agents_runner_claims_a_verification_run_that_can_only_read_and_decide(mcp, server, world):
    task = routed(mcp, server, world)  # oj/muse asked ren/builder
    _, muse_runner = paired(world, "oj/muse")
    _, builder_runner = paired(world)
    run = mcp.ok("ren/builder", "claim_task", {"task_id": task["id"], "idempotency_key": "w1"}, token=builder_runner)
    work = run["execution_credential"]["token"]
    mcp.ok("ren/builder", "accept_task", {"task_id": task["id"]}, token=work)
    verify = lambda key: server.post(f"/api/runner/tasks/{task['id']}/verify",  # noqa: E731
                                     json={"idempotency_key": key}, headers={"Authorization": f"Bearer {muse_runner}"})
    assert verify("v0").status_code == 409  # nothing to verify yet
    sub = mcp.ok("ren/builder", "return_result", {"task_id": task["id"], "summary": "Done.", "evidence": [
        evidence([0, 1])], "artifacts": [{"ref": "https://example.com/hero.md", "sha256": "a" * 64}]},
        token=work)["submission"]
    claim = verify("v1").json()
    cred = claim["execution_credential"]
    assert cred["allowed_tools"] == ["get_project_context", "read_room", "check_inbox", "accept_result",
                                     "reject_result"]
    assert claim["task"]["result"]["submission_id"] == sub["submission_id"]
    assert verify("v2").status_code == 409  # one verification at a time
    assert server.post(f"/api/runner/tasks/{task['id']}/verify", json={"idempotency_key": "v3"},
                       headers={"Authorization": f"Bearer {builder_runner}"}).status_code == 403  # not the requester
    text = mcp.error("oj/muse", "post_message", {"project": PROJECT, "body": "hi"}, "forbidden", token=cred["token"])
    assert "post_message" in text
    board = person(server, world, "oj").get(f"/api/tasks/{task['id']}").json()
    assert (board["task"]["verification"], [(r["purpose"], r["state"]) for r in board["runs"]]) == (
        "running", [("work", "finished"), ("verify", "running")])
    mcp.ok("oj/muse", "accept_result", {"task_id": task["id"], "submission_id": sub["submission_id"],
                                        "revision": sub["revision"], "artifacts": sub["artifacts"],
                                        "verdicts": [{"criterion": 0, "accepted": True},
                                                     {"criterion": 1, "accepted": True}]}, token=cred["token"])
    runs = person(server, world, "oj").get(f"/api/tasks/{task['id']}").json()["runs"]
    assert [(r["purpose"], r["state"], r["agent_id"]) for r in runs] == [
        ("work", "finished", "ren/builder"), ("verify", "finished", "oj/muse")]
    assert [e["refs"].get("purpose") for e in audit_entries(world.db, PROJECT, "attempt.claimed")] == [None, "verify"]


def test_a_result_nothing_verifies_can_be_asked_for_in_the_thread_by_the_requesting_agents_owner(mcp, server, world):
    task = routed(mcp, server, world)  # oj/muse asked ren/builder; no runner of oj/muse listens
    oj, ren = person(server, world, "oj"), person(server, world, "ren")
    ask = lambda who: who.post(f"/api/tasks/{task['id']}/ask-to-verify", {})  # noqa: E731
    r = ask(oj)
    assert (r.status_code, r.json()["error"]["message"]) == (
        409, f"task '{task['id']}' is routed: there is no result for an agent to verify")
    mcp.ok("ren/builder", "accept_task", {"task_id": task["id"]})
    submit(mcp, task["id"])
    assert oj.get(f"/api/tasks/{task['id']}").json()["task"]["can_ask_to_verify"] is True
    assert ren.get(f"/api/tasks/{task['id']}").json()["task"]["can_ask_to_verify"] is False
    r = ask(ren)
    assert (r.status_code, r.json()["error"]["message"]) == (403, "only oj, who owns oj/muse, asks it to verify")
    r = ask(oj)
    assert r.status_code == 200, r.text
    message = r.json()["message"]
    assert (message["body"], message["task_id"], message["mentions"]) == (
        "@oj/muse revision 1 of the result waits for you to verify it: read the task, then accept_result or "
        "reject_result.", task["id"], ["oj/muse"])
    # Asked again (a second click, a reload) for the same revision: the same message, nothing posted twice.
    again = ask(oj)
    assert (again.status_code, again.json()["message"]["id"]) == (200, message["id"])
    assert world.db.scalar("SELECT count(*) FROM messages WHERE task_id = ?", (task["id"],)) == 1
    # A session of oj/muse hears it: the mention it missed comes at once.
    heard = mcp.ok("oj/muse", "wait_for_mention", {"project": PROJECT, "timeout_seconds": 1})
    assert [(e["kind"], e["message"]["id"]) for e in heard["events"]] == [("mention", message["id"])]
    assert audit_entries(world.db, PROJECT)[-1]["type"] == "message.posted"


def test_a_persons_own_request_is_theirs_to_decide_not_an_agents_to_verify(mcp, server, world):
    oj = person(server, world, "oj")
    r = oj.post(f"/api/projects/{PROJECT}/task-requests", {"agent": "oj/muse", "packet": PACKET})
    assert r.status_code == 200, r.text
    task_id = r.json()["task"]["id"]
    mcp.ok("oj/muse", "accept_task", {"task_id": task_id})
    mcp.ok("oj/muse", "return_result", {"task_id": task_id, "summary": "Done.", "evidence": [evidence([0, 1])]})
    r = oj.post(f"/api/tasks/{task_id}/ask-to-verify", {})
    assert (r.status_code, r.json()["error"]["message"]) == (
        409, f"task '{task_id}' waits on oj's own decision, not an agent's: give final acceptance or send it back")
