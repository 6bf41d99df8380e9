"""End to end, tasks: two agents of different owners, a real ``prickle serve`` and the MCP SDK client.

A hands a two-criterion task to B → held for B's owner → approved over HTTP → B wakes,
accepts, checkpoints, returns tagged evidence → A wakes, rejects once, B resubmits → A
verifies → A's owner gives final acceptance → completed. The same run covers a ``never``
refusal, a stale ``accept_result`` and ``request_capability`` choosing between two agents.
"""

import asyncio
import json

import httpx

from conftest import PRICKLE, REFERENCE_TOOLS, Served
from helpers import call, cli_json, client

PROJECT = "website-v2"


def api(base, token):
    return httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=30)


async def until(c, tool, args, want):
    """Wait (wait_for_updates/wait_for_mention) until a result matching ``want`` arrives; return it."""
    for _ in range(10):
        out = await call(c, tool, args)
        args = args | {"cursor": out["cursor"]}
        if want(out):
            return out, args
    raise AssertionError(f"{tool} never returned what was expected")


def where(http, task_id):
    """Where the page is told the task stands (GET /api/tasks/ID's page fields)."""
    task = http.get(f"/api/tasks/{task_id}").json()["task"]
    return task["lifecycle"], task["awaiting_final"], task["final_by"]


def test_a_task_from_handoff_to_completed(db_path):
    with Served(db_path, "--demo") as served:
        url, base = served.info["mcp"], served.info["url"]
        keys = served.info["demo"]["keys"]
        oj = api(base, cli_json(db_path, "token", "create", "--person", "oj")["token"])
        ren = api(base, cli_json(db_path, "token", "create", "--person", "ren")["token"])
        for name in ("docs", "editor"):
            cli_json(db_path, "agent", "add", f"ren/{name}", "--name", name.title(), "--model", "m", "--client",
                     "codex", "--capability", "other:Docs", "--project", PROJECT)

        async def scenario():
            async with client(url, keys["oj/muse"]) as a, client(url, keys["ren/builder"], mode="legacy") as b:
                b_wait = {"project": PROJECT, "timeout_seconds": 20}
                a_wait = {"project": PROJECT, "timeout_seconds": 20}
                b_wait["cursor"] = (await call(b, "wait_for_mention", b_wait | {"timeout_seconds": 1}))["cursor"]
                a_wait["cursor"] = (await call(a, "wait_for_updates", a_wait | {"timeout_seconds": 1}))["cursor"]

                example = REFERENCE_TOOLS["handoff"]["example_input"] | {"to": "ren/builder"}
                held = await call(a, "handoff", example)
                task_id = held["task"]["id"]
                assert held["task"]["state"] == "approval" and held["gate"]["decision"] == "approval_required"
                assert where(ren, task_id) == ("approval_gate", False, "oj")

                waiting = asyncio.create_task(until(b, "wait_for_mention", b_wait,
                                                    lambda o: o["status"] == "events"))
                await asyncio.sleep(0.3)
                approvals = ren.get("/api/approvals").json()["approvals"]
                assert [x["task"]["id"] for x in approvals] == [task_id]
                r = ren.post(f"/api/approvals/{held['gate']['approval_id']}", json={"decision": "approve"})
                assert r.status_code == 200 and r.json()["task"]["state"] == "routed"
                woke, b_wait = await asyncio.wait_for(waiting, 30)
                assert woke["events"][0]["kind"] == "task" and woke["events"][0]["task"]["id"] == task_id

                await call(b, "accept_task", {"task_id": task_id})
                cp = await call(b, "checkpoint", REFERENCE_TOOLS["checkpoint"]["example_input"] | {"task_id": task_id})
                assert cp["task"]["state"] == "working"
                evidence = [{"kind": "note", "summary": "Headline has 6 words.", "criteria": [0]},
                            {"kind": "note", "summary": "CTA asks to try the demo.", "criteria": [1]}]
                first = await call(b, "return_result", {"task_id": task_id, "summary": "Drafted.",
                                                        "evidence": evidence})
                assert first["task"]["result"]["evidence_report"]["complete"] is True
                assert where(oj, task_id) == ("verifying_by_agent", False, "oj")

                got, a_wait = await until(a, "wait_for_updates", a_wait,
                                          lambda o: any(u["kind"] == "result" for u in o["updates"]))
                inbox = await call(a, "check_inbox", {"project": PROJECT, "include_closed": True})
                result = next(t for t in inbox["requested"] if t["id"] == task_id)["result"]
                rejected = await call(a, "reject_result", {"task_id": task_id, "submission_id": result["submission_id"],
                                                           "revision": result["revision"],
                                                           "reason": "The headline has 11 words; the limit is 8."})
                assert rejected["task"]["state"] == "working"

                second = await call(b, "return_result", {"task_id": task_id, "summary": "Shorter now.",
                                                         "evidence": evidence})
                sub = second["submission"]
                verdicts = [{"criterion": 0, "accepted": True}, {"criterion": 1, "accepted": True}]
                stale = await a.call_tool("accept_result", {"task_id": task_id, "submission_id": result["submission_id"],
                                                            "revision": 1, "verdicts": verdicts, "artifacts": []})
                assert stale.is_error and stale.content[0].text.startswith("stale_submission: ")
                verified = await call(a, "accept_result", {"task_id": task_id, "submission_id": sub["submission_id"],
                                                           "revision": sub["revision"], "verdicts": verdicts,
                                                           "artifacts": sub["artifacts"]})
                assert verified["task"]["state"] == "approval"
                assert where(oj, task_id) == ("approval_final", True, "oj")
                board = oj.get(f"/api/projects/{PROJECT}/tasks").json()["tasks"]
                assert next(t for t in board if t["id"] == task_id)["lifecycle"] == "approval_final"
                done = oj.post(f"/api/tasks/{task_id}/accept")
                assert done.status_code == 200 and done.json()["task"]["state"] == "completed"
                assert where(ren, task_id) == ("completed", False, "oj")
                got, a_wait = await until(a, "wait_for_updates", a_wait,
                                          lambda o: any(u["kind"] == "decision" for u in o["updates"]))
                final = await call(a, "check_inbox", {"project": PROJECT, "include_closed": True})
                assert next(t for t in final["requested"] if t["id"] == task_id)["state"] == "completed"

                # a refusal is a normal result
                ren.post("/api/rules", json={"decision": "never", "agent": "oj/muse"})
                refused = await call(a, "handoff", example)
                assert refused["gate"]["decision"] == "never" and refused["task"]["state"] == "rejected"

                # request_capability with two agents listing the capability
                ask = REFERENCE_TOOLS["request_capability"]["example_input"]
                ren.post("/api/rules", json={"decision": "allow", "agent": "oj/muse"})
                chose = await call(a, "request_capability", ask)
                assert chose["status"] == "choose"
                assert [(c["agent_id"], c["permission"]) for c in chose["candidates"]] == [
                    ("ren/docs", "allow"), ("ren/editor", "allow")]
                picked = await call(a, "request_capability", ask | {"prefer": {"agent": "ren/docs"}})
                assert picked["status"] == "handed_off" and picked["task"]["assignee"] == "ren/docs"

        asyncio.run(scenario())
        oj.close()
        ren.close()
        audit = json.loads(__import__("subprocess").run(
            [*PRICKLE, "audit", "verify", "--db", db_path, "--json"],
            capture_output=True, text=True).stdout)
        assert audit["ok"] is True
