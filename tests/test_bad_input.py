"""Bad input against a real `prickle serve`: every class of bad value at every /api endpoint and MCP tool.

Each answer must be a clear invalid_input that names the field, never a 500 or ``internal``,
and nothing may be written (the outbox and the audit log stay as they were). The server's
stderr must hold no traceback at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess

import httpx
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError

import prickle
from conftest import PRICKLE, PROJECT, Served, World
from helpers import written

#: Raw JSON text of each class of value no field can take, keyed by a name for failure messages.
BAD_VALUES = {
    "lone surrogate": '"\\ud800 x"',
    "5000 digits": "9" * 5000,
    "200 levels deep": "[" * 200 + "]" * 200,
    "NaN": "NaN",
    "1e999": "1e999",
    "2**53": str(2 ** 53),
}
#: Times a JSON Schema date-time check lets through that no datetime can hold in UTC.
BAD_TIMES = ["0000-01-01T00:00:00Z", "9999-12-31T23:59:59-23:59", "0001-01-01T00:00:00+23:59"]

#: Every /api endpoint that takes a body, with its fields (``{id}`` is filled with a made-up id).
API_BODIES = [
    ("POST", "/api/projects", ["slug", "name", "team", "description"]),
    ("POST", "/api/agents", ["name", "display_name", "model", "client", "role", "capabilities", "projects"]),
    ("POST", "/api/keys", ["agent_id", "project", "label"]),
    ("POST", f"/api/projects/{PROJECT}/rename", ["name"]),
    ("POST", f"/api/projects/{PROJECT}/lead", ["agent_id"]),
    ("POST", f"/api/projects/{PROJECT}/lead/answer", ["decision"]),
    ("POST", "/api/tasks/{id}/title", ["title"]),
    ("POST", "/api/tasks/{id}/blocked-by", ["blocked_by"]),
    ("POST", f"/api/projects/{PROJECT}/members", ["handle", "role"]),
    ("POST", "/api/teams/web/apps", ["apps"]),
    ("POST", f"/api/projects/{PROJECT}/invites", ["email", "role"]),
    ("POST", "/api/invite", ["token"]),
    ("POST", "/api/invite/accept", ["token", "handle", "display_name", "email"]),
    ("POST", "/api/invite/decline", ["token"]),
    ("POST", "/api/signin/email", ["email"]),
    ("POST", "/api/me/email", ["email"]),
    ("POST", "/api/me/digest", ["minutes"]),
    ("POST", f"/api/projects/{PROJECT}/agents", ["agent_id"]),
    ("POST", f"/api/projects/{PROJECT}/resume", ["agents"]),
    ("POST", f"/api/projects/{PROJECT}/memory", ["key", "value"]),
    ("POST", f"/api/projects/{PROJECT}/messages", ["body", "task_id", "in_reply_to"]),
    ("POST", f"/api/projects/{PROJECT}/read", ["message_id", "task_id"]),
    ("POST", "/api/approvals/{id}", ["decision", "standing"]),
    ("POST", f"/api/projects/{PROJECT}/task-requests", ["agent", "packet"]),
    ("POST", "/api/tasks/{id}/accept", ["reason"]),
    ("POST", "/api/tasks/{id}/send-back", ["reason"]),
    ("POST", "/api/tasks/{id}/cancel", ["reason"]),
    ("POST", "/api/rules", ["decision", "agent", "owner", "expires_at"]),
    ("POST", "/api/policy", ["auto_accept"]),
    ("POST", "/api/actions/{id}", ["decision"]),
    ("POST", "/api/room", ["reply_mode", "lead", "default_agent"]),
    ("POST", "/api/room/stop", ["turn"]),
    ("POST", "/api/room/schedules", ["agent", "project", "text", "recurrence", "timezone", "room"]),
    ("POST", "/api/room/schedules/{id}", ["version", "agent", "project", "text", "recurrence", "timezone"]),
    ("POST", "/api/room/schedules/{id}/pause", ["version"]),
    ("POST", "/api/room/schedules/{id}/resume", ["version"]),
    ("POST", "/api/devices", ["agent_id", "name"]),
    ("POST", "/api/steps/{id}", ["decision"]),
    ("POST", "/api/signout", ["all"]),
    ("POST", "/api/runner/actions", ["tool", "action", "prompt", "cost_estimate"]),
    ("POST", "/api/runner/actions/{id}/claim", ["note"]),
    ("POST", "/api/runner/actions/{id}/finish", ["body", "failure"]),
]
#: Query parameters (and the stream's Last-Event-ID) that take whole numbers.
API_NUMBERS = [
    (f"/api/projects/{PROJECT}/room", "limit"),
    (f"/api/projects/{PROJECT}/events", "after"),
    (f"/api/projects/{PROJECT}/events", "wait"),
    (f"/api/projects/{PROJECT}/audit", "before"),
    (f"/api/projects/{PROJECT}/audit", "limit"),
    (f"/api/projects/{PROJECT}/stream", "after"),
    ("/api/stream", "after"),
    ("/api/events", "after"),
    ("/api/events", "wait"),
    ("/api/search", "limit"),
]


@pytest.fixture
def served(db_path: str):
    world = World(db_path)
    world.runner = prickle.pair_device(world.db, "oj", "oj/muse")[1]
    with Served(db_path) as s:
        s.world = world
        yield s
    world.db.close()


def stop_and_read_stderr(served: Served) -> str:
    """Stop the server and return everything it wrote on stderr."""
    served.proc.terminate()
    served.proc.wait(15)
    return served.proc.stderr.read()


def check_refusal(r: httpx.Response, field: str, what: str) -> None:
    assert r.status_code == 400, (what, r.status_code, r.text)
    error = r.json()["error"]
    assert error["code"] == "invalid_input", (what, error)
    assert field in error["message"], (what, error)


def test_every_api_endpoint_refuses_each_bad_value_naming_the_field_and_writes_nothing(served):
    world, base = served.world, served.info["url"]
    before = written(world.db)
    person = {"Authorization": f"Bearer {world.tokens['oj']}", "Content-Type": "application/json"}
    runner = {"Authorization": f"Bearer {world.runner}", "Content-Type": "application/json"}
    with httpx.Client(base_url=base, timeout=30) as http:
        for method, path, fields in API_BODIES:
            headers = runner if path.startswith("/api/runner/") else person
            url = path.replace("{id}", "x_1")
            for field in fields:
                for name, raw in BAD_VALUES.items():
                    r = http.request(method, url, content=f'{{"{field}": {raw}}}', headers=headers)
                    check_refusal(r, field, f"{method} {path} {field}: {name}")
            # Bodies no field of which can be read: nested past what a parser takes, not UTF-8, not JSON.
            for raw, says in ((b'{"a": ' + b"[" * 5000 + b"]" * 5000 + b"}", "nested more than 64 levels"),
                              (b'{"body": "\xff\xfe"}', "not UTF-8"), (b'{"body": ', "not JSON"),
                              (b"[1, 2]", "one JSON object")):
                r = http.request(method, url, content=raw, headers=headers)
                check_refusal(r, says, f"{method} {path}: {raw[:20]!r}")
        for when in BAD_TIMES:
            body = {"decision": "allow", "agent": "ren/builder", "expires_at": when}
            check_refusal(http.post("/api/rules", json=body, headers=person), "expires_at", when)
        for path, param in API_NUMBERS:
            # A live position however large is not bad input: it resyncs (tests/test_api.py).
            huge = () if param == "after" else ("9" * 5000,)
            for raw in ("²", *huge, "-1", "1e3"):
                r = http.get(path, params={param: raw}, headers=person)
                check_refusal(r, param, f"{path}?{param}={raw[:10]}")
        r = http.get(f"/api/projects/{PROJECT}/stream", headers=person | {"Last-Event-ID": "²".encode()})
        check_refusal(r, "Last-Event-ID", "stream Last-Event-ID")
    assert written(world.db) == before
    assert "Traceback" not in stop_and_read_stderr(served)


def _mcp_post(http: httpx.Client, url: str, key: str, body: str, session: str | None = None,
              tool: str = "") -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}", "Accept": "application/json, text/event-stream",
               "Content-Type": "application/json"}
    if session:
        headers |= {"Mcp-Session-Id": session, "MCP-Protocol-Version": "2025-11-25"}
    else:
        headers |= {"MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/call", "Mcp-Name": tool}
    return http.post(url, content=body, headers=headers)


def _tool_call_text(name: str, arguments: str, modern: bool) -> str:
    meta = ('"_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28", '
            '"io.modelcontextprotocol/clientInfo": {"name": "tests", "version": "1"}, '
            '"io.modelcontextprotocol/clientCapabilities": {}}, ') if modern else ""
    return f'{{"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {{{meta}"name": "{name}", ' \
           f'"arguments": {arguments}}}}}'


def _answer(r: httpx.Response) -> dict:
    if r.headers["content-type"].startswith("text/event-stream"):
        return [json.loads(line[5:]) for line in r.text.splitlines() if line.startswith("data:")][-1]
    return r.json()


def check_tool_refusal(r: httpx.Response, field: str, what: str) -> None:
    """A tool result ``invalid_input: …`` or a JSON-RPC error with data.code invalid_input, naming ``field``."""
    assert r.status_code in (200, 400), (what, r.status_code, r.text[:300])
    answer = _answer(r)
    if "result" in answer:
        result = answer["result"]
        assert result.get("isError"), (what, result)
        text = result["content"][0]["text"]
        assert text.startswith("invalid_input: ") and field in text, (what, text)
    else:
        error = answer["error"]
        assert error.get("data", {}).get("code") == "invalid_input" and field in error["message"], (what, error)
    assert "internal" not in r.text and "pydantic" not in r.text, (what, r.text[:300])


def _open_session(http: httpx.Client, url: str, key: str) -> str:
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
    r = http.post(url, json=init, headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json",
                                           "Accept": "application/json, text/event-stream"})
    assert r.status_code == 200, r.text
    session = r.headers["mcp-session-id"]
    note = _mcp_post(http, url, key, '{"jsonrpc": "2.0", "method": "notifications/initialized"}', session)
    assert note.status_code == 202
    return session


def test_every_mcp_tool_refuses_each_bad_value_naming_the_field_in_both_eras(served):
    world, url = served.world, served.info["mcp"]
    before = written(world.db)
    key = world.keys["oj/muse"]
    with httpx.Client(timeout=30) as http:
        session = _open_session(http, url, key)
        for name in prickle.TOOLS:
            for field in prickle.SCHEMAS[name][0]["properties"]:
                for bad, raw in BAD_VALUES.items():
                    for modern in (True, False):
                        text = _tool_call_text(name, f'{{"{field}": {raw}}}', modern)
                        r = _mcp_post(http, url, key, text, None if modern else session, name)
                        check_tool_refusal(r, field, f"{name}.{field}: {bad} ({'modern' if modern else 'handshake'})")
        evidence = {"kind": "note", "summary": "ran it"}
        for when in BAD_TIMES:
            for name, args, field in (
                    ("check_inbox", {"project_unchanged_since": when}, "project_unchanged_since"),
                    ("return_result", {"task_id": "task_1", "summary": "done", "provenance": "agent_generated",
                                       "evidence": [evidence | {"observed_at": when}]}, "evidence[0].observed_at")):
                for modern in (True, False):
                    r = _mcp_post(http, url, key, _tool_call_text(name, json.dumps(args), modern),
                                  None if modern else session, name)
                    check_tool_refusal(r, field, f"{name} {when}")
    assert written(world.db) == before
    assert "Traceback" not in stop_and_read_stderr(served)


def test_a_malformed_handshake_era_body_is_answered_in_prickles_words(served):
    url, key = served.info["mcp"], served.world.keys["oj/muse"]
    with httpx.Client(timeout=30) as http:
        session = _open_session(http, url, key)
        for body, says in (('{"jsonrpc": "1.0", "id": 1, "method": "tools/list"}', 'jsonrpc must be "2.0"'),
                           ("[1, 2]", "one JSON object"), ('{"jsonrpc": "2.0", "id": 1', "not JSON"),
                           ('{"jsonrpc": "2.0", "id": 1, "method": 5}', "method must be text")):
            r = _mcp_post(http, url, key, body, session)
            assert r.status_code == 400, r.text
            answer = r.json()
            assert answer["jsonrpc"] == "2.0" and answer["id"] is None
            assert says in answer["error"]["message"] and answer["error"]["data"] == {"code": "invalid_input"}
            for leak in ("pydantic", "Validation error", "JSONRPCRequest", "input_value", "1.0'"):
                assert leak not in r.text, (leak, r.text)


@contextlib.asynccontextmanager
async def client(url: str, key: str | None, mode: str):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with create_mcp_http_client(headers=headers) as http:
        async with Client(streamable_http_client(url, http_client=http), mode=mode) as c:
            yield c


def test_an_unknown_tool_is_a_protocol_error_in_both_eras(served):
    url, key = served.info["mcp"], served.world.keys["oj/muse"]

    async def scenario(mode: str) -> MCPError:
        async with client(url, key, mode) as c:
            with pytest.raises(MCPError) as caught:
                await c.call_tool("no_such_tool", {})
            return caught.value

    for mode in ("auto", "legacy"):
        error = asyncio.run(scenario(mode))
        assert error.error.code == -32602, mode
        assert error.error.message == "unknown tool 'no_such_tool': call tools/list for the tools served here"


def test_a_refused_key_reaches_the_mcp_client_as_prickles_message(served, db_path):
    url, world = served.info["mcp"], served.world
    record, key = prickle.create_token(world.db, "client", agent_id="oj/muse")
    prickle.revoke_token(world.db, record["id"])

    async def scenario(key: str | None, mode: str) -> str:
        with pytest.raises(BaseException) as caught:
            async with client(url, key, mode) as c:
                await c.list_tools()
        error = caught.value
        while isinstance(error, BaseExceptionGroup):
            error = error.exceptions[0]
        assert isinstance(error, MCPError), repr(error)
        return error.error.message

    for mode in ("auto", "legacy"):
        assert "revoked" in asyncio.run(scenario(key, mode)), mode
        assert asyncio.run(scenario(None, mode)).startswith("no credential: send 'Authorization: Bearer <key>'")
    r = httpx.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
    assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Bearer")
    assert r.json() == {"jsonrpc": "2.0", "id": None, "error": {
        "code": prickle.MCP_REFUSED, "message": r.json()["error"]["message"], "data": {"code": "unauthorized"}}}


def test_the_command_line_refuses_broken_text_and_impossible_times_in_one_line(db_path):
    world = World(db_path)
    before = written(world.db)
    for args, status, says in (
            (["person", "add", "kim", "--name", "Kim \udcff"], 2, "argument 5 is not valid UTF-8 text"),
            (["rule", "set", "oj", "--decision", "allow", "--expires", "9999-12-31T23:59:59-23:59"], 1,
             "expires_at must be an ISO 8601 time with its zone between the years 1 and 9999"),
            (["rule", "set", "oj", "--decision", "allow", "--expires", "0000-01-01T00:00:00Z"], 1,
             "expires_at must be an ISO 8601 time"),
            (["serve", "--port", "70000"], 2, "Invalid value for '--port': 70000 is not in the range")):
        # The surrogate escape is how Python hands on bytes the locale could not decode.
        argv = [a.encode("utf-8", "surrogateescape") for a in PRICKLE + args + ["--db", db_path]]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        assert done.returncode == status, done.stderr
        assert done.stderr.startswith(f"prickle: {says}") and done.stderr.count("\n") == 1, done.stderr
    assert written(world.db) == before
    assert world.db.scalar("SELECT count(*) FROM people WHERE handle = 'kim'") == 0
    world.db.close()


def test_a_tool_call_whose_arguments_or_name_are_of_the_wrong_type_is_refused_naming_them_in_both_eras(served):
    url, key = served.info["mcp"], served.world.keys["oj/muse"]
    before = written(served.world.db)
    arguments = {"code": -32602, "message": "arguments must be an object: the tool's inputs by name ({} for none)",
                 "data": {"code": "invalid_input"}}
    name = {"code": -32602, "message": "name must be text: the tool to call, as tools/list names it",
            "data": {"code": "invalid_input"}}
    with httpx.Client(timeout=30) as http:
        session = _open_session(http, url, key)
        for modern in (True, False):
            bodies = [(_tool_call_text("check_inbox", bad, modern), arguments) for bad in ("[1]", '"x"', "5", "true")]
            if not modern:  # in the other era the Mcp-Name header must match the name first
                bodies.append((_tool_call_text("check_inbox", "{}", modern).replace('"name": "check_inbox"',
                                                                                    '"name": 5'), name))
                bad = lambda message: {"code": -32602, "message": message, "data": {"code": "invalid_input"}}  # noqa
                call = '{"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": %s}'
                bodies += [
                    (call % "null", bad('params must be an object: {"name": the tool, "arguments": {…}}')),
                    (call % '{"name": "check_inbox", "_meta": 5}', bad("params._meta must be an object, or left out")),
                    (call % '{"name": "check_inbox", "_meta": {"progressToken": [1]}}',
                     bad("params._meta.progressToken must be text or a whole number"))]
            for body, error in bodies:
                r = _mcp_post(http, url, key, body, None if modern else session, "check_inbox")
                assert r.status_code == (400 if modern else 200), (body, r.text)
                assert _answer(r) == {"jsonrpc": "2.0", "id": 7, "error": error}, body
        # In the other era the transport refuses params that are not an object itself: in Prickle's words too.
        r = _mcp_post(http, url, key, '{"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": [1]}', None,
                      "check_inbox")
        assert r.status_code == 400 and r.json()["error"]["message"] == "params must be an object"
        assert r.json()["error"]["data"] == {"code": "invalid_input"}
    assert written(served.world.db) == before
