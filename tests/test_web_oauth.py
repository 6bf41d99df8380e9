"""An app connects with OAuth on the page (Chromium): "Connect an app" shows who asks (its own name,
marked as not checked) and from where, the person picks the agent and its project and approves;
the browser goes back to the app with a code the app redeems; Agents & keys lists the app and
disconnects it. A person not signed in signs in and comes back to the request.
"""

from __future__ import annotations

import base64
import hashlib
import re
import secrets
import urllib.parse

import httpx
import pytest
from browser import LAUNCH_ARGS, CHROMIUM, expect, shot, sync_playwright, with_passkey  # noqa: F401
from conftest import Served
from helpers import _free_port, cli_json

PHONE = {"width": 390, "height": 844}
CALLBACK = "http://127.0.0.1:40002/callback"


@pytest.fixture(scope="module")
def oauth_served(tmp_path_factory):
    """A demo served at a fixed loopback address that is also its public_url (so OAuth is on)."""
    port = _free_port()
    root = tmp_path_factory.mktemp("oauth")
    (root / "prickle.toml").write_text(f'public_url = "http://localhost:{port}"\n')  # a name: passkeys need one
    db = str(root / "prickle.db")
    with Served(db, "--demo", "--port", str(port), "--config", str(root / "prickle.toml")) as s:
        s.db = db
        yield s


def start_connecting(base: str) -> tuple[str, str, str]:
    """An app registers and sends its person to /authorize: (client id, PKCE verifier, the page's address)."""
    with httpx.Client(base_url=base, timeout=30, follow_redirects=False) as http:
        client = http.post("/register", json={"client_name": "Claude Desktop", "redirect_uris": [CALLBACK],
                                              "token_endpoint_auth_method": "none"}).json()
        verifier = secrets.token_urlsafe(48)
        challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).decode().rstrip("=")
        r = http.get("/authorize", params={"response_type": "code", "client_id": client["client_id"],
                                           "redirect_uri": CALLBACK, "code_challenge": challenge,
                                           "code_challenge_method": "S256", "state": "s1", "resource": f"{base}/mcp"})
        assert r.status_code == 302, r.text
        return client["client_id"], verifier, r.headers["location"]


def test_a_person_approves_an_app_on_the_page_and_disconnects_it(oauth_served):
    base = oauth_served.info["url"]
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS)
        for width, viewport in (("wide", None), ("phone", PHONE)):
            client_id, verifier, page_url = start_connecting(base)
            context = browser.new_context(viewport=viewport or {"width": 1280, "height": 860})
            page = context.new_page()
            errors = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            back: list[str] = []
            page.route(re.compile(r"^http://127\.0\.0\.1:40002/"), lambda route: (
                back.append(route.request.url), route.fulfill(status=200, body="You can close this tab.")))
            page.goto(cli_json(oauth_served.db, "signin-link", "oj")["signin"])
            expect(page.get_by_role("heading", name=re.compile(r"^Hello, "))).to_be_visible()
            with_passkey(page, oauth_served, "oj")
            page.goto(page_url)
            expect(page.get_by_role("heading", name="Connect an app")).to_be_visible()
            expect(page.get_by_text("Claude Desktop")).to_be_visible()
            expect(page.get_by_text("name not checked")).to_be_visible()
            expect(page.get_by_text("It is an app on this computer (it answers at 127.0.0.1:40002).")).to_be_visible()
            page.get_by_label("Acts as").select_option("oj/muse")
            page.get_by_label("In", exact=True).select_option("website-v2")
            shot(page, f"oauth-consent-{width}")
            page.get_by_role("button", name="Approve").click()
            # Approving asks "Confirm it's you" first; the passkey answers and the approval goes on.
            dialog = page.get_by_role("dialog", name="Confirm it's you")
            expect(dialog).to_contain_text("Confirm it's you to connect an app")
            dialog.get_by_role("button", name="Use my passkey").click()
            expect(page.get_by_text("You can close this tab.")).to_be_visible()
            query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(back[0]).query))
            assert (query["state"], query["iss"]) == ("s1", base)
            tokens = httpx.post(f"{base}/token", data={
                "grant_type": "authorization_code", "code": query["code"], "client_id": client_id,
                "redirect_uri": CALLBACK, "code_verifier": verifier, "resource": f"{base}/mcp"}).json()
            assert tokens["access_token"].startswith("prk_oa_")
            # Agents & keys lists it; Disconnect ends its access at once.
            page.goto(f"{base}/#/agents")
            section = page.locator("section", has=page.get_by_role("heading", name="Connected apps"))
            row = section.locator("tr", has_text="Claude Desktop")
            expect(row).to_contain_text("oj/muse")
            expect(row).to_contain_text("website-v2")
            shot(page, f"oauth-apps-{width}")
            row.get_by_role("button", name="Disconnect Claude Desktop (oj/muse)").click()
            row.get_by_role("button", name=re.compile("Disconnect")).click()
            expect(section.get_by_text("No apps connected.")).to_be_visible()
            r = httpx.post(f"{base}/mcp", headers={"Authorization": f"Bearer {tokens['access_token']}"},
                           json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
            assert r.status_code == 401
            assert not errors, errors
            context.close()
        browser.close()


def test_signing_in_returns_to_the_apps_request(oauth_served):
    base = oauth_served.info["url"]
    _, _, page_url = start_connecting(base)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS)
        page = browser.new_context().new_page()
        page.goto(page_url)  # not signed in: the sign-in page
        expect(page.get_by_role("heading", name=re.compile("Sign in"))).to_be_visible()
        page.goto(cli_json(oauth_served.db, "signin-link", "oj")["signin"])  # the emailed link, opened here
        expect(page.get_by_role("heading", name="Connect an app")).to_be_visible()
        assert page.url == page_url
        browser.close()
