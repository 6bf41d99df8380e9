"""Real Claude Code connects with OAuth: ``claude mcp add`` with the server's address, then
``claude mcp login --no-browser`` in a terminal of its own (it needs one), the person approves the
app, the redirect is pasted back as Claude Code asks, and ``claude mcp list`` finds it connected.
No internet: the only server is Prickle's.
"""

from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import time
import urllib.parse

import httpx
import pytest

from conftest import Served
from helpers import _free_port, cli_json, confirmed_token
from runner_util import CLAUDE, CLAUDE_MISSING

pytestmark = pytest.mark.skipif(not CLAUDE, reason=CLAUDE_MISSING)
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def test_claude_code_logs_in_with_oauth_and_connects(tmp_path):
    port = _free_port()
    (tmp_path / "prickle.toml").write_text(f'public_url = "http://localhost:{port}"\n')
    db = str(tmp_path / "prickle.db")
    (tmp_path / "home").mkdir()
    env = os.environ | {"HOME": str(tmp_path / "home"), "DISABLE_AUTOUPDATER": "1",
                        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}
    with Served(db, "--demo", "--port", str(port), "--config", str(tmp_path / "prickle.toml")) as served:
        base = served.info["url"]
        added = subprocess.run([CLAUDE, "mcp", "add", "--transport", "http", "-s", "user", "prickle", f"{base}/mcp"],
                               env=env, capture_output=True, text=True, timeout=60)
        assert added.returncode == 0, added.stderr
        pid, fd = pty.fork()
        if pid == 0:  # the child: Claude Code in a terminal of its own
            os.execve(CLAUDE, [CLAUDE, "mcp", "login", "prickle", "--no-browser"], env)
        said, pasted = "", None
        deadline = time.monotonic() + 90
        try:
            while time.monotonic() < deadline and "Authenticated with" not in said:
                ready, _, _ = select.select([fd], [], [], 1)
                if not ready:
                    continue
                try:
                    chunk = os.read(fd, 4096)
                except OSError:
                    break
                said += ANSI.sub("", chunk.decode(errors="replace"))
                asked = re.search(rf"(http://localhost:{port}/authorize\?\S+)", said)
                if asked and pasted is None and "paste the redirect URL" in said:
                    query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(asked.group(1)).query))
                    assert (query["code_challenge_method"], query["resource"]) == ("S256", f"{base}/mcp")
                    page = httpx.get(asked.group(1), follow_redirects=False).headers["location"]
                    oj = confirmed_token(db, base, "oj")
                    pasted = httpx.post(f"{base}/api/oauth/{page.rsplit('/', 1)[1]}", json={
                        "decision": "approve", "agent_id": "oj/muse"}, headers={"Authorization": f"Bearer {oj}"}
                    ).json()["redirect"]
                    os.write(fd, (pasted + "\r").encode())
        finally:
            os.kill(pid, 9) if os.waitpid(pid, os.WNOHANG) == (0, 0) else None
            os.close(fd)
        assert 'Authenticated with "prickle"' in said, said[-2000:]
        listed = subprocess.run([CLAUDE, "mcp", "list"], env=env, capture_output=True, text=True, timeout=90)
        assert re.search(r"prickle: http://localhost:\d+/mcp \(HTTP\) - ✔ Connected", listed.stdout), listed.stdout
        apps = httpx.get(f"{base}/api/apps", headers={"Authorization": "Bearer " + cli_json(
            db, "token", "create", "--person", "oj")["token"]}).json()["apps"]
        assert [(a["agent_id"], a["project"]) for a in apps] == [("oj/muse", None)]
