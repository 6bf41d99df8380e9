"""What the browser tests share: a served demo, one headless Chromium, people signed in.

A real ``prickle serve --demo`` per test module (``served``) and Debian's Chromium
(``/usr/bin/chromium``) driven by Playwright (``browser``); ``people`` opens a fresh browser
context signed in as a person and fails the test on any uncaught script error in the page.
Agents act over MCP with plain HTTP POSTs (protocol 2026-07-28) through ``mcp``; ``shot`` saves
``tests/screenshots/NAME.png``. Without Chromium or Playwright, a module importing this is skipped.

The fixtures reach every test as a plugin's (``pytest_plugins`` in conftest.py); the rest is
imported by name.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import pytest

from conftest import Served
from helpers import cli_json

CHROMIUM = "/usr/bin/chromium"
if not Path(CHROMIUM).exists():
    pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install -y chromium)", allow_module_level=True)
try:
    from playwright.sync_api import Page, expect, sync_playwright
except ImportError:  # pragma: no cover - depends on the environment
    pytest.skip("playwright is not installed (pip install -e '.[test]')", allow_module_level=True)

PROJECT = "website-v2"
SHOTS = Path(__file__).parent / "screenshots"
LAUNCH_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
               "--disable-sync", "--no-first-run"]
LAPTOP = {"width": 1280, "height": 860}

expect.set_options(timeout=10_000)


# ---- helpers -------------------------------------------------------------------------------------


def mcp(served: Served, agent: str, tool: str, args: dict, key: str | None = None) -> dict:
    """Call one MCP tool as ``agent`` (one POST, protocol 2026-07-28); return its structuredContent."""
    key = key or served.info["demo"]["keys"][agent]
    meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientInfo": {"name": "web-tests", "version": "1"},
            "io.modelcontextprotocol/clientCapabilities": {}}
    r = httpx.post(served.info["mcp"], timeout=30, headers={
        "Authorization": f"Bearer {key}", "Accept": "application/json, text/event-stream",
        "Content-Type": "application/json", "MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/call",
        "Mcp-Name": tool}, json={"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                                 "params": {"name": tool, "arguments": args, "_meta": meta}})
    assert r.status_code == 200, (r.status_code, r.text)
    if r.headers["content-type"].startswith("text/event-stream"):
        messages = [json.loads(line[5:]) for line in r.text.splitlines() if line.startswith("data:")]
        message = [m for m in messages if "id" in m][-1]
    else:
        message = r.json()
    result = message["result"]
    assert not result.get("isError"), result["content"][0]["text"]
    return result["structuredContent"]


def person_api(served: Served, handle: str) -> httpx.Client:
    """An HTTP client for the people's API with a fresh personal token of ``handle``."""
    token = cli_json(served.db, "token", "create", "--person", handle)["token"]
    return httpx.Client(base_url=served.info["url"], timeout=30, headers={"Authorization": f"Bearer {token}"})


def read_all(api: httpx.Client, project: str = PROJECT) -> None:
    """Mark a project's general chat read up to its newest message, as the person ``api`` is signed in as."""
    newest = api.get(f"/api/projects/{project}/room?latest=1&limit=1").json()["messages"][-1]
    assert api.post(f"/api/projects/{project}/read", json={"message_id": newest["id"]}).status_code == 200


def shot(page: Page, name: str, full_page: bool = True) -> None:
    """Save tests/screenshots/NAME.png: the whole page from the top, or (full_page=False) what is in view."""
    SHOTS.mkdir(exist_ok=True)
    if full_page:  # the whole page from the top; sticky bars drawn where they sit in the page
        page.evaluate("window.scrollTo(0, 0)")
        page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True,
                        style=".topbar, .room-foot { position: static !important; }")
    else:
        page.screenshot(path=str(SHOTS / f"{name}.png"))


def at_name(url: str) -> str:
    """``url`` with the server's address by name (localhost): a browser binds a passkey to a name, never to an IP."""
    return url.replace("//127.0.0.1:", "//localhost:")


def signed_in_at_name(people, served: Served, handle: str, viewport: dict | None = None) -> Page:
    """A fresh browser context signed in as ``handle`` at the server's name (see at_name)."""
    return people(handle, viewport=viewport, link=at_name(cli_json(served.db, "signin-link", handle)["signin"]))


def virtual_authenticator(page: Page) -> tuple:
    """Chromium's virtual authenticator (CDP WebAuthn) for ``page``, which says yes by itself: (cdp, its id)."""
    cdp = page.context.new_cdp_session(page)
    cdp.send("WebAuthn.enable")
    made = cdp.send("WebAuthn.addVirtualAuthenticator", {"options": {
        "protocol": "ctap2", "transport": "internal", "hasResidentKey": True, "hasUserVerification": True,
        "isUserVerified": True, "automaticPresenceSimulation": True}})
    return cdp, made["authenticatorId"]


def with_passkey(page: Page, served: Served, handle: str) -> None:
    """Give ``page`` a virtual authenticator holding ``handle``'s passkey: the first call registers one
    through the API (with the tests' software authenticator), and each page gets a copy of its key."""
    import base64

    from cryptography.hazmat.primitives import serialization
    from helpers import SoftAuthenticator
    keys = served.__dict__.setdefault("passkeys", {})
    origin = at_name(served.info["url"])
    if handle not in keys:
        soft = SoftAuthenticator()
        with person_api(served, handle) as api:
            options = api.post("/api/me/passkeys/options", json={"purpose": "register"},
                               headers={"Origin": origin}).json()["publicKey"]
            r = api.post("/api/me/passkeys", json={"credential": soft.create(options, origin), "label": "Test key"})
            assert r.status_code == 200, r.text
        keys[handle] = soft
    soft = keys[handle]
    soft.count += 1000  # each copy counts on from beyond what the server saw last
    pkcs8 = soft.key.private_bytes(serialization.Encoding.DER, serialization.PrivateFormat.PKCS8,
                                   serialization.NoEncryption())
    cdp, authenticator = virtual_authenticator(page)
    cdp.send("WebAuthn.addCredential", {"authenticatorId": authenticator, "credential": {
        "credentialId": base64.b64encode(soft.credential_id).decode(), "isResidentCredential": False,
        "rpId": "localhost", "privateKey": base64.b64encode(pkcs8).decode(), "signCount": soft.count}})


# ---- fixtures --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    db = str(tmp_path_factory.mktemp("web") / "prickle.db")
    with Served(db, "--demo") as s:
        s.db = db
        yield s


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS)
        yield b
        b.close()


@pytest.fixture
def people(browser, served):
    """open(handle | None, viewport=…): a fresh browser context signed in as that person (None: signed out)."""
    contexts, errors = [], []

    def open_(handle: str | None, viewport: dict | None = None, link: str | None = None) -> Page:
        context = browser.new_context(viewport=viewport or LAPTOP)
        contexts.append(context)
        page = context.new_page()
        page.on("pageerror", lambda e: errors.append(f"{handle}: {e}"))
        if link is None and handle is not None:
            link = cli_json(served.db, "signin-link", handle)["signin"]
        page.goto(link or served.info["url"] + "/")
        if handle is not None:
            expect(page.get_by_role("heading", name=re.compile(r"^Hello, "))).to_be_visible()
        return page

    yield open_
    for context in contexts:
        context.close()
    assert not errors, errors


def goto(page: Page, served: Served, hash_: str) -> None:
    page.goto(f"{served.info['url']}/{hash_}")
