"""Helpers for the runner tests: a config file, a real ``prickle runner`` process, polling the server."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx

from conftest import PRICKLE

HERE = Path(__file__).resolve().parent
STANDIN_AGENT = [sys.executable, str(HERE / "runner_agent.py"), "{prompt_file}"]
#: Claude Code as .ci/run installs it (or $PRICKLE_TEST_CLAUDE, or on PATH); None when it is not installed.
CLAUDE_CACHE = HERE.parent / ".cache" / "agent-clis" / "cli" / "bin" / "claude"
CLAUDE = os.environ.get("PRICKLE_TEST_CLAUDE") or (str(CLAUDE_CACHE) if CLAUDE_CACHE.exists() else shutil.which("claude"))
CLAUDE_MISSING = ("Claude Code is not installed: .ci/run installs it into .cache/agent-clis (or set PRICKLE_TEST_CLAUDE "
                  "to a claude binary)")
#: Every secret Prickle makes begins so; none may reach a runner's log.
SECRET_PREFIXES = ("prk_rk_", "prk_ex_", "prk_dc_", "prk_ck_", "prk_pt_")


def toml_value(v) -> str:
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {toml_value(x)}" for k, x in v.items()) + "}"
    return str(v)


def write_config(path: Path, server: str, agents: dict[str, dict], **top) -> Path:
    """A runner config: ``server``, top-level settings, one ``[agents."x"]`` table per agent."""
    lines = [f"server = {toml_value(server)}"] + [f"{k} = {toml_value(v)}" for k, v in top.items()]
    for agent_id, fields in agents.items():
        lines.append(f'\n[agents."{agent_id}"]')
        lines += [f"{k} = {toml_value(v)}" for k, v in fields.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def wait_until(what: str, probe, timeout: float = 90, every: float = 0.1):
    """Poll ``probe`` until it returns something truthy; fail naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(every)


class RunnerProcess:
    """A real ``prickle runner start`` process on one config; its stderr goes to a file beside the config."""

    def __init__(self, config: Path, env: dict | None = None, cwd: Path | None = None, state_dir: Path | None = None):
        self.config, self.env, self.cwd = config, (env or os.environ) | {"PYTHONUNBUFFERED": "1"}, cwd
        self.state_dir = state_dir or Path(str(config.with_suffix("")) + "-state")  # the config's state_dir, if any
        self.err_path = config.parent / f"{config.stem}.stderr"
        self.err = open(self.err_path, "a")
        self.proc = subprocess.Popen(PRICKLE + ["runner", "start", "--config", str(config)],
                                     stdout=subprocess.DEVNULL, stderr=self.err, env=self.env, cwd=cwd)

    def status(self) -> dict:
        p = subprocess.run(PRICKLE + ["runner", "status", "--config", str(self.config), "--json"],
                           capture_output=True, text=True, timeout=30, env=self.env, cwd=self.cwd)
        assert p.returncode == 0, p.stderr
        return json.loads(p.stdout)

    def status_text(self) -> str:
        """What ``prickle runner status`` prints for this config."""
        p = subprocess.run(PRICKLE + ["runner", "status", "--config", str(self.config)],
                           capture_output=True, text=True, timeout=30, env=self.env, cwd=self.cwd)
        assert p.returncode == 0, p.stderr
        return p.stdout

    def state(self) -> dict:
        """The status file the runner keeps (what ``status`` prints), read without a process."""
        try:
            return json.loads((self.state_dir / "status.json").read_text())
        except (FileNotFoundError, ValueError):
            return {"agents": {}}

    def runs(self, agent: str) -> dict:
        return self.state()["agents"].get(agent, {}).get("runs", {})

    def wait_connected(self, *agents: str) -> dict:
        def probe():
            assert self.proc.poll() is None, f"the runner exited: {self.err_path.read_text()}"
            s = self.state()
            return s if s.get("pid") == self.proc.pid and all(
                s["agents"].get(a, {}).get("connected") for a in agents) else None
        return wait_until(f"{agents} connected", probe)

    def log(self) -> str:
        return (self.state_dir / "runner.log").read_text()

    def stop(self, kill: bool = False) -> None:
        if self.proc.poll() is None:
            self.proc.kill() if kill else self.proc.terminate()
        self.proc.wait(30)
        self.err.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def all_logs(state_dir: Path) -> str:
    """Every log a runner wrote (its own and each attempt's)."""
    return "".join(p.read_text() for p in sorted(state_dir.rglob("*.log")))


def person(base: str, token: str, *, keep_alive: bool = True) -> httpx.Client:
    """A people's-API client for ``token``. Across a server that gets killed, ask for no ``keep_alive``:
    a pooled connection to the dead server would be dropped unclosed (a ResourceWarning)."""
    limits = httpx.Limits() if keep_alive else httpx.Limits(max_keepalive_connections=0)
    return httpx.Client(base_url=base, timeout=30, headers={"Authorization": f"Bearer {token}"}, limits=limits)


def task_state(http: httpx.Client, task_id: str) -> dict:
    r = http.get(f"/api/tasks/{task_id}")
    assert r.status_code == 200, r.text
    return r.json()["task"]


def pulse_of(http: httpx.Client, project: str, agent_id: str) -> dict | None:
    pulses = http.get(f"/api/projects/{project}").json()["pulse"]
    return next((p for p in pulses if p["agent_id"] == agent_id), None)


def claude_env(home: Path, model_url: str) -> dict:
    """An environment for Claude Code runs: a HOME of its own, its model the stand-in at ``model_url``."""
    home.mkdir()
    return os.environ | {"HOME": str(home), "ANTHROPIC_BASE_URL": model_url, "ANTHROPIC_API_KEY": "stand-in",
                         "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "ENABLE_TOOL_SEARCH": "false"}
