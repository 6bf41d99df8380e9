"""The runner left alone: it keeps itself going, survives the server's restarts and says when it can't run.

Real ``prickle serve`` and ``prickle runner`` processes; the agent CLI is the stand-in command
(tests/runner_agent.py). Nothing here sleeps to win a race: each step waits for a state.
"""

import asyncio
import contextlib
import os
import signal

import httpx
import pytest

import prickle
from conftest import MCP, REFERENCE_TOOLS, Served, audit_entries
from helpers import _free_port, cli_json
from runner_util import STANDIN_AGENT, RunnerProcess, person, pulse_of, task_state, wait_until, write_config

PROJECT = "website-v2"


def packet(mode: str, task: str = "Draft the hero copy.") -> dict:
    return REFERENCE_TOOLS["handoff"]["example_input"]["packet"] | {"task": task, "context": f"standin: {mode}"}


def hand(mcp, mode: str, task: str = "Draft the hero copy.") -> str:
    out = mcp.ok("oj/muse", "handoff", {"project": PROJECT, "to": "ren/builder", "packet": packet(mode, task)})
    assert out["task"]["state"] == "routed"
    return out["task"]["id"]


def standin_runner(db_path, tmp_path, base, **fields):
    """ren/builder's runner config (a paired device, the stand-in agent, any other ``fields`` of its
    table), and ren's gate letting oj's handoffs in."""
    key = cli_json(db_path, "device", "pair", "ren/builder", "--name", "ren-laptop")["token"]
    cli_json(db_path, "rule", "set", "ren", "--decision", "allow", "--from-owner", "oj")
    return write_config(tmp_path / "runner.toml", base, {
        "ren/builder": {"key": key, "client": "command", "command": STANDIN_AGENT} | fields})


def served_to_restart(db_path, tmp_path, **fields):
    """A demo server on a port it can be started again on, ren/builder's runner config for it (any other
    ``fields`` of its table), oj/muse's key and a token of ren's: (port, served, config, key, token)."""
    port = _free_port()
    served = Served(db_path, "--demo", "--port", str(port))
    config = standin_runner(db_path, tmp_path, served.info["url"], **fields)
    token = cli_json(db_path, "token", "create", "--person", "ren")["token"]
    return port, served, config, served.info["demo"]["keys"]["oj/muse"], token


def runs_of(ren, task_id):
    return ren.get(f"/api/tasks/{task_id}").json()["runs"]


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL])
def test_a_server_restart_leaves_no_runner_deaf_and_no_run_running_without_a_process(db_path, tmp_path, how):
    port, first, config, muse_key, ren_token = served_to_restart(db_path, tmp_path)
    base = first.info["url"]
    with RunnerProcess(config) as runner:
        try:
            runner.wait_connected("ren/builder")
            with httpx.Client(base_url=base, timeout=60) as http, person(base, ren_token) as ren:
                sleepy = hand(MCP(http, {"oj/muse": muse_key}), "sleep")
                wait_until("the run to sleep", lambda: "Sleeping." in str(task_state(ren, sleepy)["latest_checkpoint"]))
            [run] = list(runner.runs("ren/builder").values())
            # The server goes away with the run in flight, and the run ends while it is away.
            first.proc.send_signal(how)
            first.proc.wait(30)
            first.stop()
            with contextlib.suppress(ProcessLookupError):  # it may have ended on its own with its server gone
                os.killpg(run["pid"], signal.SIGKILL)
            wait_until("the runner to see the server away", lambda: not runner.state()["agents"]["ren/builder"][
                "connected"] and not runner.runs("ren/builder"))
            # The end it could not tell is kept to tell later (saved a moment after the run ends).
            wait_until("the runner to keep the end it could not send", lambda: [
                (u["attempt"], u["what"]) for u in runner.state()["unsent"]] == [(run["attempt_id"], "ended")])
        finally:
            first.stop()
        with Served(db_path, "--port", str(port)) as again:
            assert again.info["url"] == base
            runner.wait_connected("ren/builder")
            with person(base, ren_token) as ren, httpx.Client(base_url=base, timeout=60) as http:
                # The end it could not tell is told; nothing shows running without a process behind it.
                wait_until("the end told", lambda: runs_of(ren, sleepy)[0]["state"] == "failed")
                assert runner.state()["unsent"] == []
                assert f"told the server that {run['attempt_id']} ended" in runner.log()
                # And it still hears: the next task is claimed, run and returned.
                ok = hand(MCP(http, {"oj/muse": muse_key}), "ok", "Draft the footer.")
                wait_until("the result", lambda: task_state(ren, ok)["state"] == "verifying", timeout=60)
                assert [r["state"] for r in runs_of(ren, ok)] == ["finished"]


def test_a_task_waiting_for_a_free_run_when_the_server_goes_away_is_claimed_once_it_is_back(db_path, tmp_path):
    # One run at a time: the second task waits for the first. The server goes away, the first run ends
    # while it is away, and the waiting task's claim finds no server. Its wake came before the outage,
    # so none brings it again: the runner claims it once the server answers.
    port, first, config, muse_key, ren_token = served_to_restart(db_path, tmp_path, parallel=1)
    base = first.info["url"]
    with RunnerProcess(config) as runner:
        try:
            runner.wait_connected("ren/builder")
            with httpx.Client(base_url=base, timeout=60) as http, person(base, ren_token) as ren:
                muse = MCP(http, {"oj/muse": muse_key})
                sleepy = hand(muse, "sleep")
                wait_until("the run to sleep", lambda: "Sleeping." in str(task_state(ren, sleepy)["latest_checkpoint"]))
                queued = hand(muse, "ok", "Draft the footer.")
                wait_until("the second task to wait", lambda: f"task {queued} waits for a free run" in runner.log())
            [run] = list(runner.runs("ren/builder").values())
            first.proc.kill()
            first.proc.wait(30)
            first.stop()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(run["pid"], signal.SIGKILL)
            wait_until("the waiting task's claim to find no server", lambda: (
                f"the server did not answer the claim of task {queued}" in runner.log()), timeout=60)
        finally:
            first.stop()
        with Served(db_path, "--port", str(port)), person(base, ren_token) as ren:
            wait_until("the waiting task's result", lambda: task_state(ren, queued)["state"] == "verifying", timeout=60)
            assert [r["state"] for r in runs_of(ren, queued)] == ["finished"]
            wait_until("the first run's end told", lambda: runs_of(ren, sleepy)[0]["state"] == "failed")
            assert "Runner.run_task failed" not in runner.log()


def test_a_listener_that_ends_for_any_reason_is_logged_and_started_again(tmp_path):
    config = prickle.RunnerConfig(server="http://127.0.0.1:9", agents={
        "oj/muse": prickle.RunnerAgent(key="prk_rk_x", client="command", command=["true"])})
    runner = prickle.Runner(config, str(tmp_path / "state"))
    calls = []

    async def work():
        calls.append(len(calls))
        if len(calls) == 1:  # what the MCP client raises when its own scope is cancelled
            raise BaseExceptionGroup("unhandled errors in a TaskGroup", [asyncio.CancelledError()])
        if len(calls) == 2:
            raise asyncio.CancelledError()
        if len(calls) == 3:
            return
        await asyncio.Event().wait()

    async def main():
        task = asyncio.ensure_future(runner.supervise("oj/muse: the listener", work))
        while len(calls) < 4:
            await asyncio.sleep(0.05)
        runner.stopping_all = True
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    asyncio.run(main())
    runner.close()
    lines = [line.split(" ", 1)[1] for line in (tmp_path / "state" / "runner.log").read_text().splitlines()]
    assert lines == [
        "oj/muse: the listener ended (BaseExceptionGroup: unhandled errors in a TaskGroup (1 sub-exception)); "
        "starting it again",
        "oj/muse: the listener ended (it was cancelled); starting it again",
        "oj/muse: the listener ended (it returned); starting it again"]


def test_a_runner_whose_cli_cant_run_says_so_and_its_failed_launch_shows_failed_everywhere(db_path, tmp_path):
    with Served(db_path, "--demo") as served:
        base = served.info["url"]
        key = cli_json(db_path, "device", "pair", "ren/builder", "--name", "ren-laptop")["token"]
        cli_json(db_path, "rule", "set", "ren", "--decision", "allow", "--from-owner", "oj")
        missing = str(tmp_path / "no-such-claude")
        config = write_config(tmp_path / "runner.toml", base, {
            "ren/builder": {"key": key, "client": "claude", "cli_path": missing}})
        with RunnerProcess(config) as runner, person(base, cli_json(db_path, "token", "create", "--person", "ren")[
                "token"]) as ren, httpx.Client(base_url=base, timeout=60) as http:
            runner.wait_connected("ren/builder")
            said = (f"'{missing}' was not found: install Claude Code (npm install -g @anthropic-ai/claude-code) or "
                    "set cli_path in the runner's config")
            assert said in runner.log()
            assert f"  can't run: {said}" in runner.status_text()
            task_id = hand(MCP(http, {"oj/muse": served.info["demo"]["keys"]["oj/muse"]}), "ok")
            runs = wait_until("the failed run", lambda: [r for r in runs_of(ren, task_id) if r["state"] == "failed"])
            assert [(r["state"], r["failure"]) for r in runs] == [("failed", "claude_code_not_found")]
            # The runner reports the failure to Team Pulse just after it tells the server the run ended.
            # Until then the pulse may be there without one (the runner's own "waiting" pulse).
            failure = wait_until("the pulse's run failure",
                                 lambda: (pulse_of(ren, PROJECT, "ren/builder") or {}).get("run_failure"))
            assert failure == {"class": "runtime", "step": "claude_code_not_found"}
            [item] = [i for i in ren.get("/api/inbox").json()["items"] if i["kind"] == "run_failed"]
            assert (item["task_id"], item["failure"], item["agent"], item["action"]) == (
                task_id, "claude_code_not_found", "ren/builder", "open")


@contextlib.contextmanager
def ren_running(db_path, tmp_path, **fields):
    """A demo server with ren/builder's runner on the stand-in connected (any other ``fields`` of its
    table): (the runner, ren's API, oj/muse's MCP)."""
    with Served(db_path, "--demo") as served:
        base = served.info["url"]
        config = standin_runner(db_path, tmp_path, base, **fields)
        with RunnerProcess(config) as runner, person(base, cli_json(db_path, "token", "create", "--person", "ren")[
                "token"]) as ren, httpx.Client(base_url=base, timeout=60) as http:
            runner.wait_connected("ren/builder")
            yield runner, ren, MCP(http, {"oj/muse": served.info["demo"]["keys"]["oj/muse"]})


def test_team_pulse_says_the_agent_is_working_while_its_run_goes_on(db_path, tmp_path):
    with ren_running(db_path, tmp_path) as (runner, ren, mcp):
        task_id = hand(mcp, "sleep")
        pulse = wait_until("the pulse", lambda: (p := pulse_of(ren, PROJECT, "ren/builder")) and p.get(
            "availability") == "working" and p)
        assert (pulse["task_id"], pulse["doing"]) == (task_id, "Working on Draft the hero copy.")


def test_team_pulse_names_a_run_still_going_once_a_parallel_one_has_ended(db_path, tmp_path):
    with ren_running(db_path, tmp_path, parallel=2) as (runner, ren, mcp):
        going = hand(mcp, "sleep", "Draft the long page.")
        wait_until("the first run", lambda: (pulse_of(ren, PROJECT, "ren/builder") or {}).get("task_id") == going)
        short = hand(mcp, "ok", "Draft the footer.")
        wait_until("the second result", lambda: task_state(ren, short)["state"] == "verifying", timeout=60)
        # The pulse last named the short run; it ended, so it names the one still going.
        pulse = wait_until("the pulse back on the run going", lambda: (p := pulse_of(ren, PROJECT, "ren/builder"))
                           and p.get("task_id") == going and p)
        assert (pulse["availability"], pulse["doing"]) == ("working", "Working on Draft the long page.")


def test_team_pulse_says_the_agent_is_idle_once_its_run_has_ended(db_path, tmp_path):
    with ren_running(db_path, tmp_path) as (runner, ren, mcp):
        task_id = hand(mcp, "ok")
        wait_until("the result", lambda: task_state(ren, task_id)["state"] == "verifying", timeout=60)
        wait_until("the run's end told", lambda: f"ren/builder: {runs_of(ren, task_id)[0]['attempt_id']} ended"
                   in runner.log())
        # Working while it ran; once it ended, idle, with nothing said to be going on.
        pulse = wait_until("the idle pulse", lambda: (p := pulse_of(ren, PROJECT, "ren/builder")) and p.get(
            "availability") == "idle" and p)
        assert (pulse["doing"], pulse["task_id"], "run_failure" in pulse) == ("", None, False)


def test_a_mention_the_runner_heard_reaches_the_agents_next_session_and_its_owners_inbox(db_path, tmp_path):
    with Served(db_path, "--demo") as served:
        base = served.info["url"]
        key = cli_json(db_path, "device", "pair", "ren/builder", "--name", "ren-laptop")["token"]
        config = write_config(tmp_path / "runner.toml", base, {
            "ren/builder": {"key": key, "client": "command", "command": STANDIN_AGENT}})
        keys = {a: served.info["demo"]["keys"][a] for a in ("oj/muse", "ren/builder")}
        with RunnerProcess(config) as runner, person(base, cli_json(db_path, "token", "create", "--person", "ren")[
                "token"]) as ren, httpx.Client(base_url=base, timeout=60) as http:
            runner.wait_connected("ren/builder")
            mcp = MCP(http, keys)
            builder = mcp.ok("ren/builder", "wait_for_mention", {"timeout_seconds": 1})  # drain the demo's
            while builder["status"] == "events":
                builder = mcp.ok("ren/builder", "wait_for_mention", {"timeout_seconds": 1, "cursor": builder["cursor"]})
            posted = mcp.ok("oj/muse", "post_message", {"project": PROJECT, "body": "@builder can you check the nav?"})
            message_id = posted["message"]["id"]
            wait_until("the runner's note", lambda: f"(message {message_id}); a mention never starts a run"
                       in runner.log())

            def told():
                return [i for i in ren.get("/api/inbox").json()["items"] if i["kind"] == "agent_mention"]
            [item] = told()
            assert (item["message_id"], item["agents"], item["action"]) == (message_id, ["ren/builder"], "open")
            # The agent's own session hears it (the runner did not take it away), and then the owner's inbox is clear.
            heard = mcp.ok("ren/builder", "wait_for_mention", {"timeout_seconds": 5, "cursor": builder["cursor"]})
            assert [(e["kind"], e["message"]["id"]) for e in heard["events"]] == [("mention", message_id)]
            assert told() == []
            # Or the owner reads it: a second mention leaves the inbox when ren reads the room.
            second = mcp.ok("oj/muse", "post_message", {"project": PROJECT, "body": "@builder and the footer?"})
            wait_until("the runner's second note", lambda: second["message"]["id"] in runner.log())
            assert [i["message_id"] for i in told()] == [second["message"]["id"]]
            assert ren.post(f"/api/projects/{PROJECT}/read", json={"message_id": second["message"]["id"]}).status_code \
                == 200
            assert told() == []


def test_a_config_that_names_the_wrong_agent_for_its_key_runs_nothing_and_says_so(db_path, tmp_path):
    with Served(db_path, "--demo") as served:
        base = served.info["url"]
        key = cli_json(db_path, "device", "pair", "ren/builder", "--name", "ren-laptop")["token"]
        cli_json(db_path, "rule", "set", "ren", "--decision", "allow", "--from-owner", "oj")
        config = write_config(tmp_path / "runner.toml", base, {
            "ren/build": {"key": key, "client": "command", "command": STANDIN_AGENT}})
        with RunnerProcess(config) as runner:
            said = wait_until("the refusal", lambda: (runner.state_dir / "runner.log").exists() and "runner key, not"
                              in runner.log() and runner.log())
            assert ("ren/build: this key is ren/builder's runner key, not ren/build's: fix agents.\"ren/build\" in "
                    "the runner's config (its name or its key); nothing runs for it until then") in said
            assert "  can't run: its key is ren/builder's runner key; fix the config" in runner.status_text()
            with httpx.Client(base_url=base, timeout=60) as http, person(base, cli_json(
                    db_path, "token", "create", "--person", "ren")["token"]) as ren:
                # It never listens as ren/build, so nothing handed to ren/builder runs under the wrong name.
                assert runner.state()["agents"]["ren/build"]["listening"] is False
                task_id = hand(MCP(http, {"oj/muse": served.info["demo"]["keys"]["oj/muse"]}), "ok")
                assert runs_of(ren, task_id) == [] and not runner.runs("ren/build")


def test_a_result_is_verified_by_the_requesting_agents_runner_even_when_its_session_has_ended(db_path, tmp_path):
    with Served(db_path, "--demo") as served:
        base = served.info["url"]
        ren_key = cli_json(db_path, "device", "pair", "ren/builder", "--name", "ren-laptop")["token"]
        oj_key = cli_json(db_path, "device", "pair", "oj/muse", "--name", "oj-desk")["token"]
        cli_json(db_path, "rule", "set", "ren", "--decision", "allow", "--from-owner", "oj")
        (tmp_path / "ren").mkdir(), (tmp_path / "oj").mkdir()
        ren_config = write_config(tmp_path / "ren" / "runner.toml", base, {
            "ren/builder": {"key": ren_key, "client": "command", "command": STANDIN_AGENT}})
        oj_config = write_config(tmp_path / "oj" / "runner.toml", base, {
            "oj/muse": {"key": oj_key, "client": "command", "command": STANDIN_AGENT}})
        oj_token = cli_json(db_path, "token", "create", "--person", "oj")["token"]
        with RunnerProcess(ren_config) as ren_runner, person(base, oj_token) as oj, \
                httpx.Client(base_url=base, timeout=60) as http:
            ren_runner.wait_connected("ren/builder")
            task_id = hand(MCP(http, {"oj/muse": served.info["demo"]["keys"]["oj/muse"]}), "ok")
            wait_until("the result", lambda: task_state(oj, task_id)["state"] == "verifying")
            # oj/muse's session is gone and no runner of it listens: its owner is told, and says so on the page.
            [item] = [i for i in oj.get("/api/inbox").json()["items"] if i["kind"] == "verify"]
            assert (item["task_id"], item["agent"], item["listening"], item["action"]) == (
                task_id, "oj/muse", False, "verify")
            assert oj.get(f"/api/tasks/{task_id}").json()["task"]["verification"] == "nobody"
            r = oj.post(f"/api/tasks/{task_id}/verify", json={})
            assert r.status_code == 409 and "no runner is listening for oj/muse" in r.json()["error"]["message"]
            # Its runner starts: it finds the waiting result and verifies it in a short run.
            with RunnerProcess(oj_config) as oj_runner:
                oj_runner.wait_connected("oj/muse")
                wait_until("the verification", lambda: task_state(oj, task_id)["state"] == "approval", timeout=60)
                runs = oj.get(f"/api/tasks/{task_id}").json()["runs"]
                assert [(r["purpose"], r["state"], r["agent_id"]) for r in runs] == [
                    ("work", "finished", "ren/builder"), ("verify", "finished", "oj/muse")]
                assert f"verifying the result of {task_id}" in oj_runner.log()
                kinds = [i["kind"] for i in oj.get("/api/inbox").json()["items"]]
                assert "verify" not in kinds and "final_acceptance" in kinds


def test_a_step_decided_while_its_run_is_still_ending_runs_the_task_again(db_path, tmp_path):
    """The owner allows a step while the run that asked for it is still on its way out: the wake that
    decision sends meets a run still going, so once that run ends the runner runs the task again."""
    go = tmp_path / "go"
    with Served(db_path, "--demo") as served:
        base = served.info["url"]
        config = standin_runner(db_path, tmp_path, base)
        with RunnerProcess(config) as runner, person(base, cli_json(db_path, "token", "create", "--person", "ren")[
                "token"]) as ren, httpx.Client(base_url=base, timeout=60) as http:
            runner.wait_connected("ren/builder")
            task_id = hand(MCP(http, {"oj/muse": served.info["demo"]["keys"]["oj/muse"]}), f"stepwait {go}")
            [step] = wait_until("the step", lambda: ren.get("/api/steps").json()["steps"])
            assert ren.post(f"/api/steps/{step['id']}", json={"decision": "allow"}).status_code == 200
            wait_until("the decision's wake to meet the run", lambda: f"task {task_id} already has a run" in runner.log())
            go.touch()  # the first run ends now, its step decided
            task = wait_until("the result", lambda: (t := task_state(ren, task_id))["state"] == "verifying" and t)
            assert f"task {task_id} was woken while its run went on: running it again" in runner.log()
            first, second = runs_of(ren, task_id)
            assert (first["state"], second["state"]) == ("finished", "finished")
            assert task["result"]["summary"] == "Done by the stand-in."
            [consumed] = audit_entries(prickle.Database(db_path), PROJECT, "step.consumed")
            assert (consumed["refs"]["asked_by"], consumed["refs"]["used_by"]) == (first["attempt_id"],
                                                                                  second["attempt_id"])


def test_a_task_routed_while_the_runner_reads_its_inbox_on_connect_still_starts_a_run(db_path, tmp_path):
    """The runner takes a cursor, reads its inbox, then waits: a task routed in between is in its first wait.

    The proxy hands the task over just before the runner's first inbox read reaches it, so the inbox
    answer does not have it and only the cursor taken before can bring it.
    """
    from hostile_proxy import HostileProxy
    with Served(db_path, "--demo") as served, httpx.Client(base_url=served.info["url"], timeout=60) as http:
        base = served.info["url"]
        muse = MCP(http, {"oj/muse": served.info["demo"]["keys"]["oj/muse"]})
        handed: list[str] = []

        def hand_during_first_inbox(tool, out):
            if tool == "check_inbox" and not handed:
                assert not [t for t in out.get("assigned", []) if t["state"] == "routed"]
                handed.append(hand(muse, "ok"))
            return False

        with HostileProxy(base, hand_during_first_inbox) as proxy, \
                RunnerProcess(standin_runner(db_path, tmp_path, proxy.url)) as runner, \
                person(base, cli_json(db_path, "token", "create", "--person", "ren")["token"]) as ren:
            runner.wait_connected("ren/builder")
            assert handed
            wait_until("the task's result", lambda: task_state(ren, handed[0])["state"] == "verifying")
            assert [r["state"] for r in runs_of(ren, handed[0])] == ["finished"]
