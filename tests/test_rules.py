"""The owner's gate rules: allow, never or ask for all teammates, one teammate's agents or one agent, the most
specific deciding; rules that expire; a rule for someone who does not exist."""

import pytest

import prickle
from conftest import PROJECT, audit_entries
from helpers import handoff, person


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
