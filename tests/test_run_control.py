"""The owner's control of runs: connecting a computer, Start and Stop, hand back, pause, uncertain runs."""

import pytest

import prickle
from conftest import PROJECT, audit_entries
from helpers import P, ask_connect, claimed, paired, person, routed
CALL = {"tool_name": "Bash", "input": {"command": "git push origin main"}}


def runner_state(server, key):
    r = server.get("/api/runner/state", headers={"Authorization": f"Bearer {key}"})
    assert r.status_code == 200, r.text
    return r.json()


def collect(server, asked, secret=None):
    return server.post("/api/runner/connect/collect", json={
        "request_id": asked["request_id"], "collect_secret": secret or asked["collect_secret"]})


# -- connecting a computer ----------------------------------------------------------------

def test_connect_a_computer_with_a_code_the_owner_approves_once(server, world, mcp):
    asked = ask_connect(server)
    assert asked["link"] == f"http://127.0.0.1:8321/#/connect/{asked['code']}"
    assert asked["collect_secret"].startswith("prk_dq_") and asked["interval"] == 2
    assert len(asked["code"]) == 9 and asked["code"][4] == "-"
    assert collect(server, asked).json() == {"status": "pending"}
    assert collect(server, asked, "prk_dq_wrong").status_code == 404
    ren = person(server, world, "ren")
    view = ren.get(f"/api/connect/{asked['code'].lower().replace('-', '')}").json()  # typed loosely
    assert (view["request"]["name"], view["request"]["clis"], view["request"]["state"]) == (
        "ren-laptop", ["claude", "codex"], "pending")
    assert [a["agent_id"] for a in view["agents"]] == ["ren/builder"]
    bad = ren.post(f"/api/connect/{asked['code']}", {"decision": "approve", "agents": [
        {"cli": "claude", "agent_id": "oj/muse"}]})
    assert bad.status_code == 400 and "agents[0].agent_id" in bad.json()["error"]["message"]
    ok = ren.post(f"/api/connect/{asked['code']}", {"decision": "approve", "agents": [
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
                                "by": "ren"}
    [collected] = audit_entries(world.db, PROJECT, "device.collected")
    assert collected["refs"] == {"request": asked["request_id"], "agents": ["ren/builder", "ren/scribe"], "keys": [
        {"credential": a["credential_id"], "agent": a["agent_id"], "reach": "runner"} for a in got["agents"]]}
    log = str(audit_entries(world.db, PROJECT)) + str(audit_entries(world.db, "ren-room"))
    assert asked["code"] not in log and "ren-laptop" not in log and key not in log


def test_a_refused_or_expired_request_says_so_on_both_sides(server, world):
    asked = ask_connect(server, ["codex"])
    ren = person(server, world, "ren")
    assert ren.post(f"/api/connect/{asked['code']}", {"decision": "refuse"}).json()["request"]["state"] == "refused"
    r = collect(server, asked)
    assert r.status_code == 403 and "refused" in r.json()["error"]["message"]
    late = ask_connect(server, ["codex"])
    world.db.execute("UPDATE connect_requests SET expires_at = '2020-01-01T00:00:00.000Z' WHERE id = ?",
                     (late["request_id"],))
    r = ren.post(f"/api/connect/{late['code']}", {"decision": "approve", "agents": [
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
        r = person(server, world, "ren").post(f"/api/connect/{code}", {"decision": "approve", "agents": [
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
                view = ren.get(f"/api/connect/{code}").json()
                assert view["request"]["clis"] == ["claude", "codex"]
                body = {"decision": decision}
                if decision == "approve":
                    body["agents"] = [{"cli": "codex", "agent_id": "ren/builder"}]
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


# -- Start a run, Stop, hand back --------------------------------------------------------

def test_stop_ends_the_runs_credentials_withdraws_its_step_and_needs_a_new_start(mcp, server, world):
    task, device, runner, out = claimed(mcp, server, world)
    run = out["execution_credential"]["token"]
    step = mcp.ok("ren/builder", "request_step", CALL, token=run)
    ren, oj = person(server, world, "ren"), person(server, world, "oj")
    listen = mcp.ok("ren/builder", "wait_for_mention", {"timeout_seconds": 1}, token=runner)["cursor"]
    assert oj.post(f"/api/tasks/{task['id']}/stop").status_code == 403  # not the assignee's owner
    stopped = ren.post(f"/api/tasks/{task['id']}/stop")
    assert stopped.status_code == 200, stopped.text
    assert stopped.json()["credentials_ended"] == 1
    [attempt] = stopped.json()["runs"]
    assert (attempt["attempt"], attempt["state"], attempt["device"]) == (1, "stopped", "laptop")
    assert mcp.raw(run, "tools/list").status_code == 401  # at once
    woke = mcp.ok("ren/builder", "wait_for_mention", {"cursor": listen, "timeout_seconds": 1}, token=runner)
    assert [e["task"]["id"] for e in woke["events"]] == [task["id"]]
    state = runner_state(server, runner)
    assert [(r["attempt_id"], r["state"]) for r in state["runs"]] == [(out["attempt"]["attempt_id"], "stopped")]
    assert world.db.scalar("SELECT status FROM steps WHERE id = ?", (step["step_id"],)) == "withdrawn"
    assert ren.get("/api/steps").json()["steps"] == []
    [withdrawn] = audit_entries(world.db, PROJECT, "step.withdrawn")
    assert withdrawn["refs"] == {"step": step["step_id"], "attempt": out["attempt"]["attempt_id"]}
    [entry] = audit_entries(world.db, PROJECT, "task.run_stopped")
    assert entry["refs"] == {"agent": "ren/builder", "run": world.db.scalar("SELECT run_id FROM attempts"),
                             "task": task["id"], "by": "ren", "reason": "stopped", "state_before": "routed",
                             "attempt": out["attempt"]["attempt_id"], "credentials": 1}
    # the runner can't just claim it again: its owner starts the next run
    text = mcp.error("ren/builder", "claim_task", {"task_id": task["id"], "idempotency_key": "k2"}, "invalid_state",
                     token=runner)
    assert "Start a run" in text
    r = ren.post(f"/api/tasks/{task['id']}/runs", {"confirm": "oj"})
    assert r.status_code == 400 and "confirm" in r.json()["error"]["message"]
    started = ren.post(f"/api/tasks/{task['id']}/runs", {"confirm": "ren"})
    assert started.status_code == 200, started.text
    run_id = started.json()["run_id"]
    assert ren.post(f"/api/tasks/{task['id']}/runs", {"confirm": "ren"}).status_code == 409  # one at a time
    [approved] = audit_entries(world.db, PROJECT, "task.run_approved")
    assert approved["refs"] == {"agent": "ren/builder", "run": run_id, "task": task["id"], "by": "ren"}
    second = mcp.ok("ren/builder", "claim_task", {"task_id": task["id"], "idempotency_key": "k2"}, token=runner)
    runs = ren.get(f"/api/tasks/{task['id']}").json()["runs"]
    assert [(r["attempt"], r["state"], r["run_id"]) for r in runs] == [
        (1, "stopped", runs[0]["run_id"]), (2, "running", run_id)]
    assert runs[1]["attempt_id"] == second["attempt"]["attempt_id"]
    # a run is open: no second Start, and no hand back before a Stop
    assert ren.post(f"/api/tasks/{task['id']}/runs", {"confirm": "ren"}).status_code == 409
    assert ren.post(f"/api/tasks/{task['id']}/hand-back").status_code == 409
    ren.post(f"/api/tasks/{task['id']}/stop")
    oj_wait = mcp.ok("oj/muse", "wait_for_updates", {"timeout_seconds": 1})["cursor"]
    back = ren.post(f"/api/tasks/{task['id']}/hand-back")
    assert back.status_code == 200, back.text
    assert back.json()["task"]["state"] == "returned"
    heard = mcp.ok("oj/muse", "wait_for_updates", {"cursor": oj_wait, "timeout_seconds": 1})
    assert [(u["kind"], u["task_id"]) for u in heard["updates"]] == [("task", task["id"])]
    [returned] = audit_entries(world.db, PROJECT, "task.returned")
    assert returned["refs"] == {"task": task["id"], "reason": "owner_handed_back", "agent": "ren/builder", "by": "ren"}


def test_a_new_claim_replaces_the_open_run_of_the_task(mcp, server, world):
    task, device, runner, first = claimed(mcp, server, world)
    second = mcp.ok("ren/builder", "claim_task", {"task_id": task["id"], "idempotency_key": "k2"}, token=runner)
    assert second["attempt"]["attempt_id"] != first["attempt"]["attempt_id"]
    assert mcp.raw(first["execution_credential"]["token"], "tools/list").status_code == 401
    assert [r["state"] for r in runner_state(server, runner)["runs"]] == ["running", "replaced"]
    text = mcp.error("ren/builder", "claim_task", {"task_id": task["id"], "idempotency_key": "k1"}, "invalid_state",
                     token=runner)
    assert "replaced" in text


def test_start_needs_a_connected_runner_and_a_task_that_can_run(mcp, server, world):
    task = routed(mcp, server, world)
    ren = person(server, world, "ren")
    r = ren.post(f"/api/tasks/{task['id']}/runs", {"confirm": "ren"})
    assert r.status_code == 409 and "prickle runner connect" in r.json()["error"]["message"]
    assert person(server, world, "oj").post(f"/api/tasks/{task['id']}/runs", {"confirm": "oj"}).status_code == 403
    assert ren.get(f"/api/tasks/{task['id']}").json()["run_control"] == {
        "paused": None, "runner_connected": False, "run_approved": None, "can_start": True, "can_stop": False,
        "can_hand_back": True}
    assert person(server, world, "oj").get(f"/api/tasks/{task['id']}").json()["run_control"] is None
    assert audit_entries(world.db, PROJECT, "task.run_approved") == []


# -- pause -------------------------------------------------------------------------------

def test_pausing_an_owners_agents_refuses_their_runs_at_the_next_call(mcp, server, world):
    task, device, runner, out = claimed(mcp, server, world)
    run = out["execution_credential"]["token"]
    ren = person(server, world, "ren")
    paused = ren.post("/api/agents/pause")
    assert paused.json() == {"scope": "ren", "paused": True, "active_runs": 1}
    assert ren.post("/api/agents/pause").status_code == 409
    assert ren.get("/api/agents/paused").json() == {"paused_by": "owner"}
    text = mcp.error("ren/builder", "read_room", P | {"task_id": task["id"]}, "paused", token=run)
    assert "resumed" in text
    mcp.error("ren/builder", "claim_task", {"task_id": task["id"], "idempotency_key": "k9"}, "paused", token=runner)
    assert runner_state(server, runner)["paused_by"] == "owner"
    assert ren.post(f"/api/tasks/{task['id']}/runs", {"confirm": "ren"}).json()["error"]["code"] == "paused"
    mcp.ok("oj/muse", "read_room", P)  # oj's agents run on
    [entry] = audit_entries(world.db, PROJECT, "agents.paused")
    assert entry["refs"] == {"scope": "owner", "owner": "ren", "by": "ren", "active_runs": 1}
    assert ren.post("/api/agents/resume").json() == {"scope": "ren", "paused": False}
    assert mcp.ok("ren/builder", "read_room", P | {"task_id": task["id"]}, token=run)["messages"] == []
    [resumed] = audit_entries(world.db, PROJECT, "agents.resumed")
    assert resumed["refs"] == {"scope": "owner", "owner": "ren", "by": "ren"}


def test_the_operator_pauses_every_agent_from_the_command_line(mcp, server, world, db_path):
    from helpers import jrun, run
    task, device, runner, out = claimed(mcp, server, world)
    assert jrun(db_path, "agents", "pause", "--all") == {"scope": "all", "paused": True, "active_runs": 1}
    mcp.error("ren/builder", "checkpoint", {"task_id": task["id"], "checkpoint": {"progress": "x"}}, "paused",
              token=out["execution_credential"]["token"])
    assert runner_state(server, runner)["paused_by"] == "operator"
    assert person(server, world, "oj").get("/api/agents/paused").json() == {"paused_by": "operator"}
    assert person(server, world, "ren").post("/api/agents/resume").status_code == 409  # not theirs to lift
    [entry] = audit_entries(world.db, PROJECT, "agents.paused")
    assert entry["refs"] == {"scope": "all", "active_runs": 1}
    assert audit_entries(world.db, "side", "agents.paused")[0]["refs"] == {"scope": "all", "active_runs": 0}
    code, _, err = run(db_path, "agents", "pause", ok=False)
    assert code == 1 and "--all" in err
    assert jrun(db_path, "agents", "resume", "--all") == {"scope": "all", "paused": False}
    assert runner_state(server, runner)["paused"] is False


# -- uncertain runs ----------------------------------------------------------------------

def test_a_runner_marks_a_run_uncertain_and_the_owner_settles_it(mcp, server, world):
    task, device, runner, out = claimed(mcp, server, world)
    attempt = out["attempt"]["attempt_id"]
    _, other_runner = paired(world)
    h = {"Authorization": f"Bearer {other_runner}"}
    assert server.post(f"/api/runner/attempts/{attempt}/uncertain", json={}, headers=h).status_code == 404
    r = server.post(f"/api/runner/attempts/{attempt}/uncertain", json={"reason": "restarted"},
                    headers={"Authorization": f"Bearer {runner}"})
    assert r.status_code == 200, r.text
    assert r.json()["attempt"]["state"] == "uncertain"
    assert mcp.raw(out["execution_credential"]["token"], "tools/list").status_code == 401
    again = server.post(f"/api/runner/attempts/{attempt}/uncertain", json={},
                        headers={"Authorization": f"Bearer {runner}"})
    assert again.status_code == 409
    text = mcp.error("ren/builder", "claim_task", {"task_id": task["id"], "idempotency_key": "k2"}, "invalid_state",
                     token=runner)
    assert "uncertain" in text
    assert audit_entries(world.db, PROJECT, "attempt.marked_uncertain")[0]["refs"] == {"attempt": attempt}
    ren = person(server, world, "ren")
    assert person(server, world, "oj").post(f"/api/attempts/{attempt}/settle",
                                            {"outcome": "abandoned"}).status_code == 404
    assert ren.post(f"/api/attempts/{attempt}/settle", {"outcome": "lost"}).status_code == 400
    settled = ren.post(f"/api/attempts/{attempt}/settle", {"outcome": "abandoned"})
    assert settled.status_code == 200, settled.text
    assert [r["state"] for r in settled.json()["runs"]] == ["abandoned"]
    assert ren.post(f"/api/attempts/{attempt}/settle", {"outcome": "finished"}).status_code == 409
    assert audit_entries(world.db, PROJECT, "attempt.reconciled")[0]["refs"] == {"attempt": attempt,
                                                                                 "outcome": "abandoned"}
    # after an abandoned run the owner starts the next one
    mcp.error("ren/builder", "claim_task", {"task_id": task["id"], "idempotency_key": "k2"}, "invalid_state",
              token=runner)
    assert ren.post(f"/api/tasks/{task['id']}/runs", {"confirm": "ren"}).status_code == 200
    mcp.ok("ren/builder", "claim_task", {"task_id": task["id"], "idempotency_key": "k2"}, token=runner)


def test_asking_to_connect_is_bounded_and_marking_uncertain_keeps_a_waiting_step(mcp, server, world, monkeypatch):
    monkeypatch.setattr(prickle, "CONNECT_PENDING_MAX", 2)
    ask_connect(server)
    ask_connect(server)
    r = server.post("/api/runner/connect", json={"name": "third", "clis": ["codex"]})
    assert r.status_code == 409 and "try again in a few minutes" in r.json()["error"]["message"]
    task, device, runner, out = claimed(mcp, server, world)
    step = mcp.ok("ren/builder", "request_step", CALL, token=out["execution_credential"]["token"])
    server.post(f"/api/runner/attempts/{out['attempt']['attempt_id']}/uncertain", json={},
                headers={"Authorization": f"Bearer {runner}"})
    assert world.db.scalar("SELECT status FROM steps WHERE id = ?", (step["step_id"],)) == "pending"
    assert audit_entries(world.db, PROJECT, "step.withdrawn") == []


def test_cancelling_a_task_stops_its_run(mcp, server, world):
    task, device, runner, out = claimed(mcp, server, world)
    assert person(server, world, "oj").post(f"/api/tasks/{task['id']}/cancel").status_code == 200
    assert [r["state"] for r in runner_state(server, runner)["runs"]] == ["stopped"]
    assert mcp.raw(out["execution_credential"]["token"], "tools/list").status_code == 401
