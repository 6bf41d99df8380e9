"""MCP authorization (OAuth 2.1): an app registers, its person approves it on the page as one of
their agents, it redeems the code for tokens (PKCE S256, the resource indicator), calls the MCP
tools, refreshes, and is disconnected; every refusal says the RFC's error and writes nothing.
"""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import urllib.parse

import pytest
from starlette.testclient import TestClient

import prickle
from conftest import MCP, World, audit_entries
from helpers import clock  # noqa: F401 (a fixture)

ISSUER = "https://prickle.example"
RESOURCE = f"{ISSUER}/mcp"
CALLBACK = "http://127.0.0.1:33418/callback"


@pytest.fixture
def app(world: World):
    application = prickle.create_app(world.db_path, prickle.Settings(public_url=ISSUER), port=8321)
    with TestClient(application, base_url=ISSUER, follow_redirects=False) as client:
        yield client


def pkce() -> tuple[str, str]:
    verifier = secrets.token_urlsafe(48)
    return verifier, base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).decode().rstrip("=")


def register(app, **extra) -> dict:
    r = app.post("/register", json={"client_name": "Claude Code (tests)", "redirect_uris": [CALLBACK],
                                    "token_endpoint_auth_method": "none",
                                    "grant_types": ["authorization_code", "refresh_token"],
                                    "response_types": ["code"]} | extra)
    assert r.status_code == 201, r.text
    return r.json()


def authorize(app, client_id: str, challenge: str, **extra) -> str:
    """The request id /authorize hands over to the page ("Connect an app")."""
    params = {"response_type": "code", "client_id": client_id, "redirect_uri": "http://127.0.0.1:40001/callback",
              "code_challenge": challenge, "code_challenge_method": "S256", "state": "st-1", "scope": "mcp",
              "resource": RESOURCE} | extra
    r = app.get("/authorize", params=params)
    assert r.status_code == 302, r.text
    location = r.headers["location"]
    assert location.startswith(f"{ISSUER}/#/authorize/oar_"), location
    return location.rsplit("/", 1)[1]


def confirm(app, world: World, handle="oj") -> None:
    """``handle`` confirms it's them (a first passkey, registered at the public address, confirms)."""
    from helpers import SoftAuthenticator
    h = {"Authorization": f"Bearer {world.tokens[handle]}", "Origin": ISSUER}
    options = app.post("/api/me/passkeys/options", json={"purpose": "register"}, headers=h)
    if options.status_code != 200:  # a passkey already: confirm with it
        return
    soft = SoftAuthenticator()
    r = app.post("/api/me/passkeys", json={"credential": soft.create(options.json()["publicKey"], ISSUER)}, headers=h)
    assert r.status_code == 200, r.text


def approve(app, world: World, request_id: str, handle="oj", **body) -> dict:
    confirm(app, world, handle)
    r = app.post(f"/api/oauth/{request_id}", json={"decision": "approve", "agent_id": "oj/muse"} | body,
                 headers={"Authorization": f"Bearer {world.tokens[handle]}"})
    assert r.status_code == 200, r.text
    return dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(r.json()["redirect"]).query))


def token(app, **form) -> dict:
    r = app.post("/token", data=form)
    return r.status_code, r.json()


def connected(app, world: World) -> tuple[dict, dict, str]:
    """An app connected as oj/muse: (its registration, its tokens, the PKCE verifier)."""
    client = register(app)
    verifier, challenge = pkce()
    back = approve(app, world, authorize(app, client["client_id"], challenge))
    status, tokens = token(app, grant_type="authorization_code", code=back["code"], client_id=client["client_id"],
                           redirect_uri="http://127.0.0.1:40001/callback", code_verifier=verifier, resource=RESOURCE)
    assert status == 200, tokens
    return client, tokens, verifier


def test_the_metadata_documents_say_where_to_register_authorize_and_get_tokens(app):
    r = app.get("/.well-known/oauth-protected-resource/mcp")
    assert r.status_code == 200
    assert r.json() == {"resource": RESOURCE, "authorization_servers": [ISSUER], "scopes_supported": ["mcp"],
                        "bearer_methods_supported": ["header"], "resource_name": "Prickle"}
    assert app.get("/.well-known/oauth-protected-resource").json() == r.json()
    meta = app.get("/.well-known/oauth-authorization-server").json()
    assert meta == {
        "issuer": ISSUER, "authorization_endpoint": f"{ISSUER}/authorize", "token_endpoint": f"{ISSUER}/token",
        "registration_endpoint": f"{ISSUER}/register", "scopes_supported": ["mcp"],
        "response_types_supported": ["code"], "grant_types_supported": ["authorization_code", "refresh_token"],
        "token_endpoint_auth_methods_supported": ["none", "client_secret_post", "client_secret_basic"],
        "service_documentation": f"{ISSUER}/#/help", "revocation_endpoint": f"{ISSUER}/revoke",
        "revocation_endpoint_auth_methods_supported": ["none", "client_secret_post", "client_secret_basic"],
        "code_challenge_methods_supported": ["S256"], "authorization_response_iss_parameter_supported": True}
    # The refusal of /mcp keeps its JSON-RPC body and says where the app learns the rest.
    r = app.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
    assert r.status_code == 401
    assert r.headers["www-authenticate"] == (
        f'Bearer resource_metadata="{ISSUER}/.well-known/oauth-protected-resource/mcp", scope="mcp"')
    assert r.json()["jsonrpc"] == "2.0" and r.json()["error"]["data"]["code"] == "unauthorized"


def test_without_a_public_https_address_there_is_no_oauth(server):
    assert server.get("/.well-known/oauth-authorization-server").status_code == 404
    assert server.post("/register", json={}).status_code in (404, 405)
    r = server.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
    assert r.headers["www-authenticate"] == 'Bearer realm="prickle"'


def test_an_app_connects_as_one_agent_calls_tools_refreshes_and_is_disconnected(app, world):
    client, tokens, _ = connected(app, world)
    assert (tokens["token_type"], tokens["expires_in"], tokens["scope"]) == ("Bearer", 3600, "mcp")
    assert tokens["access_token"].startswith("prk_oa_") and tokens["refresh_token"].startswith("prk_or_")
    mcp = MCP(app, {"oj/muse": tokens["access_token"]})
    assert mcp.ok("oj/muse", "get_project_context", {"project": "website-v2"})["project"]["slug"] == "website-v2"
    posted = mcp.ok("oj/muse", "post_message", {"project": "website-v2", "body": "hello from an app"})
    assert posted["message"]["author"]["agent_id"] == "oj/muse"
    # The reference refuses an OAuth token where it says so.
    mcp.error("oj/muse", "update_pulse", {"project": "website-v2", "doing": "x", "clear_run_failure": True},
              "forbidden")
    [made] = [e for e in audit_entries(world.db, "website-v2", "token.created") if e["refs"]["kind"] == "oauth"]
    assert made["refs"] == {"credential": made["refs"]["credential"], "kind": "oauth", "agent": "oj/muse",
                            "person": "oj", "scope": "all"}
    oj = {"Authorization": f"Bearer {world.tokens['oj']}"}
    [listed] = app.get("/api/apps", headers=oj).json()["apps"]
    assert (listed["client_name"], listed["agent_id"], listed["project"]) == ("Claude Code (tests)", "oj/muse", None)
    # A refresh replaces both tokens; the old access token ends with it.
    status, fresh = token(app, grant_type="refresh_token", refresh_token=tokens["refresh_token"],
                          client_id=client["client_id"])
    assert status == 200 and fresh["refresh_token"] != tokens["refresh_token"]
    assert MCP(app, {"oj/muse": tokens["access_token"]}).raw(tokens["access_token"], "tools/list").status_code == 401
    assert MCP(app, {"oj/muse": fresh["access_token"]}).raw(fresh["access_token"], "tools/list").status_code == 200
    assert len([e for e in audit_entries(world.db, "website-v2", "token.created")
                if e["refs"]["kind"] == "oauth"]) == 1  # a refresh is no new connection
    # Disconnected on the page: its tokens end at once.
    assert app.delete(f"/api/apps/{listed['family']}", headers=oj).status_code == 200
    assert MCP(app, {}).raw(fresh["access_token"], "tools/list").status_code == 401
    assert app.get("/api/apps", headers=oj).json()["apps"] == []
    revoked = [e for e in audit_entries(world.db, "website-v2", "token.revoked") if e["refs"]["kind"] == "oauth"]
    assert [(e["refs"]["agent"], e["refs"]["person"]) for e in revoked] == [("oj/muse", "oj")]  # the live one


def test_a_refresh_token_used_twice_ends_the_whole_connection(app, world):
    client, tokens, _ = connected(app, world)
    status, fresh = token(app, grant_type="refresh_token", refresh_token=tokens["refresh_token"],
                          client_id=client["client_id"])
    assert status == 200
    status, replay = token(app, grant_type="refresh_token", refresh_token=tokens["refresh_token"],
                           client_id=client["client_id"])
    assert (status, replay["error"]) == (400, "invalid_grant")
    assert MCP(app, {}).raw(fresh["access_token"], "tools/list").status_code == 401
    status, later = token(app, grant_type="refresh_token", refresh_token=fresh["refresh_token"],
                          client_id=client["client_id"])
    assert (status, later["error"]) == (400, "invalid_grant")


def test_a_code_is_good_once_and_only_with_its_verifier(app, world):
    client = register(app)
    verifier, challenge = pkce()
    back = approve(app, world, authorize(app, client["client_id"], challenge))
    assert (back["state"], back["iss"]) == ("st-1", ISSUER)
    form = {"grant_type": "authorization_code", "code": back["code"], "client_id": client["client_id"],
            "redirect_uri": "http://127.0.0.1:40001/callback", "resource": RESOURCE}
    status, wrong = token(app, **form, code_verifier="x" * 50)
    assert (status, wrong["error"], wrong["error_description"]) == (400, "invalid_grant", "incorrect code_verifier")
    status, other = token(app, **(form | {"resource": "https://elsewhere.example/mcp"}), code_verifier=verifier)
    assert (status, other["error"]) == (400, "invalid_target")
    status, tokens = token(app, **form, code_verifier=verifier)
    assert status == 200
    status, again = token(app, **form, code_verifier=verifier)
    assert (status, again["error"]) == (400, "invalid_grant")
    # The code used twice ends what it was redeemed for.
    assert MCP(app, {}).raw(tokens["access_token"], "tools/list").status_code == 401


def test_bad_requests_get_the_rfcs_error_and_write_nothing(app, world):
    client = register(app)
    _, challenge = pkce()
    base = {"response_type": "code", "client_id": client["client_id"], "redirect_uri": CALLBACK,
            "code_challenge": challenge, "code_challenge_method": "S256", "state": "st-2"}
    before = world.db.scalar("SELECT count(*) FROM oauth_requests")

    def refused(**changes) -> dict:
        r = app.get("/authorize", params={k: v for k, v in (base | changes).items() if v is not None})
        if r.status_code == 302:
            return dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(r.headers["location"]).query))
        return r.json() | {"status": r.status_code}

    assert refused(code_challenge_method="plain")["error"] == "invalid_request"
    assert refused(code_challenge=None)["error"] == "invalid_request"
    assert refused(resource="https://elsewhere.example/mcp")["error"] == "invalid_target"
    assert refused(scope="admin")["error"] == "invalid_scope"
    unregistered = refused(redirect_uri="https://evil.example/cb")
    assert (unregistered["status"], unregistered["error"]) == (400, "invalid_request")
    assert world.db.scalar("SELECT count(*) FROM oauth_requests") == before
    # Consent needs a signed-in person; another person can't see someone's request once it is decided.
    request_id = authorize(app, client["client_id"], challenge)
    assert app.get(f"/api/oauth/{request_id}").status_code == 401
    # Approving asks the person to confirm it's them first (a passkey or a mailed link).
    r = app.post(f"/api/oauth/{request_id}", json={"decision": "approve", "agent_id": "oj/muse"},
                 headers={"Authorization": f"Bearer {world.tokens['oj']}"})
    assert (r.status_code, r.json()["error"]["code"]) == (403, "step_up_required")
    assert world.db.one("SELECT state FROM oauth_requests WHERE id = ?", (request_id,))["state"] == "pending"
    confirm(app, world)
    r = app.post(f"/api/oauth/{request_id}", json={"decision": "approve", "agent_id": "ren/builder"},
                 headers={"Authorization": f"Bearer {world.tokens['oj']}"})
    assert (r.status_code, r.json()["error"]["message"]) == (
        400, "agent_id: one of your own agents, or create one")
    # Registration: a redirect that is neither https nor loopback, and a flood from one address.
    r = app.post("/register", json={"client_name": "x", "redirect_uris": ["http://lan.example/cb"],
                                    "token_endpoint_auth_method": "none"})
    assert (r.status_code, r.json()["error"]) == (400, "invalid_redirect_uri")
    for _ in range(prickle.OAUTH_REGISTRATIONS_PER_HOUR - 1):  # one registered above
        register(app)
    r = app.post("/register", json={"client_name": "x", "redirect_uris": [CALLBACK],
                                    "token_endpoint_auth_method": "none"})
    assert (r.status_code, r.json()["error"]) == (429, "too_many_requests")


def test_a_refused_request_sends_the_app_back_with_access_denied(app, world):
    client = register(app)
    _, challenge = pkce()
    request_id = authorize(app, client["client_id"], challenge)
    view = app.get(f"/api/oauth/{request_id}", headers={"Authorization": f"Bearer {world.tokens['oj']}"}).json()
    assert view["request"] == {"id": request_id, "state": "pending", "client_name": "Claude Code (tests)",
                               "on_this_computer": True, "redirect_host": "127.0.0.1:40001",
                               "expires_at": view["request"]["expires_at"]}
    assert [a["agent_id"] for a in view["agents"]] == ["oj/muse", "oj/scout"]
    r = app.post(f"/api/oauth/{request_id}", json={"decision": "refuse"},
                 headers={"Authorization": f"Bearer {world.tokens['oj']}"})
    back = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(r.json()["redirect"]).query))
    assert back == {"state": "st-1", "iss": ISSUER, "error": "access_denied", "error_description": "oj refused it"}
    r = app.post(f"/api/oauth/{request_id}", json={"decision": "approve", "agent_id": "oj/muse"},
                 headers={"Authorization": f"Bearer {world.tokens['oj']}"})
    assert (r.status_code, r.json()["error"]["code"]) == (409, "invalid_state")  # decided once


def test_a_code_or_a_request_past_its_ten_minutes_is_refused(app, world, clock):
    import datetime as dt
    clock.now = dt.datetime.now(dt.timezone.utc)
    client = register(app)
    verifier, challenge = pkce()
    back = approve(app, world, authorize(app, client["client_id"], challenge))
    late = authorize(app, client["client_id"], challenge)
    clock.now += dt.timedelta(minutes=11)
    status, out = token(app, grant_type="authorization_code", code=back["code"], client_id=client["client_id"],
                        redirect_uri="http://127.0.0.1:40001/callback", code_verifier=verifier, resource=RESOURCE)
    assert (status, out["error"]) == (400, "invalid_grant")
    r = app.post(f"/api/oauth/{late}", json={"decision": "approve", "agent_id": "oj/muse"},
                 headers={"Authorization": f"Bearer {world.tokens['oj']}"})
    assert (r.status_code, r.json()["error"]["message"]) == (
        410, "this request expired (10 minutes): start connecting again from the app")
    assert prickle.expire_due(world.db, "oauth") == 1  # the one nobody touched since, as the server's timer does
    assert sorted(r["state"] for r in world.db.rows("SELECT state FROM oauth_requests")) == ["expired", "expired"]
    assert world.db.scalar("SELECT count(*) FROM credentials WHERE kind LIKE 'oauth%'") == 0


def test_signing_out_everywhere_disconnects_the_persons_apps(app, world):
    client, tokens, _ = connected(app, world)
    r = app.post("/api/signout/everywhere", headers={"Authorization": f"Bearer {world.tokens['oj']}"})
    assert r.status_code == 200 and r.json()["apps_ended"] == 1
    assert MCP(app, {}).raw(tokens["access_token"], "tools/list").status_code == 401
    status, out = token(app, grant_type="refresh_token", refresh_token=tokens["refresh_token"],
                        client_id=client["client_id"])
    assert (status, out["error"]) == (400, "invalid_grant")


def test_an_app_may_act_as_a_new_agent_made_as_it_is_approved(app, world):
    client = register(app)
    _, challenge = pkce()
    request_id = authorize(app, client["client_id"], challenge)
    back = approve(app, world, request_id, agent_id=None, create={"name": "desk", "display_name": "Desk"})
    assert back["code"]
    made = world.db.one("SELECT * FROM agents WHERE agent_id = 'oj/desk'")
    assert (made["display_name"], made["client"]) == ("Desk", "Claude Code (tests)")
    assert world.db.one("SELECT agent_id FROM oauth_requests WHERE id = ?", (request_id,))["agent_id"] == "oj/desk"


DOCUMENT_URL = "https://app.example/oauth/client.json"


@pytest.fixture
def documents_app(world: World, monkeypatch):
    """OAuth with client metadata documents on; the document's host resolves to a public address and
    its https answers come from a stand-in transport (``served`` maps a URL to a response)."""
    import httpx2
    served: dict = {}
    seen: list = []

    def answer(request):
        seen.append((str(request.url), request.headers["host"], request.extensions.get("sni_hostname")))
        return served.get(str(request.url).replace("93.184.216.34", "app.example"),
                          httpx2.Response(404))

    monkeypatch.setattr(prickle, "CLIENT_DOCUMENT_TRANSPORT", httpx2.MockTransport(answer))
    monkeypatch.setattr(prickle, "public_address_of", lambda host: "93.184.216.34")
    application = prickle.create_app(world.db_path, prickle.Settings(
        public_url=ISSUER, oauth_client_metadata_documents=True), port=8321)
    with TestClient(application, base_url=ISSUER, follow_redirects=False) as client:
        client.served, client.seen = served, seen
        yield client


def test_an_app_named_by_its_client_metadata_document_connects_when_that_is_on(documents_app, world):
    import httpx2
    app = documents_app
    assert app.get("/.well-known/oauth-authorization-server").json()["client_id_metadata_document_supported"] is True
    app.served[DOCUMENT_URL] = httpx2.Response(200, json={
        "client_id": DOCUMENT_URL, "client_name": "Hosted app", "redirect_uris": [CALLBACK],
        "token_endpoint_auth_method": "none"})
    verifier, challenge = pkce()
    request_id = authorize(app, DOCUMENT_URL, challenge)
    # Fetched from the address it resolved to, named by its host for TLS and HTTP.
    assert app.seen == [("https://93.184.216.34/oauth/client.json", "app.example", "app.example")]
    view = app.get(f"/api/oauth/{request_id}", headers={"Authorization": f"Bearer {world.tokens['oj']}"}).json()
    assert view["request"]["client_name"] == "Hosted app"
    back = approve(app, world, request_id)
    status, tokens = token(app, grant_type="authorization_code", code=back["code"], client_id=DOCUMENT_URL,
                           redirect_uri="http://127.0.0.1:40001/callback", code_verifier=verifier, resource=RESOURCE)
    assert status == 200 and tokens["access_token"].startswith("prk_oa_")
    assert len(app.seen) == 1  # kept for an hour, not fetched at every step


@pytest.mark.parametrize("document, why", [
    ({"client_id": "https://other.example/c.json", "redirect_uris": [CALLBACK]}, "its client_id is another"),
    ({"client_id": DOCUMENT_URL, "redirect_uris": ["http://lan.example/cb"]}, "a redirect neither https nor loopback"),
    ({"client_id": DOCUMENT_URL, "redirect_uris": [CALLBACK], "token_endpoint_auth_method": "client_secret_post"},
     "not a public client"),
    ({"client_id": DOCUMENT_URL, "redirect_uris": [CALLBACK], "padding": "x" * 6000}, "too big"),
])
def test_a_client_document_that_is_wrong_names_no_app(documents_app, world, document, why):
    import httpx2
    documents_app.served[DOCUMENT_URL] = httpx2.Response(200, json=document)
    _, challenge = pkce()
    r = documents_app.get("/authorize", params={"response_type": "code", "client_id": DOCUMENT_URL,
                                                "redirect_uri": CALLBACK, "code_challenge": challenge})
    assert (r.status_code, r.json()["error"]) == (400, "invalid_request"), why
    assert world.db.scalar("SELECT count(*) FROM oauth_clients") == 0


def test_a_document_address_that_is_not_public_is_never_fetched(world, monkeypatch):
    with pytest.raises(prickle.InvalidInput, match="not public"):
        prickle.public_address_of("127.0.0.1")
    with pytest.raises(prickle.InvalidInput, match="not public"):
        prickle.public_address_of("10.1.2.3")
    with pytest.raises(prickle.InvalidInput, match="an https URL with a path"):
        import asyncio
        asyncio.run(prickle.fetch_client_document("http://app.example/c.json"))
    # Off (the default): a URL is just an unknown client id.
    application = prickle.create_app(world.db_path, prickle.Settings(public_url=ISSUER), port=8321)
    with TestClient(application, base_url=ISSUER) as app:
        assert "client_id_metadata_document_supported" not in app.get("/.well-known/oauth-authorization-server").json()
        r = app.get("/authorize", params={"response_type": "code", "client_id": DOCUMENT_URL,
                                          "redirect_uri": CALLBACK, "code_challenge": "x" * 43})
        assert r.json()["error_description"] == f"Client ID '{DOCUMENT_URL}' not found"


def test_disconnecting_ends_a_held_wait_and_a_token_for_another_address_is_refused(app, world):
    from conftest import in_thread
    client, tokens, _ = connected(app, world)
    mcp = MCP(app, {"oj/muse": tokens["access_token"]})
    mcp.ok("oj/muse", "wait_for_mention", {"timeout_seconds": 1})  # the demo's missed mentions
    join = in_thread(mcp.call, "oj/muse", "wait_for_mention", {"timeout_seconds": 30})
    hub = app.app.state.prickle.hub
    import time
    until = time.monotonic() + 10
    while not hub.agent_waiters.get("oj/muse"):
        assert time.monotonic() < until
        time.sleep(0.01)
    [listed] = app.get("/api/apps", headers={"Authorization": f"Bearer {world.tokens['oj']}"}).json()["apps"]
    app.delete(f"/api/apps/{listed['family']}", headers={"Authorization": f"Bearer {world.tokens['oj']}"})
    is_error, text = join()
    assert is_error and text.startswith("unauthorized: "), text
    # A token made when the server had another address is no good for this one (its audience).
    _, other, _ = connected(app, world)
    with world.db.transaction():
        world.db.execute("UPDATE credentials SET resource = 'https://old.example/mcp' WHERE kind = 'oauth'")
    r = MCP(app, {}).raw(other["access_token"], "tools/list")
    assert (r.status_code, r.json()["error"]["message"]) == (
        401, "this app's token was made for another server address: connect the app again")


def test_an_app_is_never_offered_or_given_a_private_room(app, world):
    client = register(app)
    _, challenge = pkce()
    request_id = authorize(app, client["client_id"], challenge)
    oj = {"Authorization": f"Bearer {world.tokens['oj']}"}
    rooms = {r["slug"] for r in world.db.rows("SELECT slug FROM projects WHERE kind = 'private'")}
    view = app.get(f"/api/oauth/{request_id}", headers=oj).json()
    assert rooms and not rooms & {p for a in view["agents"] for p in a["projects"]}
    confirm(app, world)
    room = world.db.scalar("SELECT slug FROM projects WHERE kind = 'private' AND slug LIKE 'oj%'")
    r = app.post(f"/api/oauth/{request_id}", json={"decision": "approve", "agent_id": "oj/muse", "project": room},
                 headers=oj)
    assert (r.status_code, r.json()["error"]["message"]) == (
        400, "project: one of oj/muse's team projects, or none for all of them (an app never reaches a private room)")
    assert world.db.one("SELECT state FROM oauth_requests WHERE id = ?", (request_id,))["state"] == "pending"
