"""Memory and pulse: discover_team_agents, get_project_context (memory facts, pulse, members) and update_pulse."""

import prickle
from conftest import PROJECT, all_events, audit_entries
from helpers import P, make_task


def test_discover_lists_people_and_agents_of_the_project_only(mcp, world):
    out = mcp.ok("oj/muse", "discover_team_agents", P)
    assert [p["handle"] for p in out["people"]] == ["oj", "ren"]
    assert out["people"][0] == {"handle": "oj", "display_name": "Oj Okafor", "avatar_url": None, "color": 0,
                                "away": False}
    assert [a["agent_id"] for a in out["agents"]] == ["oj/muse", "oj/scout", "ren/builder"]
    builder = out["agents"][2]
    assert builder == {
        "agent_id": "ren/builder", "owner": "ren", "name": "Builder", "avatar_url": None, "model": "gpt-5-codex",
        "client": "codex", "role": "Frontend", "capabilities": [{"kind": "repo", "name": "website"}],
        "availability": "offline", "trust_level": "owner_verified", "last_seen_at": None,
    }
    assert out["agents"][0]["availability"] == "online"  # the caller was just seen
    assert out["agents"][0]["last_seen_at"] is not None


def test_discover_shows_reported_availability(mcp, world):
    mcp.ok("ren/builder", "update_pulse", P | {"availability": "asleep", "doing": ""})
    out = mcp.ok("oj/muse", "discover_team_agents", P)
    assert {a["agent_id"]: a["availability"] for a in out["agents"]}["ren/builder"] == "asleep"


def test_project_context_has_memory_pulse_members_and_is_audited(mcp, world):
    prickle.set_memory(world.db, PROJECT, "tone", "Plain and warm.", "oj")
    prickle.set_memory(world.db, PROJECT, "stack", "Astro.", "ren")
    prickle.set_memory(world.db, PROJECT, "old", "Gone soon.", "ren")
    prickle.retract_memory(world.db, PROJECT, "old", "oj")
    mcp.ok("ren/builder", "update_pulse", P | {"doing": "Building the hero", "branch": "hero"})
    out = mcp.ok("oj/muse", "get_project_context", P)
    assert out["project"] == {"slug": PROJECT, "team": "web", "name": "Website v2", "description": "The new site."}
    assert [(m["key"], m["value"], m["provenance"], m["updated_by"]) for m in out["memory"]] == [
        ("stack", "Astro.", "owner_approved", "ren"), ("tone", "Plain and warm.", "owner_approved", "oj")]
    assert [(p["agent_id"], p["doing"], p["branch"]) for p in out["pulse"]] == [
        ("ren/builder", "Building the hero", "hero")]
    assert out["members"] == [
        {"kind": "person", "address": "oj", "display_name": "Oj Okafor", "is_you": False},
        {"kind": "person", "address": "ren", "display_name": "Ren Ito", "is_you": False},
        {"kind": "agent", "address": "oj/muse", "display_name": "Muse", "owner": "oj", "is_you": True},
        {"kind": "agent", "address": "oj/scout", "display_name": "Scout", "owner": "oj", "is_you": False},
        {"kind": "agent", "address": "ren/builder", "display_name": "Builder", "owner": "ren", "is_you": False},
    ]
    reads = audit_entries(world.db, PROJECT, "context.read")
    assert [e["refs"] for e in reads] == [{"reader": "oj/muse", "memory_facts": 2}]
    assert [e["refs"] for e in audit_entries(world.db, PROJECT, "memory.set")][0] == {
        "key": "tone", "by": "oj", "role": "owner", "provenance": "owner_approved"}
    assert [e["refs"] for e in audit_entries(world.db, PROJECT, "memory.retracted")] == [
        {"key": "old", "by": "oj", "role": "owner"}]
    assert "Plain and warm" not in str(audit_entries(world.db, PROJECT))


def test_update_pulse_replaces_the_report_and_writes_an_event(mcp, world):
    task = make_task(world, "oj/muse", "ren/builder")
    out = mcp.ok("ren/builder", "update_pulse", P | {
        "availability": "working", "doing": "Hero section", "task_id": task, "branch": "feat/hero",
        "files": ["src/hero.astro"], "last_decision": "Use the brand font.",
        "intent": {"kind": "change", "paths": ["src/hero.astro", "src/styles/**"], "areas": ["hero"]}})
    pulse = out["pulse"]
    assert {k: pulse[k] for k in ("agent_id", "owner", "project", "availability", "doing", "task_id", "branch",
                                  "files", "last_decision")} == {
        "agent_id": "ren/builder", "owner": "ren", "project": PROJECT, "availability": "working",
        "doing": "Hero section", "task_id": task, "branch": "feat/hero", "files": ["src/hero.astro"],
        "last_decision": "Use the brand font."}
    assert pulse["intent"]["kind"] == "change" and pulse["intent"]["areas"] == ["hero"]
    assert prickle.parse_iso(pulse["intent"]["expires_at"]) > prickle.parse_iso(pulse["updated_at"])
    event = all_events(world.db)[-1]
    assert event["type"] == "pulse.updated" and event["pulse"] == pulse
    assert world.db.scalar("SELECT count(*) FROM wakes WHERE seq = ?", (event["seq"],)) == 0
    # the next report replaces everything, and no intent clears it
    again = mcp.ok("ren/builder", "update_pulse", P | {"doing": ""})["pulse"]
    assert again["doing"] == "" and again["branch"] is None and again["task_id"] is None
    assert "intent" not in again and again["availability"] == "working"


def test_update_pulse_rules(mcp, world):
    text = mcp.error("ren/builder", "update_pulse", P, "invalid_input")
    assert "doing is required" in text
    mcp.error("ren/builder", "update_pulse", P | {"doing": "x", "intent": {"kind": "add"}}, "invalid_input")
    text = mcp.error("ren/builder", "update_pulse", P | {"doing": "x", "intent": {"kind": "add", "paths": ["../etc"]}},
                     "invalid_input")
    assert "repo-relative" in text
    mcp.error("ren/builder", "update_pulse", P | {"doing": "x", "intent": {"kind": "add", "paths": ["/abs"]}},
              "invalid_input")
    mcp.error("ren/builder", "update_pulse", P | {"doing": "x", "intent": {"kind": "add", "areas": ["Bad Area"]}},
              "invalid_input")
    mcp.error("ren/builder", "update_pulse", P | {"doing": "x", "task_id": "task_nope"}, "not_found")
    hidden = make_task(world, "oj/muse", "oj/scout")
    mcp.error("ren/builder", "update_pulse", P | {"doing": "x", "task_id": hidden}, "not_found")
    assert world.db.scalar("SELECT count(*) FROM pulses") == 0


def test_run_failure_only_from_runner_or_full_reach_client_key(mcp, world):
    failure = {"class": "auth", "step": "codex_sign_in"}
    _, project_key = prickle.create_token(world.db, "client", agent_id="ren/builder", project=PROJECT)
    text = mcp.error("ren/builder", "update_pulse", P | {"doing": "", "run_failure": failure}, "forbidden",
                     token=project_key)
    assert text.startswith("forbidden: run_failure:")
    mcp.error("ren/builder", "update_pulse", P | {"clear_run_failure": True}, "forbidden", token=project_key)
    _, runner_key = prickle.create_token(world.db, "runner", agent_id="ren/builder")
    pulse = mcp.ok("ren/builder", "update_pulse", P | {"doing": "", "availability": "idle", "run_failure": failure},
                   token=runner_key)["pulse"]
    assert pulse["run_failure"] == failure
    # a normal report keeps the failure; only clear_run_failure ends it
    pulse = mcp.ok("ren/builder", "update_pulse", P | {"doing": "retrying"})["pulse"]
    assert pulse["run_failure"] == failure
    text = mcp.error("ren/builder", "update_pulse", P | {"clear_run_failure": True, "doing": "x"}, "invalid_input",
                     token=runner_key)
    assert "leave out doing" in text
    mcp.error("ren/builder", "update_pulse", P | {"clear_run_failure": True, "run_failure": failure},
              "invalid_input", token=runner_key)
    pulse = mcp.ok("ren/builder", "update_pulse", P | {"clear_run_failure": True}, token=runner_key)["pulse"]
    assert "run_failure" not in pulse and pulse["doing"] == "retrying"


def test_clear_run_failure_without_a_pulse_returns_null(mcp, world):
    assert mcp.ok("oj/scout", "update_pulse", P | {"clear_run_failure": True}) == {"pulse": None}


def test_an_expired_intent_is_not_shown(mcp, world):
    mcp.ok("ren/builder", "update_pulse", P | {"doing": "x", "intent": {"kind": "remove", "areas": ["docs"]}})
    world.db.execute("UPDATE pulses SET intent = json_set(intent, '$.expires_at', '2020-01-01T00:00:00.000Z')")
    pulse = mcp.ok("oj/muse", "get_project_context", P)["pulse"][0]
    assert "intent" not in pulse
