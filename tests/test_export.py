"""Exporting a project (chapter 41), and the audit chain's hash versions (chapter 6) an export carries."""

import hashlib
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import prickle
from conftest import PROJECT, audit_entries
from helpers import _database_at_version, claimed, confirmed, evidence, jrun, person, run

GENESIS = "0" * 64


def canonical(value):
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def hash_v1(e):
    body = {k: e[k] for k in ("chain", "n", "at", "type", "refs")}
    return hashlib.sha256((e["prev_hash"] + canonical(body)).encode()).hexdigest()


def hash_v2(e):
    body = {k: e[k] for k in ("chain", "n", "at", "type", "refs", "prev_hash")} | {"hash_version": 2}
    return hashlib.sha256(canonical(body).encode()).hexdigest()


# -- hash versions ------------------------------------------------------------------------------

def _older_file(db_path, entries=3):
    """A file as the Prickle before hash versions left it: project p with a version-1 chain."""
    before = next(i for i, m in enumerate(prickle.MIGRATIONS) if any("hash_version" in sql for sql in m))
    conn = _database_at_version(db_path, before)
    prev = GENESIS
    with conn:
        conn.execute("INSERT INTO people (handle, display_name, created_at) VALUES ('oj', 'OJ', 'x')")
        conn.execute("INSERT INTO projects (slug, team, name, created_by, created_at) VALUES ('p', 't', 'P', 'oj', 'x')")
        conn.execute("INSERT INTO members (project, handle, role, joined_at) VALUES ('p', 'oj', 'owner', 'x')")
        for n in range(1, entries + 1):
            e = {"chain": "p", "n": n, "at": f"2026-11-0{n}T10:00:00.000Z", "type": "memory.set",
                 "refs": {"key": f"k{n}", "by": "oj"}, "prev_hash": prev}
            e["hash"] = hash_v1(e)
            conn.execute("INSERT INTO audit VALUES (?, ?, ?, ?, ?, ?, ?)",
                         ("p", n, e["at"], e["type"], canonical(e["refs"]), prev, e["hash"]))
            prev = e["hash"]
    conn.close()
    return prev


def test_entries_from_before_hash_versions_are_version_1_and_their_chain_stays_there(db_path):
    head = _older_file(db_path)
    db = prickle.Database(db_path)
    assert [(e["n"], e["hash_version"]) for e in audit_entries(db, "p")] == [(1, 1), (2, 1), (3, 1)]
    assert prickle.verify_audit(db, "p") == [{"chain": "p", "entries": 3, "ok": True, "broken_at": None,
                                              "hash_version": 1, "head": head}]
    with db.transaction():
        fourth = prickle.audit(db, "p", "memory.set", {"key": "k4", "by": "oj"})
        fresh = prickle.audit(db, "q", "memory.set", {"key": "k1", "by": "oj"})
    entries = audit_entries(db, "p")
    # an older chain goes on in its own version; a new chain starts at the newest
    assert entries[3]["hash_version"] == 1 and entries[3]["prev_hash"] == head
    assert entries[3]["hash"] == fourth["hash"] == hash_v1(entries[3])
    new = audit_entries(db, "q")[0]
    assert new["hash_version"] == prickle.AUDIT_HASH_VERSION == 2 and new["hash"] == fresh["hash"] == hash_v2(new)
    assert new["prev_hash"] == GENESIS


def test_rehash_moves_a_chain_to_version_2_and_records_both_heads(db_path):
    old_head = _older_file(db_path)
    db = prickle.Database(db_path)
    out = jrun(db_path, "audit", "rehash", "p")
    entries = audit_entries(db, "p")
    assert [(e["n"], e["type"], e["hash_version"]) for e in entries] == [
        (1, "memory.set", 2), (2, "memory.set", 2), (3, "memory.set", 2), (4, "chain.rehashed", 2)]
    # every entry's hash is version 2's, linked as before; what each entry says is unchanged
    prev = GENESIS
    for n, e in enumerate(entries, 1):
        assert e["prev_hash"] == prev and e["hash"] == hash_v2(e)
        prev = e["hash"]
    assert [e["refs"] for e in entries[:3]] == [{"key": f"k{n}", "by": "oj"} for n in (1, 2, 3)]
    assert entries[3]["refs"] == {"old_head": old_head, "new_head": entries[2]["hash"], "rewritten": 3,
                                  "hash_version": 2}
    assert out["rehashed"] == [{"chain": "p", "n": 4, "at": entries[3]["at"], "type": "chain.rehashed",
                                "refs": entries[3]["refs"], "hash": entries[3]["hash"]}]
    assert jrun(db_path, "audit", "verify", "p")["chains"] == [
        {"chain": "p", "entries": 4, "ok": True, "broken_at": None, "hash_version": 2, "head": entries[3]["hash"]}]
    # the next entry is written in version 2 too
    with db.transaction():
        prickle.audit(db, "p", "memory.set", {"key": "k5", "by": "oj"})
    assert audit_entries(db, "p")[4]["hash"] == hash_v2(audit_entries(db, "p")[4])
    # a chain already at the newest version: nothing to do, said plainly, nothing written
    code, _, err = run(db_path, "audit", "rehash", "p", ok=False)
    assert code == 1 and "already at hash version 2, the newest" in err
    assert len(audit_entries(db, "p")) == 5
    _, text, _ = run(db_path, "audit", "rehash")
    assert text.strip() == "Every audit chain is already at hash version 2."


def test_a_broken_chain_is_not_rehashed(db_path):
    _older_file(db_path)
    db = prickle.Database(db_path)
    db.execute("UPDATE audit SET refs = ? WHERE chain = 'p' AND n = 2", (canonical({"key": "forged", "by": "oj"}),))
    before = audit_entries(db, "p")
    code, _, err = run(db_path, "audit", "rehash", "p", ok=False)
    assert code == 1 and "broken at entry 2" in err and "not rehashed" in err
    assert audit_entries(db, "p") == before
    code, out, _ = run(db_path, "audit", "verify", "p", ok=False)
    assert code == 1 and out.strip() == f"p: 3 entries, BROKEN at entry 2 (hash version 1; head {before[2]['hash']})"


def test_a_version_2_entry_that_claims_version_1_fails_the_check(db_path):
    _older_file(db_path)
    db = prickle.Database(db_path)
    jrun(db_path, "audit", "rehash", "p")
    # going back down a version is out of place, even with a hash made right for it
    e = audit_entries(db, "p")[3]
    e1 = e | {"hash_version": 1}
    db.execute("UPDATE audit SET hash_version = 1, hash = ? WHERE chain = 'p' AND n = 4", (hash_v1(e1),))
    assert prickle.verify_audit(db, "p")[0]["broken_at"] == 4


# -- exporting ----------------------------------------------------------------------------------

def _zip_lines(archive, name):
    return [json.loads(line) for line in archive.read(name).decode().splitlines()]


def _as_line(e):
    return {k: e[k] for k in ("chain", "n", "at", "type", "refs", "prev_hash", "hash", "hash_version")}


POLICY = b"# Refund policy\n\nRefunds within **30 days**, no questions asked.\n"
DIGEST = hashlib.sha256(POLICY).hexdigest()


def _delivered(mcp, server, world):
    """ren/builder's run returns a result with one file, uploaded by its run: (task id, the deliverable)."""
    task, _, _, out = claimed(mcp, server, world)
    run_key = out["execution_credential"]["token"]
    mcp.ok("ren/builder", "accept_task", {"task_id": task["id"]}, token=run_key)
    # the file goes up first (the run's own credential), then the result that names it
    r = server.post(f"/api/runner/tasks/{task['id']}/files", params={"ref": "refund-policy.md", "sha256": DIGEST},
                    content=POLICY, headers={"Authorization": f"Bearer {run_key}"})
    assert r.status_code == 200, r.text
    mcp.ok("ren/builder", "return_result", {
        "task_id": task["id"], "summary": "The refund policy, written.", "evidence": [evidence([0, 1])],
        "artifacts": [{"ref": "refund-policy.md", "sha256": DIGEST}]}, run_key)
    return task["id"], r.json()["deliverable"]


def test_an_owner_exports_the_whole_content_from_the_api(mcp, server, world, tmp_path):
    oj = person(server, world, "oj")
    assert oj.post(f"/api/projects/{PROJECT}/messages", {"body": "Kick-off at ten."}).status_code == 200
    prickle.set_memory(world.db, PROJECT, "tone", "Plain and warm.", "oj")
    task_id, delivered = _delivered(mcp, server, world)
    moment = prickle.mark_moment(world.db, world.person("ren"), PROJECT, "launch", "2026-11-30", "Refunds are live",
                                 task_id=task_id)["moment"]
    assert oj.get(f"/api/projects/{PROJECT}/export").json() == {"can_export": True, "parts": ["audit_log", "content"]}

    r = oj.post(f"/api/projects/{PROJECT}/export", {"part": "content"})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/zip"
    day = prickle.iso(prickle.utcnow())[:10]
    assert r.headers["content-disposition"] == f'attachment; filename="{PROJECT}-content-{day}.zip"'
    path = tmp_path / "export.zip"
    path.write_bytes(r.content)
    entries = audit_entries(world.db, PROJECT)
    # the export wrote its own entry first: the log it carries ends with it
    assert entries[-1]["type"] == "project.exported" and entries[-1]["refs"] == {"part": "content", "by": "oj"}
    with zipfile.ZipFile(path) as archive:
        names = ["members.jsonl", "memory.jsonl", "messages.jsonl", "tasks.jsonl", "submissions.jsonl",
                 "evidence.jsonl", "moments.jsonl", "files.jsonl", f"files/{DIGEST}", "audit.jsonl", "manifest.json"]
        assert archive.namelist() == names
        lines = {n: _zip_lines(archive, n) for n in names if n.endswith(".jsonl")}
        manifest = json.loads(archive.read("manifest.json"))
        assert archive.read(f"files/{DIGEST}") == POLICY
        raw = {n: archive.read(n) for n in lines}
    assert lines["audit.jsonl"] == [_as_line(e) for e in entries]
    assert lines["members.jsonl"] == prickle.list_members(world.db, PROJECT)
    assert [m["handle"] for m in lines["members.jsonl"]] == ["oj", "ren"]
    assert lines["memory.jsonl"] == [{"key": "tone", "value": "Plain and warm.", "provenance": "owner_approved",
                                      "updated_by": "oj", "updated_at": lines["memory.jsonl"][0]["updated_at"]}]
    ids = [r["id"] for r in world.db.rows("SELECT id FROM messages WHERE project = ? ORDER BY seq", (PROJECT,))]
    assert lines["messages.jsonl"] == [prickle.get_message(world.db, i) for i in ids]
    assert lines["messages.jsonl"][0]["body"] == "Kick-off at ten."
    assert lines["tasks.jsonl"] == [prickle.task_out(world.db, task_id)]
    [sub] = lines["submissions.jsonl"]
    assert sub == {"task_id": task_id} | prickle.task_out(world.db, task_id)["result"]
    assert sub["artifacts"] == [{"ref": "refund-policy.md", "sha256": DIGEST, "commit_sha": None}]
    assert lines["evidence.jsonl"] == [{"task_id": task_id, "submission_id": sub["submission_id"], "revision": 1,
                                        "index": 0} | sub["evidence"][0]]
    assert lines["moments.jsonl"] == [{"id": moment["id"], "kind": "launch", "day": "2026-11-30",
                                       "title": "Refunds are live", "message_id": None, "task_id": task_id,
                                       "marked_by": {"kind": "person", "handle": "ren"},
                                       "marked_at": moment["at"], "edited_at": None}]
    assert lines["files.jsonl"] == [{
        "kind": "deliverable", "id": delivered["id"], "message_id": None, "task_id": task_id,
        "ref": "refund-policy.md", "name": "refund-policy.md", "attachment_kind": None, "sha256": DIGEST,
        "content_type": "text/markdown", "byte_size": len(POLICY), "uploaded_by": "ren/builder",
        "created_at": delivered["created_at"], "path": f"files/{DIGEST}"}]
    assert manifest == {
        "format": "prickle-export", "format_version": 1, "prickle_version": prickle.__version__,
        "project": {"slug": PROJECT, "team": "web", "name": "Website v2", "description": "The new site."},
        "part": "content", "exported_at": manifest["exported_at"], "exported_by": "oj",
        "files": [{"name": n, "lines": len(lines[n]), "sha256": hashlib.sha256(raw[n]).hexdigest()}
                  for n in names if n.endswith(".jsonl")],
        "audit": {"chain": PROJECT, "entries": len(entries), "head": entries[-1]["hash"], "hash_version": 2}}
    report = prickle.check_export(str(path))
    assert (report["ok"], report["entries"], report["head"], report["problems"]) == (
        True, len(entries), entries[-1]["hash"], [])


def test_the_audit_log_alone_from_the_command_line_checks_out_with_no_database(world, db_path, tmp_path):
    dest = str(tmp_path / "audit.zip")
    out = jrun(db_path, "project", "export", PROJECT, "--part", "audit_log", "--by", "oj", "--out", dest)
    entries = audit_entries(world.db, PROJECT)
    assert entries[-1]["type"] == "project.exported" and entries[-1]["refs"] == {"part": "audit_log", "by": "oj"}
    assert out["export"] == dest and out["manifest"]["files"] == [
        {"name": "audit.jsonl", "lines": len(entries), "sha256": out["manifest"]["files"][0]["sha256"]}]
    with zipfile.ZipFile(dest) as archive:
        assert archive.namelist() == ["audit.jsonl", "manifest.json"]
        assert _zip_lines(archive, "audit.jsonl") == [_as_line(e) for e in entries]
    # no database at all: --db names a file that isn't there
    nowhere = str(tmp_path / "no-such.db")
    code, text, _ = run(nowhere, "audit", "verify", "--file", dest)
    head = entries[-1]["hash"]
    assert text.strip() == (f"{PROJECT} (exported {out['manifest']['exported_at']}, audit_log): {len(entries)} "
                            f"entries, ok (hash version 2); head {head}")
    assert not (tmp_path / "no-such.db").exists()
    # the operator exports without --by: recorded as nobody in particular
    jrun(db_path, "project", "export", PROJECT, "--part", "audit_log", "--out", str(tmp_path / "again.zip"))
    assert audit_entries(world.db, PROJECT)[-1]["refs"] == {"part": "audit_log", "by": None}


def _tampered(src, dest, change):
    """A copy of the export at ``src`` whose audit.jsonl went through ``change(lines) -> lines``."""
    with zipfile.ZipFile(src) as a, zipfile.ZipFile(dest, "w") as b:
        for name in a.namelist():
            data = a.read(name)
            if name == "audit.jsonl":
                data = "".join(json.dumps(e) + "\n" for e in change(_zip_lines(a, name))).encode()
            b.writestr(name, data)
    return str(dest)


def test_a_tampered_export_is_refused_at_the_entry_that_was_changed(world, db_path, tmp_path):
    src = str(tmp_path / "audit.zip")
    jrun(db_path, "project", "export", PROJECT, "--part", "audit_log", "--by", "oj", "--out", src)
    entries = audit_entries(world.db, PROJECT)
    assert entries[2]["type"] == "member.added" and entries[2]["refs"]["person"] == "ren"

    def forge(lines):
        lines[2]["refs"]["person"] = "mallory"
        return lines
    bad = _tampered(src, tmp_path / "forged.zip", forge)
    code, text, _ = run(db_path, "audit", "verify", "--file", bad, ok=False)
    first, *problems = text.strip().splitlines()
    assert code == 1 and first.endswith(f"{len(entries)} entries, BROKEN at entry 3 (member.added): its hash does "
                                        "not match what it records")
    assert problems[0].startswith("  audit.jsonl holds ") and "the manifest says" in problems[0]
    # an entry taken out: the next one is out of place
    cut = _tampered(src, tmp_path / "cut.zip", lambda lines: lines[:4] + lines[5:])
    report = prickle.check_export(cut)
    assert (report["ok"], report["broken_at"], report["broken_type"], report["why"]) == (
        False, 6, entries[5]["type"], "it is out of place (expected entry 5 of chain 'website-v2')")
    # one cut from the end still chains, but not to the head the manifest names
    short = _tampered(src, tmp_path / "short.zip", lambda lines: lines[:-1])
    report = prickle.check_export(short)
    assert report["broken_at"] is None and not report["ok"]
    code, text, _ = run(db_path, "audit", "verify", "--file", short, ok=False)
    assert code == 1 and text.splitlines()[0] == (
        f"{PROJECT} (exported {report['exported_at']}, audit_log): {len(entries) - 1} entries, FAILED: the archive "
        f"does not match its manifest (the chain itself holds, hash version 2; head {entries[-2]['hash']})")
    assert (f"the manifest names {len(entries)} audit entries ending at {entries[-1]['hash']}; audit.jsonl holds "
            f"{len(entries) - 1} ending at {entries[-2]['hash']}") in report["problems"]
    # a line that is no entry at all
    garbled = _tampered(src, tmp_path / "garbled.zip", lambda lines: lines[:1] + [["not", "an", "entry"]] + lines[2:])
    assert prickle.check_export(garbled)["broken_at"] == 2
    assert prickle.check_export(garbled)["why"] == "it is not a whole audit entry"


def _readme_checker(tmp_path):
    """The checker the README prints, as a file of its own (it must run with Python alone)."""
    text = (Path(__file__).parent.parent / "README.md").read_text()
    section = text[text.index("### Checking an export with nothing but Python"):]
    code = section[section.index("```python\n") + len("```python\n"):]
    script = tmp_path / "check_export.py"
    script.write_text(code[:code.index("```")])
    return script


def test_the_readme_s_checker_agrees_with_prickle(world, db_path, tmp_path):
    script = _readme_checker(tmp_path)
    src = str(tmp_path / "audit.zip")
    jrun(db_path, "project", "export", PROJECT, "--part", "audit_log", "--by", "oj", "--out", src)
    entries = audit_entries(world.db, PROJECT)

    def checked(path):
        p = subprocess.run([sys.executable, "-I", "-S", str(script), path], capture_output=True, text=True,
                           timeout=60, cwd=tmp_path)
        assert p.returncode == 0, p.stderr
        return p.stdout.strip()
    assert checked(src) == f"ok: {len(entries)} entries, head {entries[-1]['hash']}"

    def forge(lines):
        lines[4]["at"] = "2020-01-01T00:00:00.000Z"
        return lines
    assert checked(_tampered(src, tmp_path / "forged.zip", forge)) == "broken at entry 5"
    assert prickle.check_export(str(tmp_path / "forged.zip"))["broken_at"] == 5
    # the last line cut: the chain still holds, the manifest does not
    short = str(tmp_path / "short.zip")
    with zipfile.ZipFile(src) as a, zipfile.ZipFile(short, "w") as b:
        for name in a.namelist():
            b.writestr(name, b"".join(a.read(name).splitlines(True)[:-1]) if name == "audit.jsonl" else a.read(name))
    assert checked(short) == "broken: audit.jsonl does not match the manifest"


def test_an_older_chain_exports_in_version_1_and_after_a_rehash_in_version_2(db_path, tmp_path):
    _older_file(db_path)
    script = _readme_checker(tmp_path)
    before, after = str(tmp_path / "before.zip"), str(tmp_path / "after.zip")
    jrun(db_path, "project", "export", "p", "--part", "audit_log", "--by", "oj", "--out", before)
    jrun(db_path, "audit", "rehash", "p")
    jrun(db_path, "project", "export", "p", "--part", "audit_log", "--by", "oj", "--out", after)
    with zipfile.ZipFile(before) as a, zipfile.ZipFile(after) as b:
        old, new = _zip_lines(a, "audit.jsonl"), _zip_lines(b, "audit.jsonl")
    assert [(e["type"], e["hash_version"]) for e in old] == [("memory.set", 1)] * 3 + [("project.exported", 1)]
    assert [(e["type"], e["hash_version"]) for e in new] == (
        [("memory.set", 2)] * 3 + [("project.exported", 2), ("chain.rehashed", 2), ("project.exported", 2)])
    # the rehash names the head the earlier export ended with
    assert new[4]["refs"] == {"old_head": old[-1]["hash"], "new_head": new[3]["hash"], "rewritten": 4,
                              "hash_version": 2}
    for path, lines in ((before, old), (after, new)):
        report = jrun(db_path, "audit", "verify", "--file", path)
        assert (report["ok"], report["entries"], report["hash_version"], report["head"]) == (
            True, len(lines), lines[-1]["hash_version"], lines[-1]["hash"])
        p = subprocess.run([sys.executable, "-I", "-S", str(script), path], capture_output=True, text=True, timeout=60)
        assert p.stdout.strip() == f"ok: {len(lines)} entries, head {lines[-1]['hash']}"


def test_who_may_export_and_bad_input(server, world, db_path, tmp_path):
    before = len(audit_entries(world.db, PROJECT))
    ren, sam, oj = (person(server, world, h) for h in ("ren", "sam", "oj"))
    # a member who is not an owner: told who can; the page is told the same
    assert ren.get(f"/api/projects/{PROJECT}/export").json() == {"can_export": False, "parts": ["audit_log", "content"]}
    r = ren.post(f"/api/projects/{PROJECT}/export", {"part": "audit_log"})
    assert (r.status_code, r.json()["error"]) == (403, {
        "code": "forbidden", "message": f"only an owner of '{PROJECT}' exports it: ask one of its owners"})
    # a project one can't read and one that doesn't exist answer alike
    for who, slug in ((sam, PROJECT), (oj, "nowhere")):
        for r in (who.post(f"/api/projects/{slug}/export", {"part": "audit_log"}),
                  who.get(f"/api/projects/{slug}/export")):
            assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
            assert r.json()["error"]["message"].startswith(f"project '{slug}' not found")
    r = oj.post(f"/api/projects/{PROJECT}/export", {"part": "everything"})
    assert (r.status_code, r.json()["error"]) == (400, {"code": "invalid_input", "message": (
        "part must be 'audit_log' (the audit log alone) or 'content' (messages, tasks, submissions, evidence, "
        "memory, files, members and the audit log), not 'everything'")})
    r = oj.post(f"/api/projects/{PROJECT}/export", {})
    assert r.status_code == 400 and "part" in r.json()["error"]["message"]
    assert len(audit_entries(world.db, PROJECT)) == before  # nothing written for any of them
    # the command line: the same refusals, in one line, and no file left behind
    folder = tmp_path / "exports"
    folder.mkdir()
    dest = str(folder / "x.zip")
    for args, needle in ((["nowhere"], "no project 'nowhere'"), ([PROJECT, "--by", "ren"], "only an owner"),
                         ([PROJECT, "--part", "all"], "part must be 'audit_log'")):
        code, out, err = run(db_path, "project", "export", *args, "--out", dest, ok=False)
        assert code == 1 and out == "" and err.startswith("prickle: ") and needle in err, err
    assert list(folder.iterdir()) == []
    (folder / "taken.zip").write_bytes(b"mine")
    code, _, err = run(db_path, "project", "export", PROJECT, "--out", str(folder / "taken.zip"), ok=False)
    assert "already exists" in err and (folder / "taken.zip").read_bytes() == b"mine"
    assert len(audit_entries(world.db, PROJECT)) == before
    # verify --file: no such file, and a file that is no export
    code, _, err = run(db_path, "audit", "verify", "--file", str(tmp_path / "missing.zip"), ok=False)
    assert code == 1 and "no file at" in err
    for text in ("", "Shopping: milk, eggs\n"):
        (tmp_path / "notes.txt").write_text(text)
        code, out, err = run(db_path, "audit", "verify", "--file", str(tmp_path / "notes.txt"), ok=False)
        assert (code, out, err) == (1, "", f"prickle: {tmp_path / 'notes.txt'} is not an export archive (the .zip a "
                                           "project's export gives) nor an audit.jsonl with entries\n")


def test_a_person_who_closed_their_account_is_exported_in_the_erased_form(server, world, tmp_path):
    ren = confirmed(server, world, "ren")
    said = ren.post(f"/api/projects/{PROJECT}/messages", {"body": "Back on Monday."}).json()["message"]
    assert ren.delete("/api/me").status_code == 200
    r = person(server, world, "oj").post(f"/api/projects/{PROJECT}/export", {"part": "content"})
    assert r.status_code == 200, r.text
    path = tmp_path / "export.zip"
    path.write_bytes(r.content)
    with zipfile.ZipFile(path) as archive:
        messages = _zip_lines(archive, "messages.jsonl")
        everything = b"".join(archive.read(n) for n in archive.namelist())
    [kept] = [m for m in messages if m["id"] == said["id"]]
    assert kept["author"] == {"kind": "person", "handle": "ren", "display_name": "Erased person"}
    assert kept["body"] == "Back on Monday."
    assert b"Ren Ito" not in everything
    assert prickle.check_export(str(path))["ok"]


def _bomb(src, dest, audit_bytes):
    """A copy of the export at ``src`` whose audit.jsonl is ``audit_bytes`` (a few KB zipped, however large)."""
    with zipfile.ZipFile(src) as a, zipfile.ZipFile(dest, "w", zipfile.ZIP_DEFLATED) as b:
        for name in a.namelist():
            b.writestr(name, audit_bytes if name == "audit.jsonl" else a.read(name))
    return str(dest)


def test_a_zip_that_unpacks_to_far_more_is_refused_not_read(world, db_path, tmp_path):
    src = str(tmp_path / "audit.zip")
    jrun(db_path, "project", "export", PROJECT, "--part", "audit_log", "--by", "oj", "--out", src)
    # one line past the limit (16 MiB of spaces, 17 KB zipped), from the command line
    bomb = _bomb(src, tmp_path / "bomb.zip", b" " * (prickle.EXPORT_MAX_LINE + 1))
    assert Path(bomb).stat().st_size < 100_000
    code, _, err = run(db_path, "audit", "verify", "--file", bomb, ok=False)
    assert (code, err.strip()) == (1, f"prickle: {bomb}: audit.jsonl: line 1 is longer than 16777216 bytes, which "
                                      "no export Prickle writes holds: refused, not read")
    # the limits are parameters: a line of exactly the limit is read, one byte more is not
    with zipfile.ZipFile(src) as a:
        first = a.read("audit.jsonl").split(b"\n")[0]
    fits = str(tmp_path / "fits.zip")
    with zipfile.ZipFile(fits, "w") as z:
        z.writestr("audit.jsonl", first + b"\n")
    report = prickle.check_export(fits, max_line=len(first))
    assert (report["entries"], report["broken_at"]) == (1, None)
    with pytest.raises(prickle.InvalidInput) as e:
        prickle.check_export(fits, max_line=len(first) - 1)
    assert e.value.message == (f"{fits}: audit.jsonl: line 1 is longer than {len(first) - 1} bytes, which no "
                               "export Prickle writes holds: refused, not read")
    # a file of the zip naming more than max_member is refused before anything is unpacked
    with pytest.raises(prickle.InvalidInput) as e:
        prickle.check_export(bomb, max_member=1_000_000)
    assert e.value.message == (f"{bomb}: audit.jsonl unpacks to 16777217 bytes, more than the 1000000 a file of an "
                               "export may hold: refused, not unpacked")
    with pytest.raises(prickle.InvalidInput) as e:
        prickle.check_export(src, max_line=100)
    assert e.value.message.startswith(f"{src}: manifest.json unpacks to ")
    # audit.jsonl on its own, outside a zip, is read line by line too
    loose = tmp_path / "audit.jsonl"
    loose.write_bytes(first + b"\n" + b"x" * 500)
    with pytest.raises(prickle.InvalidInput) as e:
        prickle.check_export(str(loose), max_line=len(first))
    assert e.value.message == (f"{loose}: line 2 is longer than {len(first)} bytes, which no export Prickle writes "
                               "holds: refused, not read")


def test_a_recorded_owner_exports_a_deleted_project_s_audit_log_until_it_goes(server, world, clock, tmp_path):
    from helpers import T0
    day = prickle._dt.timedelta(days=1)
    r = confirmed(server, world, "oj").delete(f"/api/projects/{PROJECT}")
    assert r.status_code == 200, r.text
    oj, ren, sam = (person(server, world, h) for h in ("oj", "ren", "sam"))
    assert oj.get(f"/api/projects/{PROJECT}/export").json() == {"can_export": True, "parts": ["audit_log"]}
    assert ren.get(f"/api/projects/{PROJECT}/export").json() == {"can_export": False, "parts": ["audit_log"]}

    def exported(n):
        r = oj.post(f"/api/projects/{PROJECT}/export", {"part": "audit_log"})
        assert r.status_code == 200, r.text
        (tmp_path / f"{n}.zip").write_bytes(r.content)
        report = prickle.check_export(str(tmp_path / f"{n}.zip"))
        entries = audit_entries(world.db, PROJECT)
        assert entries[-1]["type"] == "project.exported" and entries[-1]["refs"] == {"part": "audit_log", "by": "oj"}
        assert (report["ok"], report["entries"], report["head"]) == (True, len(entries), entries[-1]["hash"])
        return entries

    assert [e["type"] for e in exported(1)[-2:]] == ["project.deleted", "project.exported"]
    before = len(audit_entries(world.db, PROJECT))
    r = oj.post(f"/api/projects/{PROJECT}/export", {"part": "content"})
    assert (r.status_code, r.json()["error"]) == (409, {"code": "invalid_state", "message": (
        f"project '{PROJECT}' was deleted (request 1, at {prickle.iso(T0)}); an owner when it was deleted can "
        f"restore it until {prickle.iso(T0 + 30 * day)}: only its audit log (part 'audit_log') can be exported; "
        "restore it first to export its content")})
    r = ren.post(f"/api/projects/{PROJECT}/export", {"part": "audit_log"})
    assert (r.status_code, r.json()["error"]) == (403, {"code": "forbidden", "message": (
        f"only an owner of '{PROJECT}' when it was deleted exports its audit log")})
    r = sam.post(f"/api/projects/{PROJECT}/export", {"part": "audit_log"})
    assert r.status_code == 404 and r.json()["error"]["message"].startswith(f"project '{PROJECT}' not found")
    assert len(audit_entries(world.db, PROJECT)) == before  # the refusals wrote nothing
    # after the purge, for the year its log is kept, its recorded owner still exports it
    clock.now = T0 + 30 * day
    assert prickle.run_retention(world.db)[-1] == f"{PROJECT}: content purged (request 1)"
    assert [e["type"] for e in exported(2)[-2:]] == ["project.content_purged", "project.exported"]
    r = oj.post(f"/api/projects/{PROJECT}/export", {"part": "content"})
    assert (r.status_code, r.json()["error"]["message"]) == (409, (
        f"project '{PROJECT}' was purged at {prickle.iso(T0 + 30 * day)}: only its audit log is left: only its audit "
        "log (part 'audit_log') can be exported"))
    clock.now = T0 + 30 * day + prickle.AUDIT_KEPT
    assert prickle.run_retention(world.db) == [f"{PROJECT}: audit log and project removed"]
    assert oj.post(f"/api/projects/{PROJECT}/export", {"part": "audit_log"}).status_code == 404
