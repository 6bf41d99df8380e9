"""The team's steps the tests share: people on the HTTP API, agents handing work on and returning
results, messages, private rooms, runners, the command line, MCP clients, older databases and a
mail server.

The fixtures here (``smtp``, ``clock``) reach every test through ``pytest_plugins`` in conftest.py.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import email
import email.policy
import hashlib
import io
import json
import queue
import socket

import apsw
import httpx
import pytest
from aiosmtpd.controller import Controller
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

import prickle
from conftest import PROJECT, check_tool_output

P = {"project": PROJECT}


# -- people on the HTTP API ----------------------------------------------------


def auth(world, handle):
    return {"Authorization": f"Bearer {world.tokens[handle]}"}


def person(server, world, handle):
    """POST/GET helpers for the people's API as ``handle``."""
    h = {"Authorization": f"Bearer {world.tokens[handle]}"}

    class API:
        @staticmethod
        def get(path, **kw):
            return server.get(path, headers=h, **kw)

        @staticmethod
        def post(path, body=None, headers=None):
            return server.post(path, json=body or {}, headers=h | (headers or {}))

        @staticmethod
        def delete(path):
            return server.delete(path, headers=h)
    return API


# -- tasks: a packet handed off, approved, accepted, its result returned -------

PACKET = {"task": "Draft the hero copy.", "deliverable_type": "doc",
          "acceptance_criteria": ["Headline has at most 8 words.", "Include a clear call to action."],
          "context": "A collaboration tool for small teams.", "files": []}
SHA = "a" * 64


def handoff(mcp, requester="oj/muse", to="ren/builder", **extra):
    return mcp.ok(requester, "handoff", P | {"to": to, "packet": PACKET} | extra)


def routed(mcp, server, world, requester="oj/muse", to="ren/builder", **extra):
    """A cross-owner handoff approved by the assignee's owner: the task, routed."""
    out = handoff(mcp, requester, to, **extra)
    if out["gate"]["decision"] == "approval_required":
        r = person(server, world, to.split("/")[0]).post(f"/api/approvals/{out['gate']['approval_id']}",
                                                         {"decision": "approve"})
        assert r.status_code == 200, r.text
        return r.json()["task"]
    return out["task"]


def working(mcp, server, world):
    task = routed(mcp, server, world)
    mcp.ok("ren/builder", "accept_task", {"task_id": task["id"]})
    return task


def evidence(criteria=None, **extra):
    item = {"kind": "test_output", "summary": "Counted the words.", "content": "6 words"} | extra
    if criteria is not None:
        item["criteria"] = criteria
    return item


def submit(mcp, task_id, items=None, artifacts=None):
    return mcp.ok("ren/builder", "return_result", {
        "task_id": task_id, "summary": "Headline and CTA drafted.",
        "evidence": items or [evidence([0]), evidence([1], kind="note", summary="CTA: try the demo.", content="")],
        "artifacts": artifacts if artifacts is not None else [{"ref": "docs/hero.md", "sha256": SHA}]})


def wait_kinds(mcp, agent, cursor, tool="wait_for_updates"):
    out = mcp.ok(agent, tool, {"cursor": cursor, "timeout_seconds": 1})
    return [(u["kind"], u.get("task_id")) for u in out.get("updates", [])] or [
        (e["kind"], (e.get("task") or {}).get("id")) for e in out.get("events", [])]


def start(mcp, agent, tool="wait_for_updates"):
    return mcp.ok(agent, tool, {"timeout_seconds": 1})["cursor"]


# -- messages ------------------------------------------------------------------


def post(mcp, agent, body, **extra):
    return mcp.ok(agent, "post_message", P | {"body": body} | extra)["message"]


def make_task(world, requester="oj/muse", assignee="ren/builder", state="routed"):
    """Hand off a one-criterion task; approve it at the gate when ``state`` is routed."""
    out = prickle.handoff(world.db, world.actor(requester), PROJECT, assignee,
                          {"task": "Draft the hero copy.", "deliverable_type": "doc",
                           "acceptance_criteria": ["At most 8 words."]})
    if out["gate"]["decision"] == "approval_required" and state == "routed":
        prickle.decide_approval(world.db, world.person(assignee.split("/")[0]), out["gate"]["approval_id"], "approve")
    assert prickle.visible_task(world.db, world.actor(requester), PROJECT, out["task"]["id"])["state"] == state
    return out["task"]["id"]


# -- what was written, and names kept as fingerprints --------------------------


def sha(text):
    return hashlib.sha256(text.encode()).hexdigest()


def written(db):
    """How many outbox events and audit entries the file holds."""
    return db.scalar("SELECT count(*) FROM outbox"), db.scalar("SELECT count(*) FROM audit")


def audit_text(db):
    return " ".join(r["refs"] for r in db.rows("SELECT refs FROM audit"))


# -- private rooms -------------------------------------------------------------

ROOM = "oj-room"


def setup_room(world):
    """oj's room with oj/muse and oj/scout (claude-code) and oj/critic (codex); runner keys for each."""
    prickle.add_agent(world.db, "oj/critic", "Critic", "gpt-5", "codex", "Reviewer", [], [])
    return {a: prickle.pair_device(world.db, "oj", a)[1] for a in ("oj/muse", "oj/scout", "oj/critic")}


def say(server, world, body, handle="oj"):
    r = person(server, world, handle).post(f"/api/projects/{ROOM}/messages", {"body": body})
    assert r.status_code == 200, r.text
    return r.json()["message"]


def woke(mcp, agent, cursor, runner):
    out = mcp.ok(agent, "wait_for_mention", {"cursor": cursor, "timeout_seconds": 1}, token=runner)
    return out["events"]


def listen(mcp, agent, runner):
    """The agent's runner starts listening (one wait_for_mention with its key): the cursor to wait from."""
    return mcp.ok(agent, "wait_for_mention", {"timeout_seconds": 1}, token=runner)["cursor"]


def claim(mcp, agent, runner, message_id, key="k", harness=2):
    args = {"message_id": message_id, "idempotency_key": key} | ({"harness": harness} if harness else {})
    return mcp.ok(agent, "claim_discussion", args, token=runner)


# -- runners: paired devices, claimed runs, steps, connecting a computer -------


def paired(world, agent="ren/builder"):
    device, key = prickle.pair_device(world.db, agent.split("/")[0], agent, "laptop")
    return device, key


def claimed(mcp, server, world, key="k1"):
    """A routed task for ren/builder, claimed by its runner: (task, device, claim answer)."""
    task = routed(mcp, server, world)
    device, runner = paired(world)
    out = mcp.ok("ren/builder", "claim_task", {"task_id": task["id"], "idempotency_key": key}, token=runner)
    return task, device, runner, out


def decided_step(mcp, server, world, call, decision):
    """A claimed run asks ``call`` and ren decides it: (the run's credential, the step answer)."""
    task, device, runner, out = claimed(mcp, server, world)
    run = out["execution_credential"]["token"]
    step = mcp.ok("ren/builder", "request_step", call, token=run)
    person(server, world, "ren").post(f"/api/steps/{step['step_id']}", {"decision": decision})
    return run, step


def ask_connect(server, clis=("claude", "codex")):
    r = server.post("/api/runner/connect", json={"name": "ren-laptop", "clis": list(clis)})
    assert r.status_code == 200, r.text
    return r.json()


# -- the command line ----------------------------------------------------------


def run(db_path, *args, ok=True):
    """Run ``prickle ARGS --db DB`` in-process; return (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = prickle.main(list(args) + ["--db", db_path])
    if ok:
        assert code == 0, err.getvalue()
    return code, out.getvalue(), err.getvalue()


def jrun(db_path, *args):
    code, out, err = run(db_path, *args, "--json")
    lines = out.strip().splitlines()
    assert len(lines) == 1, out
    return json.loads(lines[0])


def cli_json(db_path, *args):
    """``prickle ARGS --db DB --json``'s answer, run in-process as :func:`run` does: a test's setup
    (people, projects, keys) takes milliseconds instead of a new process's start. The tests of the
    command line itself start the real ``prickle`` (tests/test_cli.py)."""
    _, out, _ = run(db_path, *args, "--json")
    return json.loads(out)


# -- MCP clients ---------------------------------------------------------------


@contextlib.asynccontextmanager
async def client(url, key, mode="auto"):
    """An MCP SDK client for one agent key (the HTTP client it is given is ours to close)."""
    async with create_mcp_http_client(headers={"Authorization": f"Bearer {key}"}) as http:
        async with Client(streamable_http_client(url, http_client=http), mode=mode) as c:
            yield c


async def call(c, tool, args, **kw):
    r = await c.call_tool(tool, args, **kw)
    assert not r.is_error, r.content[0].text
    check_tool_output(tool, r.structured_content)
    return r.structured_content


def _post(http, url, key, body, n):
    """One post_message over plain HTTP (protocol 2026-07-28); the message ID, or None if the server died."""
    meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientInfo": {"name": "burst", "version": "1"},
            "io.modelcontextprotocol/clientCapabilities": {}}
    try:
        r = http.post(url, headers={
            "Authorization": f"Bearer {key}", "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/call", "Mcp-Name": "post_message"},
            json={"jsonrpc": "2.0", "id": n, "method": "tools/call", "params": {
                "name": "post_message", "arguments": {"project": PROJECT, "body": body}, "_meta": meta}})
    except httpx.TransportError:
        return None
    result = r.json()["result"]
    check_tool_output("post_message", result["structuredContent"])
    return result["structuredContent"]["message"]["id"]


# -- a database as an older Prickle left it ------------------------------------


def _database_at_version(path, version):
    """A database file with the first ``version`` schema upgrades applied, as an older Prickle left it."""
    conn = apsw.Connection(path)
    conn.pragma("journal_mode", "wal")
    with conn:
        for statements in prickle.MIGRATIONS[:version]:
            for sql in statements:
                conn.execute(sql)
        conn.pragma("user_version", version)
    return conn


# -- mail: a real SMTP server (aiosmtpd) and a clock the test moves ------------

T0 = dt.datetime(2026, 12, 1, 10, 0, tzinfo=dt.timezone.utc)
FROM = "Prickle <prickle@mail.prickle.example>"  # not the recipients' domain


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Inbox:
    """An aiosmtpd handler that keeps every message it is given, in order."""

    def __init__(self):
        self.mails: queue.Queue = queue.Queue()

    async def handle_DATA(self, server, session, envelope):
        message = email.message_from_bytes(envelope.content, policy=email.policy.default)
        html = message.get_body(("html",))  # a digest has an HTML part beside its text
        self.mails.put({"to": envelope.rcpt_tos, "message": message, "text": message.get_body(("plain",)).get_content(),
                        "html": html.get_content() if html is not None else None})
        return "250 OK"

    def next(self) -> dict:
        return self.mails.get(timeout=15)


@pytest.fixture
def smtp():
    inbox = Inbox()
    controller = Controller(inbox, hostname="127.0.0.1", port=_free_port())
    controller.start()
    inbox.port = controller.port
    yield inbox
    controller.stop()
    assert inbox.mails.empty(), "a mail arrived that no test read"


@pytest.fixture
def clock(monkeypatch):
    """Prickle's clock, held at T0 until a test moves it (``clock.now = …``)."""

    class Clock:
        now = T0

    c = Clock()
    monkeypatch.setattr(prickle, "utcnow", lambda: c.now)
    return c


def _settings(port: int, **smtp) -> prickle.Settings:
    return prickle.Settings(smtp=prickle.SmtpSettings(host="127.0.0.1", port=port, tls="none", from_address=FROM,
                                                      **smtp))


def pdf_bytes(pages: int, rgb: tuple[float, float, float] = (1, 0, 0)) -> bytes:
    """A valid PDF of ``pages`` US Letter pages (612 x 792 pt), each with a filled square of ``rgb``
    (0..1 each) from (106, 196) to (506, 596) pt: its middle is the middle of the page."""
    objects = ["<< /Type /Catalog /Pages 2 0 R >>",
               "<< /Type /Pages /Kids [%s] /Count %d >>" % (" ".join(f"{3 + 2 * i} 0 R" for i in range(pages)), pages)]
    stream = "%g %g %g rg 106 196 400 400 re f" % rgb
    for i in range(pages):
        objects.append(f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents {4 + 2 * i} 0 R >>")
        objects.append(f"<< /Length {len(stream)} >>\nstream\n{stream}\nendstream")
    out, offsets = b"%PDF-1.4\n", []
    for n, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += f"{n} 0 obj\n{body}\nendobj\n".encode()
    xref = len(out)
    out += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode()
    out += "".join(f"{o:010d} 00000 n \n" for o in offsets).encode()
    out += f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode()
    return out


# -- passkeys: a software authenticator (an EC P-256 key, "none" attestation) --------------------


class SoftAuthenticator:
    """Answers a Prickle passkey ceremony as a browser with one platform authenticator would:
    ``create(options, origin)`` and ``get(options, origin)`` return PublicKeyCredential.toJSON()."""

    def __init__(self):
        import os as _os
        from cryptography.hazmat.primitives.asymmetric import ec
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.credential_id = _os.urandom(16)
        self.count = 0

    @staticmethod
    def b64(data: bytes) -> str:
        import base64
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    def _client_data(self, kind: str, options: dict, origin: str) -> bytes:
        return json.dumps({"type": kind, "challenge": options["challenge"], "origin": origin,
                           "crossOrigin": False}).encode()

    def _auth_data(self, rp_id: str, flags: int, attested: bytes = b"") -> bytes:
        self.count += 1
        return hashlib.sha256(rp_id.encode()).digest() + bytes([flags]) + self.count.to_bytes(4, "big") + attested

    def create(self, options: dict, origin: str) -> dict:
        import cbor2
        numbers = self.key.public_key().public_numbers()
        cose = cbor2.dumps({1: 2, 3: -7, -1: 1, -2: numbers.x.to_bytes(32, "big"), -3: numbers.y.to_bytes(32, "big")})
        attested = bytes(16) + len(self.credential_id).to_bytes(2, "big") + self.credential_id + cose
        auth = self._auth_data(options["rp"]["id"], 0x45, attested)  # user present, verified, attested data
        client = self._client_data("webauthn.create", options, origin)
        return {"id": self.b64(self.credential_id), "rawId": self.b64(self.credential_id), "type": "public-key",
                "response": {"clientDataJSON": self.b64(client),
                             "attestationObject": self.b64(cbor2.dumps({"fmt": "none", "attStmt": {},
                                                                        "authData": auth}))}}

    def get(self, options: dict, origin: str) -> dict:
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import ec
        auth = self._auth_data(options["rpId"], 0x05)
        client = self._client_data("webauthn.get", options, origin)
        signature = self.key.sign(auth + hashlib.sha256(client).digest(), ec.ECDSA(hashes.SHA256()))
        return {"id": self.b64(self.credential_id), "rawId": self.b64(self.credential_id), "type": "public-key",
                "response": {"clientDataJSON": self.b64(client), "authenticatorData": self.b64(auth),
                             "signature": self.b64(signature)}}


# The page's origin for passkeys: the in-process server (conftest's ``server``) by a name, as a browser
# binds a passkey to a name, never to an IP address.
ORIGIN = "http://localhost:8321"
AT_ORIGIN = {"Origin": ORIGIN}


def add_passkey(api, authenticator: SoftAuthenticator | None = None, label: str | None = None):
    """Register a passkey for the person ``api`` speaks for (registering confirms it's them);
    return ``(authenticator, response)``."""
    authenticator = authenticator or SoftAuthenticator()
    options = api.post("/api/me/passkeys/options", {"purpose": "register"}, AT_ORIGIN)
    assert options.status_code == 200, options.text
    body = {"credential": authenticator.create(options.json()["publicKey"], ORIGIN)}
    return authenticator, api.post("/api/me/passkeys", body | ({"label": label} if label else {}))


def confirm_with(api, authenticator: SoftAuthenticator):
    """Confirm it's them with the passkey ``authenticator`` holds; return the response."""
    options = api.post("/api/me/passkeys/options", {"purpose": "confirm"}, AT_ORIGIN)
    assert options.status_code == 200, options.text
    return api.post("/api/me/step-up/passkey", {"credential": authenticator.get(options.json()["publicKey"], ORIGIN)})


def confirmed(server, world, handle):
    """The people's API as ``handle``, confirmed it's them (a fresh step-up) with a new passkey."""
    api = person(server, world, handle)
    authenticator, r = add_passkey(api)
    assert r.status_code == 200, r.text
    api.authenticator = authenticator
    return api


def confirmed_token(db_path: str, base: str, handle: str) -> str:
    """A new personal token of ``handle`` that has just confirmed it's them, by registering a passkey at
    ``base`` (the server's address by name, as a browser would hold it)."""
    import httpx
    token = cli_json(db_path, "token", "create", "--person", handle)["token"]
    h = {"Authorization": f"Bearer {token}", "Origin": base}
    options = httpx.post(f"{base}/api/me/passkeys/options", json={"purpose": "register"}, headers=h)
    assert options.status_code == 200, options.text
    soft = SoftAuthenticator()
    r = httpx.post(f"{base}/api/me/passkeys", json={"credential": soft.create(options.json()["publicKey"], base)},
                   headers=h)
    assert r.status_code == 200, r.text
    return token
