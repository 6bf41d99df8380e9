"""Shared fixtures: a fresh database, a seeded team, an in-process server and an MCP caller.

Every structuredContent a test receives through :class:`MCP` is validated against the
reference's output schema (tests/fixtures/tools.json), and at the end of each test every
outbox event is validated against tests/fixtures/events.json.
"""

from __future__ import annotations

import json
import os
import py_compile
import threading
from pathlib import Path

import jsonschema
import pytest
from starlette.testclient import TestClient

import prickle

# The steps the tests share live in helpers.py and the browser tests' in browser.py, imported by name
# where used; their fixtures (a mail server and a clock; a served demo, one browser, people signed in)
# reach every test as a plugin's.
pytest_plugins = ["helpers", "browser"]

FIXTURES = Path(__file__).parent / "fixtures"
REFERENCE_TOOLS = json.loads((FIXTURES / "tools.json").read_text())
REFERENCE_EVENTS = json.loads((FIXTURES / "events.json").read_text())
_FORMATS = jsonschema.FormatChecker()
PROJECT = "website-v2"
_TOOL_OUTPUT = {name: jsonschema.Draft202012Validator(t["output_schema"], format_checker=_FORMATS)
                for name, t in REFERENCE_TOOLS.items()}
_EVENT = {name: jsonschema.Draft202012Validator(s, format_checker=_FORMATS) for name, s in REFERENCE_EVENTS.items()}


def pytest_configure(config):
    """Compile prickle.py's bytecode once, where every ``prickle`` process the tests start reads it.

    Each CLI call, server and runner a test starts imports the module afresh; where bytecode is not
    written (PYTHONDONTWRITEBYTECODE, a read-only checkout) each would compile 1.2 MB of source, about
    a second of CPU, hundreds of times a run. Python reads a cached file even where it writes none."""
    try:
        py_compile.compile(prickle.__file__, doraise=True)
    except (OSError, py_compile.PyCompileError):
        pass  # nowhere to write it: each process compiles for itself, as before


def pytest_collection_modifyitems(config, items):
    """The soak test (minutes, where the next longest file takes one) first, so the other workers
    share out the rest of the files meanwhile instead of one worker ending the run with it alone."""
    items.sort(key=lambda item: item.path.name != "test_soak.py")


def check_tool_output(tool: str, structured: dict) -> None:
    """Fail unless ``structured`` is valid against the reference's output schema of ``tool``."""
    _TOOL_OUTPUT[tool].validate(structured)


def check_event(event: dict) -> None:
    """Fail unless an outbox event is valid against the reference's schema for its type."""
    _EVENT[event["type"]].validate(event)


def all_events(db: prickle.Database) -> list[dict]:
    """Every outbox event, whole (common fields and payload)."""
    return [{"id": r["id"], "seq": r["seq"], "project": r["project"], "at": r["at"], "type": r["type"]}
            | json.loads(r["payload"]) for r in db.rows("SELECT * FROM outbox ORDER BY seq")]


def audit_entries(db: prickle.Database, chain: str, type_: str | None = None) -> list[dict]:
    """Audit entries of one chain (optionally of one type) with refs decoded."""
    rows = db.rows("SELECT * FROM audit WHERE chain = ? ORDER BY n", (chain,))
    return [r | {"refs": json.loads(r["refs"])} for r in rows if type_ is None or r["type"] == type_]


class World:
    """A seeded team: oj (owner) and ren (member) in website-v2, sam outside it (all three in team web).

    Agents oj/muse, oj/scout and ren/builder are in the project; sam/lone is not. ``keys``
    maps each agent to a client key for every project; ``tokens`` maps people to personal
    tokens.
    """

    def __init__(self, db_path: str):
        self.db_path = db_path
        db = self.db = prickle.Database(db_path)
        for handle, name in (("oj", "Oj Okafor"), ("ren", "Ren Ito"), ("sam", "Sam Lee")):
            prickle.add_person(db, handle, name)
        prickle.create_project(db, PROJECT, "Website v2", "web", "oj", "The new site.")
        for handle in ("ren", "sam"):
            prickle.add_to_team(db, "web", handle)
        prickle.add_member(db, PROJECT, "ren", by="oj")
        prickle.create_project(db, "side", "Side project", "web", "sam")
        prickle.add_agent(db, "oj/muse", "Muse", "claude-opus-4", "claude-code", "Copywriter",
                          [{"kind": "other", "name": "Docs"}], [PROJECT])
        prickle.add_agent(db, "oj/scout", "Scout", "claude-haiku", "claude-code", "Research", [], [PROJECT])
        prickle.add_agent(db, "ren/builder", "Builder", "gpt-5-codex", "codex", "Frontend",
                          [{"kind": "repo", "name": "website"}], [PROJECT])
        prickle.add_agent(db, "sam/lone", "Lone", "gpt-5", "codex", "", [], ["side"])
        self.keys = {a: prickle.create_token(db, "client", agent_id=a)[1]
                     for a in ("oj/muse", "oj/scout", "ren/builder", "sam/lone")}
        self.tokens = {h: prickle.create_token(db, "person", person=h)[1] for h in ("oj", "ren", "sam")}

    def actor(self, agent_id: str) -> prickle.Actor:
        """The Actor a full-reach client key of ``agent_id`` resolves to."""
        return prickle.resolve_token(self.db, self.keys[agent_id], ("client",))

    def person(self, handle: str) -> prickle.Actor:
        """The Actor a personal token of ``handle`` resolves to."""
        return prickle.resolve_token(self.db, self.tokens[handle], ("person",))


class MCP:
    """Calls tools on /mcp as a real client would (protocol 2026-07-28, one POST per call)."""

    def __init__(self, client: TestClient, keys: dict[str, str]):
        self.client, self.keys = client, keys
        self._id = 0

    def raw(self, token: str | None, method: str, params: dict | None = None, name: str | None = None,
            headers: dict | None = None):
        """POST one JSON-RPC request; return the httpx response."""
        self._id += 1
        meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "io.modelcontextprotocol/clientInfo": {"name": "tests", "version": "1"},
                "io.modelcontextprotocol/clientCapabilities": {}}
        params = dict(params or {})
        params["_meta"] = meta | params.get("_meta", {})
        body = {"jsonrpc": "2.0", "id": self._id, "method": method, "params": params}
        h = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json",
             "MCP-Protocol-Version": "2026-07-28", "Mcp-Method": method}
        if name:
            h["Mcp-Name"] = name
        if token:
            h["Authorization"] = f"Bearer {token}"
        # ASCII JSON, so even text that is not valid Unicode reaches the server to be refused there.
        return self.client.post("/mcp", content=json.dumps(body), headers=h | (headers or {}))

    def rpc(self, token: str | None, method: str, params: dict | None = None, name: str | None = None) -> dict:
        """One JSON-RPC exchange; return the response message (SSE or JSON)."""
        r = self.raw(token, method, params, name)
        assert r.status_code == 200, (r.status_code, r.text)
        if r.headers["content-type"].startswith("text/event-stream"):
            messages = [json.loads(line[5:]) for line in r.text.splitlines() if line.startswith("data:")]
            return [m for m in messages if "id" in m][-1]
        return r.json()

    def call(self, agent: str, tool: str, args: dict, token: str | None = None) -> tuple[bool, object]:
        """Call ``tool`` as ``agent``; return ``(is_error, structuredContent or error text)``.

        A success's structuredContent is checked against the reference's output schema.
        """
        msg = self.rpc(token or self.keys[agent], "tools/call", {"name": tool, "arguments": args}, tool)
        result = msg["result"]
        if result.get("isError"):
            return True, result["content"][0]["text"]
        check_tool_output(tool, result["structuredContent"])
        assert json.loads(result["content"][0]["text"]) == result["structuredContent"]
        return False, result["structuredContent"]

    def ok(self, agent: str, tool: str, args: dict, token: str | None = None) -> dict:
        """Call and require success."""
        is_error, out = self.call(agent, tool, args, token)
        assert not is_error, out
        return out

    def error(self, agent: str, tool: str, args: dict, code: str, token: str | None = None) -> str:
        """Call and require a tool error with ``code``; return its text."""
        is_error, out = self.call(agent, tool, args, token)
        assert is_error, out
        assert out.startswith(f"{code}: "), out
        return out


@pytest.fixture
def db_path(tmp_path: Path) -> str:
    return str(tmp_path / "prickle.db")


@pytest.fixture
def world(db_path: str):
    w = World(db_path)
    yield w
    for event in all_events(w.db):
        check_event(event)
    assert all(r["ok"] for r in prickle.verify_audit(w.db))
    w.db.close()


@pytest.fixture
def server(world: World):
    """The whole app in-process on the world's database, with its lifespan running -- but for its retention
    piece: the tests move a controlled clock and take the retention steps themselves (retention_step), and
    the piece would race them for each step."""
    app = prickle.create_app(world.db_path, prickle.Settings(), port=8321)
    pieces = app.state.prickle.maintenance.pieces
    pieces[:] = [piece for piece in pieces if piece.name != "retention"]
    with TestClient(app, base_url="http://127.0.0.1:8321") as client:
        client.state = app.state.prickle
        yield client


@pytest.fixture
def mcp(server: TestClient, world: World) -> MCP:
    return MCP(server, world.keys)


def in_thread(fn, *args, **kwargs):
    """Start ``fn`` in a thread; return a function that joins it and returns its result."""
    box: dict = {}

    def run():
        try:
            box["value"] = fn(*args, **kwargs)
        except BaseException as e:  # re-raised in the joining thread
            box["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()

    def join(timeout: float = 30):
        t.join(timeout)
        assert not t.is_alive(), "the call did not return"
        if "error" in box:
            raise box["error"]
        return box["value"]

    return join


SHARED = Path(__file__).resolve().parent.parent.parent / "shared"
HAVE_SHARED_CLIENTS = (SHARED / "clients" / "run-conformance.sh").exists() and not os.environ.get("PRICKLE_NO_SHARED")


PRICKLE = [__import__("sys").executable, "-m", "prickle"]


class _Drained:
    """A child's stderr read as it comes (the access log must never fill the pipe); ``read`` gives it all."""

    def __init__(self, stream):
        import threading
        self.stream, self.chunks = stream, []
        self.thread = threading.Thread(target=lambda: self.chunks.extend(stream), daemon=True)
        self.thread.start()

    def read(self) -> str:
        self.thread.join(15)
        return "".join(self.chunks)

    def close(self) -> None:
        self.thread.join(15)
        self.stream.close()


class Served:
    """A real ``prickle serve`` process; ``lines`` holds what it printed before serving."""

    def __init__(self, db_path: str, *args: str, json_info: bool = True, command: list[str] = PRICKLE,
                 env: dict | None = None, **popen):
        import subprocess
        extra = ["--json"] if json_info else []
        popen = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE} | popen  # e.g. stderr to a file
        self.proc = subprocess.Popen(command + ["serve", "--db", db_path, "--port", "0", *args, *extra],
                                     text=True, env=None if env is None else os.environ | env, **popen)
        if popen["stderr"] is subprocess.PIPE:
            self.proc.stderr = _Drained(self.proc.stderr)
        self.first = self.proc.stdout.readline()
        if not self.first:
            err = self.proc.stderr.read() if self.proc.stderr else ""
            self.stop()
            raise AssertionError(f"prickle serve did not start: {err}")
        self.info = json.loads(self.first) if json_info else None

    def stop(self, kill: bool = False) -> None:
        if self.proc.poll() is None:
            self.proc.kill() if kill else self.proc.terminate()
        self.proc.wait(15)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
