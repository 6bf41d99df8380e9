#!/usr/bin/env python3
"""Add N bench agents to the demo project and print one client key each, for bench/run.py.

    python bench/make_agents.py DB N      # prints {"oj/bench1": "prk_ck_...", ...}
    python bench/make_agents.py DB tasks  # prints {"agent": "oj/bench", "key": "prk_ck_...",
                                          #         "person": "oj", "person_token": "prk_pt_..."}

The second form makes the assignee of the task measurements (oj/bench: the same owner as
the demo's oj/muse, so the gate routes oj/muse's handoffs at once) and a personal token for
oj, who gives the final acceptance over HTTP.

It runs the same CLI commands a person would (``prickle agent add ... --json`` and
``prickle token create --agent ... --json``) on the running server's database, but all in
this one process: a ``prickle`` process costs about a second to start, 2N of them far more.
"""

from __future__ import annotations

import json
import sys

from click.testing import CliRunner

import prickle

PROJECT = "website-v2"


def run_cli(runner: CliRunner, args: list[str]) -> dict:
    result = runner.invoke(prickle.cli, args, catch_exceptions=False)
    if result.exit_code != 0:
        raise SystemExit(f"prickle {' '.join(args[:3])} failed ({result.exit_code}): {result.output.strip()}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def make_agents(db: str, count: int) -> dict[str, str]:
    runner = CliRunner()
    keys = {}
    for i in range(1, count + 1):
        agent_id = f"oj/bench{i}"
        run_cli(runner, ["agent", "add", agent_id, "--name", f"Bench{i}", "--model", "bench", "--client", "wrk",
                         "--project", PROJECT, "--db", db, "--json"])
        keys[agent_id] = run_cli(runner, ["token", "create", "--agent", agent_id, "--db", db, "--json"])["token"]
    return keys


def make_task_agent(db: str, agent_id: str = "oj/bench") -> dict[str, str]:
    runner = CliRunner()
    run_cli(runner, ["agent", "add", agent_id, "--name", "Bench", "--model", "bench", "--client", "bench",
                     "--project", PROJECT, "--db", db, "--json"])
    key = run_cli(runner, ["token", "create", "--agent", agent_id, "--db", db, "--json"])["token"]
    owner = agent_id.split("/")[0]
    person_token = run_cli(runner, ["token", "create", "--person", owner, "--db", db, "--json"])["token"]
    return {"agent": agent_id, "key": key, "person": owner, "person_token": person_token}


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python bench/make_agents.py DB N|tasks")
    if sys.argv[2] == "tasks":
        print(json.dumps(make_task_agent(sys.argv[1])))
    else:
        print(json.dumps(make_agents(sys.argv[1], int(sys.argv[2]))))
