"""Raw MCP clients for bench/run.py, each run in a process of its own.

Plain httpx POSTs of the 2026-07-28 wire (no MCP SDK client: it would add calls of its own):

- ``wake_waiter`` / ``wake_poster``: the two sides of the wake-latency measurement, driven
  step by step by the bench process over pipes;
- ``hold_waiters``: many wait_for_mention calls held open at once from one asyncio process;
- ``handoff_poster``: the poster's side of the handoff-to-wake measurement (``wake_waiter``
  is the assignee's side);
- ``task_life_worker``: full task lives (handoff to completed) from several threads of one process;
- ``load_worker``: the Python load generator used only when ``wrk`` is missing.

Every loop here is bounded in count and in time.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from typing import Any, Callable

import httpx

PROJECT = "website-v2"
PROTOCOL = "2026-07-28"
#: Connections per httpx pool in hold_waiters.
POOL_SIZE = 25


def call_headers(tool: str, key: str) -> dict[str, str]:
    return {
        "Accept": "application/json, text/event-stream",
        "Content-Type": "application/json",
        "MCP-Protocol-Version": PROTOCOL,
        "Mcp-Method": "tools/call",
        "Mcp-Name": tool,
        "Authorization": f"Bearer {key}",
    }


def call_body(tool: str, arguments: dict, request_id: int = 1) -> bytes:
    meta = {
        "io.modelcontextprotocol/protocolVersion": PROTOCOL,
        "io.modelcontextprotocol/clientInfo": {"name": "bench", "version": "1"},
        "io.modelcontextprotocol/clientCapabilities": {},
    }
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "method": "tools/call",
                       "params": {"name": tool, "arguments": arguments, "_meta": meta}}).encode()


def tool_output(response: httpx.Response) -> dict:
    """``result.structuredContent`` of a tools/call answer, JSON or SSE; raises RuntimeError on any failure."""
    if response.status_code != 200:
        raise RuntimeError(f"HTTP {response.status_code}: {response.text[:200]}")
    message = None
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        for line in response.text.splitlines():
            if line.startswith("data:") and line[5:].strip():
                data = json.loads(line[5:])
                if "result" in data or "error" in data:
                    message = data
    else:
        message = response.json()
    if message is None or "error" in message:
        raise RuntimeError(f"no result: {response.text[:200]}")
    result = message["result"]
    if result.get("isError"):
        raise RuntimeError(f"tool error: {result['content'][0]['text'][:200]}")
    return result["structuredContent"]


def call(client: httpx.Client, url: str, key: str, tool: str, arguments: dict) -> dict:
    return tool_output(client.post(url, content=call_body(tool, arguments), headers=call_headers(tool, key)))


# -- wake latency -------------------------------------------------------------


def wake_waiter(url: str, key: str, samples: int, conn: Any) -> None:
    """Call wait_for_mention ``samples`` times in a row, each from the previous cursor.

    Sends ``("ready", i)`` just before each call and ``("done", i, t, status, labels)`` after
    it, ``t`` being ``time.monotonic()`` once the whole answer was read and ``labels`` one
    :func:`event_label` per event.
    """
    cursor = None
    with httpx.Client(timeout=httpx.Timeout(60.0)) as client:
        # Mentions sent before (the demo's) come first at once: hear them before measuring.
        while True:
            arguments = {"project": PROJECT, "timeout_seconds": 1} | ({"cursor": cursor} if cursor else {})
            out = tool_output(client.post(url, content=call_body("wait_for_mention", arguments),
                                          headers=call_headers("wait_for_mention", key)))
            cursor = out["cursor"]
            if out["status"] == "timeout":
                break
        for i in range(samples):
            arguments: dict[str, Any] = {"project": PROJECT, "timeout_seconds": 50}
            if cursor:
                arguments["cursor"] = cursor
            conn.send(("ready", i))
            try:
                response = client.post(url, content=call_body("wait_for_mention", arguments),
                                        headers=call_headers("wait_for_mention", key))
                done = time.monotonic()
                out = tool_output(response)
            except (httpx.HTTPError, RuntimeError) as e:
                done = time.monotonic()
                conn.send(("error", i, done, str(e), []))
                return
            cursor = out["cursor"]
            conn.send(("done", i, done, out["status"], [event_label(e) for e in out["events"]]))


def event_label(event: dict) -> str:
    """What a wait_for_mention event carries: a message's body, or a handed task's ``packet.task``."""
    if event.get("kind") == "task":
        return "task: " + event.get("task", {}).get("packet", {}).get("task", "")
    return event.get("message", {}).get("body", "")


def _poster(url: str, conn: Any, call: Any) -> None:
    """Make one call for each item the bench process sends; answer ``(t, error)`` with ``t`` once it was read."""
    with httpx.Client(timeout=httpx.Timeout(30.0)) as client:
        for _ in range(100_000):
            item = conn.recv()
            if item is None:
                return
            try:
                done = call(client, item)
                conn.send((done, None))
            except (httpx.HTTPError, RuntimeError, KeyError) as e:
                conn.send((time.monotonic(), f"{type(e).__name__}: {e}"))


def wake_poster(url: str, key: str, conn: Any) -> None:
    """Post each body the bench process sends (as ``key``'s agent)."""
    def post(client: httpx.Client, body: str) -> float:
        response = client.post(url, content=call_body("post_message", {"project": PROJECT, "body": body}),
                               headers=call_headers("post_message", key))
        done = time.monotonic()
        tool_output(response)
        return done
    _poster(url, conn, post)


def task_packet(title: str) -> dict:
    return {"task": title, "deliverable_type": "doc", "acceptance_criteria": ["One criterion."]}


def handoff_poster(url: str, key: str, to: str, conn: Any) -> None:
    """Hand ``to`` a task titled by each title the bench process sends.

    An answer whose gate did not route the task at once counts as an error.
    """
    def hand(client: httpx.Client, title: str) -> float:
        response = client.post(url, content=call_body("handoff", {"project": PROJECT, "to": to,
                                                                  "packet": task_packet(title)}),
                               headers=call_headers("handoff", key))
        done = time.monotonic()
        out = tool_output(response)
        if out["task"]["state"] != "routed":
            raise RuntimeError(f"the task is {out['task']['state']} (gate: {out['gate']}), not routed")
        return done
    _poster(url, conn, hand)


# -- full task lives ----------------------------------------------------------

#: The steps of one task life, in order: five MCP calls and the owner's HTTP call.
LIFE_STEPS = ("handoff", "accept_task", "checkpoint", "return_result", "accept_result", "owner_accept")


def api_output(response: httpx.Response) -> dict:
    """The JSON of a people's-API answer; raises RuntimeError unless it is a 200."""
    if response.status_code != 200:
        raise RuntimeError(f"HTTP {response.status_code}: {response.text[:200]}")
    return response.json()


def one_life(client: httpx.Client, url: str, keys: dict, to: str, title: str,
             record: Callable[[str, float, float], None]) -> str:
    """Take one task from handoff to completed; ``record(step, sent, done)`` after each call. Returns its state."""
    requester, assignee, person = keys["requester"], keys["assignee"], keys["person"]
    api = url.rsplit("/mcp", 1)[0]

    def mcp(step: str, key: str, arguments: dict) -> dict:
        sent = time.monotonic()
        out = call(client, url, key, step, arguments)
        record(step, sent, time.monotonic())
        return out

    task = mcp("handoff", requester, {"project": PROJECT, "to": to, "packet": task_packet(title)})["task"]
    if task["state"] != "routed":
        raise RuntimeError(f"handoff: the task is {task['state']}, not routed")
    task_id = task["id"]
    mcp("accept_task", assignee, {"task_id": task_id})
    mcp("checkpoint", assignee, {"task_id": task_id, "checkpoint": {"progress": "Working."}})
    submission = mcp("return_result", assignee, {
        "task_id": task_id, "summary": "Done.",
        "evidence": [{"kind": "note", "summary": "Checked.", "criteria": [0]}]})["submission"]
    mcp("accept_result", requester, {"task_id": task_id, "submission_id": submission["submission_id"],
                                     "revision": submission["revision"],
                                     "verdicts": [{"criterion": 0, "accepted": True}], "artifacts": []})
    sent = time.monotonic()
    state = api_output(client.post(f"{api}/api/tasks/{task_id}/accept", content=b"{}",
                                   headers={"Content-Type": "application/json",
                                            "Authorization": f"Bearer {person}"}))["task"]["state"]
    record("owner_accept", sent, time.monotonic())
    if state != "completed":
        raise RuntimeError(f"owner_accept: the task is {state}, not completed")
    return state


def _life_thread(url: str, keys: dict, to: str, name: str, start: float, measure_from: float, until: float,
                 max_lives: int, out: dict, lock: threading.Lock) -> None:
    lives = calls = failures = started = 0
    steps: dict[str, list[float]] = {s: [] for s in LIFE_STEPS}
    errors: list[str] = []

    def record(step: str, sent: float, done: float) -> None:
        nonlocal calls
        if measure_from <= done < until:
            calls += 1
            steps[step].append((done - sent) * 1000)

    time.sleep(max(0.0, start - time.monotonic()))
    with httpx.Client(timeout=httpx.Timeout(10.0)) as client:
        while time.monotonic() < until and started < max_lives and failures < 50:
            started += 1
            try:
                one_life(client, url, keys, to, f"Bench life {name}-{started}", record)
                if measure_from <= time.monotonic() < until:
                    lives += 1
            except Exception as e:  # counted and reported, never raised
                failures += 1
                if len(errors) < 3:
                    errors.append(f"{type(e).__name__}: {e}"[:200])
    with lock:
        out["lives"] += lives
        out["calls"] += calls
        out["failures"] += failures
        out["started"] += started
        out["errors"].extend(errors)
        for s, values in steps.items():
            out["steps"][s].extend(values)


def task_life_worker(url: str, keys: dict, to: str, concurrent: int, warmup: float, seconds: float,
                     name: str, conn: Any) -> None:
    """Run ``concurrent`` task lives at a time (a thread and connection each) over a shared window.

    Sends ``("ready", None)``, receives the start time (``time.monotonic()``, one clock for
    the machine), runs lives for ``warmup`` s not counted, then ``seconds`` s counted (a
    call counts if its answer came in the window, a life if its last answer did), and sends
    ``("report", {...})``. A failed call ends its life (counted as a failure); a thread
    stops after 50 failures or 100,000 lives.
    """
    conn.send(("ready", None))
    if not conn.poll(60):
        return
    start = conn.recv()
    out: dict[str, Any] = {"lives": 0, "calls": 0, "failures": 0, "started": 0, "errors": [],
                           "steps": {s: [] for s in LIFE_STEPS}}
    lock = threading.Lock()
    cpu = time.process_time()
    threads = [threading.Thread(target=_life_thread, args=(url, keys, to, f"{name}.{i}", start, start + warmup,
                                                           start + warmup + seconds, 100_000, out, lock))
               for i in range(concurrent)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(warmup + seconds + 90)
    out["client_cpu_s"] = time.process_time() - cpu
    conn.send(("report", out))


# -- many waiters at once -----------------------------------------------------


async def _one_wait(client: httpx.AsyncClient, url: str, key: str) -> tuple[float, str]:
    """Hold wait_for_mention, asking again each time it times out, until it returns events."""
    body = call_body("wait_for_mention", {"project": PROJECT, "timeout_seconds": WAIT_SECONDS})
    try:
        while True:
            response = await client.post(url, content=body, headers=call_headers("wait_for_mention", key))
            status = tool_output(response)["status"]
            if status != "timeout":
                return time.monotonic(), status
    except Exception as e:  # counted and reported, never raised
        return time.monotonic(), f"error: {type(e).__name__}: {e}"[:160]


#: How long each held wait asks to wait: the reference's maximum; a waiter asks again when it ends.
WAIT_SECONDS = 50
#: How long a waiters' process keeps its waits open for the bench process's command.
HOLD_SECONDS = 240


def _recv(conn: Any, timeout: float) -> Any:
    return conn.recv() if conn.poll(timeout) else None


async def _hold_waiters(url: str, keys: list[str], count: int, conn: Any) -> None:
    # Small pools: httpx's pool does work in proportion to its connections on every request
    # and answer, so one pool of 1,000 costs the client seconds of CPU when they all return.
    pools = [httpx.AsyncClient(limits=httpx.Limits(max_connections=POOL_SIZE + 5, max_keepalive_connections=POOL_SIZE),
                               timeout=httpx.Timeout(WAIT_SECONDS + 30.0, connect=60.0, pool=60.0))
             for _ in range(0, count, POOL_SIZE)]
    async with contextlib.AsyncExitStack() as stack:
        for pool in pools:
            await stack.enter_async_context(pool)
        tasks = []
        for i in range(count):
            tasks.append(asyncio.create_task(_one_wait(pools[i // POOL_SIZE], url, keys[i % len(keys)])))
            if i % POOL_SIZE == POOL_SIZE - 1:
                await asyncio.sleep(0)  # send what is started before starting more: no request waits half-sent
        conn.send(("launched", count))
        command = await asyncio.to_thread(_recv, conn, HOLD_SECONDS)
        in_flight = sum(not t.done() for t in tasks)
        early = [t.result()[1] for t in tasks if t.done()]
        report: dict[str, Any] = {"in_flight": in_flight, "early": early[:5], "early_count": len(early)}
        if command == "collect":
            cpu = time.process_time()
            finished, _ = await asyncio.wait(tasks, timeout=30.0)
            results = [t.result() for t in finished]
            report.update(times=[t for t, status in results if status == "events"], finished=len(finished),
                          other=sorted({s for _, s in results if s != "events"})[:5],
                          client_cpu_ms=(time.process_time() - cpu) * 1000)
        conn.send(("report", report))
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def hold_waiters(url: str, keys: list[str], count: int, conn: Any) -> None:
    """Open ``count`` wait_for_mention calls over ``keys``; on "collect", time their returns (30 s at most).

    Sends ``("launched", count)`` once every call is started, then waits for a command from the
    bench process, and answers ``("report", {...})``: ``times`` holds the ``time.monotonic()`` at
    which each call returned with events (one clock for the whole machine).
    """
    asyncio.run(_hold_waiters(url, keys, count, conn))


# -- fallback load generator (no wrk) -----------------------------------------


def _load_thread(url: str, tool: str, key: str, deadline: float, counts: dict, lock: threading.Lock) -> None:
    body = call_body(tool, {"project": PROJECT, "body": "benchmark message, no mention"})
    headers = call_headers(tool, key)
    ok = bad = 0
    with httpx.Client(timeout=httpx.Timeout(10.0)) as client:
        while time.monotonic() < deadline:
            try:
                response = client.post(url, content=body, headers=headers)
                good = response.status_code == 200 and b'"isError":true' not in response.content
            except httpx.HTTPError:
                good = False
            ok, bad = ok + good, bad + (not good)
    with lock:
        counts["ok"] += ok
        counts["bad"] += bad


def load_worker(url: str, tool: str, keys: list[str], seconds: float, queue: Any) -> None:
    """One process of the Python load generator: a keep-alive connection (thread) per key for ``seconds``."""
    counts, lock = {"ok": 0, "bad": 0}, threading.Lock()
    deadline = time.monotonic() + seconds
    threads = [threading.Thread(target=_load_thread, args=(url, tool, k, deadline, counts, lock)) for k in keys]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + 15)
    queue.put(counts)
