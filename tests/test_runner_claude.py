"""Real Claude Code launched by ``prickle runner``, its model played by tests/model_standin.py.

Claude Code's own MCP client reaches Prickle with the run's execution credential (from
the environment, through the MCP config file), and its permission prompt goes through
``prickle runner bridge`` to request_step, so a step waits for the owner's decision.
Skips when the Claude Code package is not installed (``.ci/run`` installs it).
"""

import base64
import io
import json
import re
import threading

import httpx
import pytest
from PIL import Image

from conftest import MCP, Served, audit_entries
from model_standin import ModelStandIn
from runner_util import (CLAUDE, CLAUDE_MISSING, SECRET_PREFIXES, RunnerProcess, all_logs, claude_env, person, task_state,
                         wait_until, write_config)

import prickle

PROJECT = "website-v2"
pytestmark = pytest.mark.skipif(not CLAUDE, reason=CLAUDE_MISSING)


def test_claude_code_run_accepts_checkpoints_asks_a_step_the_owner_allows_and_returns(db_path, tmp_path):
    allowed = threading.Event()
    publish = {"command": "echo published > published.txt", "description": "Publish the copy"}

    def wait_for_owner(seen):
        assert "Prickle could not be asked" not in seen.results[-1], seen.results[-1]
        assert allowed.wait(60), "the owner never decided"
        return ("Bash", publish)

    def result(seen):
        task_id = seen.find(r"Prickle task (\S+) ")
        return ("mcp__prickle__return_result", {"task_id": task_id, "summary": "Published the hero copy.",
                "evidence": [{"kind": "note", "summary": "Six words.", "criteria": [0]},
                             {"kind": "note", "summary": "CTA: try the demo.", "criteria": [1]}]})

    script = [
        lambda seen: ("mcp__prickle__accept_task", {"task_id": seen.find(r"Prickle task (\S+) ")}),
        lambda seen: ("mcp__prickle__checkpoint", {"task_id": seen.find(r"Prickle task (\S+) "),
                                                    "checkpoint": {"progress": "Drafted; publishing next."}}),
        lambda seen: ("Bash", publish),
        wait_for_owner,
        result,
        lambda seen: "Returned the result.",
    ]
    with Served(db_path, "--demo") as served, ModelStandIn(script) as model:
        base, db = served.info["url"], prickle.Database(db_path)
        _, key = prickle.pair_device(db, "oj", "oj/muse", "oj-laptop")
        prickle.set_rule(db, "oj", "allow", from_owner="ren")
        oj = person(base, prickle.create_token(db, "person", person="oj")[1])
        ren = person(base, prickle.create_token(db, "person", person="ren")[1])
        builder = MCP(httpx.Client(base_url=base), {"ren/builder": served.info["demo"]["keys"]["ren/builder"]})
        config = write_config(tmp_path / "runner.toml", base, {
            "oj/muse": {"key": key, "client": "claude", "cli_path": CLAUDE, "launch_timeout_minutes": 5}})
        with RunnerProcess(config, env=claude_env(tmp_path / "home", model.url)) as runner:
            runner.wait_connected("oj/muse")
            handed = builder.ok("ren/builder", "handoff", {"project": PROJECT, "to": "oj/muse", "packet": {
                "task": "Draft the hero copy.", "deliverable_type": "doc",
                "acceptance_criteria": ["Headline has at most 8 words.", "Include a clear call to action."]}})
            task_id = handed["task"]["id"]
            steps = wait_until("the run's step", lambda: oj.get("/api/steps").json()["steps"])
            assert [(s["tool_name"], s["input"], s["task_id"]) for s in steps] == [("Bash", publish, task_id)]
            assert task_state(oj, task_id)["state"] == "working"
            assert oj.post(f"/api/steps/{steps[0]['id']}", json={"decision": "allow"}).status_code == 200
            allowed.set()
            task = wait_until("the result", lambda: (t := task_state(ren, task_id))["state"] == "verifying" and t,
                              timeout=60)
            wait_until("the run to end", lambda: "the task is verifying" in runner.log())
            # oj's decision woke the agent while its run went on: one run per task, no second launch.
            assert f"task {task_id} already has a run" in runner.log()
            workspace = runner.state_dir / "workspaces" / task_id
            assert (workspace / "published.txt").read_text() == "published\n"  # the allowed step ran, in its workspace
        sub = task["result"]
        assert sub["lineage"]["cause"]["kind"] == "task"
        accepted = builder.ok("ren/builder", "accept_result", {
            "task_id": task_id, "submission_id": sub["submission_id"], "revision": sub["revision"],
            "verdicts": [{"criterion": 0, "accepted": True}, {"criterion": 1, "accepted": True}],
            "artifacts": sub["artifacts"]})
        assert accepted["task"]["state"] == "approval"
        assert ren.post(f"/api/tasks/{task_id}/accept", json={}).json()["task"]["state"] == "completed"
        # The step was asked once, allowed by oj, and used once by the retried call.
        types = [e["type"] for e in audit_entries(db, PROJECT) if e["type"].startswith("step.")]
        assert types == ["step.requested", "step.decided", "step.consumed"]
        checkpoints = oj.get(f"/api/tasks/{task_id}").json()["checkpoints"]
        assert [c["checkpoint"]["progress"] if "checkpoint" in c else c["progress"] for c in checkpoints] == \
            ["Drafted; publishing next."]
        assert [a for a in model.calls if not isinstance(a, str)][0][0] == "mcp__prickle__accept_task"
        logs = all_logs(runner.state_dir)
        assert '"subtype":"success"' in logs.replace(" ", "") and not any(p in logs for p in SECRET_PREFIXES)
        mcp_config = json.loads((runner.state_dir / "runs").glob("*/mcp.json").__next__().read_text())
        assert mcp_config["mcpServers"]["prickle_bridge"]["args"] == ["-P", "-m", "prickle", "runner", "bridge"]
        oj.close(), ren.close(), builder.client.close(), db.close()



def png(width: int, height: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), (200, 30, 30)).save(out, "PNG")
    return out.getvalue()


def test_claude_code_in_a_private_room_reads_the_owners_image_as_an_mcp_resource(db_path, tmp_path):
    """The owner posts an image; the woken session reads it over MCP and the model is sent the image.

    Claude Code's ReadMcpResourceTool does not hand a resource's blob to the model: it saves the bytes to a
    file under its own folder and answers with that path (``blobSavedTo``). Its Read tool then sends the
    file as an image block, so the image reaches the model in two calls, both Claude Code's own.
    """
    image = png(40, 30)
    seen_by_model = {}

    def read_resource(seen):
        uri = re.search(r"(prickle://attachments/[A-Za-z0-9_-]+)", seen.prompt).group(1)
        return ("ReadMcpResourceTool", {"server": "prickle", "uri": uri})

    def read_saved_file(seen):
        seen_by_model["resource"] = json.loads(seen.results[-1])
        return ("Read", {"file_path": seen_by_model["resource"]["contents"][0]["blobSavedTo"]})

    script = [
        read_resource,
        read_saved_file,
        lambda seen: ("mcp__prickle__post_message", {"project": seen.find(r"private Prickle room (\S+) "),
                                                     "body": "A red rectangle, 40 by 30.", "verdict": "draft"}),
        lambda seen: "Posted.",
    ]
    with Served(db_path, "--demo") as served, ModelStandIn(script) as model:
        base, db = served.info["url"], prickle.Database(db_path)
        _, key = prickle.pair_device(db, "oj", "oj/muse", "oj-laptop")
        oj = person(base, prickle.create_token(db, "person", person="oj")[1])
        room = oj.get("/api/room").json()["room"]["project"]
        assert oj.post("/api/room", json={"reply_mode": "solo", "lead": "oj/muse"}).status_code == 200
        config = write_config(tmp_path / "runner.toml", base, {
            "oj/muse": {"key": key, "client": "claude", "cli_path": CLAUDE, "launch_timeout_minutes": 5}})
        with RunnerProcess(config, env=claude_env(tmp_path / "home", model.url)) as runner:
            runner.wait_connected("oj/muse")
            attachment = oj.post(f"/api/projects/{room}/attachments", content=image).json()["attachment"]
            asked = oj.post(f"/api/projects/{room}/messages", json={
                "body": "What is in this picture?", "attachments": [attachment["id"]]}).json()["message"]
            reply = wait_until("the reply", lambda: (m := oj.get(f"/api/projects/{room}/room").json()["messages"])[1:]
                               and m[1], timeout=120)
            wait_until("the session to end", lambda: "ended: exited" in runner.log())
        uri = f"prickle://attachments/{attachment['id']}"
        # The runner's prompt names the attachment and how to read it.
        prompt = "".join(b["text"] for b in model.bodies[0]["messages"][0]["content"] if b["type"] == "text")
        assert f"  - 40x30 image (image/png, {len(image)} bytes): {uri}" in prompt
        assert [c[0] for c in model.calls[:3]] == ["ReadMcpResourceTool", "Read", "mcp__prickle__post_message"]
        # ReadMcpResourceTool answered with where it saved the bytes, not the image itself...
        [saved] = seen_by_model["resource"]["contents"]
        assert (saved["uri"], saved["mimeType"], saved["blobSavedTo"].endswith(".png")) == (uri, "image/png", True)
        assert f"Binary content (image/png, {len(image)} bytes) saved to {saved['blobSavedTo']}" in saved["text"]
        # ...and the next request, after Read, carries the uploaded bytes as an image block.
        last = model.bodies[2]["messages"][-1]["content"]
        [result] = [b for b in last if b.get("type") == "tool_result"]
        assert result["content"] == [{"type": "image", "source": {
            "type": "base64", "media_type": "image/png", "data": base64.b64encode(image).decode()}}]
        assert (reply["author"]["agent_id"], reply["body"], reply["verdict"]) == (
            "oj/muse", "A red rectangle, 40 by 30.", "draft")
        [read] = audit_entries(db, room, "attachment.read")
        assert read["refs"] == {"message": asked["id"], "attachment": attachment["id"], "agent": "oj/muse",
                                "content_type": "image/png", "byte_size": len(image)}
        oj.close(), db.close()


def test_claude_code_sessions_of_two_runners_draft_and_one_combines_the_drafts(db_path, tmp_path):
    """Two runners' Claude Code sessions draft a named turn; the lead's third session gets both drafts in its
    prompt (role combine) and posts the one combined answer."""
    def answer(seen):
        drafts = re.findall(r"^Draft \d+ of \d+, by (\S+):$", seen.prompt, flags=re.M)
        body = f"Combined {len(drafts)} drafts: {', '.join(drafts)}." if "(role: combine)" in seen.prompt else \
            "Work, together."
        return ("mcp__prickle__post_message", {"project": seen.find(r"private Prickle room (\S+) "), "body": body,
                                               "verdict": "draft"})

    with Served(db_path, "--demo") as served, ModelStandIn([answer, lambda seen: "Posted."]) as model:
        base, db = served.info["url"], prickle.Database(db_path)
        prickle.add_agent(db, "oj/scout", "Scout", "claude-sonnet", "claude-code")
        keys = {a: prickle.pair_device(db, "oj", a, "oj-laptop")[1] for a in ("oj/muse", "oj/scout")}
        oj = person(base, prickle.create_token(db, "person", person="oj")[1])
        room = oj.get("/api/room").json()["room"]["project"]
        assert oj.post("/api/room", json={"reply_mode": "named", "lead": "oj/muse"}).status_code == 200
        configs = {a: write_config(tmp_path / f"{a.split('/')[1]}.toml", base, {
            a: {"key": keys[a], "client": "claude", "cli_path": CLAUDE, "launch_timeout_minutes": 5}}) for a in keys}
        with RunnerProcess(configs["oj/muse"], env=claude_env(tmp_path / "muse-home", model.url)) as muse, \
                RunnerProcess(configs["oj/scout"], env=claude_env(tmp_path / "scout-home", model.url)) as scout:
            muse.wait_connected("oj/muse"), scout.wait_connected("oj/scout")
            oj.post(f"/api/projects/{room}/messages", json={"body": "@muse and @scout: a headline?"})
            wait_until("the combined answer", lambda: oj.get("/api/room").json()["turn"] is None
                       and len(oj.get(f"/api/projects/{room}/room").json()["messages"]) == 4, timeout=240)
            wait_until("the sessions to end", lambda: muse.log().count("ended: exited") == 2)
        messages = oj.get(f"/api/projects/{room}/room").json()["messages"]
        drafters = [m["author"]["agent_id"] for m in messages[1:3]]
        assert sorted(drafters) == ["oj/muse", "oj/scout"]
        assert [(m["author"]["agent_id"], m["body"], m["verdict"]) for m in messages[3:]] == [
            ("oj/muse", f"Combined 2 drafts: {', '.join(drafters)}.", "draft")]
        assert f"room {room}: combine session for message {messages[2]['id']}" in muse.log()
        roles = db.rows("SELECT agent_id, role FROM discussions ORDER BY agent_id, role")
        assert [(r["agent_id"], r["role"]) for r in roles] == [
            ("oj/muse", "combine"), ("oj/muse", "draft"), ("oj/scout", "draft")]
        assert not any(p in all_logs(muse.state_dir) + all_logs(scout.state_dir) for p in SECRET_PREFIXES)
        oj.close(), db.close()
