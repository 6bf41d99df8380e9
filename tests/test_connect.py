"""Connecting a computer: ``prickle runner connect`` asks with a short code, the owner approves it once on the
page, and the runner collects its keys once into a private config."""

import pytest

import prickle
from conftest import PROJECT, audit_entries
from helpers import SoftAuthenticator, ask_connect, confirmed, person


def collect(server, asked, secret=None):
    return server.post("/api/runner/connect/collect", json={
        "request_id": asked["request_id"], "collect_secret": secret or asked["collect_secret"]})


def test_connect_a_computer_with_a_code_the_owner_approves_once(server, world, mcp):
    asked = ask_connect(server)
    assert asked["link"] == f"http://127.0.0.1:8321/#/connect/{asked['code']}"
    assert asked["collect_secret"].startswith("prk_dq_") and asked["interval"] == 2
    assert len(asked["code"]) == 9 and asked["code"][4] == "-"
    assert collect(server, asked).json() == {"status": "pending"}
    assert collect(server, asked, "prk_dq_wrong").status_code == 404
    ren = confirmed(server, world, "ren")
    view = ren.get(f"/api/connect/{asked['code'].lower().replace('-', '')}").json()  # typed loosely
    assert (view["request"]["name"], view["request"]["clis"], view["request"]["state"]) == (
        "ren-laptop", ["claude", "codex"], "pending")
    assert [a["agent_id"] for a in view["agents"]] == ["ren/builder"]
    bad = ren.post(f"/api/connect/{asked['code']}", {"decision": "approve", "typed_code": asked["code"], "agents": [
        {"cli": "claude", "agent_id": "oj/muse"}]})
    assert bad.status_code == 400 and "agents[0].agent_id" in bad.json()["error"]["message"]
    ok = ren.post(f"/api/connect/{asked['code']}", {"decision": "approve", "typed_code": asked["code"], "agents": [
        {"cli": "codex", "agent_id": "ren/builder"},
        {"cli": "claude", "create": {"name": "scribe", "display_name": "Scribe", "model": "claude-sonnet"}}]})
    assert ok.status_code == 200, ok.text
    assert ok.json()["request"]["plan"] == [{"cli": "codex", "agent_id": "ren/builder"},
                                            {"cli": "claude", "agent_id": "ren/scribe"}]
    assert world.db.one("SELECT client FROM agents WHERE agent_id = 'ren/scribe'")["client"] == "claude-code"
    again = ren.post(f"/api/connect/{asked['code']}", {"decision": "refuse"})
    assert again.status_code == 409  # single use
    got = collect(server, asked).json()
    assert got["status"] == "approved" and got["server"] == "http://127.0.0.1:8321"
    assert [(a["agent_id"], a["client"]) for a in got["agents"]] == [("ren/builder", "codex"), ("ren/scribe", "claude")]
    key = got["agents"][0]["key"]
    assert key.startswith("prk_rk_")
    assert mcp.ok("ren/builder", "wait_for_mention", {"timeout_seconds": 1}, token=key)["status"] == "timeout"
    assert collect(server, asked).status_code == 409  # keys are collected once
    devices = person(server, world, "ren").get("/api/devices").json()["devices"]
    assert sorted((d["agent_id"], d["name"]) for d in devices) == [("ren/builder", "ren-laptop"),
                                                                   ("ren/scribe", "ren-laptop")]
    [approved] = audit_entries(world.db, PROJECT, "device.approved")
    assert approved["refs"] == {"request": asked["request_id"], "agents": ["ren/builder", "ren/scribe"], "keys": 2,
                                "by": "ren", "step_up": True}
    [collected] = audit_entries(world.db, PROJECT, "device.collected")
    assert collected["refs"] == {"request": asked["request_id"], "agents": ["ren/builder", "ren/scribe"], "keys": [
        {"credential": a["credential_id"], "agent": a["agent_id"], "reach": "runner"} for a in got["agents"]]}
    log = str(audit_entries(world.db, PROJECT)) + str(audit_entries(world.db, "ren-room"))
    assert asked["code"] not in log and "ren-laptop" not in log and key not in log


def test_a_refused_or_expired_request_says_so_on_both_sides(server, world):
    asked = ask_connect(server, ["codex"])
    ren = confirmed(server, world, "ren")
    assert ren.post(f"/api/connect/{asked['code']}", {"decision": "refuse"}).json()["request"]["state"] == "refused"
    r = collect(server, asked)
    assert r.status_code == 403 and "refused" in r.json()["error"]["message"]
    late = ask_connect(server, ["codex"])
    world.db.execute("UPDATE connect_requests SET expires_at = '2020-01-01T00:00:00.000Z' WHERE id = ?",
                     (late["request_id"],))
    r = ren.post(f"/api/connect/{late['code']}", {"decision": "approve", "typed_code": late["code"], "agents": [
        {"cli": "codex", "agent_id": "ren/builder"}]})
    assert r.status_code == 410 and r.json()["error"]["code"] == "expired"
    r = collect(server, late)
    assert r.status_code == 410 and "run 'prickle runner connect' again" in r.json()["error"]["message"]
    assert server.post("/api/runner/connect", json={"name": "x", "clis": ["vim"]}).status_code == 400
    assert world.db.scalar("SELECT count(*) FROM devices") == 0


def test_prickle_runner_connect_writes_a_private_config(tmp_path, server, world):
    config = tmp_path / "conf" / "runner.toml"
    config.parent.mkdir()
    config.write_text('server = "http://old"\n\n[agents."ren/builder"]\nkey = "prk_rk_old"\nclient = "codex"\n'
                      'repo = "/src/site"\nparallel = 3\n')
    shown: list[str] = []

    def post(url, body):  # the real server, in-process, in place of the network
        r = server.post(url.removeprefix("http://127.0.0.1:8321"), json=body)
        return r.status_code, r.json()

    def approve(_seconds):
        code = shown[0].split("Code: ")[1].split(" ")[0]
        r = confirmed(server, world, "ren").post(f"/api/connect/{code}", {"decision": "approve", "typed_code": code,
                                                                       "agents": [
            {"cli": "codex", "agent_id": "ren/builder"}]})
        assert r.status_code == 200, r.text

    real, prickle._runner_post = prickle._runner_post, post
    try:
        out = prickle.connect_runner("http://127.0.0.1:8321/mcp", str(config), "ren-laptop", ["codex"],
                                     shown.append, approve)
    finally:
        prickle._runner_post = real
    assert "/#/connect/" in shown[0] and "expires in 10 minutes" in shown[0] and "prk_" not in shown[0]
    assert (config.stat().st_mode & 0o777) == 0o600
    written = prickle.read_runner_config(str(config))
    entry = written["agents"]["ren/builder"]
    assert written["server"] == "http://127.0.0.1:8321"
    assert entry["key"].startswith("prk_rk_") and entry["key"] != "prk_rk_old"
    assert (entry["client"], entry["repo"], entry["parallel"], entry["launch_timeout_minutes"]) == (
        "codex", "/src/site", 3, 30)
    assert out == {"config": str(config), "agents": [{"agent_id": "ren/builder", "client": "codex",
                                                      "device_id": out["agents"][0]["device_id"]}]}


def test_connect_with_no_agent_cli_says_how_to_pair_a_command_client(tmp_path):
    with pytest.raises(prickle.InvalidInput) as refused:
        prickle.connect_runner("http://127.0.0.1:8321", str(tmp_path / "runner.toml"), "kim-laptop", [], print)
    assert str(refused.value) == (
        "no agent CLI (claude, codex) on PATH: install one, or pair a runner key with 'prickle device pair "
        "OWNER/NAME' (or Agents & keys on the page) and configure client = \"command\" in the runner's config by hand")
    assert not (tmp_path / "runner.toml").exists()


def test_the_real_command_against_the_real_server(tmp_path, db_path, world):
    """`prickle runner connect` against `prickle serve`: the code on stderr, the keys in the file, refusal exits 1."""
    import json
    import subprocess

    import httpx
    from conftest import PRICKLE, Served
    with Served(db_path) as served:
        base = f"http://127.0.0.1:{served.info['port']}"
        config = tmp_path / "runner.toml"
        env = {"PATH": str(tmp_path), "HOME": str(tmp_path)}
        for cli in ("claude", "codex"):  # stand-ins on PATH, so the runner reports both
            (tmp_path / cli).write_text("#!/bin/sh\n")
            (tmp_path / cli).chmod(0o755)
        for decision, expect in (("approve", 0), ("refuse", 1)):
            proc = subprocess.Popen(PRICKLE + ["runner", "connect", "--server", base + "/mcp", "--config",
                                               str(config), "--name", "ren-laptop", "--json"],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                    env=env)
            first = proc.stderr.readline() + proc.stderr.readline() + proc.stderr.readline()
            code = first.split("Code: ")[1].split(" ")[0]
            with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {world.tokens['ren']}"}) as ren:
                if decision == "approve":  # approving needs a step-up: ren adds a passkey (tests/test_step_up.py)
                    key = SoftAuthenticator()
                    at = base.replace("127.0.0.1", "localhost")
                    options = ren.post("/api/me/passkeys/options", json={"purpose": "register"},
                                       headers={"Origin": at}).json()["publicKey"]
                    assert ren.post("/api/me/passkeys", json={"credential": key.create(options, at)}).status_code == 200
                view = ren.get(f"/api/connect/{code}").json()
                assert view["request"]["clis"] == ["claude", "codex"]
                body = {"decision": decision}
                if decision == "approve":
                    body |= {"typed_code": code, "agents": [{"cli": "codex", "agent_id": "ren/builder"}]}
                assert ren.post(f"/api/connect/{code}", json=body).status_code == 200
            out, err = proc.communicate(timeout=30)
            assert proc.returncode == expect, err
            if decision == "approve":
                answer = json.loads(out)
                assert answer["agents"][0]["agent_id"] == "ren/builder" and "prk_rk_" not in out + first + err
                assert (config.stat().st_mode & 0o777) == 0o600
                assert prickle.read_runner_config(str(config))["agents"]["ren/builder"]["client"] == "codex"
            else:
                assert out == "" and "refused on the page" in err


def test_strangers_asking_first_never_lock_a_real_computer_out(world):
    db, base = world.db, "http://127.0.0.1:8321"
    for n in range(3):
        prickle.request_connect(db, "noise", ["codex"], base, "203.0.113.7")
    with pytest.raises(prickle.Conflict) as e:
        prickle.request_connect(db, "noise", ["codex"], base, "203.0.113.7")
    assert str(e.value) == ("3 requests from this address already wait to be approved: approve or refuse them, "
                            "or wait until they expire (10 minutes)")
    # Strangers fill every place (three each from many addresses, the first one holding three too) ...
    for n in range(prickle.CONNECT_PENDING_MAX - 3):
        prickle.request_connect(db, "noise", ["codex"], base, f"198.51.100.{n // 3}")
    waiting = db.scalar("SELECT count(*) FROM connect_requests WHERE state = 'pending'")
    assert waiting == prickle.CONNECT_PENDING_MAX
    oldest = db.one("SELECT id FROM connect_requests ORDER BY created_at, rowid LIMIT 1")["id"]
    # ... and a computer asking for the first time still gets its code: the oldest of the busiest goes.
    mine = prickle.request_connect(db, "ren-laptop", ["claude"], base, "192.0.2.10")
    assert mine["code"] and db.one("SELECT state FROM connect_requests WHERE id = ?", (oldest,))["state"] == "expired"
    assert db.scalar("SELECT count(*) FROM connect_requests WHERE state = 'pending'") == prickle.CONNECT_PENDING_MAX
    assert db.one("SELECT address FROM connect_requests WHERE id = ?", (mine["request_id"],))["address"] == "192.0.2.10"


def test_approving_needs_the_code_typed_from_the_computer_not_just_a_link(server, world):
    asked = ask_connect(server, ["codex"])
    ren = confirmed(server, world, "ren")
    view = ren.get(f"/api/connect/{asked['code']}").json()["request"]
    assert view["address"] == "testclient" and view["created_at"]
    for typed in (None, "", "ABCD-EFGH"):
        r = ren.post(f"/api/connect/{asked['code']}", {"decision": "approve", "typed_code": typed,
                                                       "agents": [{"cli": "codex", "agent_id": "ren/builder"}]})
        assert (r.status_code, r.json()["error"]["message"]) == (400, (
            "typed_code: type the code your computer shows (prickle runner connect printed it): approve only a "
            "computer you are connecting yourself, now"))
    assert ren.get(f"/api/connect/{asked['code']}").json()["request"]["state"] == "pending"
    assert world.db.scalar("SELECT count(*) FROM devices") == 0


def test_an_agent_made_on_the_connect_page_joins_its_owners_team_projects(server, world, mcp):
    asked = ask_connect(server, ["claude"])
    ren = confirmed(server, world, "ren")
    ok = ren.post(f"/api/connect/{asked['code']}", {"decision": "approve", "typed_code": asked["code"], "agents": [
        {"cli": "claude", "create": {"name": "scribe", "display_name": "Scribe", "model": "claude-sonnet"}}]})
    assert ok.status_code == 200, ok.text
    assert prickle.team_projects_of(world.db, "ren/scribe") == [PROJECT]
    [added] = [e["refs"] for e in audit_entries(world.db, PROJECT, "agent.added") if e["refs"]["agent"] == "ren/scribe"]
    assert added == {"agent": "ren/scribe", "with_owner": True, "ended_removal": False}
    # so a teammate's agent can hand it work at once
    assert "ren/scribe" in {a["agent_id"] for a in mcp.ok("oj/muse", "discover_team_agents",
                                                           {"project": PROJECT})["agents"]}
