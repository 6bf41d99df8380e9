"""The ``prickle runner`` process against a real ``prickle serve``: listen, claim, launch, report.

The agent CLI here is the stand-in command (``client = "command"``, tests/runner_agent.py);
tests/test_runner_claude.py runs real Claude Code.
"""

import json
import os
import stat
import subprocess

import httpx

from conftest import MCP, PRICKLE, REFERENCE_TOOLS, Served, audit_entries
from runner_util import (SECRET_PREFIXES, STANDIN_AGENT, RunnerProcess, all_logs, person, pulse_of, task_state,
                         wait_until, write_config)
from test_e2e import cli_json

import prickle

PROJECT = "website-v2"


def packet(mode: str, task: str = "Draft the hero copy.") -> dict:
    return REFERENCE_TOOLS["handoff"]["example_input"]["packet"] | {"task": task, "context": f"standin: {mode}"}


def setup(db_path, served, tmp_path, **agent):
    """ren/builder's runner config (the stand-in command), oj's handoffs let through, and the callers."""
    base = served.info["url"]
    key = cli_json(db_path, "device", "pair", "ren/builder", "--name", "ren-laptop")["token"]
    cli_json(db_path, "rule", "set", "ren", "--decision", "allow", "--from-owner", "oj")
    config = write_config(tmp_path / "runner.toml", served.info["mcp"], {
        "ren/builder": {"key": key, "client": "command", "command": STANDIN_AGENT} | agent})
    mcp = MCP(httpx.Client(base_url=base, timeout=60), {"oj/muse": served.info["demo"]["keys"]["oj/muse"]})
    ren = person(base, cli_json(db_path, "token", "create", "--person", "ren")["token"])
    oj = person(base, cli_json(db_path, "token", "create", "--person", "oj")["token"])
    return config, key, mcp, ren, oj


def hand(mcp, mode: str, task: str = "Draft the hero copy.") -> str:
    out = mcp.ok("oj/muse", "handoff", {"project": PROJECT, "to": "ren/builder", "packet": packet(mode, task)})
    assert out["task"]["state"] == "routed"
    return out["task"]["id"]


def test_a_handed_off_task_is_claimed_run_in_its_workspace_and_returned(db_path, tmp_path):
    with Served(db_path, "--demo") as served:
        config, key, mcp, ren, oj = setup(db_path, served, tmp_path)
        with RunnerProcess(config) as runner:
            runner.wait_connected("ren/builder")
            status = runner.status()
            assert status["running"] is True and status["agents"]["ren/builder"]["listening"] is True
            task_id = hand(mcp, "ok")
            verifying = wait_until("the result", lambda: (t := task_state(ren, task_id))["state"] == "verifying"
                                   and t)
            result = verifying["result"]
            assert [e["criteria"] for e in result["evidence"]] == [[0], [1]]
            assert result["lineage"]["cause"]["kind"] == "task"
            # The run worked in the workspace the runner made for the task, and saw the packet and criteria.
            work = (runner.state_dir / "workspaces" / task_id / "work.txt").read_text()
            assert "Draft the hero copy." in work and "[1] Include a clear call to action." in work
            assert f"accept_task with task_id {task_id}" in work and '"criteria": [its indexes]' in work
            wait_until("the run to end", lambda: not runner.runs("ren/builder")
                       and "ended (exit status 0); the task is verifying" in runner.log())
            sub = verifying["result"]
            accepted = mcp.ok("oj/muse", "accept_result", {
                "task_id": task_id, "submission_id": sub["submission_id"], "revision": sub["revision"],
                "verdicts": [{"criterion": 0, "accepted": True}, {"criterion": 1, "accepted": True}],
                "artifacts": sub["artifacts"]})
            assert accepted["task"]["state"] == "approval"
            assert oj.post(f"/api/tasks/{task_id}/accept", json={}).json()["task"]["state"] == "completed"
            status = runner.status()
        # One claim, one finished attempt; the credential went by environment, never argv or a log.
        db = prickle.Database(db_path)
        claimed = audit_entries(db, PROJECT, "attempt.claimed")
        assert [e["refs"]["task"] for e in claimed] == [task_id]
        assert [e["refs"]["attempt"] for e in audit_entries(db, PROJECT, "attempt.finished")] == \
            [claimed[0]["refs"]["attempt"]]
        db.close()
        logs = all_logs(runner.state_dir)
        assert "stand-in: role task, argv [" in logs and f"accepted {task_id}, mode ok" in logs
        assert not any(p in logs for p in SECRET_PREFIXES) and key not in logs
        mode = stat.S_IMODE(os.stat(runner.state_dir / "status.json").st_mode)
        assert mode == 0o600
        attempt = claimed[0]["refs"]["attempt"]
        run_dir = runner.state_dir / "runs" / attempt
        assert stat.S_IMODE(os.stat(run_dir / "mcp.json").st_mode) == 0o600
        assert json.loads((run_dir / "mcp.json").read_text())["mcpServers"]["prickle"]["headers"] == {
            "Authorization": "Bearer ${PRICKLE_RUN_KEY}"}
        assert (runner.state_dir / "logs" / f"{attempt}.log").exists()
        assert status["agents"]["ren/builder"]["last_failure"] is None
        ren.close(), oj.close(), mcp.client.close()
