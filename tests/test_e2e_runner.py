"""End to end, runners: a small runner written here with the MCP SDK client, against a real server.

The runner pairs (``prickle device pair``), waits for its agent's wakes, claims a routed
task, works with the execution credential only, asks a step that the owner allows over
HTTP, uses it once and returns a result; a retried claim revokes the first credential.
A second test runs a private-room turn: the owner's message, a draft, a review asking
for changes, a revision.
"""

import asyncio

import httpx

from conftest import REFERENCE_TOOLS, Served
from helpers import call, cli_json, client

PROJECT = "website-v2"


async def wait_for(c, args, want):
    for _ in range(10):
        out = await call(c, "wait_for_mention", args)
        args = args | {"cursor": out["cursor"]}
        found = [e for e in out["events"] if want(e)]
        if found:
            return found[0], args
    raise AssertionError("the runner was never woken")


def test_a_runner_claims_works_asks_a_step_and_returns(db_path):
    with Served(db_path, "--demo") as served:
        url, base = served.info["mcp"], served.info["url"]
        runner_key = cli_json(db_path, "device", "pair", "ren/builder", "--name", "ren-laptop")["token"]
        cli_json(db_path, "rule", "set", "ren", "--decision", "allow", "--from-owner", "oj")
        ren = httpx.Client(base_url=base, timeout=30, headers={
            "Authorization": f"Bearer {cli_json(db_path, 'token', 'create', '--person', 'ren')['token']}"})

        async def scenario():
            async with client(url, served.info["demo"]["keys"]["oj/muse"]) as a, client(url, runner_key) as runner:
                listen = {"project": PROJECT, "timeout_seconds": 20}
                listen["cursor"] = (await call(runner, "wait_for_mention", listen | {"timeout_seconds": 1}))["cursor"]
                waiting = asyncio.create_task(wait_for(runner, listen, lambda e: e["kind"] == "task"))
                await asyncio.sleep(0.3)
                handed = await call(a, "handoff", REFERENCE_TOOLS["handoff"]["example_input"] | {"to": "ren/builder"})
                task_id = handed["task"]["id"]
                event, listen = await asyncio.wait_for(waiting, 30)
                assert event["task"]["id"] == task_id and event["task"]["state"] == "routed"

                first = await call(runner, "claim_task", {"task_id": task_id, "idempotency_key": "run-1"})
                second = await call(runner, "claim_task", {"task_id": task_id, "idempotency_key": "run-1"})
                assert second["attempt"] == first["attempt"]
                old = httpx.post(url, json={}, headers={
                    "Authorization": f"Bearer {first['execution_credential']['token']}"})
                assert old.status_code == 401  # the retried claim revoked the first credential

                async with client(url, second["execution_credential"]["token"]) as run:
                    refused = await run.call_tool("handoff", REFERENCE_TOOLS["handoff"]["example_input"])
                    assert refused.is_error and refused.content[0].text.startswith("forbidden: ")
                    await call(run, "accept_task", {"task_id": task_id})
                    thread = await call(run, "read_room", {"project": PROJECT, "task_id": task_id})
                    assert thread["next_cursor"] is None
                    step_call = REFERENCE_TOOLS["request_step"]["example_input"]
                    asked = await call(run, "request_step", step_call)
                    assert (asked["status"], asked["behavior"]) == ("pending", "deny")
                    steps = ren.get("/api/steps").json()["steps"]
                    assert [s["id"] for s in steps] == [asked["step_id"]]
                    assert ren.post(f"/api/steps/{asked['step_id']}", json={"decision": "allow"}).status_code == 200
                    used = await call(run, "request_step", step_call | {"tool_use_id": "toolu_e2e"})
                    assert (used["status"], used["behavior"]) == ("consumed", "allow")
                    assert used["updatedInput"] == step_call["input"]
                    result = await call(run, "return_result", {
                        "task_id": task_id, "summary": "Drafted and pushed.",
                        "evidence": [{"kind": "note", "summary": "Six words.", "criteria": [0]},
                                     {"kind": "note", "summary": "CTA: try the demo.", "criteria": [1]}]})
                    assert result["task"]["state"] == "verifying"
                    assert result["task"]["result"]["lineage"]["cause"]["kind"] == "task"

        asyncio.run(scenario())
        ren.close()


def test_a_private_room_turn_draft_review_revision(db_path):
    with Served(db_path, "--demo") as served:
        url, base = served.info["mcp"], served.info["url"]
        cli_json(db_path, "agent", "add", "oj/critic", "--name", "Critic", "--model", "gpt-5", "--client", "codex")
        keys = {a: cli_json(db_path, "device", "pair", a)["token"] for a in ("oj/muse", "oj/critic")}
        oj = httpx.Client(base_url=base, timeout=30, headers={
            "Authorization": f"Bearer {cli_json(db_path, 'token', 'create', '--person', 'oj')['token']}"})
        room = oj.get("/api/room").json()["room"]["project"]

        async def scenario():
            async with client(url, keys["oj/muse"]) as muse, client(url, keys["oj/critic"], mode="legacy") as critic:
                m_listen = {"timeout_seconds": 20}
                c_listen = {"timeout_seconds": 20}
                m_listen["cursor"] = (await call(muse, "wait_for_mention", m_listen | {"timeout_seconds": 1}))["cursor"]
                c_listen["cursor"] = (await call(critic, "wait_for_mention", c_listen | {"timeout_seconds": 1}))["cursor"]
                asked = oj.post(f"/api/projects/{room}/messages", json={"body": "Headline for the launch?"}).json()
                event, m_listen = await wait_for(muse, m_listen, lambda e: e["kind"] == "room")
                assert event["message"]["id"] == asked["message"]["id"] and event["lead"] is True

                async def reply(c, agent_client_key, message_id, body, verdict):
                    claim = await call(c, "claim_discussion", {"message_id": message_id, "idempotency_key": "d",
                                                               "harness": 2})
                    async with client(url, claim["discussion_credential"]["token"]) as d:
                        posted = await call(d, "post_message", {"project": room, "body": body, "verdict": verdict})
                    return claim, posted["message"]

                claim, draft = await reply(muse, keys["oj/muse"], event["message"]["id"], "Work, together.", "draft")
                assert claim["role"] == "draft"
                event, c_listen = await wait_for(critic, c_listen, lambda e: e["kind"] == "room")
                assert event["message"]["id"] == draft["id"]
                claim, changes = await reply(critic, keys["oj/critic"], draft["id"], "Name the product.", "changes")
                assert claim["role"] == "review" and claim["reviewing"]["message_id"] == draft["id"]
                event, m_listen = await wait_for(muse, m_listen, lambda e: e["kind"] == "room")
                assert event["message"]["id"] == changes["id"]
                claim, revision = await reply(muse, keys["oj/muse"], changes["id"], "Prickle: work, together.",
                                              "draft")
                assert claim["role"] == "revise" and revision["verdict"] == "draft"

        asyncio.run(scenario())
        assert oj.get("/api/room").json()["turn"] is None
        oj.close()
