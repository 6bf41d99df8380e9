"""Independent MCP clients: the official conformance suite and the MCP Inspector's CLI.

They live beside the project (``../shared/clients``); a plain clone has none, so these
tests skip there. ``.ci/run`` runs them.
"""

import json
import subprocess

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
