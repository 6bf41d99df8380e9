"""A stand-in agent CLI for ``client = "command"`` runner tests: it works its task over MCP.

The runner starts it with the run's credential in ``PRICKLE_RUN_KEY`` (never argv) and
Prickle's address in ``PRICKLE_MCP_URL``. What it does is read from its task's packet
context (``standin: MODE``): ``ok`` (accept, checkpoint, return a result with evidence
for each criterion), ``sleep`` (accept, then wait to be stopped), ``quiet`` (accept and
exit without a result), ``step`` (accept, ask a step with request_step and exit while it waits for
the owner), ``crash`` (exit 3), ``deliver`` (write refund-policy.md, return it first under a wrong
sha256, then fixed), ``commit`` (commit refund-policy.md on the task's branch and return the commit).
A verification run (``PRICKLE_ROLE`` verify) checks every file its prompt says is in its workspace
against the result's sha256, then accepts the result of the task its agent asked for. In a private room (``PRICKLE_ROLE`` draft,
review, revise or combine) it posts its one reply with a verdict (a combined answer names the drafts its
prompt gave it; a reviewer waits first for the file ``STANDIN_HOLD`` names, when set).
"""

import asyncio
import hashlib
import json
import os
import subprocess
import sys
import time

from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client


async def call(c, tool, args):
    r = await c.call_tool(tool, args)
    if r.is_error:
        raise SystemExit(f"{tool} failed: {r.content[0].text}")
    return r.structured_content


async def main() -> None:
    key, url = os.environ["PRICKLE_RUN_KEY"], os.environ["PRICKLE_MCP_URL"]
    role, project = os.environ["PRICKLE_ROLE"], os.environ["PRICKLE_PROJECT"]
    prompt = open(sys.argv[1]).read()
    print(f"stand-in: role {role}, argv {sys.argv[1:]}, cwd {os.getcwd()}", flush=True)
    async with create_mcp_http_client(headers={"Authorization": f"Bearer {key}"}) as http:
        async with Client(streamable_http_client(url, http_client=http), mode="2026-07-28") as c:
            if role == "verify":  # a verification run: accept what came back, criterion by criterion
                task = (await call(c, "check_inbox", {}))["requested"][0]
                result = task["result"]
                for a in result["artifacts"]:
                    if a.get("sha256") and "in the current directory" in prompt:
                        with open(a["ref"], "rb") as f:
                            same = hashlib.sha256(f.read()).hexdigest() == a["sha256"]
                        print(f"stand-in: verified the file {a['ref']}: sha256 {'ok' if same else 'WRONG'}", flush=True)
                await call(c, "accept_result", {
                    "task_id": task["id"], "submission_id": result["submission_id"], "revision": result["revision"],
                    "artifacts": result["artifacts"], "verdicts": [
                        {"criterion": i, "accepted": True} for i in range(len(task["packet"]["acceptance_criteria"]))]})
                print(f"stand-in: verified {task['id']}", flush=True)
                return
            if role != "task":
                verdict = {"review": "approve"}.get(role, "draft")
                body = {"draft": "Work, together.", "revise": "Prickle: work, together."}.get(role, "")
                if role == "combine":  # says which drafts its prompt gave it
                    by = [line.split(", by ")[1].rstrip(":") for line in prompt.splitlines()
                          if line.startswith("Draft ") and ", by " in line]
                    body = f"Combined {len(by)} drafts: {', '.join(by)}."
                hold = os.environ.get("STANDIN_HOLD")
                while role == "review" and hold and not os.path.exists(hold):  # a reviewer that takes its time
                    time.sleep(0.05)
                posted = await call(c, "post_message", {"project": project, "body": body, "verdict": verdict})
                print(f"stand-in: posted {posted['message']['id']} ({verdict})", flush=True)
                return
            task_id = os.environ["PRICKLE_TASK_ID"]
            task = (await call(c, "check_inbox", {}))["assigned"][0]
            mode = task["packet"].get("context", "").partition("standin: ")[2].split()[0] or "ok"
            if mode == "crash":
                raise SystemExit(3)
            if task["state"] == "routed":  # a run resumed after an earlier one finds it accepted
                await call(c, "accept_task", {"task_id": task_id})
            with open("work.txt", "w") as f:  # in the workspace the runner made
                f.write(prompt)
            print(f"stand-in: accepted {task_id}, mode {mode}", flush=True)
            if mode == "sleep":
                await call(c, "checkpoint", {"task_id": task_id, "checkpoint": {"progress": "Sleeping."}})
                time.sleep(600)
            if mode == "quiet":
                return
            if mode in ("step", "stepwait"):
                asked = await call(c, "request_step", {"tool_name": "Bash", "input": {"command": "make publish"},
                                                       "reason": "Publish the copy.", "tool_use_id": "publish-1"})
                print(f"stand-in: step {asked['status']}", flush=True)
                if mode == "step" or asked["behavior"] != "allow":
                    if mode == "stepwait":  # hold the run until the test says (a file it names appears)
                        go = task["packet"]["context"].split()[2]
                        while not os.path.exists(go):
                            time.sleep(0.05)
                    return
            await call(c, "checkpoint", {"task_id": task_id, "checkpoint": {"progress": "Drafted."}})
            criteria = task["packet"]["acceptance_criteria"]
            if mode in ("deliver", "commit"):
                policy = b"# Refund policy\n\nRefunds within **30 days**, no questions asked.\n"
                with open("refund-policy.md", "wb") as f:
                    f.write(policy)
                digest = hashlib.sha256(policy).hexdigest()
                if mode == "commit":
                    git = ["git", "-c", "user.name=stand-in", "-c", "user.email=standin@example.org"]
                    subprocess.run(git + ["add", "refund-policy.md"], check=True)
                    subprocess.run(git + ["commit", "-q", "-m", "The refund policy"], check=True)
                    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
                    artifacts = [{"ref": f"prickle/{task_id}", "commit_sha": head}]
                else:
                    artifacts = [{"ref": "refund-policy.md", "sha256": digest}]
                    wrong = await c.call_tool("return_result", {
                        "task_id": task_id, "summary": "The refund policy.", "artifacts": [
                            {"ref": "refund-policy.md", "sha256": "0" * 64}], "evidence": [
                            {"kind": "note", "summary": "The policy.", "criteria": list(range(len(criteria)))}]})
                    print(f"stand-in: first return: {wrong.content[0].text}", flush=True)
                out = await call(c, "return_result", {
                    "task_id": task_id, "summary": "The refund policy, written.", "artifacts": artifacts,
                    "evidence": [{"kind": "note", "summary": "The policy as delivered.", "artifact": 0,
                                  "criteria": list(range(len(criteria)))}]})
                print(json.dumps({"returned": task_id, "state": out["task"]["state"]}), flush=True)
                return
            await call(c, "return_result", {"task_id": task_id, "summary": "Done by the stand-in.", "evidence": [
                {"kind": "note", "summary": f"Shows: {text}", "criteria": [i]} for i, text in enumerate(criteria)]})
            print(json.dumps({"returned": task_id}), flush=True)


asyncio.run(main())
