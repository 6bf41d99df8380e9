"""Closing an account: a person erased from every project (person.erased with its counts), their agents,
keys, devices and invites ended, and the erased form of a person wherever they appeared."""

import glob
import json
from pathlib import Path

import pytest

import prickle
from conftest import PROJECT, audit_entries
from helpers import P, PACKET, ask_connect, claimed, confirmed, handoff, jrun, person, post, run

ERASED_REN = {"kind": "person", "handle": "ren", "erased": True}
ERASED_BUILDER = {"kind": "agent", "agent_id": "ren/builder", "erased": True}


def scene(mcp, server, world):
    """ren's part in website-v2: a run of ren/builder going (a task oj/muse asked for, claimed by ren's
    runner), a handoff waiting for ren's approval, a task ren/builder asked oj/scout for (held for oj),
    a task ren asked their own agent for, a message of ren's, an invite ren sent (ren is an owner beside oj)
    and one sent to ren's address. Returns the ids by name."""
    prickle.set_person_email(world.db, "ren", "ren@example.org")
    prickle.promote_member(world.db, PROJECT, "ren", by="oj")
    world.db.execute("UPDATE team_people SET role = 'owner' WHERE handle = 'ren'")
    running, device, runner, _ = claimed(mcp, server, world)
    waiting = handoff(mcp, "oj/scout", "ren/builder")
    asked = mcp.ok("ren/builder", "handoff", P | {"to": "oj/scout", "packet": PACKET})
    assert asked["gate"]["decision"] == "approval_required"
    own = person(server, world, "ren").post(f"/api/projects/{PROJECT}/task-requests", {
        "agent": "ren/builder", "packet": PACKET})
    assert own.status_code == 200, own.text
    said = person(server, world, "ren").post(f"/api/projects/{PROJECT}/messages", {"body": "Back on Monday."})
    assert said.status_code == 200, said.text
    card = prickle.propose_action(world.db, prickle.resolve_token(world.db, runner, ("runner",)), "image_gen",
                                  "Draw the poster", "A poster.")
    sent, _ = prickle.create_invite(world.db, PROJECT, "kim@example.org", "member", "ren")
    to_ren, _ = prickle.create_invite(world.db, PROJECT, "ren@example.org", "member", "oj")
    return {"running": running["id"], "device": device["id"], "runner": runner,
            "waiting": waiting["task"]["id"], "approval": waiting["gate"]["approval_id"],
            "asked": asked["task"]["id"], "own": own.json()["task"]["id"],
            "message": said.json()["message"]["id"], "sent": sent["id"], "to_ren": to_ren["id"], "card": card["id"]}


def test_closing_an_account_erases_the_person_in_each_project_with_the_counts(mcp, server, world):
    ren = confirmed(server, world, "ren")  # (before ren has an address: a passkey then needs a step-up too)
    ids = scene(mcp, server, world)
    r = ren.delete("/api/me")
    assert r.status_code == 200, r.text
    out = r.json()
    counts = {"approvals_denied": 1, "tasks_cancelled": 2, "runs_closed": 1, "agents": 1, "returned": 1,
              "transferred": 0, "rules_revoked": 0, "standing_revoked": 0, "credentials": 0, "invites": 2}
    # ren's private room is one of the projects ren was in: ren/builder leaves it too, and the Approve card
    # it proposed there is declined.
    in_room = dict.fromkeys(counts, 0) | {"agents": 1, "approvals_denied": 1}
    assert out["projects"] == [{"project": "ren-room", "person": "ren", "by": "ren"} | in_room,
                               {"project": PROJECT, "person": "ren", "by": "ren"} | counts]
    assert [e["refs"] for e in audit_entries(world.db, "ren-room", "person.erased")] == [
        {"person": "ren", "by": "ren"} | in_room]
    assert (out["handle"], out["devices_ended"], out["invites_revoked"]) == ("ren", 1, 1)
    assert [e["refs"] for e in audit_entries(world.db, "ren-room", "action.declined")] == [
        {"action": ids["card"], "tool": "image_gen"}]
    # ren's private room goes with the account: erased, its content purged 30 days later.
    room = out["private_room"]
    assert (room["project"], room["kind"], room["state"], room["requested_by"]) == ("ren-room", "erase", "erasing",
                                                                                    "ren")
    assert [e["refs"] for e in audit_entries(world.db, "ren-room", "project.erasure_requested")] == [
        {"owner": "ren", "request_number": room["request_number"]}]
    assert [e["refs"] for e in audit_entries(world.db, PROJECT, "person.erased")] == [
        {"person": "ren", "by": "ren"} | counts]
    # The handoff held for ren was denied by them; what ren and ren/builder asked for is cancelled.
    assert [e["refs"] for e in audit_entries(world.db, PROJECT, "approval.decided")][-1] == {
        "approval": ids["approval"], "task": ids["waiting"], "decision": "denied", "by": "ren"}
    states = {t: world.db.scalar("SELECT state FROM tasks WHERE id = ?", (ids[t],))
              for t in ("running", "waiting", "asked", "own")}
    assert states == {"running": "returned", "waiting": "rejected", "asked": "cancelled", "own": "cancelled"}
    assert [e["refs"] for e in audit_entries(world.db, PROJECT, "task.returned")] == [
        {"task": ids["running"], "reason": "member_erased", "agent": "ren/builder", "by": "ren"}]
    assert world.db.scalar("SELECT state FROM attempts WHERE task_id = ?", (ids["running"],)) == "stopped"
    # The invites ren sent and the one sent to ren's address end, with the erasure's reasons, before
    # person.erased, which counts both (invites: 2).
    assert [e["refs"] for e in audit_entries(world.db, PROJECT, "invite.revoked")] == [
        {"invite": ids["to_ren"], "reason": "invitee_closed_account", "by": None},
        {"invite": ids["sent"], "reason": "inviter_erased", "by": None}]
    assert [(e["type"], e["refs"]) for e in audit_entries(world.db, PROJECT)[-2:]] == [
        ("invite.revoked", {"invite": ids["sent"], "reason": "inviter_erased", "by": None}),
        ("person.erased", {"person": "ren", "by": "ren"} | counts)]
    assert world.db.rows("SELECT state, email FROM invites ORDER BY id") == [
        {"state": "revoked", "email": None}, {"state": "revoked", "email": None}]
    assert [e["refs"]["reason"] for e in audit_entries(world.db, PROJECT, "device.revoked")] == ["sessions_ended"]


def test_an_erased_person_shows_as_one_everywhere_and_nothing_of_theirs_works(mcp, server, world):
    ren = confirmed(server, world, "ren")
    ids = scene(mcp, server, world)
    ren_token = world.tokens["ren"]
    assert ren.delete("/api/me").status_code == 200
    oj = person(server, world, "oj")
    # The room: ren's message stays the team's, by an erased person.
    room = mcp.ok("oj/muse", "read_room", P | {"limit": 50})
    said = next(m for m in room["messages"] if m["id"] == ids["message"])
    assert said["author"] == {"kind": "person", "handle": "ren", "display_name": "Erased person"}
    assert said["body"] == "Back on Monday."
    # Tasks: who asked is an erased person (or agent), in the API and the tools alike.
    assert oj.get(f"/api/tasks/{ids['own']}").json()["task"]["requested_by"] == ERASED_REN
    assert oj.get(f"/api/tasks/{ids['asked']}").json()["task"]["requested_by"] == ERASED_BUILDER
    timeline = oj.get(f"/api/tasks/{ids['own']}").json()["timeline"]
    assert [(e["kind"], e.get("move"), e["by"]) for e in timeline] == [
        ("created", None, ERASED_REN), ("state", "allow", {"kind": "system"}), ("state", "cancel", ERASED_REN)]
    # The project: ren is no member, ren/builder no agent of it any more.
    view = oj.get(f"/api/projects/{PROJECT}").json()
    assert [p["handle"] for p in view["people"]] == ["oj"]
    assert [a["agent_id"] for a in view["agents"]] == ["oj/muse", "oj/scout"]
    assert [m["handle"] for m in oj.get(f"/api/projects/{PROJECT}/members").json()["members"]] == ["oj"]
    # The audit view says which handles are of erased people.
    assert oj.get(f"/api/projects/{PROJECT}/audit").json()["erased"] == ["ren", "ren/builder"]
    # The person row keeps only the handle.
    assert world.db.one("SELECT display_name, email, timezone, erased_at IS NOT NULL AS erased FROM people WHERE "
                        "handle = 'ren'") == {"display_name": "Erased person", "email": None, "timezone": None,
                                              "erased": 1}
    assert world.db.scalar("SELECT display_name FROM agents WHERE agent_id = 'ren/builder'") == "builder"
    # Nothing of ren's works: their token, their agent's key, their runner's key.
    assert server.get("/api/me", headers={"Authorization": f"Bearer {ren_token}"}).status_code == 401
    for secret, kind in ((world.keys["ren/builder"], "client"), (ids["runner"], "runner")):
        with pytest.raises(prickle.Unauthorized, match="this credential was revoked"):
            prickle.resolve_token(world.db, secret, (kind,))
    r = server.post("/mcp", headers={"Authorization": f"Bearer {world.keys['ren/builder']}"}, json={
        "jsonrpc": "2.0", "id": 1, "method": "tools/list"})
    assert r.status_code == 401
    assert world.db.scalar("SELECT count(*) FROM credentials WHERE (person = 'ren' OR agent_id = 'ren/builder') "
                           "AND revoked_at IS NULL") == 0
    # ...and nothing can be made for them again.
    for args in (("--person", "ren"), ("--agent", "ren/builder"), ("--runner", "ren/builder")):
        code, _, err = run(world.db_path, "token", "create", *args, ok=False)
        assert code != 0 and "'ren' closed their account" in err, args


def test_the_events_lose_the_name_and_the_file_keeps_no_name_or_address(mcp, server, world):
    scene(mcp, server, world)
    prickle.set_person_email(world.db, "ren", "ren@example.org")  # an earlier copy of the row, in free space
    assert "Ren Ito" in json.dumps(prickle.read_events(world.db, PROJECT, 0, 1000))
    out = jrun(world.db_path, "person", "erase", "ren", "--vacuum")
    assert out["vacuum"]["bytes_after"] > 0
    assert "Ren Ito" not in json.dumps(prickle.read_events(world.db, PROJECT, 0, 1000))
    for table in [r["name"] for r in world.db.rows("SELECT name FROM sqlite_master WHERE type = 'table'")]:
        dump = json.dumps(world.db.rows(f"SELECT * FROM \"{table}\""), default=str)
        assert "Ren Ito" not in dump and "ren@example.org" not in dump, table
    # Not in the file's bytes either: not in a row, not in free space, not in the write-ahead log.
    for path in glob.glob(world.db_path + "*"):
        data = Path(path).read_bytes()
        assert b"Ren Ito" not in data and b"ren@example.org" not in data, path


def test_closing_asks_for_a_step_up_and_refuses_the_last_owner_and_a_second_time(mcp, server, world):
    oj = confirmed(server, world, "oj")
    before = world.db.scalar("SELECT count(*) FROM audit")
    r = person(server, world, "ren").delete("/api/me")
    assert (r.status_code, r.json()["error"]["code"]) == (403, "step_up_required")
    assert "confirm it's you to close your account" in r.json()["error"]["message"]
    # oj is the only owner of website-v2: say what to do, change nothing.
    r = oj.delete("/api/me")
    assert r.status_code == 409, r.text
    assert r.json()["error"]["message"] == (
        "'oj' is the last owner of 'website-v2': make another member an owner (Promote on the project's Members "
        "screen, or prickle member promote website-v2 HANDLE) or delete the project, then close the account")
    code, _, err = run(world.db_path, "person", "erase", "sam", ok=False)
    assert code != 0 and "'sam' is the last owner of 'side'" in err
    assert world.db.scalar("SELECT count(*) FROM audit") == before
    assert world.db.scalar("SELECT count(*) FROM people WHERE erased_at IS NOT NULL") == 0
    # The operator closes ren's account; a second time is refused, and so is an unknown handle.
    out = jrun(world.db_path, "person", "erase", "ren")
    assert [(p["project"], p["by"]) for p in out["projects"]] == [("ren-room", None), (PROJECT, None)]
    code, _, err = run(world.db_path, "person", "erase", "ren", ok=False)
    assert code != 0 and "'ren' closed their account already" in err
    code, _, err = run(world.db_path, "person", "erase", "nobody", ok=False)
    assert code != 0 and "no person 'nobody'" in err
    code, _, err = run(world.db_path, "person", "erase", "Not A Handle", ok=False)
    assert code != 0 and "handle" in err
    assert world.db.scalar("SELECT count(*) FROM people WHERE erased_at IS NOT NULL") == 1


def test_a_deleted_project_restored_after_a_member_closed_their_account_does_not_bring_them_back(world):
    prickle.delete_project(world.db, PROJECT, "oj")
    prickle.close_account(world.db, "ren")
    assert audit_entries(world.db, PROJECT, "person.erased") == []  # ren was in no live project but their room
    prickle.restore_project(world.db, PROJECT, "oj")
    assert world.db.rows("SELECT handle FROM members WHERE project = ? ORDER BY handle", (PROJECT,)) == [
        {"handle": "oj"}]
    assert world.db.rows("SELECT agent_id FROM project_agents WHERE project = ? ORDER BY agent_id", (PROJECT,)) == [
        {"agent_id": "oj/muse"}, {"agent_id": "oj/scout"}]


def test_a_computer_approved_but_not_yet_connected_gets_no_key_once_the_account_is_closed(server, world):
    ren = confirmed(server, world, "ren")
    asked = ask_connect(server)
    ok = ren.post(f"/api/connect/{asked['code']}", {"decision": "approve", "typed_code": asked["code"], "agents": [
        {"cli": "codex", "agent_id": "ren/builder"}]})
    assert ok.status_code == 200, ok.text
    keys = world.db.scalar("SELECT count(*) FROM credentials")
    assert ren.delete("/api/me").status_code == 200
    r = server.post("/api/runner/connect/collect", json={"request_id": asked["request_id"],
                                                         "collect_secret": asked["collect_secret"]})
    assert (r.status_code, r.json()["error"]["code"]) == (410, "expired")
    assert world.db.scalar("SELECT state FROM connect_requests WHERE id = ?", (asked["request_id"],)) == "expired"
    assert world.db.scalar("SELECT count(*) FROM credentials") == keys


def test_the_last_owner_of_a_deleted_project_is_told_to_restore_and_hand_it_on_or_erase_it(server, world):
    prickle.delete_project(world.db, PROJECT, "oj")
    before = world.db.scalar("SELECT count(*) FROM audit")
    said = ("'oj' is the last owner of 'website-v2', deleted but restorable: restore it (Restore under Deleted "
            "projects on the home page, or prickle project restore website-v2 --by oj), then make another member "
            "an owner or erase it, then close the account")
    r = confirmed(server, world, "oj").delete("/api/me")
    assert (r.status_code, r.json()["error"]["message"]) == (409, said), r.text
    code, _, err = run(world.db_path, "person", "erase", "oj", ok=False)
    assert code != 0 and said in err
    assert world.db.scalar("SELECT count(*) FROM audit") == before
    assert world.db.scalar("SELECT erased_at FROM people WHERE handle = 'oj'") is None
    # ren, a member but no owner when it was deleted, may go; once oj restores and erases it, oj may too.
    assert jrun(world.db_path, "person", "erase", "ren")["handle"] == "ren"
    prickle.restore_project(world.db, PROJECT, "oj")
    prickle.erase_project(world.db, PROJECT, "oj")
    out = jrun(world.db_path, "person", "erase", "oj")
    assert (out["handle"], [p["project"] for p in out["projects"]]) == ("oj", ["oj-room"])


def test_closing_ones_own_account_leaves_no_name_or_address_in_the_files_bytes(mcp, server, world):
    ren = confirmed(server, world, "ren")
    scene(mcp, server, world)  # ren's name in member.joined and project.created events, on pages moved since
    assert ren.delete("/api/me").status_code == 200
    # Zeroed where it lay (not left on a freed page), and the log emptied after the closing: no vacuum needed.
    for path in glob.glob(world.db_path + "*"):
        data = Path(path).read_bytes()
        assert b"Ren Ito" not in data and b"ren@example.org" not in data, path
