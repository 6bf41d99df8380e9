"""wait_for_mention and wait_for_updates: wakes, cursors, resync, progress, other writers."""

import datetime
import json
import socket
import subprocess
import sys
import time

import httpx

import prickle
from conftest import MCP, PROJECT, Served, in_thread
from runner_util import wait_until
from helpers import make_task, post


def wait(mcp, agent, tool="wait_for_mention", **args):
    return mcp.ok(agent, tool, {"timeout_seconds": 5} | args)


def cursor_now(world, agent, tool="wait_for_mention"):
    """A cursor at the outbox head for ``agent``'s ``tool``: a waiter given it misses nothing posted later."""
    return prickle.wake_cursor(world.db, f"{agent}|{tool}|*", prickle.outbox_head(world.db))


def test_timeout_returns_a_cursor_and_that_cursor_catches_what_came_after(mcp, world):
    first = wait(mcp, "oj/muse", timeout_seconds=1)
    assert first["status"] == "timeout" and first["events"] == []
    m = post(mcp, "ren/builder", "@muse while you were away")
    later = wait(mcp, "oj/muse", cursor=first["cursor"])
    assert later["status"] == "events"
    assert later["events"] == [{"kind": "mention", "message": m}]
    # and the new cursor is past it
    again = wait(mcp, "oj/muse", cursor=later["cursor"], timeout_seconds=1)
    assert again["status"] == "timeout" and again["events"] == []


def test_without_a_cursor_only_what_happens_from_now_on(mcp, world):
    earlier = post(mcp, "ren/builder", "@muse earlier")
    post(mcp, "ren/builder", "nobody named")
    missed = wait(mcp, "oj/muse", timeout_seconds=1)  # a mention never handed out is still muse's
    assert missed["status"] == "events" and missed["events"] == [{"kind": "mention", "message": earlier}]
    out = wait(mcp, "oj/muse", timeout_seconds=1)
    assert out["status"] == "timeout"


def test_mentions_sent_while_an_agent_was_not_waiting_reach_it_once(mcp, world):
    task = make_task(world, "oj/muse", "ren/builder")
    general = post(mcp, "ren/builder", "@muse while you were away")
    threaded = post(mcp, "ren/builder", "@muse see the thread", task_id=task)
    other = post(mcp, "ren/builder", "@scout not muse")
    assert other["mentions"] == ["oj/scout"]
    timed_out = wait(mcp, "oj/muse", "wait_for_updates", kinds=["task"], timeout_seconds=1)
    assert timed_out["status"] == "timeout"
    cursor = timed_out["cursor"]
    out = wait(mcp, "oj/muse", "wait_for_updates", cursor=cursor)
    assert out["status"] == "updates"
    assert [(u["kind"], u.get("task_id"), u["message_id"]) for u in out["updates"]] == [
        ("mention", None, general["id"]), ("mention", task, threaded["id"])]
    assert prickle.decode_cursor(world.db, "wake|oj/muse|wait_for_updates|*", out["cursor"]) == \
        prickle.decode_cursor(world.db, "wake|oj/muse|wait_for_updates|*", cursor)
    # heard once: neither wait tells them again
    assert wait(mcp, "oj/muse", timeout_seconds=1)["status"] == "timeout"
    assert wait(mcp, "oj/muse", "wait_for_updates", cursor=out["cursor"], timeout_seconds=1)["status"] == "timeout"


def test_missed_mentions_keep_the_project_filter_and_come_fifty_at_a_time(mcp, world):
    prickle.add_member(world.db, "side", "ren", by="sam")
    prickle.add_agent_to_project(world.db, "side", "ren/builder")
    there = mcp.ok("sam/lone", "post_message", {"project": "side", "body": "@ren/builder over here"})["message"]
    for i in range(52):
        post(mcp, "oj/muse", f"@builder {i}")
    assert wait(mcp, "ren/builder", project="side")["events"] == [{"kind": "mention", "message": there}]
    first = wait(mcp, "ren/builder", project=PROJECT)
    assert [e["message"]["body"] for e in first["events"]] == [f"@builder {i}" for i in range(50)]
    rest = wait(mcp, "ren/builder", project=PROJECT, cursor=first["cursor"])
    assert [e["message"]["body"] for e in rest["events"]] == ["@builder 50", "@builder 51"]
    assert wait(mcp, "ren/builder", project=PROJECT, cursor=rest["cursor"], timeout_seconds=1)["status"] == "timeout"


def test_a_waiting_agent_wakes_when_mentioned(mcp, world):
    join = in_thread(wait, mcp, "oj/muse", cursor=cursor_now(world, "oj/muse"), timeout_seconds=20)
    m = post(mcp, "ren/builder", "@oj/muse Can you help with the hero copy?")
    out = join()
    assert out["status"] == "events" and out["events"][0]["message"]["id"] == m["id"]


def test_only_mentions_of_the_caller_wake_it(mcp, world):
    first = wait(mcp, "oj/muse", timeout_seconds=1)
    post(mcp, "ren/builder", "@scout not you")
    post(mcp, "ren/builder", "nobody named")
    post(mcp, "oj/muse", "@muse myself")
    out = wait(mcp, "oj/muse", cursor=first["cursor"], timeout_seconds=1)
    assert out["status"] == "timeout"


def test_person_mention_wakes_an_agent(mcp, server, world):
    join = in_thread(wait, mcp, "ren/builder", cursor=cursor_now(world, "ren/builder"), timeout_seconds=20)
    r = server.post(f"/api/projects/{PROJECT}/messages", json={"body": "@builder build the page"},
                    headers={"Authorization": f"Bearer {world.tokens['oj']}"})
    out = join()
    assert out["events"][0]["message"]["id"] == r.json()["message"]["id"]
    assert out["events"][0]["message"]["author"]["kind"] == "person"


def test_resync_for_malformed_foreign_and_future_cursors(mcp, world):
    mine = wait(mcp, "oj/muse", timeout_seconds=1)["cursor"]
    for bad in ("not-a-cursor", mine):
        out = wait(mcp, "ren/builder", cursor=bad)  # mine is foreign to builder
        assert out["status"] == "resync" and out["events"] == []
        scope = "wake|ren/builder|wait_for_mention|*"
        assert prickle.decode_cursor(world.db, scope, out["cursor"]) == prickle.outbox_head(world.db)
    future = prickle.wake_cursor(world.db, "oj/muse|wait_for_mention|*", prickle.outbox_head(world.db) + 100)
    assert wait(mcp, "oj/muse", cursor=future)["status"] == "resync"
    assert wait(mcp, "oj/muse", tool="wait_for_updates", cursor="zzz")["status"] == "resync"


def test_project_filter_and_scoped_keys(mcp, world):
    prickle.add_member(world.db, "side", "ren", by="sam")
    prickle.add_agent_to_project(world.db, "side", "ren/builder")
    _, scoped = prickle.create_token(world.db, "client", agent_id="ren/builder", project=PROJECT)
    here = wait(mcp, "ren/builder", project=PROJECT, timeout_seconds=1)["cursor"]
    there = wait(mcp, "ren/builder", project="side", timeout_seconds=1)["cursor"]
    anywhere = wait(mcp, "ren/builder", timeout_seconds=1)["cursor"]
    scoped_start = mcp.ok("ren/builder", "wait_for_mention", {"timeout_seconds": 1}, token=scoped)["cursor"]
    mcp.ok("sam/lone", "post_message", {"project": "side", "body": "@ren/builder over here"})
    assert wait(mcp, "ren/builder", cursor=here, project=PROJECT, timeout_seconds=1)["status"] == "timeout"
    assert wait(mcp, "ren/builder", cursor=there, project="side")["events"][0]["message"]["project"] == "side"
    assert wait(mcp, "ren/builder", cursor=anywhere)["events"][0]["message"]["project"] == "side"
    out = mcp.ok("ren/builder", "wait_for_mention", {"cursor": scoped_start, "timeout_seconds": 1}, token=scoped)
    assert out["status"] == "timeout"  # the key cannot hear the other project
    mcp.error("ren/builder", "wait_for_mention", {"project": "side", "timeout_seconds": 1}, "forbidden", token=scoped)
    mcp.error("oj/muse", "wait_for_mention", {"project": "side", "timeout_seconds": 1}, "not_found")


def test_wait_for_updates_reports_pointers_for_mentions_and_replies(mcp, world):
    task = make_task(world, "oj/muse", "ren/builder")
    start = wait(mcp, "oj/muse", "wait_for_updates", timeout_seconds=1)
    assert start["status"] == "timeout" and start["updates"] == []
    mine = post(mcp, "oj/muse", "Draft is up.")
    reply = post(mcp, "ren/builder", "Looks good", in_reply_to=mine["id"])
    in_thread_msg = post(mcp, "ren/builder", "Working on it", task_id=task)
    mention = post(mcp, "oj/scout", "@muse hi")
    out = wait(mcp, "oj/muse", "wait_for_updates", cursor=start["cursor"])
    assert out["status"] == "updates"
    assert [(u["kind"], u.get("task_id"), u["message_id"]) for u in out["updates"]] == [
        ("reply", None, reply["id"]), ("reply", task, in_thread_msg["id"]), ("mention", None, mention["id"])]
    assert all(u["project"] == PROJECT and u["at"] for u in out["updates"])
    only = wait(mcp, "oj/muse", "wait_for_updates", cursor=start["cursor"], kinds=["mention"])
    assert [u["message_id"] for u in only["updates"]] == [mention["id"]]


def test_a_mention_that_is_also_a_reply_counts_once_as_mention(mcp, world):
    start = wait(mcp, "oj/muse", "wait_for_updates", timeout_seconds=1)["cursor"]
    mine = post(mcp, "oj/muse", "Question?")
    reply = post(mcp, "ren/builder", "@muse answer", in_reply_to=mine["id"])
    out = wait(mcp, "oj/muse", "wait_for_updates", cursor=start)
    assert [(u["kind"], u["message_id"]) for u in out["updates"]] == [("mention", reply["id"])]
    only_replies = wait(mcp, "oj/muse", "wait_for_updates", cursor=start, kinds=["reply"])
    assert [(u["kind"], u["message_id"]) for u in only_replies["updates"]] == [("reply", reply["id"])]


def test_no_wake_for_an_agent_that_cannot_see_the_thread(mcp, world):
    task = make_task(world)
    start = wait(mcp, "oj/scout", timeout_seconds=1)["cursor"]
    post(mcp, "oj/muse", "@scout look here", task_id=task)
    assert wait(mcp, "oj/scout", cursor=start, timeout_seconds=1)["status"] == "timeout"


def test_at_most_fifty_updates_then_the_rest(mcp, world):
    start = wait(mcp, "oj/muse", "wait_for_updates", timeout_seconds=1)["cursor"]
    for i in range(55):
        post(mcp, "oj/scout" if i % 2 else "ren/builder", f"@muse {i}")
    first = wait(mcp, "oj/muse", "wait_for_updates", cursor=start)
    assert len(first["updates"]) == 50
    rest = wait(mcp, "oj/muse", "wait_for_updates", cursor=first["cursor"])
    assert len(rest["updates"]) == 5


def test_wait_for_updates_without_progress_token_is_capped(mcp, world):
    # 240 s is accepted by the schema; without a progressToken it is held 50 s at most.
    assert prickle.WAIT_PLAIN_MAX == 50
    assert prickle.validate_input("wait_for_updates", {"timeout_seconds": 240})["timeout_seconds"] == 240
    mcp.error("oj/muse", "wait_for_updates", {"timeout_seconds": 241}, "invalid_input")
    mcp.error("oj/muse", "wait_for_mention", {"timeout_seconds": 51}, "invalid_input")


def test_progress_notifications_while_waiting(mcp, world, monkeypatch):
    monkeypatch.setattr(prickle, "PROGRESS_EVERY", 0.3)
    params = {"name": "wait_for_updates", "arguments": {"timeout_seconds": 1},
              "_meta": {"progressToken": "tok-1"}}
    r = mcp.raw(world.keys["oj/muse"], "tools/call", params, "wait_for_updates")
    assert r.headers["content-type"].startswith("text/event-stream")
    import json
    messages = [json.loads(line[5:]) for line in r.text.splitlines() if line.startswith("data:")]
    progress = [m for m in messages if m.get("method") == "notifications/progress"]
    assert len(progress) >= 2
    assert all(m["params"]["progressToken"] == "tok-1" for m in progress)
    assert messages[-1]["result"]["structuredContent"]["status"] == "timeout"


def test_a_write_from_another_process_wakes_a_waiter(mcp, world, db_path):
    join = in_thread(wait, mcp, "oj/muse", cursor=cursor_now(world, "oj/muse"), timeout_seconds=20)
    script = (
        "import prickle, sys\n"
        "db = prickle.Database(sys.argv[1])\n"
        "actor = prickle.resolve_token(db, sys.argv[2], ('client',))\n"
        "print(prickle.post_message(db, actor, 'website-v2', '@muse from another process')['id'])\n"
    )
    done = subprocess.run([sys.executable, "-c", script, db_path, world.keys["ren/builder"]],
                          capture_output=True, text=True, check=True)
    out = join()
    assert out["status"] == "events"
    assert out["events"][0]["message"]["id"] == done.stdout.strip()


def test_a_cursor_is_good_only_for_its_tool_and_project_filter(mcp, world):
    start = wait(mcp, "oj/muse", project=PROJECT, timeout_seconds=1)["cursor"]
    post(mcp, "ren/builder", "@muse here")
    assert wait(mcp, "oj/muse", cursor=start)["status"] == "resync"  # no project filter now
    assert wait(mcp, "oj/muse", "wait_for_updates", cursor=start, project=PROJECT)["status"] == "resync"
    assert wait(mcp, "oj/muse", cursor=start, project=PROJECT)["status"] == "events"


def test_a_key_revoked_while_waiting_gets_no_data(mcp, world, monkeypatch):
    monkeypatch.setattr(prickle, "LIVE_CHECK_EVERY", 0.1)
    record, key = prickle.create_token(world.db, "client", agent_id="oj/muse")
    join = in_thread(mcp.call, "oj/muse", "wait_for_mention", {"timeout_seconds": 10}, key)
    time.sleep(0.3)
    prickle.revoke_token(world.db, record["id"])
    post(mcp, "ren/builder", "@muse secret plan")
    is_error, text = join()
    assert is_error and text.startswith("unauthorized: ") and "secret" not in text


def test_a_cursor_older_than_what_pruning_kept_gets_resync_and_a_cursor_that_works(mcp, world):
    scope = "oj/muse|wait_for_mention|*"
    old = prickle.wake_cursor(world.db, scope, 1)
    later = prickle.utcnow() + datetime.timedelta(days=40)
    assert prickle.prune_outbox(world.db, datetime.timedelta(days=30), later) > 0
    assert prickle.pruned_through(world.db) > 1
    out = wait(mcp, "oj/muse", cursor=old, timeout_seconds=1)
    assert out == {"status": "resync", "events": [],
                   "cursor": prickle.wake_cursor(world.db, scope, prickle.outbox_head(world.db))}
    m = post(mcp, "ren/builder", "@muse after the resync")
    assert wait(mcp, "oj/muse", cursor=out["cursor"])["events"] == [{"kind": "mention", "message": m}]


def _wire(r) -> tuple[str, list[str], dict]:
    """A tools/call answer as (media type, its SSE lines other than data, the JSON-RPC answer)."""
    kind = r.headers["content-type"].split(";")[0]
    if kind == "text/event-stream":
        lines = [ln for ln in r.text.split("\r\n") if ln]
        answers = [json.loads(ln[5:]) for ln in lines if ln.startswith("data:")]
        return kind, [ln for ln in lines if not ln.startswith("data:")], answers[-1]
    return kind, [], r.json()


def test_a_held_wait_is_answered_as_the_sdk_answers_a_call_it_serves_at_once(mcp, world):
    """A wait with something to hand out is the SDK's answer; one held until a post wakes it is shaped the same."""
    token = world.keys["oj/muse"]
    params = {"name": "wait_for_mention", "arguments": {"timeout_seconds": 5}}
    post(mcp, "ren/builder", "@muse at once")
    at_once = mcp.raw(token, "tools/call", params, "wait_for_mention")
    cursor = at_once.json()["result"]["structuredContent"]["cursor"]
    join = in_thread(mcp.raw, token, "tools/call",
                     {"name": "wait_for_mention", "arguments": {"timeout_seconds": 5, "cursor": cursor}},
                     "wait_for_mention")
    wait_until_held(mcp, "oj/muse")
    woken_by = post(mcp, "ren/builder", "@muse later")
    held = join()
    (kind_a, _, a), (kind_b, _, b) = _wire(at_once), _wire(held)
    assert (at_once.status_code, held.status_code, kind_a, kind_b) == (200, 200, "application/json", "application/json")
    assert sorted(a) == sorted(b) == ["id", "jsonrpc", "result"]
    assert sorted(a["result"]) == sorted(b["result"])
    assert a["result"]["_meta"] == b["result"]["_meta"] and a["result"]["isError"] is b["result"]["isError"] is False
    assert b["result"]["structuredContent"]["events"] == [{"kind": "mention", "message": woken_by}]
    assert json.loads(b["result"]["content"][0]["text"]) == b["result"]["structuredContent"]


def wait_until_held(mcp, agent: str, deadline: float = 10.0) -> None:
    """Until the server holds a wait of ``agent`` (its WakeHub has a waiter for it)."""
    hub = mcp.client.app.state.prickle.hub
    until = time.monotonic() + deadline
    while not hub.agent_waiters.get(agent):
        assert time.monotonic() < until, f"no wait of {agent} held"
        time.sleep(0.01)


def test_a_held_wait_past_the_switch_streams_pings_then_its_answer(mcp, world, monkeypatch):
    """Silent past the SDK's switch (15 s; 0.2 s here) a held wait becomes an event stream of pings, then the answer."""
    monkeypatch.setattr(prickle.sdk_http_modern, "_SSE_PING_INTERVAL", 0.2)
    r = mcp.raw(world.keys["oj/muse"], "tools/call", {"name": "wait_for_mention", "arguments": {"timeout_seconds": 1}},
                "wait_for_mention")
    kind, others, answer = _wire(r)
    assert (r.status_code, kind) == (200, "text/event-stream")
    assert r.headers["cache-control"] == "no-cache, no-transform"
    assert set(others) == {": ping", "event: message"} and others.count(": ping") >= 3
    assert answer["result"]["structuredContent"]["status"] == "timeout"
    assert answer["id"] == mcp._id


def test_a_held_wait_whose_client_leaves_is_let_go(db_path):
    """A real server: the wait of a client that closes its connection ends at once, as the SDK's would."""
    with Served(db_path, "--demo") as served, httpx.Client(base_url=served.info["url"], timeout=30) as http:
        key = served.info["demo"]["keys"]["oj/muse"]
        mcp = MCP(http, {"oj/muse": key})

        def waits() -> int:
            return http.get("/healthz").json()["waits"]
        mcp.ok("oj/muse", "wait_for_mention", {"timeout_seconds": 1})  # the demo's welcome, a missed mention
        body = json.dumps({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {
            "name": "wait_for_mention", "arguments": {"timeout_seconds": 50},
            "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                      "io.modelcontextprotocol/clientInfo": {"name": "tests", "version": "1"},
                      "io.modelcontextprotocol/clientCapabilities": {}}}}).encode()
        host, port = httpx.URL(served.info["url"]).host, httpx.URL(served.info["url"]).port
        request = (f"POST /mcp HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
                   "Accept: application/json, text/event-stream\r\nMCP-Protocol-Version: 2026-07-28\r\n"
                   f"Mcp-Method: tools/call\r\nMcp-Name: wait_for_mention\r\nAuthorization: Bearer {key}\r\n"
                   f"Content-Length: {len(body)}\r\n\r\n").encode() + body
        with socket.create_connection((host, port)) as leaving:
            leaving.sendall(request)
            wait_until("the wait held", lambda: waits() == 1, timeout=10)
        wait_until("the wait let go", lambda: waits() == 0, timeout=10)
        assert mcp.ok("oj/muse", "wait_for_mention", {"timeout_seconds": 1})["status"] == "timeout"
