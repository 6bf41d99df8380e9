"""Leaving and removal: members leave or are removed, agents are taken out, owners promoted, and
every knock-on (tasks returned and passed on, rules and standing approvals revoked, keys ended)."""

import asyncio
import time

import prickle
from conftest import PROJECT, Served, audit_entries, in_thread
from helpers import P, PACKET, call, claimed, client, jrun, person, run, start

REMOVAL = {"agents": 1, "returned": 1, "transferred": 1, "rules_revoked": 2, "standing_revoked": 1, "credentials": 1, "invites": 0}


def _counts(db):
    return {t: db.scalar(f"SELECT count(*) FROM {t}") for t in ("members", "project_agents", "audit", "outbox",
                                                                 "tasks", "credentials")}


def scene(mcp, server, world):
    """ren's work in website-v2: a task ren/builder holds (accepted), a task it asked oj/scout for (routed on
    oj's standing approval), ren's rule for oj's agents, oj's rule naming ren, and ren/builder's key for
    website-v2 alone. Returns (held task, asked task, ren's rule, oj's rule, standing approval)."""
    oj, ren = person(server, world, "oj"), person(server, world, "ren")
    ren_rule = ren.post("/api/rules", {"decision": "allow", "owner": "oj"}).json()["rule"]["id"]
    oj_rule = oj.post("/api/rules", {"decision": "approval_required", "owner": "ren"}).json()["rule"]["id"]
    held = mcp.ok("oj/muse", "handoff", P | {"to": "ren/builder", "packet": PACKET})
    assert held["gate"]["decision"] == "allow"
    mcp.ok("ren/builder", "accept_task", {"task_id": held["task"]["id"]})
    asked = mcp.ok("ren/builder", "handoff", P | {"to": "oj/scout", "packet": PACKET})
    r = oj.post(f"/api/approvals/{asked['gate']['approval_id']}", {"decision": "approve",
                                                                    "standing": {"uses": 3, "days": 7}})
    assert r.status_code == 200, r.text
    standing = world.db.scalar("SELECT id FROM standing_approvals")
    prickle.create_token(world.db, "client", agent_id="ren/builder", project=PROJECT)
    return held["task"]["id"], asked["task"]["id"], ren_rule, oj_rule, standing


def test_removing_a_member_hands_back_passes_on_revokes_and_counts_in_one_entry(mcp, server, world):
    held, asked, ren_rule, oj_rule, standing = scene(mcp, server, world)
    oj = person(server, world, "oj")
    assert oj.get(f"/api/projects/{PROJECT}/removal?handle=ren").json() == {
        "agents": ["ren/builder"], "returned": 1, "transferred": 1}
    oj_muse = mcp.ok("oj/muse", "wait_for_updates", {"timeout_seconds": 1})["cursor"]
    r = oj.delete(f"/api/projects/{PROJECT}/members/ren")
    assert r.status_code == 200, r.text
    assert r.json() == {"project": PROJECT, "handle": "ren", "left": False, "counts": REMOVAL}
    assert audit_entries(world.db, PROJECT, "member.removed")[0]["refs"] == {"person": "ren", "by": "oj"} | REMOVAL
    # The task ren/builder held is its requester's again, and the requester hears of it.
    assert [e["refs"] for e in audit_entries(world.db, PROJECT, "task.returned")] == [
        {"task": held, "reason": "member_removed", "agent": "ren/builder", "by": "oj"}]
    held_now = oj.get(f"/api/tasks/{held}").json()["task"]
    assert (held_now["state"], held_now["waiting_on"]) == ("returned", None)
    returned = [i for i in oj.get("/api/inbox").json()["items"] if i["kind"] == "returned"]
    assert [(i["id"], i["action"], i["task_id"]) for i in returned] == [(f"returned:{held}", "reassign", held)]
    heard = mcp.ok("oj/muse", "wait_for_updates", {"cursor": oj_muse, "timeout_seconds": 1})
    assert [(u["kind"], u["task_id"]) for u in heard["updates"]] == [("task", held)]
    # The task ren/builder asked for is oj's (a project owner's) to check now.
    assert [e["refs"] for e in audit_entries(world.db, PROJECT, "task.reassigned")] == [
        {"task": asked, "side": "requester", "from": "ren/builder", "to": "oj", "by": "oj"}]
    row = world.db.one("SELECT requester, requested_by, state FROM tasks WHERE id = ?", (asked,))
    assert row == {"requester": None, "requested_by": '{"kind": "person", "handle": "oj"}', "state": "routed"}
    # Both rules named someone who left: revoked with the reason, in the project's chain.
    assert [e["refs"] for e in audit_entries(world.db, PROJECT, "delegation.revoked")] == [
        {"rule": ren_rule, "reason": "owner_left", "grant_version": 2},
        {"rule": oj_rule, "reason": "named_left", "grant_version": 2}]
    assert [e["refs"] for e in audit_entries(world.db, PROJECT, "standing_approval.revoked")] == [
        {"standing_approval": standing, "uses": 0, "reason": "named_left", "voided": 0}]
    assert person(server, world, "oj").get("/api/rules").json()["standing_approvals"] == []
    # Nothing of ren's reaches the project: the project key ended, the every-project key and ren's token
    # find nothing there.
    scoped = world.db.one("SELECT revoked_at FROM credentials WHERE project = ?", (PROJECT,))
    assert scoped["revoked_at"] is not None
    mcp.error("ren/builder", "read_room", P, "not_found")
    assert person(server, world, "ren").get(f"/api/projects/{PROJECT}").status_code == 404
    assert [m["handle"] for m in oj.get(f"/api/projects/{PROJECT}/members").json()["members"]] == ["oj"]
    assert world.db.one("SELECT 1 FROM wakes WHERE agent_id = 'ren/builder' AND project = ?", (PROJECT,)) is None


def test_the_invites_a_removed_owner_sent_end_with_the_removal(server, world):
    prickle.promote_member(world.db, PROJECT, "ren", by="oj")
    world.db.execute("UPDATE team_people SET role = 'owner' WHERE handle = 'ren'")
    invite, secret = prickle.create_invite(world.db, PROJECT, "kim@example.org", "member", "ren")
    r = person(server, world, "oj").delete(f"/api/projects/{PROJECT}/members/ren")
    assert r.status_code == 200, r.text
    assert r.json()["counts"]["invites"] == 1
    assert audit_entries(world.db, PROJECT, "member.removed")[0]["refs"]["invites"] == 1
    assert [e["refs"]["reason"] for e in audit_entries(world.db, PROJECT, "invite.revoked")] == ["inviter_removed"]
    assert world.db.one("SELECT state, email FROM invites WHERE id = ?", (invite["id"],)) == {
        "state": "revoked", "email": None}


def test_the_requester_hands_a_returned_task_to_another_agent_through_its_gate(mcp, server, world):
    held, asked, *_ = scene(mcp, server, world)
    oj, ren, sam = (person(server, world, h) for h in ("oj", "ren", "sam"))
    # Only a returned task is handed on this way.
    r = oj.post(f"/api/tasks/{asked}/reassign", {"to": "oj/muse"})
    assert r.status_code == 409 and "is routed: reassign to another agent" in r.json()["error"]["message"]
    oj.delete(f"/api/projects/{PROJECT}/members/ren")
    before = _counts(world.db)
    for who, body, status, needle in (
            (oj, {"to": "oj/muse"}, 400, "to: 'oj/muse' is the task's requester"),
            (oj, {"to": "ren/builder"}, 400, "to: 'ren/builder' is the task's assignee"),
            (oj, {"to": "sam/lone"}, 404, "to: no agent 'sam/lone' in 'website-v2'"),
            (oj, {"to": "nope"}, 400, "to"),
            (sam, {"to": "oj/scout"}, 404, "no task")):
        r = who.post(f"/api/tasks/{held}/reassign", body)
        assert r.status_code == status and needle in r.json()["error"]["message"], r.text
    assert _counts(world.db) == before
    # Back in the project, ren is not the requester's owner nor a project owner.
    world.db.execute("INSERT INTO members VALUES (?, 'ren', 'member', 1, 'x')", (PROJECT,))
    assert ren.post(f"/api/tasks/{held}/reassign", {"to": "oj/scout"}).status_code == 403
    scout = mcp.ok("oj/scout", "wait_for_mention", {"timeout_seconds": 1})["cursor"]
    r = oj.post(f"/api/tasks/{held}/reassign", {"to": "oj/scout"})
    assert r.status_code == 200, r.text
    assert [i for i in oj.get("/api/inbox").json()["items"] if i["kind"] == "returned"] == []  # handed on
    assert r.json()["gate"]["decision"] == "allow"
    assert (r.json()["task"]["state"], r.json()["task"]["assignee"]) == ("routed", "oj/scout")
    assert audit_entries(world.db, PROJECT, "task.reassigned")[-1]["refs"] == {
        "task": held, "side": "assignee", "from": "ren/builder", "to": "oj/scout", "by": "oj"}
    moves = [(e["refs"]["from"], e["refs"]["to"], e["refs"]["move"])
             for e in audit_entries(world.db, PROJECT, "task.transitioned") if e["refs"]["task"] == held]
    assert moves[-3:] == [("accepted", "returned", "assignee_left"), ("returned", "requested", "reassign"),
                          ("requested", "routed", "allow")]
    woke = mcp.ok("oj/scout", "wait_for_mention", {"cursor": scout, "timeout_seconds": 1})
    assert [(e["kind"], e["task"]["id"]) for e in woke["events"]] == [("task", held)]


def test_a_returned_task_handed_to_a_teammates_agent_waits_for_that_owners_approval(mcp, server, world):
    oj = person(server, world, "oj")
    task = mcp.ok("oj/muse", "handoff", P | {"to": "oj/scout", "packet": PACKET})["task"]
    oj.delete(f"/api/projects/{PROJECT}/agents/oj/scout")
    r = oj.post(f"/api/tasks/{task['id']}/reassign", {"to": "ren/builder"})
    assert r.status_code == 200, r.text
    assert (r.json()["gate"]["decision"], r.json()["task"]["state"]) == ("approval_required", "approval")
    approvals = person(server, world, "ren").get("/api/approvals").json()["approvals"]
    assert [(a["approval"]["task_id"], a["approval"]["owner"]) for a in approvals] == [(task["id"], "ren")]


def test_the_last_owner_stays_until_another_is_promoted(mcp, server, world):
    oj, ren = person(server, world, "oj"), person(server, world, "ren")
    can_leave = lambda api: api.get(f"/api/projects/{PROJECT}").json()["can_leave"]  # the page's Leave button
    assert (can_leave(oj), can_leave(ren)) == (False, True)
    before = _counts(world.db)
    for r in (oj.post(f"/api/projects/{PROJECT}/leave"), oj.delete(f"/api/projects/{PROJECT}/members/oj")):
        assert r.status_code == 409
        assert r.json()["error"]["message"] == (
            f"'oj' is the last owner of '{PROJECT}': promote another member first "
            f"(Promote on the project's Members screen, or prickle member promote {PROJECT} HANDLE), then leave")
    assert ren.post(f"/api/projects/{PROJECT}/members/ren/promote").status_code == 403
    assert _counts(world.db) == before
    r = oj.post(f"/api/projects/{PROJECT}/members/ren/promote")
    assert r.json() == {"member": {"project": PROJECT, "handle": "ren", "role": "owner"}}
    assert audit_entries(world.db, PROJECT, "member.promoted")[0]["refs"] == {
        "person": "ren", "by": "oj", "grant_version": 2}
    assert oj.post(f"/api/projects/{PROJECT}/members/ren/promote").status_code == 409
    assert (can_leave(oj), can_leave(ren)) == (True, True)
    r = oj.post(f"/api/projects/{PROJECT}/leave")
    assert r.status_code == 200, r.text
    assert audit_entries(world.db, PROJECT, "member.left")[0]["refs"] == {
        "person": "oj", "by": "oj", "agents": 2, "returned": 0, "transferred": 0, "rules_revoked": 0,
        "standing_revoked": 0, "credentials": 0, "invites": 0}
    assert world.db.rows("SELECT agent_id FROM project_agents WHERE project = ?", (PROJECT,)) == [
        {"agent_id": "ren/builder"}]
    # Now ren is the last owner.
    assert can_leave(ren) is False
    assert ren.post(f"/api/projects/{PROJECT}/leave").status_code == 409


def test_only_an_owner_removes_others_and_bad_requests_change_nothing(mcp, server, world):
    ren, sam = person(server, world, "ren"), person(server, world, "sam")
    before = _counts(world.db)
    r = ren.delete(f"/api/projects/{PROJECT}/members/oj")
    assert r.status_code == 403 and r.json()["error"]["message"] == (
        f"only an owner of '{PROJECT}' can remove a member; to leave, leave yourself")
    assert sam.delete(f"/api/projects/{PROJECT}/members/ren").status_code == 404  # not in it
    r = person(server, world, "oj").delete(f"/api/projects/{PROJECT}/members/sam")
    assert r.status_code == 404 and r.json()["error"]["message"] == f"handle: 'sam' is not a member of '{PROJECT}'"
    assert person(server, world, "oj").delete(f"/api/projects/{PROJECT}/members/BAD!").status_code == 400
    assert ren.delete(f"/api/projects/{PROJECT}/agents/oj/muse").status_code == 403
    assert ren.get(f"/api/projects/{PROJECT}/removal").status_code == 400
    assert _counts(world.db) == before
    # A private room has no members to remove.
    room = world.db.scalar("SELECT project FROM rooms WHERE owner = 'ren'")
    assert ren.post(f"/api/projects/{room}/leave").status_code == 403


def test_an_agent_is_taken_out_by_its_owner_or_a_project_owner(mcp, server, world):
    oj, ren = person(server, world, "oj"), person(server, world, "ren")
    ren.post("/api/rules", {"decision": "allow", "owner": "oj"})
    task = mcp.ok("oj/muse", "handoff", P | {"to": "ren/builder", "packet": PACKET})["task"]
    oj_rule = oj.post("/api/rules", {"decision": "allow", "agent": "ren/builder"}).json()["rule"]["id"]
    r = oj.delete(f"/api/projects/{PROJECT}/agents/ren/builder")
    assert r.status_code == 200, r.text
    counts = {"agents": 1, "returned": 1, "transferred": 0, "rules_revoked": 1, "standing_revoked": 0,
              "credentials": 0, "invites": 0}
    assert audit_entries(world.db, PROJECT, "agent.removed")[0]["refs"] == {"agent": "ren/builder", "by": "oj"} | counts
    assert audit_entries(world.db, PROJECT, "task.returned")[0]["refs"] == {
        "task": task["id"], "reason": "agent_removed", "agent": "ren/builder", "by": "oj"}
    assert audit_entries(world.db, PROJECT, "delegation.revoked")[0]["refs"] == {
        "rule": oj_rule, "reason": "named_left", "grant_version": 2}
    # ren stays a member, with no agent here; ren's rule for oj's agents still applies.
    members = oj.get(f"/api/projects/{PROJECT}/members").json()["members"]
    assert [(m["handle"], m["agents"]) for m in members] == [("oj", ["oj/muse", "oj/scout"]), ("ren", [])]
    assert len(person(server, world, "ren").get("/api/rules").json()["rules"]) == 1
    mcp.error("ren/builder", "check_inbox", P, "not_found")
    assert oj.delete(f"/api/projects/{PROJECT}/agents/ren/builder").status_code == 404
    # Its owner takes their own agent out too.
    r = oj.delete(f"/api/projects/{PROJECT}/agents/oj/scout")
    assert r.json()["counts"]["agents"] == 1


def test_rules_stay_while_their_two_sides_still_share_a_project(mcp, server, world):
    oj = person(server, world, "oj")
    jrun(world.db_path, "member", "add", "side", "oj")
    jrun(world.db_path, "member", "add", "side", "ren")
    oj.post("/api/rules", {"decision": "never", "owner": "ren"})
    r = oj.delete(f"/api/projects/{PROJECT}/members/ren")
    assert r.json()["counts"]["rules_revoked"] == 0
    assert [x["subject"] for x in oj.get("/api/rules").json()["rules"]] == ["ren"]
    assert audit_entries(world.db, PROJECT, "delegation.revoked") == []


def test_waits_of_an_agent_taken_out_end_with_not_found(mcp, server, world, monkeypatch):
    # Only the removal's wake can end these waits: no periodic re-check comes in time.
    monkeypatch.setattr(prickle, "LIVE_CHECK_EVERY", 1000.0)
    hub = server.state.hub
    for args in (P, {}):
        mcp.ok("ren/builder", "wait_for_updates", args | {"timeout_seconds": 1})
        join = in_thread(mcp.call, "ren/builder", "wait_for_updates", args | {"timeout_seconds": 50})
        for _ in range(1000):  # until the wait is open on the server
            if hub.is_waiting("ren/builder"):
                break
            time.sleep(0.01)
        assert hub.is_waiting("ren/builder")
        if args:
            person(server, world, "oj").delete(f"/api/projects/{PROJECT}/agents/ren/builder")
            expected = f"not_found: project '{PROJECT}' not found: it does not exist or agent 'ren/builder' is not in it"
        else:
            person(server, world, "ren").delete(f"/api/projects/{PROJECT}/agents/ren/builder")
            expected = (f"not_found: agent 'ren/builder' was taken out of project '{PROJECT}': wait again to hear "
                        "from the projects it is still in")
        is_error, text = join(40)
        assert is_error and text == expected
        prickle.add_agent_to_project(world.db, PROJECT, "ren/builder")  # back for the next round


def test_member_and_agent_commands(world):
    db = world.db_path
    code, out, err = run(db, "member", "leave", PROJECT, "oj", ok=False)
    assert code == 1 and "'oj' is the last owner of 'website-v2'" in err
    assert jrun(db, "member", "promote", PROJECT, "ren") == {"member": {"project": PROJECT, "handle": "ren",
                                                                        "role": "owner"}}
    assert audit_entries(world.db, PROJECT, "member.promoted")[0]["refs"] == {"person": "ren", "by": None,
                                                                             "grant_version": 2}
    out = jrun(db, "agent", "remove", PROJECT, "oj/scout")
    assert out == {"project": PROJECT, "agent_id": "oj/scout", "counts": {
        "agents": 1, "returned": 0, "transferred": 0, "rules_revoked": 0, "standing_revoked": 0, "credentials": 0, "invites": 0}}
    assert jrun(db, "member", "leave", PROJECT, "oj")["left"] is True
    assert audit_entries(world.db, PROJECT, "member.left")[0]["refs"]["by"] == "oj"
    prickle.add_member(world.db, PROJECT, "sam")
    text = run(db, "member", "remove", PROJECT, "sam")[1]
    assert text.strip() == (f"Removed sam from {PROJECT}: 0 agents out, 0 tasks returned, 0 passed to an owner, "
                            "0 rules and 0 standing approvals revoked, 0 credentials ended, 0 invites revoked.")
    assert audit_entries(world.db, PROJECT, "member.removed")[0]["refs"]["by"] is None
    assert jrun(db, "member", "list", PROJECT)["members"][0]["handle"] == "ren"


def test_after_ren_is_removed_a_real_server_ends_the_agents_wait_and_the_task_goes_on(world, db_path):
    """A real ``prickle serve`` and the MCP SDK client: ren's agent waits; an owner removes ren over HTTP."""
    import httpx
    oj_rule = prickle.set_rule(world.db, "oj", "approval_required", from_owner="ren")["id"]
    ren_rule = prickle.set_rule(world.db, "ren", "allow", from_owner="oj")["id"]
    with Served(db_path) as served:
        url, base = served.info["mcp"], served.info["url"]
        api = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {world.tokens['oj']}"})

        async def scenario():
            async with client(url, world.keys["ren/builder"]) as builder, \
                    client(url, world.keys["oj/muse"]) as muse, client(url, world.keys["oj/scout"]) as scout:
                held = (await call(muse, "handoff", P | {"to": "ren/builder", "packet": PACKET}))["task"]["id"]
                await call(builder, "accept_task", {"task_id": held})
                cursor = (await call(builder, "wait_for_mention", P | {"timeout_seconds": 1}))["cursor"]
                waiting = asyncio.create_task(builder.call_tool(
                    "wait_for_mention", P | {"cursor": cursor, "timeout_seconds": 50}))
                scout_cursor = (await call(scout, "wait_for_mention", P | {"timeout_seconds": 1}))["cursor"]
                r = await asyncio.to_thread(api.delete, f"/api/projects/{PROJECT}/members/ren")
                assert r.status_code == 200, r.text
                assert r.json()["counts"] == {"agents": 1, "returned": 1, "transferred": 0, "rules_revoked": 2,
                                              "standing_revoked": 0, "credentials": 0, "invites": 0}
                ended = await asyncio.wait_for(waiting, 40)
                assert ended.is_error and ended.content[0].text.startswith(
                    f"not_found: project '{PROJECT}' not found")
                nxt = await builder.call_tool("read_room", P)
                assert nxt.is_error and nxt.content[0].text.startswith("not_found: ")
                task = (await asyncio.to_thread(api.get, f"/api/tasks/{held}")).json()["task"]
                assert (task["state"], task["assignee"]) == ("returned", "ren/builder")
                r = await asyncio.to_thread(api.post, f"/api/tasks/{held}/reassign", json={"to": "oj/scout"})
                assert r.status_code == 200 and r.json()["task"]["state"] == "routed", r.text
                woke = await call(scout, "wait_for_mention", P | {"cursor": scout_cursor, "timeout_seconds": 30})
                assert [(e["kind"], e["task"]["id"]) for e in woke["events"]] == [("task", held)]
                await call(scout, "accept_task", {"task_id": held})

        asyncio.run(scenario())
        api.close()
    assert [(e["refs"]["rule"], e["refs"]["reason"]) for e in audit_entries(world.db, PROJECT, "delegation.revoked")] \
        == [(oj_rule, "named_left"), (ren_rule, "owner_left")]


def test_a_run_inside_a_call_when_its_agent_is_removed_finds_its_task_not_found(mcp, server, world):
    task, device, runner, out = claimed(mcp, server, world)
    run = out["execution_credential"]["token"]
    mcp.ok("ren/builder", "accept_task", {"task_id": task["id"]}, token=run)
    r = person(server, world, "oj").delete(f"/api/projects/{PROJECT}/members/ren")
    assert r.status_code == 200, r.text
    # Its next request is refused before any tool runs, as a JSON-RPC error that says not_found.
    r = mcp.raw(run, "tools/call", {"name": "read_room", "arguments": P | {"task_id": task["id"]}}, "read_room")
    assert r.status_code == 404 and r.json()["error"]["data"] == {"code": "not_found"}
    assert r.json()["error"]["message"] == f"task '{task['id']}' not found: ren/builder is no longer in its project"
    assert world.db.scalar("SELECT revoked_reason FROM credentials WHERE task_id = ?", (task["id"],)) == "assignee_left"
    # A key revoked by its owner still says so: only leaving the project reads as not_found.
    record, key = prickle.create_token(world.db, "client", agent_id="oj/muse")
    with world.db.transaction():
        prickle.revoke_credentials(world.db, "id = ?", (record["id"],), "revoked")
    assert mcp.raw(key, "tools/call", {"name": "read_room", "arguments": P}, "read_room").status_code == 401


def test_a_default_lead_taken_out_of_the_project_leads_it_no_more(mcp, server, world):
    oj, ren = person(server, world, "oj"), person(server, world, "ren")
    oj.post(f"/api/projects/{PROJECT}/lead", {"agent_id": "ren/builder"})
    assert ren.post(f"/api/projects/{PROJECT}/lead/answer", {"decision": "agree"}).json()["lead"]["state"] == "agreed"
    assert oj.delete(f"/api/projects/{PROJECT}/agents/ren/builder").status_code == 200
    assert oj.get(f"/api/projects/{PROJECT}").json()["lead"] is None
    assert audit_entries(world.db, PROJECT, "agent.removed")[-1]["refs"]["agent"] == "ren/builder"
    assert audit_entries(world.db, PROJECT, "room.lead_declined") == []  # its owner declined nothing
    # Added back, it leads nothing until picked again: a message naming nobody wakes nobody.
    prickle.add_agent_to_project(world.db, PROJECT, "ren/builder")
    oj.post(f"/api/projects/{PROJECT}/messages", {"body": "Anyone free for the footer?"})
    assert world.db.scalar("SELECT count(*) FROM wakes WHERE agent_id = 'ren/builder' AND kind = 'mention'") == 0
    # A team owner picks another lead at once.
    assert oj.post(f"/api/projects/{PROJECT}/lead", {"agent_id": "oj/muse"}).json() == {
        "lead": {"agent_id": "oj/muse", "state": "proposed", "picked_by": "oj"}}
    # A picked lead whose owner leaves goes with them.
    prickle.add_member(world.db, PROJECT, "sam", by="oj")
    prickle.add_agent_to_project(world.db, PROJECT, "sam/lone")
    assert oj.post(f"/api/projects/{PROJECT}/lead", {"agent_id": "sam/lone"}).status_code == 200
    assert person(server, world, "sam").post(f"/api/projects/{PROJECT}/leave").status_code == 200
    assert oj.get(f"/api/projects/{PROJECT}").json()["lead"] is None
    assert audit_entries(world.db, PROJECT, "member.left")[-1]["refs"]["agents"] == 1
    assert oj.post(f"/api/projects/{PROJECT}/lead", {"agent_id": "oj/muse"}).json()["lead"]["agent_id"] == "oj/muse"


def test_an_agent_taken_out_hears_nothing_when_a_person_answers_its_old_message(mcp, server, world):
    oj = person(server, world, "oj")
    old = mcp.ok("ren/builder", "post_message", P | {"body": "The footer is done."})["message"]
    cursor = start(mcp, "ren/builder", "wait_for_updates")
    assert oj.delete(f"/api/projects/{PROJECT}/agents/ren/builder").status_code == 200
    r = oj.post(f"/api/projects/{PROJECT}/messages", {"body": "Thanks, looks good.", "in_reply_to": old["id"]})
    assert r.status_code == 200 and r.json()["message"]["in_reply_to"] == old["id"]
    assert world.db.scalar("SELECT count(*) FROM wakes WHERE agent_id = 'ren/builder'") == 0
    out = mcp.ok("ren/builder", "wait_for_updates", {"cursor": cursor, "timeout_seconds": 1})
    assert (out["status"], out.get("updates", [])) == ("timeout", [])
    # An agent still in the project hears the answer to its message.
    mine = mcp.ok("oj/muse", "post_message", P | {"body": "Hero copy is in."})["message"]
    cursor = start(mcp, "oj/muse", "wait_for_updates")
    reply = oj.post(f"/api/projects/{PROJECT}/messages", {"body": "Great.", "in_reply_to": mine["id"]}).json()
    out = mcp.ok("oj/muse", "wait_for_updates", {"cursor": cursor, "timeout_seconds": 1})
    assert [(u["kind"], u["message_id"]) for u in out["updates"]] == [("reply", reply["message"]["id"])]


def test_a_removal_preview_of_someone_not_in_the_project_is_not_found(server, world):
    ren = person(server, world, "ren")
    for query, message in (("handle=sam", "handle: 'sam' is not a member of 'website-v2'"),
                           ("handle=nobody", "handle: 'nobody' is not a member of 'website-v2'"),
                           ("agent=sam/lone", "agent: no agent 'sam/lone' in 'website-v2'"),
                           ("agent=nobody/x", "agent: no agent 'nobody/x' in 'website-v2'")):
        r = ren.get(f"/api/projects/{PROJECT}/removal?{query}")
        assert r.status_code == 404 and r.json()["error"] == {"code": "not_found", "message": message}
    assert ren.get(f"/api/projects/{PROJECT}/removal?agent=oj/scout").json() == {
        "agents": ["oj/scout"], "returned": 0, "transferred": 0}


def test_a_member_leaving_with_the_default_lead_names_it_in_the_entry(mcp, server, world):
    oj, ren = person(server, world, "oj"), person(server, world, "ren")
    oj.post(f"/api/projects/{PROJECT}/lead", {"agent_id": "ren/builder"})
    ren.post(f"/api/projects/{PROJECT}/lead/answer", {"decision": "agree"})
    assert ren.post(f"/api/projects/{PROJECT}/leave").status_code == 200
    [left] = audit_entries(world.db, PROJECT, "member.left")
    assert (left["refs"]["person"], left["refs"]["lead"], left["refs"]["agents"]) == ("ren", "ren/builder", 1)
    prickle.add_member(world.db, PROJECT, "sam", by="oj")
    prickle.remove_member(world.db, PROJECT, "sam", by="oj")
    [removed] = audit_entries(world.db, PROJECT, "member.removed")
    assert "lead" not in removed["refs"]  # sam's leaving ended no lead


def test_a_result_its_leaving_requester_was_to_verify_waits_on_the_person_it_passes_to(mcp, server, world):
    task = mcp.ok("oj/scout", "handoff", P | {"to": "oj/muse", "packet": PACKET})["task"]
    mcp.ok("oj/muse", "accept_task", {"task_id": task["id"]})
    mcp.ok("oj/muse", "return_result", {"task_id": task["id"], "summary": "Done.", "evidence": [
        {"kind": "test_output", "summary": "Counted.", "content": "6 words", "criteria": [0, 1]}]})
    assert prickle.task_out(world.db, task["id"])["waiting_on"] == "agent"  # oj/scout verifies it
    prickle.remove_agent(world.db, PROJECT, "oj/scout", "oj")
    out = prickle.task_out(world.db, task["id"])
    assert (out["state"], out["requester"], out["requested_by"]["handle"], out["waiting_on"]) == (
        "verifying", None, "oj", "owner_approval")
