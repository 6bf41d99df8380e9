"""What ``prickle serve`` holds against slow, idle or greedy clients: connection and session caps.

Each test drives a real ``prickle serve`` process on 127.0.0.1 with a bounded number of
sockets and sessions.
"""

import json
import logging
import resource
import select
import socket
import subprocess

import httpx

import prickle
from conftest import PRICKLE, PROJECT, Served, in_thread

LEGACY = "2025-11-25"


def _settings(tmp_path, **values) -> str:
    path = tmp_path / "prickle.toml"
    path.write_text("".join(f"{k} = {json.dumps(v)}\n" for k, v in values.items()))
    return str(path)


def _file_limit(n: int):
    def apply():
        resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))
    return apply


def _tool(http: httpx.Client, url: str, key: str, name: str, args: dict) -> dict:
    """One tools/call over plain HTTP (protocol 2026-07-28); its structuredContent."""
    meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientInfo": {"name": "limits", "version": "1"},
            "io.modelcontextprotocol/clientCapabilities": {}}
    r = http.post(url, headers={
        "Authorization": f"Bearer {key}", "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/call", "Mcp-Name": name},
        json={"jsonrpc": "2.0", "id": 1, "method": "tools/call",
              "params": {"name": name, "arguments": args, "_meta": meta}})
    assert r.status_code == 200, r.text
    if r.headers["content-type"].startswith("text/event-stream"):
        messages = [json.loads(line[5:]) for line in r.text.splitlines() if line.startswith("data:")]
        result = [m for m in messages if "id" in m][-1]["result"]
    else:
        result = r.json()["result"]
    assert not result.get("isError"), result
    return result["structuredContent"]


def _read_to_end(sock: socket.socket) -> bytes:
    """What the server sent until it closed; empty if it reset the connection (closed it unread)."""
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except ConnectionResetError:
        return b""
    return data


def test_connections_that_never_finish_their_request_lock_nobody_out(world, tmp_path):
    log = tmp_path / "serve.log"
    config = _settings(tmp_path, request_timeout_seconds=2, access_log=False)  # the log below is the guard's alone
    with open(log, "w") as err, Served(world.db_path, "--config", config, stderr=err,
                                        preexec_fn=_file_limit(256)) as served:
        host, port = "127.0.0.1", served.info["port"]
        slow = []
        for _ in range(300):  # more than the 256 files the process may open
            s = socket.create_connection((host, port), timeout=30)
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Never-Ends: ")
            slow.append(s)
        with httpx.Client(timeout=20) as http:
            # A wait that outlives the request deadline is an answer in progress: it is not cut.
            waiting = in_thread(_tool, http, served.info["mcp"], world.keys["oj/muse"], "wait_for_mention",
                                {"project": PROJECT, "timeout_seconds": 5})
            health = http.get(f"{served.info['url']}/healthz")
            assert health.status_code == 200 and health.json()["ok"] is True
            assert waiting()["status"] == "timeout"
        answers = [_read_to_end(s) for s in slow]
        for s in slow:
            s.close()
    timed_out = json.dumps({"error": {"code": "request_timeout", "message": (
        "the request was not complete within 2 seconds (request_timeout_seconds): send it again, whole")}})
    evicted = json.dumps({"error": {"code": "unavailable", "message": (
        "the server keeps at most 120 connections (max_connections) and this one had not sent a complete "
        "request: send it again, whole")}})
    kinds = {}
    for answer in answers:
        head, _, body = answer.partition(b"\r\n\r\n")
        status = head.split(b"\r\n")[0].decode()
        kinds[status] = kinds.get(status, 0) + 1
        assert (status, body.decode()) in {("", ""), ("HTTP/1.1 408 Request Timeout", timed_out),
                                           ("HTTP/1.1 503 Service Unavailable", evicted)}, answer
    assert kinds["HTTP/1.1 408 Request Timeout"] >= 1 and sum(kinds.values()) == 300
    assert log.read_text().splitlines() == [
        "prickle: keeping at most 120 connections open, not 1000 (max_connections): this process may open "
        "only 256 files (raise it with 'ulimit -n')"]


def test_a_connection_beyond_the_cap_is_refused_clearly_when_all_are_busy(world, tmp_path):
    config = _settings(tmp_path, max_connections=16, request_timeout_seconds=2)
    with Served(world.db_path, "--config", config) as served:
        host, port = "127.0.0.1", served.info["port"]
        streams = []
        for _ in range(16):
            s = socket.create_connection((host, port), timeout=30)
            s.sendall(f"GET /api/projects/{PROJECT}/stream HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                      f"Authorization: Bearer {world.tokens['oj']}\r\n\r\n".encode())
            got = b""
            while b"\n\n" not in got.partition(b"\r\n\r\n")[2]:  # the stream's first event
                got += s.recv(65536)
            assert got.startswith(b"HTTP/1.1 200 OK\r\n")
            streams.append(s)
        refused = httpx.get(f"{served.info['url']}/healthz", timeout=20)
        assert refused.status_code == 503
        assert refused.headers["retry-after"] == "5"
        assert refused.json() == {"error": {"code": "unavailable", "message": (
            "the server has 16 connections open (max_connections), each busy with a request: "
            "try again in a few seconds")}}
        for s in streams:
            s.close()


def test_clients_that_never_read_their_answers_lock_nobody_out(world, tmp_path):
    config = _settings(tmp_path, max_connections=16, request_timeout_seconds=2)
    with Served(world.db_path, "--config", config) as served:
        host, port = "127.0.0.1", served.info["port"]
        # Pipelined requests for the page's style sheet, far more than any socket buffer holds,
        # from clients that read nothing: every answer stalls and the connection looks busy.
        pipelined = b"GET /static/style.css HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" * 400
        silent = []
        for _ in range(20):
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
            s.connect((host, port))
            s.sendall(pipelined)
            silent.append(s)
        # Without reading a byte (reading would let the answers through), each must be closed by
        # the server: a stalled answer is cut after request_timeout_seconds, like an unfinished request.
        ended = select.POLLRDHUP | select.POLLHUP | select.POLLERR
        for s in silent:
            poller = select.poll()
            poller.register(s, ended)
            assert poller.poll(30_000), "the server kept a connection whose client reads nothing"
            s.close()
        health = httpx.get(f"{served.info['url']}/healthz", timeout=20)
        assert health.status_code == 200 and health.json()["ok"] is True


def test_a_log_line_that_repeats_is_written_once_a_minute_with_a_count():
    now = [1000.0]
    limiter = prickle.RepeatLimiter(window=60, clock=lambda: now[0])
    records = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())
    handler.addFilter(limiter)
    logger = logging.getLogger("test.repeats")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        for _ in range(1000):
            try:
                raise OSError(24, "Too many open files")
            except OSError:
                logger.error("socket.accept() out of system resource", exc_info=True)
        logger.error("another line")
        now[0] += 59
        logger.error("socket.accept() out of system resource")
        now[0] += 2
        logger.error("socket.accept() out of system resource")
        try:
            raise OSError(24, "Too many open files")
        except OSError:
            logger.error("socket.accept() out of system resource", exc_info=True)
    finally:
        logger.removeHandler(handler)
    assert records == ["socket.accept() out of system resource", "another line",
                       "socket.accept() out of system resource",
                       "socket.accept() out of system resource (999 more like it were left out)"]


def _initialize(http: httpx.Client, url: str, key: str) -> httpx.Response:
    """Open a handshake-era session; return the initialize response."""
    r = http.post(url, headers={"Authorization": f"Bearer {key}", "Accept": "application/json, text/event-stream"},
                  json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                      "protocolVersion": LEGACY, "capabilities": {}, "clientInfo": {"name": "limits", "version": "1"}}})
    if r.status_code == 200:
        done = http.post(url, headers=_in_session(key, r.headers["mcp-session-id"]),
                         json={"jsonrpc": "2.0", "method": "notifications/initialized"})
        assert done.status_code == 202, done.text
    return r


def _in_session(key: str, session_id: str) -> dict:
    return {"Authorization": f"Bearer {key}", "Accept": "application/json, text/event-stream",
            "Mcp-Session-Id": session_id, "MCP-Protocol-Version": LEGACY}


def _ping(http: httpx.Client, url: str, key: str, session_id: str) -> int:
    return http.post(url, headers=_in_session(key, session_id),
                     json={"jsonrpc": "2.0", "id": 2, "method": "ping"}).status_code


def test_one_key_cannot_use_up_the_sessions_and_revoking_it_ends_them(world, tmp_path):
    config = _settings(tmp_path, max_sessions=4, max_sessions_per_key=3)
    record, key_a = prickle.create_token(world.db, "client", agent_id="oj/muse")
    key_b, key_c = world.keys["ren/builder"], world.keys["oj/scout"]
    with Served(world.db_path, "--config", config) as served, httpx.Client(timeout=20) as http:
        url = served.info["mcp"]
        opened = [_initialize(http, url, key_a) for _ in range(5)]
        assert [r.status_code for r in opened] == [200] * 5
        ids = [r.headers["mcp-session-id"] for r in opened]
        # The key's sessions idle the longest made room for its newer ones.
        assert [_ping(http, url, key_a, sid) for sid in ids] == [404, 404, 200, 200, 200]
        assert _initialize(http, url, key_b).status_code == 200
        full = _initialize(http, url, key_c)
        assert full.status_code == 503, full.text  # four sessions in all, the server's cap

        # With a request in flight in each of its sessions, the key's next one is refused.
        with _Streams(http, url, key_a, ids[2:]) as streams:
            busy = _initialize(http, url, key_a)
            assert busy.status_code == 429
            assert busy.json() == {"error": {"code": "too_many_sessions", "message": (
                "this key already has 3 MCP sessions with a request in flight (max_sessions_per_key): end one "
                "(HTTP DELETE with its Mcp-Session-Id) or wait for one to finish")}}

            revoked = subprocess.run(PRICKLE + ["token", "revoke", record["id"], "--db", world.db_path],
                                     capture_output=True, text=True, timeout=60)
            assert revoked.returncode == 0, revoked.stderr
            for stream in streams:  # each open stream of the revoked key ends
                assert in_thread(_drain, stream)() == b""
        assert _initialize(http, url, key_c).status_code == 200  # its sessions no longer count
        assert _ping(http, url, key_b, _initialize(http, url, key_b).headers["mcp-session-id"]) == 200


def _drain(stream: httpx.Response) -> bytes:
    """Everything but keep-alive pings a stream sends until it ends."""
    return b"".join(c for c in stream.iter_bytes() if not c.startswith(b":"))


class _Streams:
    """Open a standalone GET stream in each of these sessions; close them on exit."""

    def __init__(self, http: httpx.Client, url: str, key: str, session_ids: list[str]):
        self.managers = [http.stream("GET", url, headers=_in_session(key, sid) | {"Accept": "text/event-stream"})
                         for sid in session_ids]

    def __enter__(self) -> list[httpx.Response]:
        streams = [m.__enter__() for m in self.managers]
        assert [s.status_code for s in streams] == [200] * len(streams)
        return streams

    def __exit__(self, *exc) -> None:
        for m in self.managers:
            m.__exit__(None, None, None)


def test_revoking_a_key_on_the_page_ends_its_sessions_at_once(world, tmp_path):
    record, key = prickle.create_token(world.db, "client", agent_id="oj/muse")
    with Served(world.db_path) as served, httpx.Client(timeout=20) as http:
        url = served.info["mcp"]
        session = _initialize(http, url, key).headers["mcp-session-id"]
        other = _initialize(http, url, world.keys["ren/builder"]).headers["mcp-session-id"]
        with _Streams(http, url, key, [session]) as streams:
            gone = http.delete(f"{served.info['url']}/api/keys/{record['id']}",
                               headers={"Authorization": f"Bearer {world.tokens['oj']}"})
            assert gone.status_code == 200, gone.text
            assert in_thread(_drain, streams[0])() == b""
        assert _ping(http, url, world.keys["ren/builder"], other) == 200


def test_at_the_cap_a_newcomer_closes_an_idle_connection_then_sheds_the_oldest_held_wait_then_is_refused():
    guard = prickle.ConnectionGuard(max_connections=16, request_seconds=5)
    guard.limit = 3
    closed, shed = [], []

    class Connection:
        def __init__(self, name):
            self.name = name

        def close_waiting(self, answer):
            closed.append(self.name)
            guard.open.discard(self)
            guard.waiting.pop(self, None)

        def close_after_answer(self):
            closed.append(f"{self.name} after its answer")

    idle, old_wait, new_wait = Connection("idle"), Connection("old wait"), Connection("new wait")
    guard.open |= {idle, old_wait, new_wait}
    guard.waiting[idle] = None
    guard.held[old_wait] = lambda: shed.append("old wait")
    guard.held[new_wait] = lambda: shed.append("new wait")
    assert guard.make_room() is True and closed == ["idle"] and shed == []  # an idle one goes first
    guard.open.add(Connection("newcomer"))
    assert guard.make_room() is True and shed == ["old wait"] and closed[-1] == "old wait after its answer"
    assert list(guard.held) == [new_wait]
    assert guard.make_room() is True and shed == ["old wait", "new wait"]
    assert guard.make_room() is False  # nothing idle and no wait held: the newcomer is refused


def test_marking_a_device_stolen_ends_its_keys_sessions_at_once(world, tmp_path):
    device, key = prickle.pair_device(world.db, "oj", "oj/muse", "oj-laptop")
    with Served(world.db_path) as served, httpx.Client(timeout=20) as http:
        url = served.info["mcp"]
        session = _initialize(http, url, key).headers["mcp-session-id"]
        other = _initialize(http, url, world.keys["ren/builder"]).headers["mcp-session-id"]
        with _Streams(http, url, key, [session]) as streams:
            gone = http.post(f"{served.info['url']}/api/devices/{device['id']}/stolen",
                             headers={"Authorization": f"Bearer {world.tokens['oj']}"})
            assert gone.json()["reason"] == "stolen", gone.text
            assert in_thread(_drain, streams[0])() == b""
        assert _ping(http, url, world.keys["ren/builder"], other) == 200
