"""Reach and limits that testers tried to get around: credentials, rooms, runs, steps, cards."""

import prickle
from conftest import PROJECT, audit_entries
from helpers import PACKET, P, ROOM, claim, claimed, decided_step, listen, person, say, setup_room, woke


def test_what_one_credential_may_reach_is_not_lent_to_another(mcp, world):
    _, runner = prickle.pair_device(world.db, "oj", "oj/muse")
    assert mcp.ok("oj/muse", "read_room", {"project": ROOM}, token=runner)["messages"] == []
    mcp.error("oj/muse", "read_room", {"project": ROOM}, "not_found")  # the plain key, right after
    _, rooms = prickle.create_token(world.db, "client", agent_id="oj/muse", project=prickle.ROOMS_SCOPE)
    mcp.ok("oj/muse", "read_room", P)
    mcp.error("oj/muse", "read_room", P, "not_found", token=rooms)


def test_room_wakes_reach_only_credentials_that_reach_the_room(mcp, server, world):
    setup_room(world)
    _, rooms = prickle.create_token(world.db, "client", agent_id="oj/muse", project=prickle.ROOMS_SCOPE)
    plain = mcp.ok("oj/muse", "wait_for_mention", {"timeout_seconds": 1})["cursor"]
    scoped = mcp.ok("oj/muse", "wait_for_mention", {"timeout_seconds": 1}, token=rooms)["cursor"]
    say(server, world, "A secret plan for the room")
    assert mcp.ok("oj/muse", "wait_for_mention", {"cursor": plain, "timeout_seconds": 1})["events"] == []
    heard = mcp.ok("oj/muse", "wait_for_mention", {"cursor": scoped, "timeout_seconds": 1}, token=rooms)["events"]
    assert [e["kind"] for e in heard] == ["room"]


def test_a_run_works_only_on_its_own_task(mcp, server, world):
    task, device, runner, out = claimed(mcp, server, world)
    run = out["execution_credential"]["token"]
    other = prickle.handoff(world.db, world.actor("ren/builder"), PROJECT, "oj/muse", PACKET)["task"]
    mine = prickle.request_task(world.db, world.person("ren"), PROJECT, "ren/builder", PACKET)["task"]
    for tool, args in (("accept_task", {"task_id": mine["id"]}),
                       ("checkpoint", {"task_id": mine["id"], "checkpoint": {"progress": "x"}})):
        mcp.error("ren/builder", tool, args, "not_found", token=run)
    mcp.error("ren/builder", "post_message", P | {"body": "x", "task_id": mine["id"]}, "forbidden", token=run)
    mcp.error("ren/builder", "post_message", P | {"body": "general chat"}, "forbidden", token=run)
    inbox = mcp.ok("ren/builder", "check_inbox", {"include_closed": True}, token=run)
    assert [t["id"] for t in inbox["assigned"]] == [task["id"]] and inbox["requested"] == []
    assert other["id"] not in str(inbox)


def test_cancelling_a_task_ends_its_runs_and_no_new_run_starts(mcp, server, world):
    task, device, runner, out = claimed(mcp, server, world)
    person(server, world, "oj").post(f"/api/tasks/{task['id']}/cancel")
    assert mcp.raw(out["execution_credential"]["token"], "tools/list").status_code == 401
    mcp.error("ren/builder", "claim_task", {"task_id": task["id"], "idempotency_key": "k1"}, "invalid_state",
              token=runner)


def test_a_second_discussion_credential_cannot_post_a_second_reply(mcp, server, world):
    runners = setup_room(world)
    _, rooms = prickle.create_token(world.db, "client", agent_id="oj/muse", project=prickle.ROOMS_SCOPE)
    asked = say(server, world, "One answer please")
    first = claim(mcp, "oj/muse", runners["oj/muse"], asked["id"], key="k1")
    second = mcp.ok("oj/muse", "claim_discussion", {"message_id": asked["id"], "idempotency_key": "k2",
                                                    "harness": 2}, token=rooms)
    mcp.ok("oj/muse", "post_message", {"project": ROOM, "body": "Draft", "verdict": "draft"},
           token=first["discussion_credential"]["token"])
    mcp.error("oj/muse", "post_message", {"project": ROOM, "body": "Draft again", "verdict": "draft"},
              "invalid_state", token=second["discussion_credential"]["token"])


def test_a_private_room_has_no_teammates_and_no_tasks(mcp, server, world):
    oj = person(server, world, "oj")
    assert oj.post(f"/api/projects/{ROOM}/members", {"handle": "ren"}).status_code == 403
    assert oj.post(f"/api/projects/{ROOM}/task-requests", {"agent": "oj/muse", "packet": PACKET}).status_code == 403
    r = person(server, world, "ren").post(f"/api/projects/{ROOM}/agents", {"agent_id": "ren/builder"})
    assert r.status_code == 404


def test_cards_only_from_a_runner_and_expired_cards_leave_the_list(mcp, server, world):
    runners = setup_room(world)
    asked = say(server, world, "Draw something")
    dsc = claim(mcp, "oj/muse", runners["oj/muse"], asked["id"])
    r = server.post("/api/runner/actions", json={"tool": "image_gen", "action": "x", "prompt": "p"},
                    headers={"Authorization": f"Bearer {dsc['discussion_credential']['token']}"})
    assert r.status_code == 403
    card = server.post("/api/runner/actions", json={"tool": "image_gen", "action": "x", "prompt": "p"},
                       headers={"Authorization": f"Bearer {runners['oj/muse']}"}).json()["action"]
    world.db.execute("UPDATE actions SET expires_at = '2020-01-01T00:00:00.000Z' WHERE id = ?", (card["id"],))
    assert person(server, world, "oj").get("/api/actions").json()["actions"] == []
    assert person(server, world, "oj").post(f"/api/actions/{card['id']}", {"decision": "approve"}).status_code == 409


def test_steps_the_permission_layer_and_undecided_expiry(mcp, server, world):
    call = {"tool_name": "Bash", "input": {"command": "deploy"}}
    run, step = decided_step(mcp, server, world, call, "allow")
    told = mcp.ok("ren/builder", "request_step", call, token=run)
    assert (told["status"], told["behavior"]) == ("approved", "deny")  # the agent is told; nothing is used up
    used = mcp.ok("ren/builder", "request_step", call | {"tool_use_id": "t1"}, token=run)
    assert (used["status"], used["behavior"]) == ("consumed", "allow")
    late = {"tool_name": "Bash", "input": {"command": "spend"}}
    pending = mcp.ok("ren/builder", "request_step", late, token=run)
    world.db.execute("UPDATE steps SET created_at = '2020-01-01T00:00:00.000Z' WHERE id = ?", (pending["step_id"],))
    again = mcp.ok("ren/builder", "request_step", late, token=run)
    assert (again["step_id"], again["status"], again["behavior"]) == (pending["step_id"], "expired", "deny")


def test_stopping_a_turn_ends_its_queued_wakes(mcp, server, world):
    runners = setup_room(world)
    cursor = listen(mcp, "oj/muse", runners["oj/muse"])
    say(server, world, "Start")
    out = person(server, world, "oj").post("/api/room/stop").json()
    assert out["wakes_ended"] == 1
    assert woke(mcp, "oj/muse", cursor, runners["oj/muse"]) == []
    assert audit_entries(world.db, ROOM, "room.turn_stopped")[0]["refs"]["wakes"] == 1


def test_deeply_nested_input_is_invalid_not_a_crash(mcp, server, world):
    task, device, runner, out = claimed(mcp, server, world)
    nested: dict = {}
    inner = nested
    for _ in range(900):
        inner["a"] = {}
        inner = inner["a"]
    is_error, text = mcp.call("ren/builder", "request_step", {"tool_name": "Bash", "input": nested},
                              token=out["execution_credential"]["token"])
    assert is_error and not text.startswith("internal")
