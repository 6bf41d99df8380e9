"""End to end: a real ``prickle serve --demo`` process, driven by the MCP SDK's own client.

Keys come from ``prickle token create`` run while the server is up. Agent A (oj/muse)
speaks the 2026-07-28 protocol, agent B (ren/builder) the older initialize handshake.
"""

import asyncio
import datetime
import json
import os
import signal
import subprocess
import time

import httpx

import prickle
from conftest import PRICKLE, REFERENCE_TOOLS, Served, in_thread
from helpers import _post, call, cli_json, client

PROJECT = "website-v2"


def test_two_real_clients_talk_and_wake_each_other(db_path):
    with Served(db_path, "--demo") as served:
        url = served.info["mcp"]
        assert set(served.info["demo"]["keys"]) == {"oj/muse", "ren/builder"}
        key_a = cli_json(db_path, "token", "create", "--agent", "oj/muse")["token"]
        key_b = cli_json(db_path, "token", "create", "--agent", "ren/builder", "--project", PROJECT)["token"]

        async def scenario():
            async with client(url, key_a) as a, client(url, key_b, mode="legacy") as b:
                listed = await a.list_tools()
                assert {t.name for t in listed.tools} >= set(REFERENCE_TOOLS) & {t.name for t in listed.tools}
                for tool in ("discover_team_agents", "get_project_context", "read_room", "update_pulse"):
                    await call(a, tool, REFERENCE_TOOLS[tool]["example_input"])
                team = await call(b, "discover_team_agents", {"project": PROJECT})
                assert "oj/muse" in [x["agent_id"] for x in team["agents"]]
                context = await call(b, "get_project_context", {"project": PROJECT})
                assert {m["address"] for m in context["members"]} >= {"oj", "ren", "oj/muse", "ren/builder"}
                assert [p["agent_id"] for p in context["pulse"]] == ["oj/muse"]

                # A first hears what it missed: the demo's mentions of it, sent before it connected.
                missed = await call(a, "wait_for_mention", {"project": PROJECT, "timeout_seconds": 1})
                assert missed["status"] == "events" and {e["kind"] for e in missed["events"]} == {"mention"}
                assert all("oj/muse" in e["message"]["mentions"] for e in missed["events"])
                # A sleeps; B mentions A with the reference's example; A wakes with that message.
                waiting = asyncio.create_task(call(a, "wait_for_mention", {"project": PROJECT, "timeout_seconds": 30,
                                                                           "cursor": missed["cursor"]}))
                posted = await call(b, "post_message", REFERENCE_TOOLS["post_message"]["example_input"])
                woke = await asyncio.wait_for(waiting, 20)
                assert woke["status"] == "events"
                assert woke["events"][0] == {"kind": "mention", "message": posted["message"]}

                # And back: B waits for updates (with progress), A replies to B's message.
                progress = []

                async def on_progress(p, total, message):
                    progress.append(p)

                updates = asyncio.create_task(call(b, "wait_for_updates", REFERENCE_TOOLS["wait_for_updates"]
                                                   ["example_input"] | {"timeout_seconds": 30},
                                                   progress_callback=on_progress))
                await asyncio.sleep(0.5)
                reply = await call(a, "post_message", {"project": PROJECT, "body": "On it.",
                                                       "in_reply_to": posted["message"]["id"]})
                got = await asyncio.wait_for(updates, 20)
                assert got["status"] == "updates"
                assert [(u["kind"], u["message_id"]) for u in got["updates"]] == [("reply", reply["message"]["id"])]

                room = await call(b, "read_room", REFERENCE_TOOLS["read_room"]["example_input"])
                assert [m["body"] for m in room["messages"]][-2:] == [posted["message"]["body"], "On it."]

                timeout = await call(a, "wait_for_mention", {"project": PROJECT, "timeout_seconds": 1})
                assert timeout["status"] == "timeout" and timeout["cursor"]

        asyncio.run(scenario())


def test_kill_9_during_a_burst_loses_no_acknowledged_message(db_path):
    served = Served(db_path, "--demo")
    url, key = served.info["mcp"], served.info["demo"]["keys"]["ren/builder"]
    acknowledged: list[str] = []

    def burst():
        with httpx.Client(timeout=10) as http:
            for i in range(2000):
                message_id = _post(http, url, key, f"burst {i}", i)
                if message_id is None:
                    return
                acknowledged.append(message_id)

    join = in_thread(burst)
    while len(acknowledged) < 100:
        time.sleep(0.005)
    os.kill(served.proc.pid, signal.SIGKILL)
    join()
    served.stop(kill=True)
    assert 100 <= len(acknowledged) < 2000

    with Served(db_path) as again:
        key_b = cli_json(db_path, "token", "create", "--agent", "ren/builder")["token"]

        async def read_all():
            seen, cursor = [], None
            async with client(again.info["mcp"], key_b) as b:
                while True:
                    args = {"project": PROJECT, "limit": 100} | ({"cursor": cursor} if cursor else {})
                    page = await call(b, "read_room", args)
                    seen += [m["id"] for m in page["messages"]]
                    cursor = page["next_cursor"]
                    if cursor is None:
                        return seen

        seen = asyncio.run(read_all())
    assert set(acknowledged) <= set(seen)
    verify = subprocess.run(PRICKLE + ["audit", "verify", "--db", db_path], capture_output=True, text=True)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert "BROKEN" not in verify.stdout


def test_demo_restart_keeps_data_and_prints_fresh_keys(db_path):
    with Served(db_path, "--demo") as first:
        keys1, link1 = first.info["demo"]["keys"], first.info["demo"]["signin"]
    time.sleep(0.2)
    with Served(db_path, "--demo") as second:
        keys2 = second.info["demo"]["keys"]
        assert keys1 != keys2
        # the first start's unused sign-in link ended with it
        old = httpx.get(second.info["url"] + link1[link1.index("/signin"):], follow_redirects=False)
        assert "set-cookie" not in old.headers
        assert second.info["demo"]["signin"].startswith(second.info["url"] + "/signin?token=")
        for key, status in ((keys1["oj/muse"], 401), (keys2["oj/muse"], 200)):
            r = httpx.post(second.info["mcp"], headers={"Authorization": f"Bearer {key}"}, json={})
            assert (r.status_code == 401) == (status == 401)
        # links printed by other commands point at the running server
        link = cli_json(db_path, "signin-link", "ren")["signin"]
        assert link.startswith(second.info["url"] + "/signin?token=")


def test_the_live_event_stream_continues_after_last_event_id(db_path):
    with Served(db_path, "--demo") as served:
        base, keys = served.info["url"], served.info["demo"]["keys"]
        token = cli_json(db_path, "token", "create", "--person", "oj")["token"]
        h = {"Authorization": f"Bearer {token}"}
        head = httpx.get(f"{base}/healthz").json()["outbox_head"]
        with httpx.Client(timeout=10) as http:
            first = _post(http, served.info["mcp"], keys["ren/builder"], "one", 1)
            second = _post(http, served.info["mcp"], keys["ren/builder"], "two", 2)
            seen = []
            with http.stream("GET", f"{base}/api/projects/{PROJECT}/stream", params={"after": head},
                             headers=h) as r:
                assert r.headers["content-type"].startswith("text/event-stream")
                event = {}
                for line in r.iter_lines():
                    if line.startswith("id: "):
                        event["id"] = int(line[4:])
                    elif line.startswith("data: "):
                        event["data"] = json.loads(line[6:])
                    elif line == "" and event.get("data", {}).get("type") is None:
                        event = {}  # the stream's first event says where it starts
                    elif line == "" and event:
                        seen.append(event)
                        event = {}
                        if len(seen) == 2:
                            break
            assert [e["data"]["message"]["id"] for e in seen] == [first, second]
            with http.stream("GET", f"{base}/api/projects/{PROJECT}/stream",
                             headers=h | {"Last-Event-ID": str(seen[0]["id"])}) as r:
                resumed = None
                for line in r.iter_lines():
                    if line.startswith("data: ") and "message" in line:
                        resumed = json.loads(line[6:])
                        break
            assert resumed is not None and resumed["message"]["id"] == second and resumed["seq"] == seen[1]["id"]
            r = http.get(f"{base}/api/projects/{PROJECT}/stream",
                         headers={"Authorization": f"Bearer {keys['oj/muse']}"})
            assert r.status_code == 401


#: Runs `prickle` with its checkpoint and its watch for other writers failing while a file exists.
_FAILING_DISK = """
import os, sys
import prickle

def failing(real):
    def run(*args, **kwargs):
        if os.path.exists(os.environ["PRICKLE_TEST_FAIL_WHILE"]):
            raise OSError(28, "No space left on device")
        return real(*args, **kwargs)
    return run

prickle.checkpoint_wal = failing(prickle.checkpoint_wal)
prickle.WakeHub.catch_up = failing(prickle.WakeHub.catch_up)
sys.exit(prickle.main(sys.argv[1:]))
"""


def _health_until(base, done, what):
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        health = httpx.get(f"{base}/healthz").json()
        if done(health):
            return health
        time.sleep(0.1)
    raise AssertionError(f"/healthz never showed {what}: {health}")


def test_background_work_survives_an_oserror_reports_it_and_recovers(db_path, tmp_path):
    flag = tmp_path / "disk-full"
    flag.write_text("")
    served = Served(db_path, "--demo", command=[PRICKLE[0], "-c", _FAILING_DISK],
                    env={"PRICKLE_TEST_FAIL_WHILE": str(flag)})
    try:
        base = served.info["url"]
        cli_json(db_path, "token", "create", "--person", "oj")  # another process writes: the watcher looks
        failing = ["checkpoint", "watcher"]
        health = _health_until(base, lambda h: sorted(d["piece"] for d in h.get("degraded", []) if d["failures"] >= 2)
                               == failing, "both pieces failing twice")
        assert health["ok"] is True
        assert sorted((d["piece"], d["cause"]) for d in health["degraded"]) == [
            ("checkpoint", "OSError: [Errno 28] No space left on device"),
            ("watcher", "OSError: [Errno 28] No space left on device")]
        flag.unlink()  # the disk has room again: each piece's next try works
        _health_until(base, lambda h: h["degraded"] == [], "the recovery")
        served.proc.terminate()
        err = served.proc.stderr.read()
    finally:
        served.stop()
    for piece in failing:
        # Logged once (with its cause) however often it was tried, and its recovery once.
        assert err.count(f"prickle: background {piece} failed, retrying with backoff: "
                         "OSError: [Errno 28] No space left on device\n") == 1, err
        assert err.count(f"prickle: background {piece} works again after") == 1, err


def _sse_events(lines, count):
    """The next ``count`` events from an SSE response's lines as ``(event, id, data)`` (blocks without data skipped)."""
    out, event = [], {}
    for line in lines:
        if line == "":
            if "data" in event:
                out.append((event.get("event", "message"), event.get("id"), event["data"]))
                if len(out) == count:
                    return out
            event = {}
        elif ": " in line and not line.startswith(":"):
            name, value = line.split(": ", 1)
            event[name] = int(value) if name == "id" else json.loads(value) if name == "data" else value
    return out


def test_the_stream_resyncs_a_position_beyond_the_head_or_pruned_and_goes_on_from_the_head(db_path):
    with Served(db_path, "--demo") as served:
        base, keys = served.info["url"], served.info["demo"]["keys"]
        token = cli_json(db_path, "token", "create", "--person", "oj")["token"]
        h = {"Authorization": f"Bearer {token}"}
        url = f"{base}/api/projects/{PROJECT}/stream"
        with httpx.Client(timeout=10) as http:
            head = http.get(f"{base}/healthz").json()["outbox_head"]
            # A browser that last saw a seq of the database before a restore, and one far beyond any seq.
            for headers, params in (({"Last-Event-ID": str(head + 1000)}, {}), ({}, {"after": "9" * 40})):
                with http.stream("GET", url, headers=h | headers, params=params) as r:
                    assert r.status_code == 200
                    lines = r.iter_lines()
                    assert _sse_events(lines, 2) == [("resync", head, {"seq": head, "reason": "ahead"}),
                                                 ("ready", head, {"seq": head})]
                    message_id = _post(http, served.info["mcp"], keys["ren/builder"], "after the restore", 1)
                    [(kind, seq, data)] = _sse_events(lines, 1)
                    assert (kind, data["message"]["id"]) == ("message.posted", message_id) and seq > head
                    head = seq
            # Events older than the kept window are pruned (here by another process on the same file).
            db = prickle.Database(db_path)
            try:
                later = prickle.utcnow() + datetime.timedelta(days=2)
                assert prickle.prune_outbox(db, datetime.timedelta(days=1), later) > 0
            finally:
                db.close()
            with http.stream("GET", url, headers=h, params={"after": "1"}) as r:
                assert _sse_events(r.iter_lines(), 2) == [("resync", head, {"seq": head, "reason": "pruned"}),
                                             ("ready", head, {"seq": head})]


def _readme_python_example():
    """The README's MCP Python SDK example, exactly as written there."""
    with open(os.path.join(os.path.dirname(os.path.abspath(prickle.__file__)), "README.md"), encoding="utf-8") as f:
        readme = f.read()
    blocks = [b.split("```", 1)[0] for b in readme.split("```python\n")[1:]]
    (example,) = [b for b in blocks if "streamable_http_client" in b]
    return example


def test_the_readme_python_example_runs_as_written_and_prints_a_tool_error(db_path, tmp_path):
    script = tmp_path / "example.py"
    script.write_text(_readme_python_example(), encoding="utf-8")
    with Served(db_path, "--demo") as served:
        env = os.environ | {"PRICKLE_URL": served.info["mcp"], "PRICKLE_KEY": served.info["demo"]["keys"]["oj/muse"]}
        ok = subprocess.run([PRICKLE[0], str(script)], capture_output=True, text=True, timeout=60, env=env)
        assert ok.returncode == 0, ok.stderr
        posted = prickle.get_message(prickle.Database(db_path), ok.stdout.strip())
        assert (posted["body"], posted["author"]["agent_id"]) == ("hello", "oj/muse")
        # an agent outside the project: the example prints the tool error instead of crashing
        cli_json(db_path, "agent", "add", "oj/outsider", "--name", "Outsider", "--model", "m", "--client", "c")
        env["PRICKLE_KEY"] = cli_json(db_path, "token", "create", "--agent", "oj/outsider")["token"]
        refused = subprocess.run([PRICKLE[0], str(script)], capture_output=True, text=True, timeout=60, env=env)
        assert refused.returncode == 0, refused.stderr
        assert refused.stdout.startswith("error: ") and "website-v2" in refused.stdout, refused.stdout


def test_the_access_log_has_one_line_per_request_and_no_secret(db_path):
    served = Served(db_path, "--demo")
    try:
        link, key = served.info["demo"]["signin"], served.info["demo"]["keys"]["oj/muse"]
        token = link.split("token=")[1]
        signin = httpx.get(link, follow_redirects=False)
        assert signin.status_code == 303, signin.text
        cookie = "; ".join(f"{k}={v}" for k, v in signin.cookies.items())
        assert httpx.get(served.info["url"] + "/api/me", headers={"Cookie": cookie}).status_code == 200
        assert httpx.get(served.info["url"] + "/api/me?x=1", headers={"Authorization": f"Bearer {key}"}).status_code == 401
        served.proc.terminate()
        served.proc.wait(15)
        err = served.proc.stderr.read()
    finally:
        served.stop()
    access = [line for line in err.splitlines() if line.startswith("prickle: access ")]
    assert [line.split()[2:5] for line in access] == [["GET", "/signin", "303"], ["GET", "/api/me", "200"],
                                                      ["GET", "/api/me", "401"]], err
    assert all(line.endswith("ms") for line in access)
    assert token not in err and key not in err and "x=1" not in err
    assert not any(v and v in err for v in signin.cookies.values())


def test_sigterm_with_waits_and_streams_open_answers_them_and_exits_without_a_traceback(db_path):
    served = Served(db_path, "--demo")
    try:
        url, base = served.info["mcp"], served.info["url"]
        keys = served.info["demo"]["keys"]
        signin = cli_json(db_path, "token", "create", "--person", "oj")["token"]
        got: dict = {}

        async def scenario():
            async with client(url, keys["oj/muse"]) as a, client(url, keys["ren/builder"], mode="legacy") as b:
                # The demo's mentions first (missed mentions come out at once), then the waits that hold.
                ca = (await call(a, "wait_for_updates", {"timeout_seconds": 1}))["cursor"]
                cb = (await call(b, "wait_for_mention", {"timeout_seconds": 1}))["cursor"]
                modern = asyncio.ensure_future(call(a, "wait_for_updates", {"timeout_seconds": 50, "cursor": ca}))
                legacy = asyncio.ensure_future(call(b, "wait_for_mention", {"timeout_seconds": 50, "cursor": cb}))
                async with httpx.AsyncClient(base_url=base, timeout=60,
                                             headers={"Authorization": f"Bearer {signin}"}) as http:
                    head = (await http.get("/api/events")).json()["last_seq"]
                    poll = asyncio.ensure_future(http.get("/api/events", params={"wait": 50, "after": head}))
                    async with http.stream("GET", "/api/stream") as stream:
                        lines = stream.aiter_lines()
                        while "event: ready" not in await lines.__anext__():
                            pass
                        await asyncio.sleep(0.5)  # the waits are in (nothing to wait for: no race to win)
                        served.proc.send_signal(signal.SIGTERM)
                        got["stream_end"] = [line async for line in lines]
                    got["poll"] = (await poll).json()
                got["modern"], got["legacy"] = await modern, await legacy
        started = time.monotonic()
        asyncio.run(scenario())
        assert served.proc.wait(15) == 0 or served.proc.returncode in (0, -signal.SIGTERM)
        took = time.monotonic() - started
        err = served.proc.stderr.read()
    finally:
        served.stop()
    assert (got["modern"]["status"], got["legacy"]["status"]) == ("timeout", "timeout"), got
    assert got["poll"]["events"] == [] and got["poll"]["resync"] is None
    assert "Traceback" not in err and "Cancel" not in err, err
    assert took < 15


def test_a_wait_whose_key_ends_gets_its_tool_result_in_both_protocol_eras(db_path):
    """Revoked from the command line (another process), or its owner removed from the project on the page."""
    with Served(db_path, "--demo") as served:
        url, base = served.info["mcp"], served.info["url"]
        muse = cli_json(db_path, "token", "create", "--agent", "oj/muse")
        builder = served.info["demo"]["keys"]["ren/builder"]
        oj = cli_json(db_path, "token", "create", "--person", "oj")["token"]
        ren = cli_json(db_path, "token", "create", "--person", "ren")["token"]
        answers = {}

        async def wait_then(c, agent_key_end):
            cursor = (await call(c, "wait_for_mention", {"timeout_seconds": 1}))["cursor"]
            waiting = asyncio.ensure_future(c.call_tool("wait_for_mention", {"timeout_seconds": 50,
                                                                             "cursor": cursor}))
            await asyncio.sleep(0.5)  # in the wait (nothing to wait for)
            await asyncio.to_thread(agent_key_end)
            try:
                r = await asyncio.wait_for(waiting, 20)
            except BaseException as e:  # noqa: BLE001 - what a client saw, to compare below
                return "cut", type(e).__name__
            return r.is_error, r.content[0].text

        async def scenario():
            for mode in ("legacy", "auto"):
                async with client(url, muse["token"], mode=mode) as c:
                    fresh = cli_json(db_path, "token", "create", "--agent", "oj/muse")
                    answers[mode, "revoked"] = await wait_then(
                        c, lambda: cli_json(db_path, "token", "revoke", muse["id"]))
                    muse.update(fresh)
            for mode in ("legacy", "auto"):
                async with client(url, builder, mode=mode) as c:
                    def remove():
                        with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {oj}"}) as http:
                            assert http.delete("/api/projects/website-v2/members/ren").status_code == 200
                    answers[mode, "removed"] = await wait_then(c, remove)
                # ren and the agent come back for the next era's turn
                with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {oj}"}) as http:
                    assert http.post("/api/projects/website-v2/members", json={"handle": "ren"}).status_code == 200
                with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {ren}"}) as http:
                    assert http.post("/api/projects/website-v2/agents",
                                     json={"agent_id": "ren/builder"}).status_code == 200
        asyncio.run(scenario())
    for mode in ("legacy", "auto"):
        assert answers[mode, "revoked"][0] is True and answers[mode, "revoked"][1].startswith("unauthorized: "), answers
        assert answers[mode, "removed"][0] is True and answers[mode, "removed"][1].startswith("not_found: "), answers
