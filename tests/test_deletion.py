"""Deleting, restoring and erasing a project: the recovery window, restore, erasure and the retention worker."""

import datetime as dt
import glob
import time
from pathlib import Path

import pytest

import prickle
from conftest import PROJECT, all_events, audit_entries, in_thread
from helpers import P, T0, claimed, cli_json, confirmed, handoff, person, post, run

DAY = dt.timedelta(days=1)


def _events(db, type_):
    return [e for e in all_events(db) if e["type"] == type_]


def _delete(server, world, handle="oj", project=PROJECT):
    r = confirmed(server, world, handle).delete(f"/api/projects/{project}")
    assert r.status_code == 200, r.text
    return r.json()["deletion"]


def jdeleted(server, world, handle):
    r = person(server, world, handle).get("/api/deleted-projects")
    assert r.status_code == 200, r.text
    return r.json()["projects"]


def _rows_left(db, slug):
    """Rows that still name the project, by table (every table with a project column, and the audit chain)."""
    tables = [r["name"] for r in db.rows(
        "SELECT name FROM sqlite_schema s WHERE type = 'table' AND EXISTS (SELECT 1 FROM pragma_table_info(s.name) c "
        "WHERE c.name = 'project') ORDER BY name")]
    counts = {t: db.scalar(f"SELECT count(*) FROM {t} WHERE project = ?", (slug,)) for t in tables}
    counts["audit"] = db.scalar("SELECT count(*) FROM audit WHERE chain = ?", (slug,))
    counts["projects"] = db.scalar("SELECT count(*) FROM projects WHERE slug = ?", (slug,))
    return {t: n for t, n in counts.items() if n}


def test_an_owner_deletes_a_project_after_confirming_and_nothing_of_it_is_served(mcp, server, world, clock):
    post(mcp, "oj/muse", "Hello team")
    oj, ren = person(server, world, "oj"), person(server, world, "ren")
    # Without a fresh confirmation nothing happens.
    r = oj.delete(f"/api/projects/{PROJECT}")
    assert (r.status_code, r.json()["error"]["code"]) == (403, "step_up_required")
    assert world.db.scalar("SELECT state FROM projects WHERE slug = ?", (PROJECT,)) == "live"
    assert world.db.scalar("SELECT count(*) FROM deletions") == 0
    # A member who is not an owner may not.
    r = confirmed(server, world, "ren").delete(f"/api/projects/{PROJECT}")
    assert (r.status_code, r.json()["error"]["message"]) == (403, f"only an owner of '{PROJECT}' can delete it")
    deletion = _delete(server, world)
    assert deletion == {"project": PROJECT, "request_number": 1, "kind": "delete", "state": "deleted",
                        "requested_at": prickle.iso(T0), "requested_by": "oj",
                        "deadline": prickle.iso(T0 + 30 * DAY), "can_restore": True}
    [event] = _events(world.db, "project.deleted")
    assert {k: event[k] for k in ("project", "type", "request_number")} == {
        "project": PROJECT, "type": "project.deleted", "request_number": 1}
    assert set(event) == {"id", "seq", "project", "at", "type", "request_number"}
    assert [e["refs"] for e in audit_entries(world.db, PROJECT, "project.deleted")] == [
        {"owner": "oj", "request_number": 1}]
    # Nothing of it is served: the page, the API, MCP, its live stream and its files.
    for api in (oj, ren):
        assert api.get(f"/api/projects/{PROJECT}").status_code == 404
        assert api.get(f"/api/projects/{PROJECT}/room").status_code == 404
        assert api.get(f"/api/projects/{PROJECT}/events?after=0").status_code == 404
        assert PROJECT not in [p["slug"] for p in api.get("/api/projects").json()["projects"]]
        assert api.get("/api/search?q=Hello").json()["results"] == []
    mcp.error("oj/muse", "read_room", P, "not_found")
    mcp.error("ren/builder", "check_inbox", P, "not_found")
    assert jdeleted(server, world, "oj") == [deletion | {"name": "Website v2", "team": "web"}]
    assert jdeleted(server, world, "ren") == []  # a member, not an owner: nothing to restore
    # Still there for whoever was in it, who is told what became of it.
    r = confirmed(server, world, "oj").delete(f"/api/projects/{PROJECT}")
    assert (r.status_code, r.json()["error"]["message"]) == (409, (
        f"project '{PROJECT}' was deleted (request 1, at {prickle.iso(T0)}); an owner when it was deleted can "
        f"restore it until {prickle.iso(T0 + 30 * DAY)}"))
    assert confirmed(server, world, "sam").delete(f"/api/projects/{PROJECT}").status_code == 404
    assert world.db.scalar("SELECT count(*) FROM deletions") == 1


def test_running_agents_stop_their_run_keys_lose_reach_and_waits_end_with_not_found(mcp, server, world, monkeypatch):
    monkeypatch.setattr(prickle, "LIVE_CHECK_EVERY", 1000.0)  # only the deletion's wake can end the waits
    task, device, runner, out = claimed(mcp, server, world)
    run_key = out["execution_credential"]["token"]
    attempt = out["attempt_id"] if "attempt_id" in out else world.db.scalar(
        "SELECT id FROM attempts WHERE task_id = ?", (task["id"],))
    hub = server.state.hub
    joins = []
    for agent, args in (("ren/builder", P), ("oj/muse", {})):
        mcp.ok(agent, "wait_for_updates", args | {"timeout_seconds": 1})
        joins.append(in_thread(mcp.call, agent, "wait_for_updates", args | {"timeout_seconds": 50}))
        for _ in range(1000):  # until the wait is open on the server
            if hub.is_waiting(agent):
                break
            time.sleep(0.01)
        assert hub.is_waiting(agent)
    _delete(server, world)
    assert joins[0](40) == (True, f"not_found: project '{PROJECT}' was deleted (request 1): wait again to hear "
                                  "from the projects agent 'ren/builder' is still in")
    assert joins[1](40) == (True, f"not_found: project '{PROJECT}' was deleted (request 1): wait again to hear "
                                  "from the projects agent 'oj/muse' is still in")
    # The run's key reaches nothing (refused before any tool runs); the run is stopped, recorded by reference.
    r = mcp.raw(run_key, "tools/call", {"name": "read_room", "arguments": P | {"task_id": task["id"]}}, "read_room")
    assert r.status_code == 404 and r.json()["error"]["data"] == {"code": "not_found"}
    assert r.json()["error"]["message"] == f"task '{task['id']}' not found: its project '{PROJECT}' was deleted"
    assert world.db.one("SELECT state FROM attempts WHERE id = ?", (attempt,)) == {"state": "stopped"}
    assert [e["refs"] for e in audit_entries(world.db, PROJECT, "task.run_stopped")] == [
        {"agent": "ren/builder", "run": world.db.scalar("SELECT run_id FROM attempts WHERE id = ?", (attempt,)),
         "task": task["id"], "by": None, "reason": "project_deleted"}]
    assert world.db.scalar("SELECT revoked_reason FROM credentials WHERE attempt_id = ?", (attempt,)) == "project_deleted"
    # The runner's and the agents' keys hear nothing of it.
    mcp.error("ren/builder", "claim_task", {"task_id": task["id"], "idempotency_key": "k2"}, "not_found", token=runner)
    mcp.error("oj/muse", "wait_for_updates", P | {"timeout_seconds": 1}, "not_found")
    assert world.db.scalar("SELECT count(*) FROM wakes WHERE project = ?", (PROJECT,)) == 0


def test_a_recorded_owner_restores_within_the_window_and_work_stays_stopped(mcp, server, world, clock):
    task, device, runner, out = claimed(mcp, server, world)
    project_key = prickle.create_token(world.db, "client", agent_id="oj/muse", project=PROJECT)[1]
    mcp.ok("oj/muse", "read_room", P, token=project_key)
    _delete(server, world)
    mcp.error("oj/muse", "read_room", P, "not_found", token=project_key)
    # Someone who was never in it, and a member who was no owner, can't restore it.
    r = person(server, world, "sam").post(f"/api/projects/{PROJECT}/restore")
    assert (r.status_code, r.json()["error"]["message"]) == (404, f"no deleted project '{PROJECT}' that 'sam' was in")
    r = person(server, world, "ren").post(f"/api/projects/{PROJECT}/restore")
    assert (r.status_code, r.json()["error"]["message"]) == (
        403, f"only an owner of '{PROJECT}' when it was deleted can restore it")
    r = person(server, world, "oj").post(f"/api/projects/{PROJECT}/restore", {"now": True})
    assert (r.status_code, r.json()["error"]["code"]) == (400, "invalid_input")
    clock.now = T0 + dt.timedelta(hours=20)  # within the window (and before the task's approval would lapse)
    r = person(server, world, "oj").post(f"/api/projects/{PROJECT}/restore")
    assert r.status_code == 200, r.text
    assert r.json() == {"project": {"slug": PROJECT, "team": "web", "name": "Website v2",
                                    "description": "The new site."}, "request_number": 1, "state": "live"}
    assert [e["refs"] for e in audit_entries(world.db, PROJECT, "project.restored")] == [
        {"owner": "oj", "request_number": 1}]
    assert [e["request_number"] for e in _events(world.db, "project.restored")] == [1]
    # Everything is back: members with their roles, agents, keys; the run stays stopped.
    assert prickle.list_members(world.db, PROJECT)[0]["role"] == "owner"
    assert sorted(m["handle"] for m in prickle.list_members(world.db, PROJECT)) == ["oj", "ren"]
    assert sorted(r["agent_id"] for r in world.db.rows("SELECT agent_id FROM project_agents WHERE project = ?",
                                                       (PROJECT,))) == ["oj/muse", "oj/scout", "ren/builder"]
    mcp.ok("oj/muse", "read_room", P, token=project_key)
    view = person(server, world, "ren").get(f"/api/tasks/{task['id']}").json()
    assert view["task"]["waiting_on"] == "stopped"
    assert [r["state"] for r in view["runs"]] == ["stopped"]
    assert jdeleted(server, world, "oj") == []
    # Restored, it is deleted again with a new request number.
    assert prickle.delete_project(world.db, PROJECT, "oj")["request_number"] == 2


def test_the_retention_worker_purges_after_the_deadline_and_the_log_goes_a_year_later(mcp, server, world, clock):
    handoff(mcp)
    post(mcp, "oj/muse", "The copy is due Friday")
    _delete(server, world)
    clock.now = T0 + 30 * DAY - dt.timedelta(seconds=1)
    assert prickle.run_retention(world.db) == []
    clock.now = T0 + 30 * DAY
    steps = prickle.run_retention(world.db)
    assert steps[0] == f"{PROJECT}: purge started (request 1)"
    assert steps[-1] == f"{PROJECT}: content purged (request 1)"
    entries = audit_entries(world.db, PROJECT)
    assert [(e["type"], e["refs"]) for e in entries[-2:]] == [
        ("project.purge_started", {"request_number": 1}),
        ("project.content_purged", {"request_number": 1, "messages": 1, "tasks": 1, "files": 0})]
    assert world.db.one("SELECT state, name, description FROM projects WHERE slug = ?", (PROJECT,)) == {
        "state": "purged", "name": "", "description": ""}
    # What is left: the audit log, the request, the row, and the newest event, which keeps only the request number.
    assert _rows_left(world.db, PROJECT) == {"audit": len(entries), "deletions": 1, "projects": 1, "outbox": 1}
    assert all_events(world.db)[-1] == {"id": all_events(world.db)[-1]["id"], "seq": prickle.outbox_head(world.db),
                                        "project": PROJECT, "at": all_events(world.db)[-1]["at"],
                                        "type": "project.deleted", "request_number": 1}
    # No restore from the purge on; the chain still checks.
    r = person(server, world, "oj").post(f"/api/projects/{PROJECT}/restore")
    assert (r.status_code, r.json()["error"]) == (409, {"code": "invalid_state", "message": (
        f"project '{PROJECT}' was purged at {prickle.iso(T0 + 30 * DAY)}: only its audit log is left")})
    assert prickle.verify_audit(world.db, PROJECT)[0]["ok"]
    clock.now = T0 + 30 * DAY + dt.timedelta(days=365) - dt.timedelta(seconds=1)
    assert prickle.run_retention(world.db) == []
    clock.now += dt.timedelta(seconds=1)
    assert prickle.run_retention(world.db) == [f"{PROJECT}: audit log and project removed"]
    assert _rows_left(world.db, PROJECT) == {"outbox": 1}  # the newest event, until another comes
    # The slug is free again, and the other project never noticed.
    assert prickle.create_project(world.db, PROJECT, "Again", "web", "oj")["name"] == "Again"
    assert person(server, world, "sam").get("/api/projects/side").status_code == 200


def test_restore_is_refused_once_the_deadline_passed_or_the_purge_started(server, world, clock):
    _delete(server, world)
    clock.now = T0 + 30 * DAY
    r = person(server, world, "oj").post(f"/api/projects/{PROJECT}/restore")
    assert (r.status_code, r.json()["error"]["message"]) == (409, (
        f"project '{PROJECT}' can no longer be restored: its recovery window ended at {prickle.iso(T0 + 30 * DAY)}"))
    assert prickle.retention_step(world.db) == f"{PROJECT}: purge started (request 1)"
    r = person(server, world, "oj").post(f"/api/projects/{PROJECT}/restore")
    assert (r.status_code, r.json()["error"]["message"]) == (409, (
        f"project '{PROJECT}' is being purged since {prickle.iso(T0 + 30 * DAY)} (request 1): it can't be restored"))
    assert jdeleted(server, world, "oj")[0]["state"] == "purging"
    assert world.db.scalar("SELECT state FROM projects WHERE slug = ?", (PROJECT,)) == "purging"


def test_a_purge_broken_off_goes_on_where_it_stopped_and_never_shows_half_a_project(mcp, server, world, clock):
    for n in range(7):
        post(mcp, "oj/muse", f"Note {n}")
    handoff(mcp)
    _delete(server, world)
    # The steps are this test's to take (the served app's own retention piece is held: conftest's server).
    clock.now = T0 + 30 * DAY
    assert prickle.retention_step(world.db, batch=3) == f"{PROJECT}: purge started (request 1)"
    steps = 0
    while True:
        # Each step is one transaction, as a process killed between two would leave the file: a fresh
        # connection (a restarted server) goes on from there, and the project is never readable.
        db = prickle.Database(world.db_path)
        try:
            with pytest.raises(prickle.NotFound):
                prickle.require_project(db, prickle.resolve_token(db, world.tokens["oj"], ("person",)), PROJECT)
            assert person(server, world, "oj").get(f"/api/projects/{PROJECT}/room").status_code == 404
            step = prickle.retention_step(db, batch=3)
        finally:
            db.close()
        steps += 1
        if step.endswith("content purged (request 1)"):
            break
        assert "rows of" in step and int(step.split(": ")[1].split()[0]) <= 3
    assert steps > 5
    assert audit_entries(world.db, PROJECT)[-1]["type"] == "project.content_purged"
    assert set(_rows_left(world.db, PROJECT)) == {"audit", "deletions", "projects", "outbox"}
    assert world.db.scalar("SELECT count(*) FROM outbox WHERE project = ?", (PROJECT,)) == 1


def test_an_owner_erases_a_project_invites_are_revoked_and_it_goes_30_days_later(mcp, server, world, clock):
    oj = confirmed(server, world, "oj")
    invite, secret = prickle.create_invite(world.db, PROJECT, "kim@example.com", "member", "oj")
    invite = invite["id"]
    r = oj.post(f"/api/projects/{PROJECT}/erase", {"why": "x"})
    assert (r.status_code, r.json()["error"]["code"]) == (400, "invalid_input")
    r = oj.post(f"/api/projects/{PROJECT}/erase")
    assert r.status_code == 200, r.text
    assert r.json()["deletion"] == {"project": PROJECT, "request_number": 1, "kind": "erase", "state": "erasing",
                                    "requested_at": prickle.iso(T0), "requested_by": "oj",
                                    "deadline": prickle.iso(T0 + 30 * DAY), "can_restore": False}
    assert [e["request_number"] for e in _events(world.db, "project.deleted")] == [1]
    assert [(e["type"], e["refs"]) for e in audit_entries(world.db, PROJECT)[-2:]] == [
        ("project.erasure_requested", {"owner": "oj", "request_number": 1}),
        ("invite.revoked", {"invite": invite, "reason": "project_erased", "by": None})]
    assert audit_entries(world.db, PROJECT, "project.deleted") == []
    assert world.db.one("SELECT state, email FROM invites WHERE id = ?", (invite,)) == {"state": "revoked",
                                                                                         "email": None}
    # the person invited, opening the link, is told why
    with pytest.raises(prickle.InvalidState) as e:
        prickle.invite_view(world.db, secret)
    assert e.value.message == (f"this invite was revoked because the project '{PROJECT}' was erased: there is "
                               "nothing left to join")
    mcp.error("oj/muse", "read_room", P, "not_found")
    r = person(server, world, "oj").post(f"/api/projects/{PROJECT}/restore")
    assert (r.status_code, r.json()["error"]["message"]) == (409, (
        f"project '{PROJECT}' is being erased (request 1): it can't be restored, and its content goes at "
        f"{prickle.iso(T0 + 30 * DAY)}"))
    clock.now = T0 + 30 * DAY
    steps = prickle.run_retention(world.db)
    assert (steps[0], steps[-1]) == (f"{PROJECT}: purge started (request 1)", f"{PROJECT}: content purged (request 1)")
    assert [e["type"] for e in audit_entries(world.db, PROJECT)[-2:]] == ["project.purge_started",
                                                                          "project.content_purged"]


def test_a_private_room_is_not_deleted_and_bad_input_changes_nothing(server, world):
    with world.db.transaction():
        room = prickle.ensure_room(world.db, "oj")
    r = confirmed(server, world, "oj").delete(f"/api/projects/{room}")
    assert (r.status_code, r.json()["error"]["message"]) == (
        403, f"'{room}' is a private room: it goes only with its owner's account")
    r = confirmed(server, world, "oj").delete("/api/projects/Not_A_Slug")
    assert (r.status_code, r.json()["error"]["code"]) == (400, "invalid_input")
    assert world.db.scalar("SELECT count(*) FROM deletions") == 0
    assert world.db.scalar("SELECT count(*) FROM projects WHERE state <> 'live'") == 0


def test_the_command_line_deletes_restores_erases_and_lists(world):
    db = world.db_path
    out = cli_json(db, "project", "delete", PROJECT, "--by", "oj")
    assert out["deletion"]["request_number"] == 1 and out["deletion"]["state"] == "deleted"
    assert cli_json(db, "project", "deleted", "--by", "oj")["projects"][0]["project"] == PROJECT
    # Out of service, its log is still the operator's to check.
    assert cli_json(db, "audit", "verify", PROJECT)["chains"][0]["ok"] is True
    code, _, err = run(db, "project", "delete", PROJECT, "--by", "oj", ok=False)
    assert code == 1 and "was deleted (request 1" in err
    code, _, err = run(db, "project", "restore", PROJECT, "--by", "ren", ok=False)
    assert code == 1 and f"only an owner of '{PROJECT}' when it was deleted can restore it" in err
    assert cli_json(db, "project", "restore", PROJECT, "--by", "oj")["state"] == "live"
    # Restoring a live project says it is not deleted (to its members; anyone else learns nothing).
    code, _, err = run(db, "project", "restore", PROJECT, "--by", "oj", ok=False)
    assert code == 1 and f"project '{PROJECT}' is not deleted: there is nothing to restore" in err
    code, _, err = run(db, "project", "restore", PROJECT, "--by", "sam", ok=False)
    assert code == 1 and f"no deleted project '{PROJECT}' that 'sam' was in" in err
    code, _, err = run(db, "project", "erase", PROJECT, "--by", "ren", ok=False)
    assert code == 1 and f"only an owner of '{PROJECT}' can erase it" in err
    erased = cli_json(db, "project", "erase", PROJECT, "--by", "oj")["deletion"]
    assert (erased["kind"], erased["request_number"]) == ("erase", 2)
    text = run(db, "project", "deleted", "--by", "oj")[1]
    assert text.strip() == f"{PROJECT} is to be erased (request 2): its content goes at {erased['deadline']}."


def test_the_server_runs_the_retention_worker_as_a_named_piece(world):
    pieces = [p.name for p in prickle.server_maintenance(world.db, None, None, prickle.Settings(), lambda: None).pieces]
    assert "retention" in pieces


def test_a_real_server_killed_mid_purge_goes_on_at_its_next_start_and_nothing_is_ever_readable(world):
    from conftest import Served
    agent = world.actor("oj/muse")
    for start in range(0, 20_000, 5000):
        with world.db.transaction():
            for n in range(start, start + 5000):
                prickle.write_message(world.db, agent, PROJECT, f"Note {n}")
    prickle.delete_project(world.db, PROJECT, "oj", window=dt.timedelta(0))  # its deadline is now
    oj = world.person("oj")

    def state_and_left():
        return (world.db.scalar("SELECT state FROM projects WHERE slug = ?", (PROJECT,)),
                world.db.scalar("SELECT count(*) FROM messages WHERE project = ?", (PROJECT,)))

    server = Served(world.db_path)
    try:
        deadline = time.monotonic() + 60
        while state_and_left()[1] == 20_000 and time.monotonic() < deadline:  # until the purge is under way
            time.sleep(0.02)
    finally:
        server.stop(kill=True)  # kill -9, mid-purge
    state, left = state_and_left()
    assert state == "purging" and 0 < left < 20_000, (state, left)
    with pytest.raises(prickle.NotFound):
        prickle.require_project(world.db, oj, PROJECT)
    assert prickle.deleted_projects(world.db, oj)[0]["state"] == "purging"
    with Served(world.db_path):
        deadline = time.monotonic() + 90
        while state_and_left()[0] != "purged" and time.monotonic() < deadline:
            time.sleep(0.05)
    assert state_and_left() == ("purged", 0)
    entries = audit_entries(world.db, PROJECT)
    assert [e["type"] for e in entries].count("project.purge_started") == 1
    assert (entries[-1]["type"], entries[-1]["refs"]) == (
        "project.content_purged", {"request_number": 1, "messages": 20_000, "tasks": 0, "files": 0})
    assert prickle.verify_audit(world.db, PROJECT)[0]["ok"]


def test_two_owners_deleting_at_once_make_one_request_and_the_other_is_told(world):
    prickle.add_member(world.db, PROJECT, "sam")
    prickle.promote_member(world.db, PROJECT, "ren")
    dbs = [prickle.Database(world.db_path) for _ in range(2)]
    try:
        joins = [in_thread(prickle.delete_project, db, PROJECT, who) for db, who in zip(dbs, ("oj", "ren"))]
        outcomes = []
        for join in joins:
            try:
                outcomes.append(join(30)["request_number"])
            except prickle.InvalidState as e:
                outcomes.append(str(e).split(";")[0])
    finally:
        for db in dbs:
            db.close()
    assert sorted(outcomes, key=str) == sorted([1, f"project '{PROJECT}' was deleted (request 1, at "
                                                   f"{world.db.scalar('SELECT requested_at FROM deletions')})"], key=str)
    assert world.db.scalar("SELECT count(*) FROM deletions") == 1
    assert [e["refs"]["request_number"] for e in audit_entries(world.db, PROJECT, "project.deleted")] == [1]


def _in_files(db_path, *texts):
    """Which of ``texts`` the database file and its log still hold, in their bytes."""
    data = b"".join(Path(p).read_bytes() for p in glob.glob(db_path + "*"))
    return [t for t in texts if t.encode() in data]


def test_a_purge_leaves_nothing_of_the_project_in_the_files_bytes(world, clock):
    db, oj = world.db, world.person("oj")
    prickle.create_project(db, "orchid", "Orchid Harbour", "web", "oj", "Tulip ledger for the quay")
    said = prickle.post_message(db, oj, "orchid", "Quetzal marmalade ships on Thursday")
    prickle.mark_moment(db, oj, "orchid", "launch", "2026-11-30", "Zephyr beacon lit", message_id=said["id"])
    texts = ("Orchid Harbour", "Tulip ledger", "Quetzal marmalade", "Zephyr beacon", "quetzal")  # (the index's word)
    assert prickle.search(db, oj, "Quetzal")["results"]
    prickle.erase_project(db, "orchid", "oj")
    clock.now = T0 + 30 * DAY
    steps = prickle.run_retention(db)
    assert steps[-1] == "orchid: content purged (request 1)"
    # What went was zeroed where it lay, the search index forgot its words, and the log was emptied.
    assert _in_files(world.db_path, *texts) == []
    assert glob.glob(world.db_path + "-wal") == [] or Path(world.db_path + "-wal").stat().st_size == 0
