"""Raw MCP clients for bench/run.py, each run in a process of its own.

Plain httpx POSTs of the 2026-07-28 wire (no MCP SDK client: it would add calls of its own):

- ``wake_waiter`` / ``wake_poster``: the two sides of the wake-latency measurement, driven
  step by step by the bench process over pipes;
- ``hold_waiters``: many wait_for_mention calls held open at once from one asyncio process;
- ``load_worker``: the Python load generator used only when ``wrk`` is missing.

Every loop here is bounded in count and in time.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from typing import Any

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

    Sends ``("ready", i)`` just before each call and ``("done", i, t, status, bodies)`` after
    it, ``t`` being ``time.monotonic()`` once the whole answer was read.
    """
    cursor = None
    with httpx.Client(timeout=httpx.Timeout(60.0)) as client:
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
            bodies = [e.get("message", {}).get("body", "") for e in out["events"]]
            conn.send(("done", i, done, out["status"], bodies))


def wake_poster(url: str, key: str, conn: Any) -> None:
    """Post each body the bench process sends; answer ``(t, error)`` with ``t`` once the answer was read."""
    with httpx.Client(timeout=httpx.Timeout(30.0)) as client:
        for _ in range(100_000):
            body = conn.recv()
            if body is None:
                return
            try:
                response = client.post(url, content=call_body("post_message", {"project": PROJECT, "body": body}),
                                       headers=call_headers("post_message", key))
                done = time.monotonic()
                tool_output(response)
                conn.send((done, None))
            except (httpx.HTTPError, RuntimeError) as e:
                conn.send((time.monotonic(), str(e)))


# -- many waiters at once -----------------------------------------------------


async def _one_wait(client: httpx.AsyncClient, url: str, key: str) -> tuple[float, str]:
    body = call_body("wait_for_mention", {"project": PROJECT, "timeout_seconds": 50})
    try:
        response = await client.post(url, content=body, headers=call_headers("wait_for_mention", key))
        out = tool_output(response)
        return time.monotonic(), out["status"]
    except Exception as e:  # counted and reported, never raised
        return time.monotonic(), f"error: {type(e).__name__}: {e}"[:160]


def _recv(conn: Any, timeout: float) -> Any:
    return conn.recv() if conn.poll(timeout) else None


async def _hold_waiters(url: str, keys: list[str], count: int, poster_key: str, wake_body: str, conn: Any) -> None:
    # Small pools: httpx's pool does work in proportion to its connections on every request
    # and answer, so one pool of 1,000 costs the client seconds of CPU when they all return.
    pools = [httpx.AsyncClient(limits=httpx.Limits(max_connections=POOL_SIZE + 5, max_keepalive_connections=POOL_SIZE),
                               timeout=httpx.Timeout(70.0, connect=30.0, pool=30.0))
             for _ in range(0, count, POOL_SIZE)]
    async with contextlib.AsyncExitStack() as stack:
        for pool in pools:
            await stack.enter_async_context(pool)
        tasks = [asyncio.create_task(_one_wait(pools[i // POOL_SIZE], url, keys[i % len(keys)]))
                 for i in range(count)]
        conn.send(("launched", count))
        command = await asyncio.to_thread(_recv, conn, 90.0)
        in_flight = sum(not t.done() for t in tasks)
        early = [t.result()[1] for t in tasks if t.done()]
        report: dict[str, Any] = {"in_flight": in_flight, "early": early[:5], "early_count": len(early)}
        if command == "wake":
            cpu = time.process_time()
            async with httpx.AsyncClient(timeout=httpx.Timeout(30.0)) as poster:
                response = await poster.post(url, content=call_body("post_message",
                                                                    {"project": PROJECT, "body": wake_body}),
                                             headers=call_headers("post_message", poster_key))
                posted = time.monotonic()
                tool_output(response)
            finished, _ = await asyncio.wait(tasks, timeout=30.0)
            results = [t.result() for t in finished]
            woken = [(t, status) for t, status in results if status == "events"]
            report.update(posted=posted, woken=len(woken), finished=len(finished),
                          last_ms=(max(t for t, _ in woken) - posted) * 1000 if woken else None,
                          p50_ms=(sorted(t for t, _ in woken)[len(woken) // 2] - posted) * 1000 if woken else None,
                          other=sorted({s for _, s in results if s != "events"})[:5],
                          client_cpu_ms=(time.process_time() - cpu) * 1000)
        conn.send(("report", report))
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def hold_waiters(url: str, keys: list[str], count: int, poster_key: str, wake_body: str, conn: Any) -> None:
    """Open ``count`` wait_for_mention calls at once over ``keys``; on "wake", post ``wake_body`` and time the returns.

    Sends ``("launched", count)`` once every call is started, then waits (90 s at most) for a
    command from the bench process, and answers ``("report", {...})``.
    """
    asyncio.run(_hold_waiters(url, keys, count, poster_key, wake_body, conn))


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
