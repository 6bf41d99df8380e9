"""The ``prickle runner`` process against a real ``prickle serve``: listen, claim, launch, report.

The agent CLI here is the stand-in command (``client = "command"``, tests/runner_agent.py);
tests/test_runner_claude.py runs real Claude Code.
"""

import json
import os
import stat
import subprocess
import sys

import httpx

from conftest import MCP, PRICKLE, REFERENCE_TOOLS, Served, audit_entries
from runner_util import (SECRET_PREFIXES, STANDIN_AGENT, RunnerProcess, all_logs, person, pulse_of, task_state,
                         wait_until, write_config)
from helpers import _free_port, cli_json

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
    repo = tmp_path / "website"
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.org", "commit", "-q",
                    "--allow-empty", "-m", "start"], check=True)
    with Served(db_path, "--demo") as served:
        config, key, mcp, ren, oj = setup(db_path, served, tmp_path, repo=str(repo))
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
            workspace = runner.state_dir / "workspaces" / task_id
            work = (workspace / "work.txt").read_text()
            branch = subprocess.run(["git", "-C", str(workspace), "rev-parse", "--abbrev-ref", "HEAD"],
                                    capture_output=True, text=True).stdout.strip()
            assert branch == f"prickle/{task_id}"  # a worktree of the repo on a branch named for the task
            assert not (repo / "work.txt").exists()
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


def test_failed_runs_set_run_failure_a_good_run_clears_it_and_a_mention_only_notifies(db_path, tmp_path):
    with Served(db_path, "--demo") as served:
        base, db = served.info["url"], prickle.Database(db_path)
        prickle.add_agent(db, "ren/ghost", "Ghost", "gpt-5", "codex", "", [], [PROJECT])
        prickle.set_rule(db, "ren", "allow", from_owner="oj")
        keys = {a: prickle.pair_device(db, "ren", a, "ren-laptop")[1] for a in ("ren/builder", "ren/ghost")}
        config = write_config(tmp_path / "runner.toml", base, {
            "ren/builder": {"key": keys["ren/builder"], "client": "command", "command": STANDIN_AGENT,
                            "launch_timeout_minutes": 0.15},
            "ren/ghost": {"key": keys["ren/ghost"], "client": "command", "command": ["/nonexistent/prickle-agent"]}})
        mcp = MCP(httpx.Client(base_url=base, timeout=60), {"oj/muse": served.info["demo"]["keys"]["oj/muse"]})
        ren = person(base, prickle.create_token(db, "person", person="ren")[1])

        def failure(agent):
            return (pulse_of(ren, PROJECT, agent) or {}).get("run_failure")

        with RunnerProcess(config) as runner:
            runner.wait_connected("ren/builder", "ren/ghost")
            posted = mcp.ok("oj/muse", "post_message", {"project": PROJECT, "body": "@ren/builder a quick word"})
            wait_until("the notification", lambda: f"(message {posted['message']['id']}); a mention never starts "
                       "a run" in runner.log())

            quiet = hand(mcp, "quiet")
            assert wait_until("run_failure", lambda: failure("ren/builder")) == {
                "class": "agent", "step": "agent_error"}
            assert task_state(ren, quiet)["state"] == "accepted"  # it accepted, then exited without a result
            # The runner told the server the run failed: it shows as failed with why, never a green "finished",
            # and its credential ended with it.
            [run] = ren.get(f"/api/tasks/{quiet}").json()["runs"]
            assert (run["state"], run["failure"]) == ("failed", "agent_error") and run["ended_at"] is not None
            assert (f"ren/builder: {run['attempt_id']} ended (exit status 0) without a result; the task is accepted: "
                    "its owner's inbox shows the failed run, and Start a run on the task's page runs it again"
                    in runner.log())
            assert db.scalar("SELECT revoked_reason FROM credentials WHERE attempt_id = ?", (run["attempt_id"],)) == \
                "run_ended"
            assert [e["refs"] for e in audit_entries(db, PROJECT, "attempt.finished")
                    if e["refs"]["attempt"] == run["attempt_id"]] == [{"attempt": run["attempt_id"]}]
            ok = hand(mcp, "ok", "Draft the footer.")
            wait_until("the result", lambda: task_state(ren, ok)["state"] == "verifying")
            wait_until("run_failure cleared", lambda: "run_failure" not in pulse_of(ren, PROJECT, "ren/builder")
                       and not runner.runs("ren/builder"))
            assert runner.status()["agents"]["ren/builder"]["last_failure"] is None

            sleepy = hand(mcp, "sleep", "Draft the about page.")
            ghost = mcp.ok("oj/muse", "handoff", {"project": PROJECT, "to": "ren/ghost", "packet": packet("ok")})
            ghost = ghost["task"]["id"]
            assert wait_until("the time limit", lambda: failure("ren/builder"), timeout=60) == {
                "class": "timeout", "step": "task_time_limit"}
            assert [(r["state"], r["failure"]) for r in ren.get(f"/api/tasks/{sleepy}").json()["runs"]] == [
                ("failed", "task_time_limit")]
            assert wait_until("cli_not_found", lambda: failure("ren/ghost")) == {
                "class": "runtime", "step": "cli_not_found"}
            status = runner.status()
            assert status["agents"]["ren/builder"]["last_failure"]["step"] == "task_time_limit"
            assert status["agents"]["ren/builder"]["last_failure"]["task_id"] == sleepy
            text = subprocess.run(PRICKLE + ["runner", "status", "--config", str(config)], capture_output=True,
                                  text=True, timeout=30).stdout
            assert "ren/builder: connected, listening, 0 run(s) in progress" in text
            assert "last failure: runtime/cli_not_found" in text
        log = runner.log()
        assert "past its time limit of 0.15 minutes" in log
        # The failed launch was claimed again with the same idempotency key: one attempt, the first credential ended.
        claimed = [e["refs"] for e in audit_entries(db, PROJECT, "attempt.claimed")]
        assert sorted(r["task"] for r in claimed) == sorted([quiet, ok, sleepy, ghost])  # the mention claimed nothing
        revoked = [e["refs"] for e in audit_entries(db, PROJECT, "token.revoked") if e["refs"].get("task") == ghost]
        assert [r["reason"] for r in revoked] == ["claim_retried", "run_ended"]  # then the second launch's ended
        made = [e for e in audit_entries(db, PROJECT, "token.created") if e["refs"].get("task") == ghost]
        assert len(made) == 2 and len({e["refs"]["attempt"] for e in made}) == 1
        sleeping = [r["attempt"] for r in claimed if r["task"] == sleepy][0]
        assert "end: time_limit" in (runner.state_dir / "logs" / f"{sleeping}.log").read_text()
        ren.close(), mcp.client.close(), db.close()


def _child_pid(runner, agent):
    runs = runner.runs(agent)
    return next(iter(runs.values()))["pid"] if runs else None


def _alive(pid):
    return prickle.process_alive(pid)


def test_a_refused_runner_key_is_logged_as_refused_with_what_to_do_not_as_the_server_away(db_path, tmp_path):
    with Served(db_path, "--demo") as served:
        db = prickle.Database(db_path)
        device, key = prickle.pair_device(db, "ren", "ren/builder", "ren-laptop")
        prickle.revoke_device(db, "ren", device["id"])
        config = write_config(tmp_path / "runner.toml", served.info["url"], {
            "ren/builder": {"key": key, "client": "command", "command": STANDIN_AGENT}})
        with RunnerProcess(config) as runner:
            log = runner.state_dir / "runner.log"
            line = wait_until("the refusal in the runner's log", lambda: log.exists() and next(
                (x for x in log.read_text().splitlines() if "ren/builder: the server" in x), None))
            assert line.split(" ", 1)[1].startswith("ren/builder: the server refused this agent's runner key (")
            assert line.endswith("): connect this computer again (prickle runner connect) or pair a key "
                                 "(prickle device pair ren/builder) and put it in the runner's config"), line
            assert "prk_rk_" not in runner.log()
            assert runner.state()["agents"]["ren/builder"]["connected"] is False


def test_the_owner_stops_a_run_pauses_the_agents_and_a_killed_runner_marks_its_run_uncertain(db_path, tmp_path):
    port = _free_port()
    served = Served(db_path, "--demo", "--port", str(port))
    with served:
        base, db = served.info["url"], prickle.Database(db_path)
        prickle.set_rule(db, "ren", "allow", from_owner="oj")
        _, key = prickle.pair_device(db, "ren", "ren/builder", "ren-laptop")
        config = write_config(tmp_path / "runner.toml", base, {
            "ren/builder": {"key": key, "client": "command", "command": STANDIN_AGENT}}, pause_poll_seconds=0.5)
        # No pooled connections across the restart below: one left to the stopped server is dropped unclosed.
        mcp = MCP(httpx.Client(base_url=base, timeout=60, limits=httpx.Limits(max_keepalive_connections=0)),
                  {"oj/muse": served.info["demo"]["keys"]["oj/muse"]})
        ren = person(base, prickle.create_token(db, "person", person="ren")[1], keep_alive=False)

        def attempts(type_, task_id):
            return [e["refs"]["attempt"] for e in audit_entries(db, PROJECT, type_) if e["refs"].get("task") == task_id]

        runner = RunnerProcess(config)
        try:
            runner.wait_connected("ren/builder")
            # Stop from the page: the runner ends the process.
            stopped = hand(mcp, "sleep")
            wait_until("the run to sleep", lambda: "Sleeping." in str(task_state(ren, stopped)["latest_checkpoint"]))
            pid = _child_pid(runner, "ren/builder")
            assert _alive(pid)
            assert ren.post(f"/api/tasks/{stopped}/stop", json={}).status_code == 200
            wait_until("the stopped run to end", lambda: not runner.runs("ren/builder") and not _alive(pid))
            attempt = attempts("attempt.claimed", stopped)[0]
            assert "the server says the attempt is stopped" in runner.log()
            assert "end: stopped" in (runner.state_dir / "logs" / f"{attempt}.log").read_text()
            assert "run_failure" not in (pulse_of(ren, PROJECT, "ren/builder") or {})

            # Paused: nothing is claimed until the owner resumes.
            assert ren.post("/api/agents/pause", json={}).status_code == 200
            held = hand(mcp, "ok", "Draft the footer.")
            wait_until("the pause to be seen", lambda: "ren/builder: paused by its owner: launching nothing"
                       in runner.log())
            assert attempts("attempt.claimed", held) == [] and runner.state()["agents"]["ren/builder"]["paused"]
            assert ren.post("/api/agents/resume", json={}).status_code == 200
            wait_until("the held task's result", lambda: task_state(ren, held)["state"] == "verifying")
            assert "ren/builder: resumed" in runner.log()

            # kill -9 mid-run; the restarted runner ends the orphan and marks the attempt uncertain.
            lost = hand(mcp, "sleep", "Draft the about page.")
            wait_until("the run to sleep", lambda: "Sleeping." in str(task_state(ren, lost)["latest_checkpoint"]))
            orphan = _child_pid(runner, "ren/builder")
            runner.stop(kill=True)
            assert _alive(orphan)
            runner = RunnerProcess(config)
            wait_until("the orphan to end", lambda: not _alive(orphan))
            runner.wait_connected("ren/builder")
            lost_attempt = attempts("attempt.claimed", lost)[0]
            assert [e["refs"] for e in audit_entries(db, PROJECT, "attempt.marked_uncertain")] == [
                {"attempt": lost_attempt}]
            assert f"attempt {lost_attempt} of task {lost} was running when the last runner ended" in runner.log()
            runs = ren.get(f"/api/tasks/{lost}").json()["runs"]
            assert [(r["attempt_id"], r["state"]) for r in runs] == [(lost_attempt, "uncertain")]
            assert runner.status()["agents"]["ren/builder"]["runs"] == {}

            # The server goes away and comes back: the runner reconnects and resumes from its cursor.
            served.stop()
            wait_until("the runner to notice", lambda: not runner.state()["agents"]["ren/builder"]["connected"])
            served = Served(db_path, "--demo", "--port", str(port))
            wait_until("the runner to reconnect", lambda: runner.state()["agents"]["ren/builder"]["connected"])
            mcp.keys["oj/muse"] = served.info["demo"]["keys"]["oj/muse"]
            after = hand(mcp, "ok", "Draft the pricing page.")
            wait_until("the result after the restart", lambda: task_state(ren, after)["state"] == "verifying")
            said = runner.log()  # the outage was noticed (its wait failed, or was refused as the server stopped)
            assert "ren/builder: the server is not answering" in said or "ren/builder: wait_for_mention refused" in said
            assert said.count("ren/builder: connected to") >= 2, said
        finally:
            runner.stop()
            served.stop()
            ren.close(), mcp.client.close()
        logs = all_logs(runner.state_dir)
        assert not any(p in logs for p in SECRET_PREFIXES)
        db.close()


def test_a_private_room_turn_is_drafted_and_reviewed_by_two_runners(db_path, tmp_path):
    with Served(db_path, "--demo") as served:
        base, db = served.info["url"], prickle.Database(db_path)
        prickle.add_agent(db, "oj/critic", "Critic", "gpt-5", "codex")
        keys = {a: prickle.pair_device(db, "oj", a, "oj-laptop")[1] for a in ("oj/muse", "oj/critic")}
        oj = person(base, prickle.create_token(db, "person", person="oj")[1])
        room = oj.get("/api/room").json()["room"]["project"]
        make = [sys.executable, "-c", "import sys; print('Made: ' + sys.argv[1])", "{prompt}"]
        configs = {a: write_config(tmp_path / f"{a.split('/')[1]}.toml", base, {
            a: {"key": keys[a], "client": "command", "command": STANDIN_AGENT, "actions": {"image_gen": make}}})
            for a in keys}
        with RunnerProcess(configs["oj/muse"]) as muse, RunnerProcess(configs["oj/critic"]) as critic:
            muse.wait_connected("oj/muse"), critic.wait_connected("oj/critic")
            asked = oj.post(f"/api/projects/{room}/messages", json={"body": "Headline for the launch?"}).json()
            wait_until("the turn to end", lambda: oj.get("/api/room").json()["turn"] is None
                       and len(oj.get(f"/api/projects/{room}/room").json()["messages"]) == 3)
            messages = oj.get(f"/api/projects/{room}/room").json()["messages"]
            assert [(m["author"].get("agent_id") or m["author"]["handle"], m["body"], m.get("verdict"))
                    for m in messages] == [("oj", "Headline for the launch?", None),
                                           ("oj/muse", "Work, together.", "draft"),
                                           ("oj/critic", "", "approve")]
            assert f"room {room}: draft session for message {asked['message']['id']}" in muse.log()
            assert f"room {room}: review session for message {messages[1]['id']}" in critic.log()

            # An approved make-or-spend card runs through the command configured for its tool.
            card = httpx.post(f"{base}/api/runner/actions", headers={"Authorization": f"Bearer {keys['oj/muse']}"},
                              json={"tool": "image_gen", "action": "Make the hero image", "prompt": "a hedgehog"})
            assert card.status_code == 200, card.text
            action_id = card.json()["action"]["id"]
            assert oj.post(f"/api/actions/{action_id}", json={"decision": "approve"}).status_code == 200
            made = wait_until("the card to be made", lambda: next(
                (m for m in oj.get(f"/api/projects/{room}/room").json()["messages"] if m["body"] == "Made: a hedgehog"),
                None))
            assert made["author"]["agent_id"] == "oj/muse"
        claims = [e["refs"] for e in audit_entries(db, room, "discussion.claimed")]
        assert len(claims) == 2
        assert [e["refs"]["action"] for e in audit_entries(db, room, "action.claimed")] == [action_id]
        assert [e["refs"]["failure"] for e in audit_entries(db, room, "action.finished")] == [None]
        assert not any(p in all_logs(muse.state_dir) + all_logs(critic.state_dir) for p in SECRET_PREFIXES)
        oj.close(), db.close()


def _room_runners(db_path, tmp_path, served, env=None):
    """oj/muse's and oj/critic's runners (the stand-in command) for oj's room, and oj's API."""
    base, db = served.info["url"], prickle.Database(db_path)
    prickle.add_agent(db, "oj/critic", "Critic", "gpt-5", "codex")
    keys = {a: prickle.pair_device(db, "oj", a, "oj-laptop")[1] for a in ("oj/muse", "oj/critic")}
    oj = person(base, prickle.create_token(db, "person", person="oj")[1])
    configs = {a: write_config(tmp_path / f"{a.split('/')[1]}.toml", base, {
        a: {"key": keys[a], "client": "command", "command": STANDIN_AGENT}}) for a in keys}
    return db, oj, oj.get("/api/room").json()["room"]["project"], configs


def _said(oj, room):
    return [(m["author"].get("agent_id") or m["author"]["handle"], m["body"], m.get("verdict"))
            for m in oj.get(f"/api/projects/{room}/room").json()["messages"]]


def test_a_named_turn_is_drafted_by_two_runners_and_combined_by_the_lead(db_path, tmp_path):
    with Served(db_path, "--demo") as served:
        db, oj, room, configs = _room_runners(db_path, tmp_path, served)
        assert oj.post("/api/room", json={"reply_mode": "named", "lead": "oj/critic"}).status_code == 200
        with RunnerProcess(configs["oj/muse"]) as muse, RunnerProcess(configs["oj/critic"]) as critic:
            muse.wait_connected("oj/muse"), critic.wait_connected("oj/critic")
            asked = oj.post(f"/api/projects/{room}/messages", json={"body": "@muse and @critic: a headline?"}).json()
            wait_until("the combined answer", lambda: oj.get("/api/room").json()["turn"] is None
                       and len(_said(oj, room)) == 4)
            said = _said(oj, room)
            drafters = [who for who, _, _ in said[1:3]]
            assert sorted(said[1:3]) == [("oj/critic", "Work, together.", "draft"),
                                         ("oj/muse", "Work, together.", "draft")]
            # The lead combined both drafts, as its prompt gave them, in one answer.
            assert said[3] == ("oj/critic", f"Combined 2 drafts: {', '.join(drafters)}.", "draft")
            messages = oj.get(f"/api/projects/{room}/room").json()["messages"]
            assert f"room {room}: combine session for message {messages[2]['id']}" in critic.log()
            assert oj.get("/api/room").json()["last_turn"]["end_reason"] == "answered"
        roles = db.rows("SELECT agent_id, role FROM discussions ORDER BY agent_id, role")
        assert [(r["agent_id"], r["role"]) for r in roles] == [
            ("oj/critic", "combine"), ("oj/critic", "draft"), ("oj/muse", "draft")]
        assert asked["message"]["id"] == db.scalar("SELECT message_id FROM turns")
        oj.close(), db.close()


def test_a_turn_that_runs_out_of_time_refuses_the_late_reviewer(db_path, tmp_path):
    hold = tmp_path / "let-the-reviewer-post"
    with Served(db_path, "--demo") as served:
        db, oj, room, configs = _room_runners(db_path, tmp_path, served)
        assert oj.post("/api/room", json={"lead": "oj/muse"}).status_code == 200
        with RunnerProcess(configs["oj/muse"]) as muse, \
                RunnerProcess(configs["oj/critic"], env=os.environ | {"STANDIN_HOLD": str(hold)}) as critic:
            muse.wait_connected("oj/muse"), critic.wait_connected("oj/critic")
            oj.post(f"/api/projects/{room}/messages", json={"body": "Headline for the launch?"})
            wait_until("the reviewer's session", lambda: "review session for message" in critic.log())
            turn = oj.get("/api/room").json()["turn"]
            assert (turn["step"], turn["waiting_on"]) == ("review", ["oj/critic"])
            # The turn's time is up (its deadline moved to now, as a clock would): the owner sees it ended.
            db.execute("UPDATE turns SET expires_at = ? WHERE id = ?", (prickle.iso(prickle.utcnow()), turn["id"]))
            view = oj.get("/api/room").json()
            assert view["turn"] is None
            assert (view["last_turn"]["end_reason"], view["last_turn"]["missed"]) == ("out_of_time", ["oj/critic"])
            hold.touch()  # the reviewer answers late: its credential ended with the turn
            wait_until("the late session to end", lambda: "exit status 1" in critic.log())
        assert [who for who, _, _ in _said(oj, room)] == ["oj", "oj/muse"]
        [entry] = audit_entries(db, room, "room.turn_timed_out")
        assert entry["refs"] == {"turn": turn["id"], "step": "review", "agents": ["oj/critic"], "credentials": 1,
                                 "wakes": 0}
        # The session's late post is told why.
        assert "MCPError: this discussion credential ended with its turn: it ran out of time" in all_logs(
            critic.state_dir)
        oj.close(), db.close()


def test_a_task_beyond_the_parallel_limit_waits_for_the_run_before_it(db_path, tmp_path):
    with Served(db_path, "--demo") as served:
        config, key, mcp, ren, oj = setup(db_path, served, tmp_path, parallel=1)
        with RunnerProcess(config) as runner:
            runner.wait_connected("ren/builder")
            first = hand(mcp, "sleep", "Draft the hero copy.")
            wait_until("the first run to sleep",
                       lambda: "Sleeping." in str(task_state(ren, first)["latest_checkpoint"]))
            second = hand(mcp, "ok", "Draft the footer copy.")
            wait_until("the second task to wait", lambda: f"task {second} waits for a free run" in runner.log())
            # One run at a time for this agent: the second task is not claimed while the first runs.
            assert task_state(ren, second)["state"] == "routed"
            assert len(runner.runs("ren/builder")) == 1
            assert ren.post(f"/api/tasks/{first}/stop", json={}).status_code == 200
            done = wait_until("the second result", lambda: (t := task_state(ren, second))["state"] == "verifying"
                              and t)
            assert [e["criteria"] for e in done["result"]["evidence"]] == [[0], [1]]
        ren.close(), oj.close(), mcp.client.close()


def test_a_run_that_ends_waiting_on_a_step_it_asked_for_is_not_a_failure(db_path, tmp_path):
    with Served(db_path, "--demo") as served:
        config, key, mcp, ren, oj = setup(db_path, served, tmp_path)
        with RunnerProcess(config) as runner:
            runner.wait_connected("ren/builder")
            task_id = hand(mcp, "step")
            wait_until("the run to end", lambda: "ended waiting on a step its owner has not decided yet"
                       in runner.log() and not runner.runs("ren/builder"))
            steps = ren.get("/api/steps").json()["steps"]
            assert [(s["tool_name"], s["input"], s["task_id"]) for s in steps] == [
                ("Bash", {"command": "make publish"}, task_id)]
            assert "stand-in: step pending" in all_logs(runner.state_dir)
            state = httpx.get(served.info["url"] + "/api/runner/state", headers={"Authorization": f"Bearer {key}"})
            # The run is over (no process behind it) and says it waits on its owner's step.
            assert [(r["task_id"], r["state"], r["step_pending"]) for r in state.json()["runs"]] == [
                (task_id, "finished", True)]
            [run] = ren.get(f"/api/tasks/{task_id}").json()["runs"]
            assert (run["state"], run["waiting_on_step"]) == ("finished", True)
        # The runner has ended (its report sent): the run was a good one, no run_failure.
        assert runner.status()["agents"]["ren/builder"]["last_failure"] is None
        assert "run_failure" not in (pulse_of(ren, PROJECT, "ren/builder") or {})
        assert task_state(ren, task_id)["state"] == "accepted"
        ren.close(), oj.close(), mcp.client.close()


def _snapshot(root, skip=()) -> dict:
    """Every path under ``root`` (but ``skip``) with its kind, size and modification time."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if not any(rel == s or rel.startswith(s + "/") for s in skip):
            st = p.lstat()
            out[rel] = (stat.S_IFMT(st.st_mode), st.st_size if p.is_file() else None, st.st_mtime_ns)
    return out


def test_the_runner_writes_only_in_its_state_directory_and_the_worktree_it_added(db_path, tmp_path):
    home, cwd, tmp = tmp_path / "home", tmp_path / "cwd", tmp_path / "tmp"
    for d in (home, cwd, tmp):
        d.mkdir()
    (cwd / "notes.txt").write_text("mine\n")
    repo = tmp_path / "website"
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.org"]
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
    (repo / "index.html").write_text("<h1>Hello</h1>\n")
    subprocess.run(git + ["add", "index.html"], check=True)
    subprocess.run(git + ["commit", "-q", "-m", "start"], check=True)
    env = {k: v for k, v in os.environ.items() if k not in ("XDG_CONFIG_HOME", "PRICKLE_RUNNER_CONFIG")}
    env |= {"HOME": str(home), "TMPDIR": str(tmp)}
    config_dir = home / ".config" / "prickle"  # the default config directory under this HOME
    config_dir.mkdir(parents=True)
    with Served(db_path, "--demo") as served:
        base, db = served.info["url"], prickle.Database(db_path)
        prickle.set_rule(db, "ren", "allow", from_owner="oj")
        _, key = prickle.pair_device(db, "ren", "ren/builder", "ren-laptop")
        # Relative paths, read from the config file's folder (not the directory the runner starts in).
        config = write_config(config_dir / "runner.toml", base, {
            "ren/builder": {"key": key, "client": "command", "command": STANDIN_AGENT, "repo": "../../../website"}},
            state_dir="state")
        mcp = MCP(httpx.Client(base_url=base, timeout=60), {"oj/muse": served.info["demo"]["keys"]["oj/muse"]})
        ren = person(base, prickle.create_token(db, "person", person="ren")[1])
        before = {"home": _snapshot(home, [".config/prickle"]), "cwd": _snapshot(cwd), "tmp": _snapshot(tmp),
                  "repo": _snapshot(repo, [".git"]), "git": _snapshot(repo / ".git")}
        with RunnerProcess(config, env=env, cwd=cwd, state_dir=config_dir / "state") as runner:
            runner.wait_connected("ren/builder")
            task_id = hand(mcp, "ok")
            wait_until("the result", lambda: task_state(ren, task_id)["state"] == "verifying")
            wait_until("the run to end", lambda: not runner.runs("ren/builder")
                       and "the task is verifying" in runner.log())
            assert runner.status()["agents"]["ren/builder"]["last_failure"] is None
        # The run wrote in the worktree the runner added for its task, inside the state directory.
        workspace = runner.state_dir / "workspaces" / task_id
        assert "Draft the hero copy." in (workspace / "work.txt").read_text()
        worktrees = subprocess.run(git + ["worktree", "list", "--porcelain"], capture_output=True, text=True).stdout
        assert [line.split(" ", 1)[1] for line in worktrees.splitlines() if line.startswith("worktree ")] == [
            str(repo), str(workspace)]
        # Nothing else changed: HOME beyond the config directory, the directory it started in, TMPDIR, and
        # the repository's own work tree are as they were.
        assert _snapshot(home, [".config/prickle"]) == before["home"]
        assert sorted(p.name for p in config_dir.iterdir()) == ["runner.stderr", "runner.toml", "state"]
        assert (_snapshot(cwd), _snapshot(tmp), _snapshot(repo, [".git"])) == (before["cwd"], before["tmp"],
                                                                                before["repo"])
        # In the repository's .git, git recorded only the worktree and its branch.
        git_after = _snapshot(repo / ".git")
        changed = sorted(p for p in set(git_after) | set(before["git"]) if git_after.get(p) != before["git"].get(p)
                         and git_after.get(p, (0,))[0] != stat.S_IFDIR)
        allowed = (f"worktrees/{task_id}/", f"refs/heads/prickle/{task_id}", f"logs/refs/heads/prickle/{task_id}")
        assert changed and all(p.startswith(allowed) for p in changed), changed
        assert f"refs/heads/prickle/{task_id}" in changed
        status = subprocess.run(git + ["status", "--porcelain", "--branch"], capture_output=True, text=True).stdout
        assert status == "## main\n"
        ren.close(), mcp.client.close(), db.close()
