"""The default lead: a team owner picks an agent, its owner agrees, declines or steps down, and a
person's message naming nobody wakes the agent that leads."""

from conftest import PROJECT, audit_entries
from helpers import P, jrun, person, start, written


def _heard(mcp, agent, cursor):
    out = mcp.ok(agent, "wait_for_mention", {"cursor": cursor, "timeout_seconds": 1})
    return [(e["kind"], e["message"]["body"]) for e in out.get("events", [])], out["cursor"]


def _lead_wakes(world):
    return world.db.scalar("SELECT count(*) FROM wakes WHERE agent_id = 'ren/builder' AND kind = 'mention'")


def test_a_team_owner_picks_a_default_lead_its_owner_agrees_and_a_message_naming_nobody_wakes_it(
        server, mcp, world):
    oj, ren = person(server, world, "oj"), person(server, world, "ren")
    before = written(world.db)
    r = ren.post(f"/api/projects/{PROJECT}/lead", {"agent_id": "ren/builder"})
    assert r.status_code == 403 and r.json()["error"]["message"] == (
        "only an owner of team 'web' picks the default lead of 'website-v2'")
    r = oj.post(f"/api/projects/{PROJECT}/lead", {"agent_id": "sam/lone"})
    assert r.status_code == 404
    assert written(world.db) == before
    assert oj.post(f"/api/projects/{PROJECT}/lead", {"agent_id": "ren/builder"}).json() == {
        "lead": {"agent_id": "ren/builder", "state": "proposed", "picked_by": "oj"}}
    assert ren.get(f"/api/projects/{PROJECT}").json()["lead"]["state"] == "proposed"
    # Until its owner agrees, a message naming nobody wakes nobody.
    oj.post(f"/api/projects/{PROJECT}/messages", {"body": "Anyone free for the footer?"})
    assert _lead_wakes(world) == 0
    r = oj.post(f"/api/projects/{PROJECT}/lead/answer", {"decision": "agree"})
    assert r.status_code == 403 and r.json()["error"]["message"] == "only ren, who owns 'ren/builder', answers for it"
    assert ren.post(f"/api/projects/{PROJECT}/lead/answer", {"decision": "agree"}).json() == {
        "lead": {"agent_id": "ren/builder", "state": "agreed", "picked_by": "oj"}}
    assert [e["refs"] for e in audit_entries(world.db, PROJECT, "room.lead_agreed")] == [
        {"agent": "ren/builder", "by": "ren", "picked_by": "oj"}]
    cursor = start(mcp, "ren/builder", "wait_for_mention")
    oj.post(f"/api/projects/{PROJECT}/messages", {"body": "Who can take the footer?"})
    heard, cursor = _heard(mcp, "ren/builder", cursor)
    assert heard == [("mention", "Who can take the footer?")]
    # Naming someone, answering an agent, or an agent's own message: the lead is not woken.
    oj.post(f"/api/projects/{PROJECT}/messages", {"body": "@muse can you?"})
    oj.post(f"/api/projects/{PROJECT}/messages", {"body": "@ren can you?"})
    mcp.ok("oj/muse", "post_message", P | {"body": "I can look at it."})
    heard, cursor = _heard(mcp, "ren/builder", cursor)
    assert heard == []
    # Its owner steps down: the project has no default lead again.
    r = oj.post(f"/api/projects/{PROJECT}/lead/step-down")
    assert r.status_code == 403
    assert ren.post(f"/api/projects/{PROJECT}/lead/step-down").json() == {"lead": None}
    oj.post(f"/api/projects/{PROJECT}/messages", {"body": "Anyone?"})
    heard, cursor = _heard(mcp, "ren/builder", cursor)
    assert heard == []
    # A second pick declined; the command line picks and answers for whoever holds the file.
    oj.post(f"/api/projects/{PROJECT}/lead", {"agent_id": "ren/builder"})
    assert ren.post(f"/api/projects/{PROJECT}/lead/answer", {"decision": "decline"}).json() == {"lead": None}
    assert jrun(world.db_path, "lead", "pick", PROJECT, "oj/muse")["lead"] == {
        "agent_id": "oj/muse", "state": "proposed", "picked_by": None}
    assert jrun(world.db_path, "lead", "answer", PROJECT, "agree")["lead"]["state"] == "agreed"
    r = oj.post(f"/api/projects/{PROJECT}/lead", {"agent_id": "ren/builder"})
    assert r.status_code == 409 and r.json()["error"]["message"] == (
        "'oj/muse' leads 'website-v2' now: its owner steps down first")
    assert jrun(world.db_path, "lead", "show", PROJECT)["lead"]["agent_id"] == "oj/muse"
    assert [e["refs"] for e in audit_entries(world.db, PROJECT, "room.lead_declined")] == [
        {"agent": "ren/builder", "by": "ren", "reason": "stepped_down"},
        {"agent": "ren/builder", "by": "ren", "reason": "declined"}]
    assert [e["refs"] for e in audit_entries(world.db, PROJECT, "room.lead_agreed")][-1] == {
        "agent": "oj/muse", "by": None, "picked_by": None}
