"""A runner delivers what its run made: the files a result names, and its commits (pushed or bundled).

Real ``prickle serve`` and ``prickle runner`` processes with the stand-in agent (tests/runner_agent.py):
it writes refund-policy.md, names it in its result (first with a wrong sha256, which is refused with
why, then right); ren's runner uploads it with the run's credential before the result is recorded;
oj downloads it with its hash checked, and oj/muse's runner gives its verification run a copy. With
a git workspace, the task's branch is pushed to a bare repository standing in for the remote, or
bundled among the task's files.
"""

import hashlib
import os
import subprocess

import httpx

import prickle
from conftest import MCP, REFERENCE_TOOLS, Served, audit_entries
from helpers import cli_json
from runner_util import STANDIN_AGENT, RunnerProcess, all_logs, person, task_state, wait_until, write_config

PROJECT = "website-v2"
POLICY = b"# Refund policy\n\nRefunds within **30 days**, no questions asked.\n"
DIGEST = hashlib.sha256(POLICY).hexdigest()


def hand(mcp, mode: str) -> str:
    """oj/muse hands ren/builder a task the stand-in works in ``mode``."""
    packet = REFERENCE_TOOLS["handoff"]["example_input"]["packet"] | {"task": "Write the refund policy.",
                                                                       "context": f"standin: {mode}"}
    out = mcp.ok("oj/muse", "handoff", {"project": PROJECT, "to": "ren/builder", "packet": packet})
    assert out["task"]["state"] == "routed"
    return out["task"]["id"]


def runners(db_path, served, tmp_path, **ren_agent):
    """ren/builder's and oj/muse's runner configs (the stand-in), oj's handoffs let through, oj's token."""
    base = served.info["url"]
    ren_key = cli_json(db_path, "device", "pair", "ren/builder", "--name", "ren-laptop")["token"]
    oj_key = cli_json(db_path, "device", "pair", "oj/muse", "--name", "oj-desk")["token"]
    cli_json(db_path, "rule", "set", "ren", "--decision", "allow", "--from-owner", "oj")
    (tmp_path / "ren").mkdir(), (tmp_path / "oj").mkdir()
    ren = write_config(tmp_path / "ren" / "runner.toml", base, {
        "ren/builder": {"key": ren_key, "client": "command", "command": STANDIN_AGENT} | ren_agent})
    oj = write_config(tmp_path / "oj" / "runner.toml", base, {
        "oj/muse": {"key": oj_key, "client": "command", "command": STANDIN_AGENT}})
    return ren, oj, cli_json(db_path, "token", "create", "--person", "oj")["token"]


def git(*args, cwd=None) -> str:
    done = subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.org", *args], cwd=cwd,
                          capture_output=True, text=True, check=True)
    return done.stdout.strip()


def test_a_file_the_result_names_is_uploaded_downloaded_and_given_to_the_verification_run(db_path, tmp_path):
    with Served(db_path, "--demo") as served:
        base = served.info["url"]
        ren_config, oj_config, oj_token = runners(db_path, served, tmp_path)
        with RunnerProcess(ren_config) as ren_runner, RunnerProcess(oj_config) as oj_runner, \
                person(base, oj_token) as oj, httpx.Client(base_url=base, timeout=60) as http:
            ren_runner.wait_connected("ren/builder"), oj_runner.wait_connected("oj/muse")
            task_id = hand(MCP(http, {"oj/muse": served.info["demo"]["keys"]["oj/muse"]}), "deliver")
            task = wait_until("the verified result", lambda: (t := task_state(oj, task_id))["state"] == "approval"
                              and t, timeout=120)
            assert task["result"]["artifacts"] == [{"ref": "refund-policy.md", "sha256": DIGEST, "commit_sha": None}]
            # The first return named a wrong hash: the runner's upload was refused and the run told why.
            logs = all_logs(ren_runner.state_dir)
            assert (f"stand-in: first return: invalid_input: artifacts[0]: refund-policy.md was not delivered: "
                    f"its {len(POLICY)} bytes hash to {DIGEST}, not the sha256 {'0' * 64} the result names; fix it "
                    "and call return_result again") in logs
            assert f"uploaded refund-policy.md ({len(POLICY)} bytes)" in ren_runner.log()
            # The requester's person opens it from the task page, its hash checked.
            [delivered] = oj.get(f"/api/tasks/{task_id}").json()["deliverables"]
            assert (delivered["ref"], delivered["content_type"], delivered["preview"]) == (
                "refund-policy.md", "text/markdown", True)
            r = oj.get(delivered["url"])
            assert hashlib.sha256(r.content).hexdigest() == DIGEST == r.headers["x-content-sha256"]
            # The verification run found it in its own workspace, checked against the result's sha256.
            copy = oj_runner.state_dir / "workspaces" / f"verify-{task_id}" / "refund-policy.md"
            assert copy.read_bytes() == POLICY
            assert "stand-in: verified the file refund-policy.md: sha256 ok" in all_logs(oj_runner.state_dir)
            prompt = next((oj_runner.state_dir / "runs").rglob("prompt.txt")).read_text()
            assert ("The result's files are in the current directory, each checked against its sha256:\n"
                    f"  refund-policy.md ({len(POLICY)} bytes, sha256 {DIGEST})") in prompt
        db = prickle.Database(db_path)
        assert [e["refs"]["sha256"] for e in audit_entries(db, PROJECT, "deliverable.uploaded")] == [DIGEST]
        db.close()


def test_a_commit_is_pushed_to_the_remote_when_the_config_says_push(db_path, tmp_path):
    remote = tmp_path / "remote.git"
    git("init", "-q", "--bare", "-b", "main", str(remote))
    repo = tmp_path / "website"
    git("clone", "-q", str(remote), str(repo))
    git("commit", "-q", "--allow-empty", "-m", "start", cwd=repo)
    git("push", "-q", "origin", "HEAD:main", cwd=repo)
    with Served(db_path, "--demo") as served:
        base = served.info["url"]
        ren_config, _, oj_token = runners(db_path, served, tmp_path, repo=str(repo), push=True)
        with RunnerProcess(ren_config) as ren_runner, person(base, oj_token) as oj, \
                httpx.Client(base_url=base, timeout=60) as http:
            ren_runner.wait_connected("ren/builder")
            task_id = hand(MCP(http, {"oj/muse": served.info["demo"]["keys"]["oj/muse"]}), "commit")
            task = wait_until("the result", lambda: (t := task_state(oj, task_id))["state"] == "verifying" and t,
                              timeout=120)
            [artifact] = task["result"]["artifacts"]
            assert artifact["ref"] == f"prickle/{task_id}"
            # The requester can fetch the commit the result names from the team's remote.
            assert git("rev-parse", f"prickle/{task_id}", cwd=remote) == artifact["commit_sha"]
            assert git("show", f"{artifact['commit_sha']}:refund-policy.md", cwd=remote) == POLICY.decode().strip()
            assert f"commit {artifact['commit_sha'][:12]} pushed to origin prickle/{task_id}" in ren_runner.log()
            assert oj.get(f"/api/tasks/{task_id}").json()["deliverables"] == []


def test_without_push_the_tasks_commits_go_as_a_git_bundle_among_its_files(db_path, tmp_path):
    repo = tmp_path / "website"
    git("init", "-q", "-b", "main", str(repo))
    git("commit", "-q", "--allow-empty", "-m", "start", cwd=repo)
    with Served(db_path, "--demo") as served:
        base = served.info["url"]
        ren_config, _, oj_token = runners(db_path, served, tmp_path, repo=str(repo))
        with RunnerProcess(ren_config) as ren_runner, person(base, oj_token) as oj, \
                httpx.Client(base_url=base, timeout=60) as http:
            ren_runner.wait_connected("ren/builder")
            task_id = hand(MCP(http, {"oj/muse": served.info["demo"]["keys"]["oj/muse"]}), "commit")
            task = wait_until("the result", lambda: (t := task_state(oj, task_id))["state"] == "verifying" and t,
                              timeout=120)
            sha = task["result"]["artifacts"][0]["commit_sha"]
            [bundle] = oj.get(f"/api/tasks/{task_id}").json()["deliverables"]
            assert (bundle["ref"], bundle["content_type"], bundle["preview"]) == (
                f"prickle-{task_id}.bundle", "application/octet-stream", False)
            r = oj.get(bundle["url"])
            assert r.headers["content-disposition"] == f"attachment; filename*=UTF-8''prickle-{task_id}.bundle"
            path = tmp_path / "got.bundle"
            path.write_bytes(r.content)
        # The requester, with the repository at main, fetches the task's branch from the bundle.
        mine = tmp_path / "mine"
        git("clone", "-q", str(repo), str(mine))
        git("fetch", "-q", str(path), f"prickle/{task_id}:review", cwd=mine)
        assert git("rev-parse", "review", cwd=mine) == sha
        assert (mine / "refund-policy.md").exists() is False and git("show", "review:refund-policy.md", cwd=mine) == \
            POLICY.decode().strip()


def test_the_runner_never_reads_a_file_outside_the_workspace(tmp_path):
    workspace = tmp_path / "ws"
    (workspace / "docs").mkdir(parents=True)
    (workspace / "docs" / "ok.md").write_text("fine")
    (tmp_path / "secret.txt").write_text("not yours")
    os.symlink(tmp_path / "secret.txt", workspace / "leak.md")
    os.symlink(tmp_path, workspace / "up")
    assert prickle.workspace_file(str(workspace), "docs/ok.md") == (str((workspace / "docs" / "ok.md").resolve()),
                                                                      None)
    assert prickle.workspace_file(str(workspace), "leak.md") == (
        None, "leak.md leads outside the workspace (a symbolic link); deliver the file itself")
    assert prickle.workspace_file(str(workspace), "up/secret.txt")[1].startswith("up/secret.txt leads outside")
    assert prickle.workspace_file(str(workspace), "../secret.txt") == (
        None, "'../secret.txt' is not a path inside the workspace")
    assert prickle.workspace_file(str(workspace), str(tmp_path / "secret.txt"))[1].endswith(
        "is not a path inside the workspace")
    assert prickle.workspace_file(str(workspace), "docs/none.md") == (None, "there is no file docs/none.md in the workspace")
