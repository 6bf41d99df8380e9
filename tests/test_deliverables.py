"""Deliverables: the files a runner's run delivers with its result (chapter 24).

A run names a file of its workspace in its result's artifacts (a relative ref and the sha256 of
its bytes); its runner, asked through its device's state, uploads the bytes with the run's own
credential before the result is recorded; the requester's people and agents download them. A
file whose bytes do not match, a truncated one, one too big, one uploaded with a credential
that is not this task's run: each refused naming the field, nothing kept.
"""

from __future__ import annotations

import io
import socket

import httpx

import prickle
from conftest import MCP, Served, audit_entries, in_thread
from helpers import PROJECT, claimed, cli_json, evidence, paired, pdf_bytes, person, routed

POLICY = b"# Refund policy\n\nRefunds within **30 days**, no questions asked.\n"
DIGEST = prickle.sha256_hex(POLICY)


def bearer(key: str) -> dict:
    return {"Authorization": f"Bearer {key}"}


def running(mcp, server, world):
    """ren/builder's claimed run of a routed task, accepted: (task id, run credential, runner key)."""
    task, device, runner, out = claimed(mcp, server, world)
    run = out["execution_credential"]["token"]
    mcp.ok("ren/builder", "accept_task", {"task_id": task["id"]}, token=run)
    return task["id"], run, runner


def returning(mcp, task_id: str, run: str, artifacts: list[dict]):
    """return_result by the run, in a thread (it waits for the runner's uploads): join() gives (is_error, out)."""
    return in_thread(mcp.call, "ren/builder", "return_result", {
        "task_id": task_id, "summary": "The refund policy, written.", "evidence": [evidence([0, 1])],
        "artifacts": artifacts}, run)


def wanted(server, runner: str) -> list[dict]:
    """What the runner is asked to upload (its device's state), once it is asked."""
    import time
    for _ in range(200):
        runs = server.get("/api/runner/state", headers=bearer(runner)).json()["runs"]
        if runs and runs[0].get("files_wanted"):
            return runs[0]["files_wanted"]
        time.sleep(0.05)
    raise AssertionError("the runner was never asked for files")


def upload(server, task_id: str, key: str, data: bytes, ref: str = "refund-policy.md", digest: str = DIGEST):
    return server.post(f"/api/runner/tasks/{task_id}/files", params={"ref": ref, "sha256": digest}, content=data,
                       headers=bearer(key))


def stored(world) -> tuple[int, int]:
    return world.db.scalar("SELECT count(*) FROM deliverables"), world.db.scalar("SELECT count(*) FROM blobs")


def test_a_runs_file_goes_up_before_its_result_and_the_requester_downloads_it(mcp, server, world):
    task_id, run, runner = running(mcp, server, world)
    join = returning(mcp, task_id, run, [{"ref": "refund-policy.md", "sha256": DIGEST}])
    assert wanted(server, runner) == [{"ref": "refund-policy.md", "sha256": DIGEST}]
    # Not shown yet: the requester still sees the task being worked on.
    assert mcp.ok("oj/muse", "check_inbox", {})["requested"][0]["state"] == "accepted"
    r = upload(server, task_id, run, POLICY)
    assert r.status_code == 200, r.text
    delivered = r.json()["deliverable"]
    assert delivered == {"id": delivered["id"], "task_id": task_id, "ref": "refund-policy.md", "sha256": DIGEST,
                         "content_type": "text/markdown", "byte_size": len(POLICY), "uploaded_by": "ren/builder",
                         "created_at": delivered["created_at"], "url": f"/api/deliverables/{delivered['id']}",
                         "preview": True}
    is_error, out = join()
    assert not is_error, out
    assert out["task"]["state"] == "verifying"
    assert out["submission"]["artifacts"] == [{"ref": "refund-policy.md", "sha256": DIGEST, "commit_sha": None}]
    # The task page lists it; the requester's owner opens it (shown inline, never run) or downloads it.
    oj = person(server, world, "oj")
    assert oj.get(f"/api/tasks/{task_id}").json()["deliverables"] == [delivered]
    r = oj.get(delivered["url"])
    assert r.status_code == 200 and r.content == POLICY and prickle.sha256_hex(r.content) == DIGEST
    assert (r.headers["content-type"].split(";")[0], r.headers["x-content-type-options"],
            r.headers["content-disposition"], r.headers["content-security-policy"], r.headers["x-content-sha256"]) == (
        "text/markdown", "nosniff", "inline", "default-src 'none'; sandbox", DIGEST)
    r = oj.get(delivered["url"] + "?download=1")
    assert r.headers["content-disposition"] == "attachment; filename*=UTF-8''refund-policy.md"
    # The requesting agent lists and reads it with its own key; the read is audited (no name, no bytes).
    listed = server.get(f"/api/tasks/{task_id}/files", headers=bearer(world.keys["oj/muse"])).json()
    assert listed == {"deliverables": [delivered]}
    assert server.get(delivered["url"], headers=bearer(world.keys["oj/muse"])).content == POLICY
    [up] = audit_entries(world.db, PROJECT, "deliverable.uploaded")
    assert up["refs"] == {"task": task_id, "deliverable": delivered["id"], "attempt": up["refs"]["attempt"],
                          "content_type": "text/markdown", "byte_size": len(POLICY), "sha256": DIGEST}
    [read] = audit_entries(world.db, PROJECT, "deliverable.read")
    assert read["refs"] == {"task": task_id, "deliverable": delivered["id"], "agent": "oj/muse",
                            "byte_size": len(POLICY)}
    # Someone who can't see the task gets what an unknown file gets.
    r = server.get(delivered["url"], headers=bearer(world.tokens["sam"]))
    assert (r.status_code, r.json()["error"]["message"]) == (
        404, f"deliverable: no deliverable '{delivered['id']}' of a task you can see")
    assert server.get("/api/deliverables/dlv_nothing", headers=bearer(world.keys["oj/muse"])).status_code == 404
    # Uploading the same file again keeps one row and one copy of the bytes.
    assert stored(world) == (1, 1)


def test_other_files_are_downloads_of_bytes_never_shown(mcp, server, world):
    task_id, run, runner = running(mcp, server, world)
    svg = b'<svg xmlns="http://www.w3.org/2000/svg"><script>alert(1)</script></svg>'
    archive = b"PK\x03\x04" + bytes(range(256))
    files = {"art/logo.svg": svg, "dist/site.zip": archive}
    join = returning(mcp, task_id, run, [{"ref": ref, "sha256": prickle.sha256_hex(data)} for ref, data in files.items()])
    assert [w["ref"] for w in wanted(server, runner)] == list(files)
    for ref, data in files.items():
        assert upload(server, task_id, run, data, ref, prickle.sha256_hex(data)).status_code == 200
    assert join()[1]["task"]["state"] == "verifying"
    oj = person(server, world, "oj")
    for d in oj.get(f"/api/tasks/{task_id}").json()["deliverables"]:
        assert (d["content_type"], d["preview"]) == ("application/octet-stream", False)
        r = oj.get(d["url"])
        name = d["ref"].rsplit("/", 1)[1]
        assert (r.headers["content-type"], r.headers["content-disposition"], r.headers["x-content-type-options"]) == (
            "application/octet-stream", f"attachment; filename*=UTF-8''{name}", "nosniff")
        assert r.content == files[d["ref"]]


def test_a_wrong_or_truncated_file_is_refused_and_the_run_is_told_why(mcp, server, world):
    task_id, run, runner = running(mcp, server, world)
    join = returning(mcp, task_id, run, [{"ref": "refund-policy.md", "sha256": DIGEST}])
    wanted(server, runner)
    r = upload(server, task_id, run, POLICY[:-7])  # cut short on the way
    assert r.status_code == 400
    message = r.json()["error"]["message"]
    cut = len(POLICY) - 7
    assert message.startswith(f"sha256: refund-policy.md: its {cut} bytes hash to ") and "nothing was kept" in message
    is_error, out = join()
    assert is_error and out.startswith(f"invalid_input: artifacts[0]: refund-policy.md was not delivered: its {cut} "
                                       "bytes hash to "), out
    assert out.endswith(f"not the sha256 {DIGEST} the result names; fix it and call return_result again")
    assert stored(world) == (0, 0)
    assert mcp.ok("oj/muse", "check_inbox", {})["requested"][0]["state"] == "accepted"
    # The run fixes the file and returns again: asked afresh, uploaded whole, recorded.
    join = returning(mcp, task_id, run, [{"ref": "refund-policy.md", "sha256": DIGEST}])
    assert wanted(server, runner) == [{"ref": "refund-policy.md", "sha256": DIGEST}]
    assert upload(server, task_id, run, POLICY).status_code == 200
    assert join()[1]["task"]["state"] == "verifying"


def test_a_file_the_runner_cannot_find_is_said_and_one_never_sent_times_out(mcp, server, world, monkeypatch):
    task_id, run, runner = running(mcp, server, world)
    join = returning(mcp, task_id, run, [{"ref": "missing.md", "sha256": DIGEST}])
    wanted(server, runner)
    r = server.post(f"/api/runner/tasks/{task_id}/files/refused", json={
        "ref": "missing.md", "sha256": DIGEST, "reason": "there is no file missing.md in the workspace"},
        headers=bearer(run))
    assert r.status_code == 200, r.text
    is_error, out = join()
    assert out == ("invalid_input: artifacts[0]: missing.md was not delivered: there is no file missing.md in the "
                   "workspace; fix it and call return_result again")
    monkeypatch.setattr(prickle, "FILES_WAIT_SECONDS", 0.3)
    is_error, out = returning(mcp, task_id, run, [{"ref": "late.md", "sha256": DIGEST}])()
    assert out == ("invalid_state: artifacts[0]: late.md is not in the store: your runner did not deliver it within "
                   "0.3 seconds (is it running?); call return_result again")
    assert stored(world) == (0, 0)


def test_bad_uploads_name_the_field_and_keep_nothing(mcp, server, world):
    task_id, run, runner = running(mcp, server, world)
    cases = [
        (upload(server, task_id, run, POLICY, ref="../outside.md"), 400, "ref: '../outside.md' is not a file's path"),
        (upload(server, task_id, run, POLICY, ref="/etc/passwd"), 400, "ref: give the file's path relative"),
        (upload(server, task_id, run, POLICY, ref=".git/config"), 400, "ref: '.git/config' is not a file's path"),
        (upload(server, task_id, run, POLICY, digest="abc"), 400, "sha256: give the file's SHA-256"),
        (upload(server, task_id, run, b""), 400, "file: it is empty"),
        (upload(server, task_id, run, b"x" * (prickle.DELIVERABLE_MAX_BYTES + 1)), 413,
         f"the limit is {prickle.DELIVERABLE_MAX_BYTES}"),
        # Not the run's credential: the runner's own key, an agent's MCP key, a person's token.
        (upload(server, task_id, runner, POLICY), 401, "here you need a run's execution credential"),
        (upload(server, task_id, world.keys["ren/builder"], POLICY), 401, "here you need a run's execution"),
        (upload(server, task_id, world.tokens["ren"], POLICY), 401, "here you need a run's execution"),
    ]
    for n, (r, status, text) in enumerate(cases):
        assert (r.status_code, text in r.json()["error"]["message"]) == (status, True), (n, r.text)
    # A run of another task can't upload for this one.
    other = routed(mcp, server, world)
    device, second_runner = paired(world)
    claim = mcp.ok("ren/builder", "claim_task", {"task_id": other["id"], "idempotency_key": "k2"}, token=second_runner)
    r = upload(server, task_id, claim["execution_credential"]["token"], POLICY)
    assert r.status_code == 404 and r.json()["error"]["message"].startswith("task_id: no run of task")
    # A ref outside the workspace in the result itself is refused before anything is asked.
    is_error, out = returning(mcp, task_id, run, [{"ref": "../../secrets.txt", "sha256": DIGEST}])()
    assert is_error and out.startswith("invalid_input: artifacts[0].ref: '../../secrets.txt' is not a file's path")
    assert stored(world) == (0, 0)
    assert audit_entries(world.db, PROJECT, "deliverable.uploaded") == []


def test_a_commit_the_result_names_is_delivered_by_its_runner_or_refused(mcp, server, world):
    task_id, run, runner = running(mcp, server, world)
    commit = "c" * 40
    code = [{"ref": f"prickle/{task_id}", "commit_sha": commit}, {"ref": "https://example.com/pr/7", "commit_sha": "d" * 40}]
    join = returning(mcp, task_id, run, code)
    # Only the commit on the runner's branch is asked: a URL ref is somewhere the agent put it itself.
    assert wanted(server, runner) == [{"ref": f"prickle/{task_id}", "commit_sha": commit}]
    r = server.post(f"/api/runner/tasks/{task_id}/files/refused", json={
        "ref": f"prickle/{task_id}", "commit_sha": commit, "reason": f"commit {commit} is not on the branch"},
        headers=bearer(run))
    assert r.status_code == 200, r.text
    assert join()[1] == (f"invalid_input: artifacts[0]: prickle/{task_id} was not delivered: commit {commit} is not "
                         "on the branch; fix it and call return_result again")
    join = returning(mcp, task_id, run, code)
    wanted(server, runner)
    r = server.post(f"/api/runner/tasks/{task_id}/commits", json={
        "ref": f"prickle/{task_id}", "commit_sha": commit, "how": f"pushed to origin prickle/{task_id}"},
        headers=bearer(run))
    assert r.status_code == 200, r.text
    assert join()[1]["task"]["state"] == "verifying"
    [entry] = audit_entries(world.db, PROJECT, "deliverable.commit")
    assert entry["refs"] == {"task": task_id, "commit_sha": commit, "attempt": entry["refs"]["attempt"]}
    # The run has ended: nothing more goes up with its credential.
    r = server.post(f"/api/runner/tasks/{task_id}/commits", json={
        "ref": f"prickle/{task_id}", "commit_sha": commit, "how": "again"}, headers=bearer(run))
    assert (r.status_code, r.json()["error"]["message"]) == (
        409, f"the run of task '{task_id}' has ended; its files can no longer be uploaded")


def test_an_upload_cut_short_on_the_wire_is_refused_and_keeps_nothing(db_path):
    """A body that ends before its Content-Length (the connection closed mid-file): refused, nothing kept."""
    with Served(db_path, "--demo") as served:
        runner = cli_json(db_path, "device", "pair", "ren/builder", "--name", "ren-laptop")["token"]
        cli_json(db_path, "rule", "set", "ren", "--decision", "allow", "--from-owner", "oj")
        with httpx.Client(base_url=served.info["url"], timeout=30) as http:
            mcp = MCP(http, {"oj/muse": served.info["demo"]["keys"]["oj/muse"]})
            task = mcp.ok("oj/muse", "handoff", {"project": PROJECT, "to": "ren/builder", "packet": {
                "task": "Write the refund policy.", "deliverable_type": "doc", "acceptance_criteria": ["Clear."]}})
            run = mcp.ok("ren/builder", "claim_task", {"task_id": task["task"]["id"], "idempotency_key": "k"},
                         token=runner)["execution_credential"]["token"]
        host, port = served.info["url"].removeprefix("http://").split(":")
        with socket.create_connection((host, int(port))) as sock:
            sock.sendall((f"POST /api/runner/tasks/{task['task']['id']}/files?ref=refund-policy.md&sha256={DIGEST} "
                          f"HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: Bearer {run}\r\n"
                          f"Content-Length: {len(POLICY)}\r\n\r\n").encode() + POLICY[:20])
            sock.shutdown(socket.SHUT_WR)
            answer = sock.recv(65536).decode(errors="replace")
        assert not answer.startswith("HTTP/1.1 500"), answer  # the server hangs up, or refuses it: never a failure
        db = prickle.Database(db_path)
        assert (db.scalar("SELECT count(*) FROM deliverables"), db.scalar("SELECT count(*) FROM blobs")) == (0, 0)
        db.close()


def test_a_pdf_deliverable_shows_its_first_pages_as_pictures(mcp, server, world):
    """The page previews a PDF by pictures the server draws of its first three pages; no more, nothing run."""
    from PIL import Image
    document = pdf_bytes(4)
    digest = prickle.sha256_hex(document)
    task_id, run, runner = running(mcp, server, world)
    join = returning(mcp, task_id, run, [{"ref": "out/brief.pdf", "sha256": digest}])
    wanted(server, runner)
    delivered = upload(server, task_id, run, document, "out/brief.pdf", digest).json()["deliverable"]
    assert (delivered["content_type"], delivered["preview"]) == ("application/pdf", True)
    assert join()[1]["task"]["state"] == "verifying"
    oj = person(server, world, "oj")
    for n in (1, 2, 3):
        r = oj.get(f"{delivered['url']}/pages/{n}")
        assert r.status_code == 200, r.text
        assert (r.headers["content-type"], r.headers["x-page-count"], r.headers["x-content-type-options"],
                r.headers["content-security-policy"]) == ("image/png", "4", "nosniff", "default-src 'none'; sandbox")
        picture = Image.open(io.BytesIO(r.content))
        assert picture.size == (1000, 1295)  # 612 x 792 pt drawn 1000 px wide (pdfium rounds up)
        assert picture.convert("RGB").getpixel((500, 647)) == (255, 0, 0)  # the square's middle
        assert picture.convert("RGB").getpixel((20, 20)) == (255, 255, 255)
    # The requesting agent may read them too, with its own key.
    assert server.get(f"{delivered['url']}/pages/1", headers=bearer(world.keys["oj/muse"])).status_code == 200
    for n in (0, 4):
        r = oj.get(f"{delivered['url']}/pages/{n}")
        assert (r.status_code, r.json()["error"]["message"]) == (
            404, "page: the preview shows page 1 to 3 of 4; download the PDF for the rest")
    r = server.get(f"{delivered['url']}/pages/1", headers=bearer(world.tokens["sam"]))
    assert (r.status_code, r.json()["error"]["message"]) == (
        404, f"deliverable: no deliverable '{delivered['id']}' of a task you can see")


def test_a_damaged_pdf_or_another_file_has_no_pages_to_show(mcp, server, world):
    task_id, run, runner = running(mcp, server, world)
    broken = b"%PDF-1.4\nnot really a PDF\n%%EOF\n"
    files = {"broken.pdf": broken, "refund-policy.md": POLICY}
    join = returning(mcp, task_id, run, [{"ref": ref, "sha256": prickle.sha256_hex(d)} for ref, d in files.items()])
    wanted(server, runner)
    urls = {ref: upload(server, task_id, run, data, ref, prickle.sha256_hex(data)).json()["deliverable"]["url"]
            for ref, data in files.items()}
    assert join()[1]["task"]["state"] == "verifying"
    oj = person(server, world, "oj")
    r = oj.get(urls["broken.pdf"] + "/pages/1")
    assert (r.status_code, r.json()["error"]["message"]) == (
        400, "the PDF could not be read (damaged, or locked with a password): download it to open it")
    r = oj.get(urls["refund-policy.md"] + "/pages/1")
    assert (r.status_code, r.json()["error"]["message"]) == (
        400, "this file is text/markdown, not a PDF: open it as it is")
    assert oj.get(urls["broken.pdf"]).content == broken  # the download is still there
