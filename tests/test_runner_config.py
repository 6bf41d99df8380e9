"""The runner's config, the argv it launches and what ``prickle runner status`` says, without a server."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import PRICKLE
from runner_util import write_config

import prickle

KEY = "prk_rk_" + "a" * 43


def _load(tmp_path, agent: dict, server="http://127.0.0.1:8321/mcp"):
    return prickle.load_runner_config(str(write_config(tmp_path / "runner.toml", server, {"oj/muse": agent})))


def test_a_config_reads_its_server_agents_and_limits(tmp_path):
    config = _load(tmp_path, {"key": KEY, "client": "claude", "parallel": 2, "launch_timeout_minutes": 5})
    assert (config.base_url, config.mcp_url) == ("http://127.0.0.1:8321", "http://127.0.0.1:8321/mcp")
    agent = config.agents["oj/muse"]
    assert (agent.client, agent.parallel, agent.launch_timeout_minutes, agent.repo) == ("claude", 2, 5, None)
    assert prickle.runner_state_dir(config, str(tmp_path / "runner.toml")) == str(tmp_path / "runner-state")


@pytest.mark.parametrize("agent, message", [
    ({"key": KEY, "client": "gemini"}, "agents.oj/muse.client: String should match pattern"),
    ({"key": "prk_ck_abc", "client": "claude"}, "agents.oj/muse.key: String should match pattern"),
    ({"key": KEY, "client": "command"}, "agents.oj/muse.command: client 'command' needs the argv"),
    ({"key": KEY, "client": "claude", "repo": "/nonexistent"}, "agents.oj/muse.repo: /nonexistent is not a git"),
    ({"key": KEY, "client": "claude", "parallel": 0}, "agents.oj/muse.parallel: Input should be greater than"),
    ({"key": KEY, "client": "claude", "colour": "red"}, "agents.oj/muse.colour: unknown key"),
])
def test_a_bad_config_is_refused_naming_the_field(tmp_path, agent, message):
    with pytest.raises(prickle.RunnerError) as e:
        _load(tmp_path, agent)
    assert message in e.value.message and KEY not in e.value.message


def test_a_missing_config_says_how_to_make_one(tmp_path):
    p = subprocess.run(PRICKLE + ["runner", "status", "--config", str(tmp_path / "none.toml")], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 1
    assert p.stderr.strip() == (f"prickle: no runner config at {tmp_path / 'none.toml'}: run 'prickle runner connect "
                                "--server URL' or write one (see README, 'Run your agents'); a config elsewhere is "
                                "named with --config FILE or $PRICKLE_RUNNER_CONFIG")


def test_status_without_a_running_runner_shows_every_agent_idle(tmp_path):
    config = write_config(tmp_path / "runner.toml", "http://127.0.0.1:8321", {
        "oj/muse": {"key": KEY, "client": "claude"}, "oj/critic": {"key": KEY, "client": "codex"}})
    script = Path(sys.executable).parent / "prickle-runner"
    p = subprocess.run([str(script), "status", "--config", str(config)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines() == [
        "runner: not running; server http://127.0.0.1:8321; log -",
        "oj/muse: not connected, not listening, 0 run(s) in progress", "  last failure: none",
        "oj/critic: not connected, not listening, 0 run(s) in progress", "  last failure: none"]
    out = json.loads(subprocess.run(PRICKLE + ["runner", "status", "--config", str(config), "--json"],
                                    capture_output=True, text=True, timeout=60).stdout)
    assert out["running"] is False and out["agents"]["oj/critic"] == {
        "connected": False, "listening": False, "runs": {}, "last_failure": None}
    assert KEY not in p.stdout


def test_each_client_is_launched_with_prickle_configured_and_no_secret_on_its_command_line(tmp_path):
    values = {"mcp_url": "http://127.0.0.1:8321/mcp", "task_id": "task_1", "project": "website-v2", "role": "task",
              "workspace": "/w", "prompt_file": "/r/prompt.txt", "mcp_config": "/r/mcp.json"}
    files = {"mcp_config": "/r/mcp.json", "prompt_file": "/r/prompt.txt", "settings": "/r/settings.json"}
    claude = prickle.RunnerAgent(key=KEY, client="claude")
    assert prickle.launch_argv(claude, files, values) == ([
        "claude", "-p", "--mcp-config", "/r/mcp.json", "--strict-mcp-config",
        "--setting-sources", "user", "--settings", "/r/settings.json", "--allowedTools", "mcp__prickle",
        "--permission-prompt-tool", "mcp__prickle_bridge__approve", "--output-format", "json"], True)
    codex = prickle.RunnerAgent(key=KEY, client="codex", cli_path="/opt/codex")
    assert prickle.launch_argv(codex, files, values) == ([
        "/opt/codex", "exec", "--skip-git-repo-check", "--sandbox", "workspace-write", "--ignore-rules",
        "-c", 'mcp_servers.prickle.url="http://127.0.0.1:8321/mcp"',
        "-c", 'mcp_servers.prickle.bearer_token_env_var="PRICKLE_RUN_KEY"', "-"], True)
    command = prickle.RunnerAgent(key=KEY, client="command", command=["agent", "--task", "{task_id}", "{prompt_file}"])
    assert prickle.launch_argv(command, files, values) == (["agent", "--task", "task_1", "/r/prompt.txt"], False)
    servers = prickle.mcp_config_for(values["mcp_url"], bridge=True)["mcpServers"]
    assert servers["prickle"]["headers"] == {"Authorization": "Bearer ${PRICKLE_RUN_KEY}"}
    assert servers["prickle_bridge"]["env"] == {"PRICKLE_RUN_KEY": "${PRICKLE_RUN_KEY}",
                                                "PRICKLE_MCP_URL": values["mcp_url"]}


def test_secrets_are_cut_from_log_lines():
    assert prickle.redact("key prk_ex_AbC-12_x and prk_rk_zz done") == "key prk_ex_… and prk_rk_… done"


CODEX_CACHE = Path(__file__).resolve().parent.parent / ".cache" / "agent-clis" / "cli" / "bin" / "codex"


@pytest.mark.skipif(not CODEX_CACHE.exists(),
                    reason="Codex is not installed: .ci/run installs it into .cache/agent-clis")
def test_codex_reads_the_prickle_server_the_runner_configures(tmp_path):
    codex = prickle.RunnerAgent(key=KEY, client="codex", cli_path=str(CODEX_CACHE))
    argv, _ = prickle.launch_argv(codex, {}, {"mcp_url": "http://127.0.0.1:8321/mcp"})
    overrides = [a for i, a in enumerate(argv) if argv[i - 1] == "-c"]
    home = tmp_path / "codex-home"
    home.mkdir()
    p = subprocess.run([str(CODEX_CACHE)] + [x for o in overrides for x in ("-c", o)] + ["mcp", "list", "--json"],
                       capture_output=True, text=True, timeout=60, env={"CODEX_HOME": str(home), "HOME": str(home),
                                                                        "PATH": "/usr/bin:/bin"})
    assert p.returncode == 0, p.stderr
    servers = {s["name"]: s for s in json.loads(p.stdout)}
    assert servers["prickle"]["transport"]["url"] == "http://127.0.0.1:8321/mcp"
    assert servers["prickle"]["transport"]["bearer_token_env_var"] == "PRICKLE_RUN_KEY"


def test_relative_paths_in_a_config_are_read_from_its_folder(tmp_path, monkeypatch):
    folder, repo, elsewhere = tmp_path / "conf", tmp_path / "website", tmp_path / "elsewhere"
    folder.mkdir(), elsewhere.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    monkeypatch.chdir(elsewhere)  # where the runner happens to start
    path = write_config(folder / "runner.toml", "http://127.0.0.1:8321", {
        "oj/muse": {"key": KEY, "client": "claude", "repo": "../website", "cli_path": "bin/claude"},
        "oj/critic": {"key": KEY, "client": "codex", "cli_path": "codex-beta"}}, state_dir="state")
    config = prickle.load_runner_config(str(path))
    assert prickle.runner_state_dir(config, str(path)) == str(folder / "state")
    assert (config.agents["oj/muse"].repo, config.agents["oj/muse"].cli_path) == (str(repo), str(folder / "bin/claude"))
    assert config.agents["oj/critic"].cli_path == "codex-beta"  # a bare name is looked up on PATH
    write_config(path, "http://127.0.0.1:8321", {"oj/muse": {"key": KEY, "client": "claude", "repo": "website"}})
    with pytest.raises(prickle.RunnerError) as e:
        prickle.load_runner_config(str(path))
    assert e.value.message == (f"runner config {path}: agents.oj/muse.repo: website is not a git repository "
                               f"(looked in {folder / 'website'})")


def test_the_bridge_a_run_starts_in_its_workspace_is_prickles_own(tmp_path):
    # A workspace may hold a prickle.py (a checkout of Prickle, or one the run wrote): it must not answer
    # the permission prompt in the bridge's place.
    (tmp_path / "prickle.py").write_text("open('hijacked', 'w').write('yes')\n")
    bridge = prickle.mcp_config_for("http://127.0.0.1:8321/mcp", bridge=True)["mcpServers"]["prickle_bridge"]
    hello = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}}}
    p = subprocess.run([bridge["command"], *bridge["args"]], input=json.dumps(hello) + "\n", cwd=tmp_path,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout.splitlines()[0])["result"]["serverInfo"]["name"] == "prickle-bridge"
    assert not (tmp_path / "hijacked").exists()


def test_a_run_without_the_bridge_is_told_to_ask_with_request_step():
    task = {"id": "task_1", "project": "website-v2", "requester": "ren/builder",
            "packet": {"task": "Publish the copy.", "acceptance_criteria": ["Live."]}}
    claude, codex = (prickle.task_prompt(task, [], [], bridged=b).splitlines() for b in (True, False))
    step = next(line for line in codex if line.startswith("3. "))
    assert step == ("3. Work only inside the current directory. Before a destructive, spending or outbound step, "
                    "ask your owner first with request_step {tool_name, input, reason, tool_use_id}, naming the "
                    "exact call: make it only when the answer allows it: behavior allow, or, asked without a "
                    "tool_use_id, a message that begins \"Allowed\" (ask again with the same fields "
                    "once they decided); while it is pending, checkpoint and end your turn (you will be resumed).")
    assert "just make the call: your owner is asked" in next(line for line in claude if line.startswith("3. "))
    # Besides step 3, only how the Prickle tools are named differs (Claude Code's names, or the server's).
    assert [a for a, b in zip(claude, codex) if a != b] == [
        "Use the Prickle tools (mcp__prickle__*, as Claude Code names them) and only those for Prickle:",
        next(line for line in claude if line.startswith("3. "))]


def test_a_config_says_claude_code_or_misspells_a_key_and_is_told_by_that_keys_name(tmp_path):
    path = tmp_path / "runner.toml"
    path.write_text('server = "http://127.0.0.1:8321"\n\n[agents."oj/muse"]\nkey = "prk_rk_x"\n'
                    'client = "claude-code"\n')
    assert prickle.load_runner_config(str(path)).agents["oj/muse"].client == "claude"
    path.write_text('server = "http://127.0.0.1:8321"\n\n[agents."oj/muse"]\nkey = "prk_rk_x"\nclinet = "claude"\n')
    with pytest.raises(prickle.RunnerError) as e:
        prickle.load_runner_config(str(path))
    assert str(e.value) == f"runner config {path}: agents.oj/muse.clinet: unknown key (did you mean client?)"
    path.write_text('server = "http://127.0.0.1:8321"\nparalell = 2\n')
    with pytest.raises(prickle.RunnerError) as e:
        prickle.load_runner_config(str(path))
    assert str(e.value) == f"runner config {path}: paralell: unknown key (did you mean parallel?)"


def test_a_run_asked_for_by_a_person_says_so_in_its_prompt():
    task = {"id": "task_1", "project": "website-v2", "requester": None,
            "requested_by": {"kind": "person", "handle": "oj"},
            "packet": {"task": "Draft it.", "deliverable_type": "doc", "acceptance_criteria": ["Short."]}}
    assert prickle.task_prompt(task, [], []).splitlines()[0] == (
        "You are working on Prickle task task_1 in project website-v2, handed to you by your owner, @oj.")
    assert "handed to you by oj/muse." in prickle.task_prompt(task | {"requester": "oj/muse"}, [], [])


def test_a_run_after_a_send_back_is_told_who_sent_the_result_back_and_why():
    task = {"id": "task_1", "project": "website-v2", "requester": "oj/muse",
            "packet": {"task": "Draft it.", "acceptance_criteria": ["Short.", "Names the price."]},
            "result": {"status": "rejected", "revision": 2, "reason": "Criterion 1 has no evidence.",
                       "verified_by": {"kind": "agent", "agent_id": "oj/muse"}, "decided_by": None}}
    lines = prickle.task_prompt(task, [], []).splitlines()
    at = lines.index("Your last result (revision 2) was sent back by oj/muse: Criterion 1 has no evidence.")
    assert lines[at + 1] == "Fix what it names, then return a new result."
    by_person = task | {"result": task["result"] | {"decided_by": {"kind": "person", "handle": "oj"}}}
    assert "Your last result (revision 2) was sent back by @oj: Criterion 1 has no evidence." in \
        prickle.task_prompt(by_person, [], []).splitlines()
    for status in ("submitted", "accepted", "superseded"):  # nothing sent back: nothing said
        assert "sent back" not in prickle.task_prompt(task | {"result": task["result"] | {"status": status}}, [], [])
    assert "sent back" not in prickle.task_prompt(task | {"result": None}, [], [])


def test_the_runner_knows_its_own_process_by_when_it_started():
    started = prickle.process_started(os.getpid())
    assert started is not None and started == prickle.process_started(os.getpid())
    assert prickle.process_started(None) is None


def test_a_runs_prompt_names_the_prickle_tools_as_its_client_does():
    task = {"id": "task_1", "project": "website-v2", "requester": "oj/muse",
            "packet": {"task": "Draft it.", "deliverable_type": "doc", "acceptance_criteria": ["Short."]}}
    said = lambda bridged: [line for line in prickle.task_prompt(task, [], [], bridged).splitlines()  # noqa: E731
                            if line.startswith("Use the Prickle tools")]
    assert said(True) == ["Use the Prickle tools (mcp__prickle__*, as Claude Code names them) and only those for "
                          "Prickle:"]
    assert said(False) == ["Use the Prickle tools (those of the MCP server named prickle) and only those for Prickle:"]
