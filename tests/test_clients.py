"""Independent MCP clients: the official conformance suite and the MCP Inspector's CLI.

They live beside the project (``../shared/clients``); a plain clone has none, so these
tests skip there. ``.ci/run`` runs them.
"""

import json
import subprocess
from pathlib import Path

import pytest

from conftest import HAVE_SHARED_CLIENTS, SHARED, Served

pytestmark = pytest.mark.skipif(not HAVE_SHARED_CLIENTS, reason="../shared/clients is not here (a plain clone)")
CLIENTS = SHARED / "clients"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with Served(str(tmp_path_factory.mktemp("clients") / "prickle.db"), "--demo") as s:
        yield s


def sh(*args, timeout=900):
    return subprocess.run(["bash", *map(str, args)], capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("version", ["0.1.16", "0.2.0-alpha.12"])
def test_conformance_suite(served, version, monkeypatch):
    monkeypatch.setenv("CONFORMANCE_VERSION", version)
    p = sh(CLIENTS / "run-conformance.sh", served.info["mcp"], served.info["demo"]["keys"]["oj/muse"])
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.strip().splitlines()[-1] == "5 passed, 0 failed"


def test_inspector_lists_and_calls_tools(served):
    url, key = served.info["mcp"], served.info["demo"]["keys"]["oj/muse"]
    p = sh(CLIENTS / "inspector-call.sh", url, key, "--list")
    assert p.returncode == 0, p.stderr
    names = {t["name"] for t in json.loads(p.stdout)["result"]["tools"]}
    assert {"read_room", "post_message", "wait_for_mention", "wait_for_updates"} <= names
    p = sh(CLIENTS / "inspector-call.sh", url, key, "post_message",
           json.dumps({"project": "website-v2", "body": "@ren/builder from the Inspector"}))
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["result"]["structuredContent"]["message"]["mentions"] == ["ren/builder"]
    # the demo's mentions of oj/muse that no wait has handed out yet come first, then nothing is new
    p = sh(CLIENTS / "inspector-call.sh", url, key, "wait_for_updates", json.dumps({"timeout_seconds": 2}))
    missed = json.loads(p.stdout)["result"]["structuredContent"]
    assert p.returncode == 0 and missed["status"] == "updates" and missed["updates"], p.stdout
    assert {u["kind"] for u in missed["updates"]} == {"mention"}
    p = sh(CLIENTS / "inspector-call.sh", url, key, "wait_for_updates", json.dumps({"timeout_seconds": 2}))
    assert p.returncode == 0 and json.loads(p.stdout)["result"]["structuredContent"]["status"] == "timeout"
    p = sh(CLIENTS / "inspector-call.sh", url, key, "read_room", json.dumps({"project": "elsewhere"}))
    assert p.returncode == 5  # an isError result
    p = sh(CLIENTS / "inspector-call.sh", url, "prk_ck_wrong", "--list")
    assert p.returncode == 3  # unauthorised


def test_the_typescript_sdks_oauth_client_connects_end_to_end(tmp_path):
    """The MCP TypeScript SDK's OAuth client, headless: 401 → both metadata documents → /register →
    /authorize (a person approves it) → /token with PKCE → a tool call with the access token."""
    import os
    import urllib.parse

    import httpx
    from helpers import _free_port, confirmed_token
    find = sh("-c", f'source "{CLIENTS}/common.sh" && ensure_node >&2 && ensure_conformance >&2 && '
                    'echo "$NODE" && dirname "$(dirname "$CONFORMANCE_JS")"')
    assert find.returncode == 0, find.stderr
    node, conformance = find.stdout.split()[-2:]
    sdk = os.path.join(os.path.dirname(conformance), "sdk")
    port = _free_port()
    (tmp_path / "prickle.toml").write_text(f'public_url = "http://localhost:{port}"\n')
    db = str(tmp_path / "prickle.db")
    callback = "http://127.0.0.1:40003/callback"
    with Served(db, "--demo", "--port", str(port), "--config", str(tmp_path / "prickle.toml")) as served:
        base = served.info["url"]
        client = subprocess.Popen([node, str(Path(__file__).parent / "oauth_client.mjs"), sdk, f"{base}/mcp", callback],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            asked = json.loads(client.stdout.readline())["authorize"]
            assert asked.startswith(f"{base}/authorize?")
            query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(asked).query))
            assert (query["code_challenge_method"], query["resource"]) == ("S256", f"{base}/mcp")
            page = httpx.get(asked, follow_redirects=False).headers["location"]
            oj = confirmed_token(db, base, "oj")
            back = httpx.post(f"{base}/api/oauth/{page.rsplit('/', 1)[1]}", json={
                "decision": "approve", "agent_id": "oj/muse"}, headers={"Authorization": f"Bearer {oj}"}).json()
            returned = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(back["redirect"]).query))
            assert (returned.get("state"), returned["iss"]) == (query.get("state"), base)
            out, err = client.communicate(returned["code"] + "\n", timeout=120)
        finally:
            if client.poll() is None:
                client.kill()
        assert client.returncode == 0, out + err
        said = json.loads(out.strip().splitlines()[-1])
        assert (said["ok"], said["token_kind"], said["refresh"]) == ("website-v2", "prk_oa_", True)


def test_the_conformance_suites_authorization_server_scenarios_pass(tmp_path, monkeypatch):
    """The official conformance suite (0.2.0-alpha.12) against Prickle's authorization server: its
    metadata, and the authorization code grant (PKCE, the resource indicator, iss, the token answer),
    with a person approving the request on the API as the page would."""
    import threading
    import urllib.parse

    import httpx
    from helpers import _free_port, confirmed_token
    monkeypatch.setenv("CONFORMANCE_VERSION", "0.2.0-alpha.12")
    find = sh("-c", f'source "{CLIENTS}/common.sh" && ensure_node >&2 && ensure_conformance >&2 && '
                    'echo "$NODE" && echo "$CONFORMANCE_JS"')
    assert find.returncode == 0, find.stderr
    node, suite = find.stdout.split()[-2:]
    port, callback = _free_port(), _free_port()
    (tmp_path / "prickle.toml").write_text(f'public_url = "http://localhost:{port}"\n')
    db = str(tmp_path / "prickle.db")
    with Served(db, "--demo", "--port", str(port), "--config", str(tmp_path / "prickle.toml")) as served:
        base = served.info["url"]
        client = httpx.post(f"{base}/register", json={
            "client_name": "conformance", "redirect_uris": [f"http://127.0.0.1:{callback}/callback"],
            "token_endpoint_auth_method": "none"}).json()
        run = subprocess.Popen([node, suite, "authorization", "--url", base, "--client-id", client["client_id"],
                                "--resource", f"{base}/mcp", "--port", str(callback), "-o", str(tmp_path / "out")],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        said = []
        try:
            for line in run.stdout:
                said.append(line)
                if line.startswith(f"{base}/authorize?"):
                    page = httpx.get(line.strip(), follow_redirects=False).headers["location"]
                    oj = confirmed_token(db, base, "oj")
                    back = httpx.post(f"{base}/api/oauth/{page.rsplit('/', 1)[1]}", json={
                        "decision": "approve", "agent_id": "oj/muse"}, headers={"Authorization": f"Bearer {oj}"}
                    ).json()["redirect"]
                    assert urllib.parse.urlsplit(back).port == callback
                    threading.Thread(target=httpx.get, args=(back,), daemon=True).start()  # the browser's return
            run.wait(120)
        finally:
            if run.poll() is None:
                run.kill()
            run.wait(30)
            run.stdout.close()
        text = "".join(said)
        assert run.returncode == 0, text
        assert "✓ authorization-server-metadata-endpoint: 1 passed, 0 failed" in text
        assert "✓ authorization-code-grant: 1 passed, 0 failed" in text
        assert text.strip().splitlines()[-1] == "Total: 2 passed, 0 failed"
