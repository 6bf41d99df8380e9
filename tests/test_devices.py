"""Devices that can be lost: marked stolen, expired when unused, ended by signing out everywhere; and the
device list's last use (when, and from which address)."""

import datetime as dt

import pytest

import prickle
from conftest import PROJECT, audit_entries, in_thread
from helpers import ROOM, T0, claim, claimed, cli_json, paired, person, say, setup_room
from runner_util import wait_until

DAY = dt.timedelta(days=1)


def listed(server, world, handle, device_id):
    [row] = [d for d in person(server, world, handle).get("/api/devices").json()["devices"] if d["id"] == device_id]
    return row


def test_a_device_marked_stolen_ends_its_keys_and_its_run_at_once(mcp, server, world):
    task, device, runner, out = claimed(mcp, server, world)
    run = out["execution_credential"]["token"]
    r = person(server, world, "ren").post(f"/api/devices/{device['id']}/stolen")
    assert r.json() == {"id": device["id"], "revoked": True, "reason": "stolen", "credentials_ended": 2,
                        "runs_stopped": 1}
    for token in (runner, run):
        assert mcp.raw(token, "tools/list").status_code == 401
    attempt = world.db.one("SELECT state, ended_at FROM attempts WHERE id = ?", (out["attempt"]["attempt_id"],))
    assert attempt["state"] == "stopped" and attempt["ended_at"] is not None
    assert world.db.scalar("SELECT waiting_on FROM tasks WHERE id = ?", (task["id"],)) == "stopped"
    [entry] = audit_entries(world.db, PROJECT, "device.revoked")
    assert entry["refs"] == {"device": device["id"], "agent": "ren/builder", "reason": "stolen", "credentials": 2}
    [stopped] = audit_entries(world.db, PROJECT, "task.run_stopped")
    assert stopped["refs"] == {"agent": "ren/builder", "run": world.db.scalar(
        "SELECT run_id FROM attempts WHERE id = ?", (out["attempt"]["attempt_id"],)), "task": task["id"], "by": "ren",
        "reason": "device_revoked", "device": device["id"], "state_before": "routed",
        "attempt": out["attempt"]["attempt_id"]}
    row = listed(server, world, "ren", device["id"])
    assert (row["revoked_reason"], row["can_revoke"]) == ("stolen", False) and row["revoked_at"] is not None
    # A new run of the task waits for its owner's Start, as after a Stop.
    _, other = paired(world)
    text = mcp.error("ren/builder", "claim_task", {"task_id": task["id"], "idempotency_key": "k2"}, "invalid_state",
                     token=other)
    assert "was stopped" in text


def test_a_stolen_devices_waiting_runner_is_answered_at_once(mcp, server, world):
    device, runner = paired(world)
    join = in_thread(mcp.call, "ren/builder", "wait_for_mention", {"timeout_seconds": 30}, runner)
    wait_until("the runner listens", lambda: prickle.runner_listening(server.state.db, "ren/builder"))
    assert person(server, world, "ren").post(f"/api/devices/{device['id']}/stolen").status_code == 200
    is_error, text = join()
    assert is_error and text.startswith("unauthorized: this credential was revoked")


def test_a_stolen_device_ends_its_private_room_discussion(mcp, server, world):
    runners = setup_room(world)
    asked = say(server, world, "What do you think?")
    live = claim(mcp, "oj/muse", runners["oj/muse"], asked["id"])["discussion_credential"]["token"]
    device_id = world.db.scalar("SELECT device_id FROM credentials WHERE secret_hash = ?",
                                (prickle.sha256_hex(runners["oj/muse"]),))
    out = person(server, world, "oj").post(f"/api/devices/{device_id}/stolen").json()
    assert (out["credentials_ended"], out["runs_stopped"]) == (2, 0)
    assert mcp.raw(live, "tools/list").status_code == 401
    assert audit_entries(world.db, ROOM, "device.revoked")[0]["refs"] == {
        "device": device_id, "agent": "oj/muse", "reason": "stolen", "credentials": 2}
    assert mcp.raw(runners["oj/scout"], "tools/list").status_code == 200  # oj's other devices go on


def test_marking_stolen_refuses_another_persons_device_an_unknown_one_and_twice(mcp, server, world):
    device, runner = paired(world)
    oj, ren = person(server, world, "oj"), person(server, world, "ren")
    r = oj.post(f"/api/devices/{device['id']}/stolen")
    assert r.status_code == 404 and r.json()["error"] == {"code": "not_found",
                                                          "message": f"no device '{device['id']}' of yours"}
    assert ren.post("/api/devices/dev_nothing/stolen").status_code == 404
    r = ren.post("/api/devices/dev%20bad!/stolen")
    assert r.status_code == 400 and "device_id must be an id" in r.json()["error"]["message"]
    assert audit_entries(world.db, PROJECT, "device.revoked") == []
    assert mcp.raw(runner, "tools/list").status_code == 200
    assert ren.post(f"/api/devices/{device['id']}/stolen").status_code == 200
    again = ren.post(f"/api/devices/{device['id']}/stolen")
    assert again.status_code == 409 and again.json()["error"]["message"].startswith(
        f"device '{device['id']}' was already revoked (stolen) at ")
    assert ren.delete(f"/api/devices/{device['id']}").status_code == 409
    assert len(audit_entries(world.db, PROJECT, "device.revoked")) == 1
    with pytest.raises(prickle.InvalidInput, match="reason must be one of owner, stolen"):
        prickle.revoke_device(world.db, "ren", device["id"], "expired")


def test_a_device_unused_for_its_idle_days_expires(world, clock):
    used, used_key = paired(world)
    idle, idle_key = paired(world, "oj/muse")
    clock.now = T0 + 10 * DAY
    actor = prickle.resolve_token(world.db, used_key, ("runner",))
    prickle.note_seen(world.db, "ren/builder", actor.credential_id, "203.0.113.7")
    clock.now = T0 + 90 * DAY - dt.timedelta(seconds=1)
    assert prickle.expire_due(world.db, "device") == 0
    clock.now = T0 + 90 * DAY
    assert prickle.expire_due(world.db, "device") == 1
    row = world.db.one("SELECT revoked_at, revoked_reason FROM devices WHERE id = ?", (idle["id"],))
    assert row == {"revoked_at": prickle.iso(T0 + 90 * DAY), "revoked_reason": "expired"}
    assert audit_entries(world.db, PROJECT, "device.revoked")[0]["refs"] == {
        "device": idle["id"], "agent": "oj/muse", "reason": "expired", "credentials": 1}
    with pytest.raises(prickle.Unauthorized):
        prickle.resolve_token(world.db, idle_key, ("runner",))
    clock.now = T0 + 100 * DAY
    assert prickle.expire_due(world.db, "device") == 1  # 90 days after its last use
    assert world.db.scalar("SELECT revoked_reason FROM devices WHERE id = ?", (used["id"],)) == "expired"


def test_the_idle_days_come_from_the_servers_settings(world, clock):
    device, _ = paired(world)
    app = prickle.create_app(world.db_path, prickle.Settings(device_idle_days=7), port=8321)
    assert app is not None and world.db.scalar("SELECT value FROM meta WHERE key = 'device_idle_days'") == "7"
    clock.now = T0 + 7 * DAY - dt.timedelta(seconds=1)
    assert prickle.expire_due(world.db, "device") == 0
    clock.now = T0 + 7 * DAY
    assert prickle.expire_due(world.db) >= 1  # the sweep runs every kind
    assert world.db.scalar("SELECT revoked_reason FROM devices WHERE id = ?", (device["id"],)) == "expired"
    with pytest.raises(Exception, match="device_idle_days"):
        prickle.Settings(device_idle_days=0)


def test_signing_out_everywhere_ends_sessions_links_and_devices(mcp, server, world):
    sessions = [prickle.create_token(world.db, "session", person="ren", ttl=DAY)[1] for _ in range(2)]
    link = prickle.create_token(world.db, "signin", person="ren", ttl=DAY)[1]
    task, device, runner, out = claimed(mcp, server, world)
    second, second_key = paired(world)
    _, oj_key = paired(world, "oj/muse")
    for handle in ("ren", "oj"):
        world.db.execute("INSERT INTO push_subscriptions (id, handle, endpoint, p256dh, auth, created_at) VALUES "
                         "(?, ?, ?, 'k', 'a', ?)", (f"sub_{handle}", handle, f"https://push.example/{handle}",
                                                     prickle.iso(prickle.utcnow())))
    r = person(server, world, "ren").post("/api/signout/everywhere")
    assert r.json() == {"sessions_ended": 3, "devices_ended": 2, "credentials_ended": 3, "runs_stopped": 1,
                        "push_ended": 1, "apps_ended": 0}
    assert [row["handle"] for row in world.db.rows("SELECT handle FROM push_subscriptions")] == ["oj"]
    for session in sessions:
        with pytest.raises(prickle.Unauthorized, match="^this session has ended: sign in again$"):
            prickle.resolve_token(world.db, session, ("session",))
    with pytest.raises(prickle.Unauthorized, match="already used"):
        prickle.resolve_token(world.db, link, ("signin",))
    for token in (runner, second_key, out["execution_credential"]["token"]):
        assert mcp.raw(token, "tools/list").status_code == 401
    entries = [e["refs"] for e in audit_entries(world.db, PROJECT, "device.revoked")]
    assert entries == [{"device": device["id"], "agent": "ren/builder", "reason": "sessions_ended", "credentials": 2},
                       {"device": second["id"], "agent": "ren/builder", "reason": "sessions_ended", "credentials": 1}]
    assert person(server, world, "ren").get("/api/me").status_code == 200  # a personal token is not a session
    assert mcp.raw(world.keys["ren/builder"], "tools/list").status_code == 200  # nor an agent's MCP key
    assert mcp.raw(oj_key, "tools/list").status_code == 200  # nor someone else's device
    again = person(server, world, "ren").post("/api/signout/everywhere").json()
    assert again == {"sessions_ended": 0, "devices_ended": 0, "credentials_ended": 0, "runs_stopped": 0,
                     "push_ended": 0, "apps_ended": 0}


def test_the_device_list_says_when_and_from_where_its_keys_were_last_used(mcp, server, world, clock):
    device, runner = paired(world)
    row = listed(server, world, "ren", device["id"])
    assert (row["last_used_at"], row["last_address"], row["can_revoke"]) == (None, None, True)
    mcp.ok("ren/builder", "check_inbox", {}, token=runner)
    row = listed(server, world, "ren", device["id"])
    assert (row["last_used_at"], row["last_address"]) == (prickle.iso(T0), "testclient")
    clock.now = T0 + dt.timedelta(seconds=30)
    assert server.get("/api/runner/state", headers={"Authorization": f"Bearer {runner}"}).status_code == 200
    assert listed(server, world, "ren", device["id"])["last_used_at"] == prickle.iso(T0 + dt.timedelta(seconds=30))


def test_the_command_line_marks_a_device_stolen_and_signs_a_person_out_everywhere(world):
    device, _ = paired(world)
    other, _ = paired(world)
    out = cli_json(world.db_path, "device", "revoke", "ren", device["id"], "--stolen")
    assert out == {"id": device["id"], "revoked": True, "reason": "stolen", "credentials_ended": 1, "runs_stopped": 0}
    out = cli_json(world.db_path, "person", "signout-everywhere", "ren")
    assert out == {"sessions_ended": 0, "devices_ended": 1, "credentials_ended": 1, "runs_stopped": 0,
                   "push_ended": 0, "apps_ended": 0}
    rows = {d["id"]: d for d in cli_json(world.db_path, "device", "list", "ren")["devices"]}
    assert (rows[device["id"]]["revoked_reason"], rows[other["id"]]["revoked_reason"]) == ("stolen", "sessions_ended")
