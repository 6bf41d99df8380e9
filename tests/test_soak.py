"""The whole loop left alone: 20 tasks handed between two people's agents, run by real runners.

Real ``prickle serve`` and two real ``prickle runner`` processes (oj's computer runs oj/muse, ren's
runs ren/builder), each agent's runs real Claude Code with its model played by
tests/model_standin.py. Each task is handed on by an agent's session that then goes away, so the
requesting agent's runner verifies each result; its owner gives final acceptance. Meanwhile the
test kills things at chosen moments, as a team's machines restart:

- ren's runner is killed with SIGKILL while a run is being launched (the CLI is up, its model has
  not answered yet);
- the server is stopped with SIGTERM while a run's step waits for oj's decision;
- the server is killed with SIGKILL while a run is returning its result.

The people do what the page offers (settle a run the runner could not vouch for, start a run
after a failed one, allow a step, give final acceptance) and nothing else. Every task must end
``completed``, no run may be left ``running``, and nothing the server acknowledged may be lost.
The model stand-in holds a run at each chosen moment until the test has done its killing, so
nothing depends on timing; the test waits for states, never sleeps.
"""

import re
import signal
import threading

import httpx
import pytest

from conftest import MCP, Served, audit_entries
from helpers import SoftAuthenticator, _free_port, cli_json
from model_standin import ModelStandIn
from runner_util import (CLAUDE, CLAUDE_MISSING, SECRET_PREFIXES, RunnerProcess, all_logs, claude_env, person,
                         wait_until, write_config)

import prickle

pytestmark = pytest.mark.skipif(not CLAUDE, reason=CLAUDE_MISSING)

PROJECT = "website-v2"
TASKS = 20
LAUNCH_KILL, STEP_STOP, RETURN_KILL = 1, 2, 3  # the tasks at whose moments the test kills
VERIFY = "its result is back: verify it"


class Moment:
    """A point in one task's run where the model stand-in holds the run until the test lets it go."""

    def __init__(self):
        self.reached, self.go = threading.Event(), threading.Event()
        self.hit = False

    def hold(self) -> None:
        if not self.hit:
            self.hit = True
            self.reached.set()
            assert self.go.wait(180), "the test never let the run go on"


def soak_script(moments: dict[int, Moment]) -> list:
    """A model for every run of the soak, from what each run's prompt says.

    A task's run accepts, (for a task whose context says ``soak: step``) asks to publish through
    Claude Code's permission prompt, checkpoints and ends while the step waits, is resumed after
    the decision and publishes, then returns with a note per criterion. A verification run
    accepts the result criterion by criterion.
    """
    def number(seen):
        return int(re.search(r"Soak task (\d+)\.", seen.prompt).group(1))

    def plan(seen) -> list:
        task_id = re.search(r"Prickle task (\S+) ", seen.prompt).group(1)
        if VERIFY in seen.prompt:
            submission, revision = re.search(r"submission (\S+), revision (\d+)\)", seen.prompt).groups()
            return [("mcp__prickle__accept_result", {
                "task_id": task_id, "submission_id": submission, "revision": int(revision), "artifacts": [],
                "verdicts": [{"criterion": 0, "accepted": True}, {"criterion": 1, "accepted": True}]}), "Verified."]
        n = number(seen)
        publish = ("Bash", {"command": f"echo {n} > published.txt", "description": "Publish the copy"})

        def accept(seen):
            if n == LAUNCH_KILL:
                moments[LAUNCH_KILL].hold()
            return ("mcp__prickle__accept_task", {"task_id": task_id})

        def give_back(seen):
            if n == RETURN_KILL:
                moments[RETURN_KILL].hold()
            return ("mcp__prickle__return_result", {"task_id": task_id, "summary": f"Copy {n} drafted.",
                    "evidence": [{"kind": "note", "summary": "Six words.", "criteria": [0]},
                                 {"kind": "note", "summary": "CTA: try the demo.", "criteria": [1]}]})
        if "soak: step" not in seen.prompt:
            return [accept, give_back, "Returned."]
        if "The last checkpoint of this task" not in seen.prompt:
            return [accept, publish, ("mcp__prickle__checkpoint", {"task_id": task_id, "checkpoint": {
                "progress": "Drafted; publishing waits for the owner."}}), "Waiting for the owner."]
        return [publish, give_back, "Returned."]

    def turn(n):
        def answer(seen):
            steps = plan(seen)
            step = steps[n] if n < len(steps) else "Done."
            return step(seen) if callable(step) else step
        return answer
    return [turn(n) for n in range(6)]


def test_twenty_tasks_complete_while_the_server_and_a_runner_are_killed_at_chosen_moments(db_path, tmp_path):
    moments = {n: Moment() for n in (LAUNCH_KILL, RETURN_KILL)}
    port = _free_port()
    with ModelStandIn(soak_script(moments)) as model:
        server = Served(db_path, "--demo", "--port", str(port))
        try:
            base = server.info["url"]
            keys = server.info["demo"]["keys"]
            cli_json(db_path, "rule", "set", "ren", "--decision", "allow", "--from-owner", "oj")
            cli_json(db_path, "rule", "set", "oj", "--decision", "allow", "--from-owner", "ren")
            people = {h: person(base, cli_json(db_path, "token", "create", "--person", h)["token"], keep_alive=False)
                      for h in ("oj", "ren")}
            passkeys, at = {h: SoftAuthenticator() for h in people}, base.replace("127.0.0.1", "localhost")
            for h, key in passkeys.items():
                options = people[h].post("/api/me/passkeys/options", json={"purpose": "register"},
                                         headers={"Origin": at}).json()["publicKey"]
                assert people[h].post("/api/me/passkeys", json={"credential": key.create(options, at)}).is_success

            def confirm(handle):
                options = people[handle].post("/api/me/passkeys/options", json={"purpose": "confirm"},
                                              headers={"Origin": at}).json()
                people[handle].post("/api/me/step-up/passkey",
                                    json={"credential": passkeys[handle].get(options["publicKey"], at)})
            configs = {}
            for handle, agent in (("oj", "oj/muse"), ("ren", "ren/builder")):
                (tmp_path / handle).mkdir()
                key = cli_json(db_path, "device", "pair", agent, "--name", f"{handle}-laptop")["token"]
                configs[handle] = write_config(tmp_path / handle / "runner.toml", base, {agent: {
                    "key": key, "client": "claude", "cli_path": CLAUDE, "parallel": 2, "launch_timeout_minutes": 5}},
                    parallel=2)
            envs = {h: claude_env(tmp_path / h / "home", model.url) for h in configs}
            runners = {h: RunnerProcess(configs[h], env=envs[h]) for h in configs}
            runners["oj"].wait_connected("oj/muse")
            runners["ren"].wait_connected("ren/builder")

            # Each agent's session hands its tasks on and goes away; the handoffs are acknowledged.
            sessions = MCP(httpx.Client(base_url=base, timeout=60), keys)
            tasks: dict[int, str] = {}
            for n in range(1, TASKS + 1):
                frm, to = ("oj/muse", "ren/builder") if n % 2 else ("ren/builder", "oj/muse")
                out = sessions.ok(frm, "handoff", {"project": PROJECT, "to": to, "packet": {
                    "task": f"Soak task {n}. Draft the hero copy.", "deliverable_type": "doc",
                    "context": "soak: step" if n % 4 == 2 else "soak: plain",
                    "acceptance_criteria": ["Headline has at most 8 words.", "Include a clear call to action."]}})
                tasks[n] = out["task"]["id"]
            sessions.client.close()

            def runs(n):
                return people["oj"].get(f"/api/tasks/{tasks[n]}").json()["runs"]

            # 1. ren's runner dies while it launches task 1's run: the CLI is up, its model has not answered.
            assert moments[LAUNCH_KILL].reached.wait(180), "task 1's run never reached its model"
            runners["ren"].stop(kill=True)
            runners["ren"] = RunnerProcess(configs["ren"], env=envs["ren"])
            runners["ren"].wait_connected("ren/builder")
            wait_until("task 1's run marked uncertain", lambda: [r["state"] for r in runs(LAUNCH_KILL)] == ["uncertain"])
            moments[LAUNCH_KILL].go.set()

            # 2. The server stops (SIGTERM) while task 2's step waits for oj.
            step = wait_until("task 2's step", lambda: [s for s in people["oj"].get("/api/steps").json()["steps"]
                                                        if s["task_id"] == tasks[STEP_STOP]], timeout=180)[0]
            server.proc.send_signal(signal.SIGTERM)
            assert server.proc.wait(30) in (0, -signal.SIGTERM)  # uvicorn re-raises the signal it handled
            server.stop()
            server = Served(db_path, "--port", str(port))
            assert people["oj"].post(f"/api/steps/{step['id']}", json={"decision": "allow"}).status_code == 200

            # 3. The server is killed (SIGKILL) while task 3's run returns its result.
            assert moments[RETURN_KILL].reached.wait(180), "task 3's run never came to return"
            server.proc.kill()
            server.proc.wait(30)
            server.stop()
            server = Served(db_path, "--port", str(port))
            moments[RETURN_KILL].go.set()

            # The people do what the page asks of them until every task is done.
            def tend() -> bool:
                done = 0
                for n, task_id in tasks.items():
                    owner = people[prickle.owner_of(runs_owner[n])]
                    detail = owner.get(f"/api/tasks/{task_id}").json()
                    task, task_runs = detail["task"], detail["runs"]
                    asker = people[task["final_by"]]
                    if task["state"] == "completed":
                        done += 1
                    elif task["awaiting_final"]:
                        asker.post(f"/api/tasks/{task_id}/accept", json={})
                    elif task_runs and task_runs[-1]["state"] == "uncertain":
                        owner.post(f"/api/attempts/{task_runs[-1]['attempt_id']}/settle", json={"outcome": "abandoned"})
                    elif (detail.get("run_control") or {}).get("can_start") and task_runs and \
                            task_runs[-1]["state"] in ("failed", "abandoned"):
                        confirm(prickle.owner_of(runs_owner[n]))  # Start a run needs a fresh step-up
                        owner.post(f"/api/tasks/{task_id}/runs")
                for s in people["oj"].get("/api/steps").json()["steps"]:
                    people["oj"].post(f"/api/steps/{s['id']}", json={"decision": "allow"})
                return done == TASKS

            runs_owner = {n: "ren/builder" if n % 2 else "oj/muse" for n in tasks}
            try:
                wait_until("every task completed", tend, timeout=420, every=0.5)
            except AssertionError:
                states = {n: (people["oj"].get(f"/api/tasks/{t}").json()["task"]["state"],
                              [(r["purpose"], r["state"], r["failure"]) for r in runs(n)]) for n, t in tasks.items()}
                raise AssertionError(f"not every task completed: {states}") from None

            # Nothing stays running, and each chosen moment happened as planned.
            for n in tasks:
                assert all(r["state"] != "running" for r in runs(n)), (n, runs(n))
            work = [r for r in runs(LAUNCH_KILL) if r["purpose"] == "work"]
            assert [r["state"] for r in work][:2] == ["abandoned", "finished"]
            consumed = [e["refs"] for e in audit_entries(prickle.Database(db_path), PROJECT, "step.consumed")]
            assert step["id"] in [c["step"] for c in consumed]
            assert all(c["used_by"] != c["asked_by"] for c in consumed)  # each used by the run resumed after it
            returned = people["ren"].get(f"/api/tasks/{tasks[RETURN_KILL]}").json()["task"]["result"]
            assert returned["summary"] == f"Copy {RETURN_KILL} drafted."
            for n in tasks:
                result = people["oj"].get(f"/api/tasks/{tasks[n]}").json()["task"]["result"]
                assert (result["summary"], result["verified_by"]["agent_id"]) == (
                    f"Copy {n} drafted.", "oj/muse" if n % 2 else "ren/builder")
        finally:
            for r in locals().get("runners", {}).values():
                r.stop()
            server.stop()
        for handle in configs:
            logs = all_logs(runners[handle].state_dir)
            assert not any(p in logs for p in SECRET_PREFIXES)
        verified = cli_json(db_path, "audit", "verify")
        assert verified["ok"] is True, verified
        for client in people.values():
            client.close()
