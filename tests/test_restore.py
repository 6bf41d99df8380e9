"""Restoring the file from a backup: ``prickle restore``, and chain.restored at the first start after it."""

import datetime as dt
import glob
import json
import os
import shutil
from pathlib import Path

import apsw
import pytest
from starlette.testclient import TestClient

import prickle
from conftest import PROJECT, Served, audit_entries
from helpers import T0, jrun, run

MINUTE = dt.timedelta(minutes=1)


def start(db_path):
    """One start of the server on the file (and its stop)."""
    with TestClient(prickle.create_app(db_path, prickle.Settings(), port=8321), base_url="http://127.0.0.1:8321"):
        pass


def heads(path):
    """Every chain's head in the file at ``path``, read leaving no -wal or -shm file the read made."""
    made = [path + suffix for suffix in ("-wal", "-shm") if not os.path.exists(path + suffix)]
    conn = apsw.Connection(path, flags=apsw.SQLITE_OPEN_READONLY)
    try:
        return prickle.chain_heads(conn)
    finally:
        conn.close()
        for leftover in made:
            if os.path.exists(leftover):
                os.unlink(leftover)


def bodies(db):
    return [r["body"] for r in db.rows("SELECT body FROM messages WHERE project = ? ORDER BY seq", (PROJECT,))]


def test_a_restore_from_a_backup_is_recorded_once_in_every_chain_at_the_first_start(world, db_path, tmp_path, clock):
    muse = world.actor("oj/muse")
    prickle.post_message(world.db, muse, PROJECT, "kept")
    backup = str(tmp_path / "nightly.db")
    clock.now = T0 + MINUTE
    assert jrun(db_path, "backup", backup) == {"backup": backup}
    clock.now = T0 + 2 * MINUTE
    for i in range(3):
        prickle.post_message(world.db, muse, PROJECT, f"lost {i}")
    prickle.create_project(world.db, "later", "Later", "web", "oj")
    kept, lost = heads(backup), heads(db_path)
    assert lost[PROJECT][0] == kept[PROJECT][0] + 3  # one message.posted each
    clock.now = T0 + 5 * MINUTE

    out = jrun(db_path, "restore", backup)
    aside = db_path + ".replaced-20261201T100500Z"
    assert out == {"db": db_path, "source": "backup", "from": backup, "point": "2026-12-01T10:01:00.000Z",
                   "replaced": aside, "chains": len(kept), "closures_reapplied": 0}
    assert heads(aside) == lost  # the replaced file is kept whole, its log copied in
    # Beside them nothing: no hidden copy, no log, not even the -wal and -shm of reading the backup.
    assert sorted(os.listdir(tmp_path)) == ["nightly.db", "prickle.db", "prickle.db.replaced-20261201T100500Z"]
    assert not glob.glob(str(tmp_path / ".prickle-restore-*")) and not os.path.exists(db_path + "-wal")
    restored = prickle.Database(db_path)
    assert bodies(restored) == ["kept"]
    assert restored.scalar("SELECT count(*) FROM audit WHERE type = 'chain.restored'") == 0  # written at the start

    clock.now = T0 + 6 * MINUTE
    start(db_path)
    assert set(kept) >= {PROJECT, "side", prickle.DEPLOYMENT_CHAIN}
    for chain, (n, digest) in kept.items():
        gap = {"from": "2026-12-01T10:01:00.000Z", "to": "2026-12-01T10:05:00.000Z",
               "entries": 3 if chain == PROJECT else 0}
        if chain == prickle.DEPLOYMENT_CHAIN:
            gap["chains"] = 1  # the project made after the backup
        entries = audit_entries(restored, chain, "chain.restored")
        assert [(e["n"], e["at"], e["prev_hash"], e["refs"]) for e in entries] == [
            (n + 1, "2026-12-01T10:06:00.000Z", digest,
             {"source": "backup", "point": "2026-12-01T10:01:00.000Z", "through": n, "gap": gap})], chain
    assert restored.scalar("SELECT value FROM meta WHERE key IN ('restore', 'backup_taken_at')") is None
    assert all(r["ok"] for r in prickle.verify_audit(restored))
    assert jrun(db_path, "audit", "verify")["ok"] is True

    clock.now = T0 + 7 * MINUTE
    start(db_path)  # the second start records nothing more
    assert restored.scalar("SELECT count(*) FROM audit WHERE type = 'chain.restored'") == len(kept)
    restored.close()


def test_a_restore_to_a_new_file_knows_no_gap_and_the_audit_screen_shows_it(world, tmp_path, clock):
    prickle.post_message(world.db, world.actor("oj/muse"), PROJECT, "before the backup")
    backup = str(tmp_path / "b.db")
    world.db.backup_to(backup)
    target = str(tmp_path / "elsewhere" / "prickle.db")
    os.makedirs(os.path.dirname(target))
    clock.now = T0 + MINUTE
    out = jrun(target, "restore", backup)
    assert out["replaced"] is None and out["point"] == "2026-12-01T10:00:00.000Z"
    with Served(target) as served:
        import httpx
        page = httpx.get(served.info["url"] + "/api/projects/website-v2/audit",
                         headers={"Authorization": f"Bearer {world.tokens['oj']}"}).json()
    restored = prickle.Database(target)
    for chain, (n, _) in heads(backup).items():
        [entry] = audit_entries(restored, chain, "chain.restored")
        gap = {"from": "2026-12-01T10:00:00.000Z", "to": "2026-12-01T10:01:00.000Z", "entries": None}
        assert entry["refs"] == {"source": "backup", "point": "2026-12-01T10:00:00.000Z", "through": n,
                                 "gap": gap | ({"chains": None} if chain == "" else {})}
    assert "before the backup" in bodies(restored)
    # The project's Audit screen shows it as the newest entry, and the chain checks.
    assert page["entries"][0]["type"] == "chain.restored" and page["chain"]["ok"] is True
    restored.close()


def test_a_restore_onto_a_running_servers_file_is_refused_and_changes_nothing(world, db_path, tmp_path):
    backup = str(tmp_path / "b.db")
    world.db.backup_to(backup)
    prickle.post_message(world.db, world.actor("oj/muse"), PROJECT, "after the backup")
    before = heads(db_path)
    with Served(db_path) as served:
        code, out, err = run(db_path, "restore", backup, ok=False)
        assert code == 1 and out == ""
        assert err == (f"prickle: a prickle serve (pid {served.proc.pid}) is using {db_path}: stop it first (Ctrl-C "
                       "or SIGTERM), then run 'prickle restore' again; a restore replaces the file, and what a "
                       "running server writes after it would be lost\n")
    assert heads(db_path) == before
    assert not glob.glob(db_path + ".replaced-*") and not glob.glob(str(tmp_path / ".prickle-restore-*"))


def test_a_restore_waits_for_no_program_that_holds_the_file_open(world, db_path, tmp_path):
    backup = str(tmp_path / "b.db")
    world.db.backup_to(backup)
    reader = apsw.Connection(db_path)  # as Litestream holds its read transaction
    reader.execute("BEGIN")
    reader.execute("SELECT count(*) FROM audit").fetchall()
    before = heads(backup)
    code, _, err = run(db_path, "restore", backup, ok=False)
    reader.execute("COMMIT")
    reader.close()
    assert code == 1
    assert err == (f"prickle: another program has {db_path} open (Litestream replicating it, or a prickle command): "
                   "stop it, then run 'prickle restore' again\n")
    assert not glob.glob(db_path + ".replaced-*") and not glob.glob(str(tmp_path / ".prickle-restore-*"))
    assert heads(db_path) == before


def _not_a_database(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("not a database, just words " * 200)
    return str(path)


def _not_prickle(tmp_path):
    path = str(tmp_path / "other.db")
    conn = apsw.Connection(path)
    conn.execute("CREATE TABLE t (x)")
    conn.close()
    return path


@pytest.mark.parametrize("args, said", [
    ([], "name one thing to restore from: a BACKUP file 'prickle backup' wrote, or --from-replica URL (or "
         "--litestream-config FILE) for a Litestream replica"),
    (["{backup}", "--from-replica", "s3://b/p.db"], "name one thing to restore from"),
    (["{backup}", "--timestamp", "2026-12-01T09:00:00Z"],
     "--timestamp goes with --from-replica or --litestream-config: a backup holds one moment"),
    (["--from-replica", "s3://b/p.db", "--timestamp", "yesterday"], "--timestamp must be an ISO 8601 time"),
    (["--from-replica", "s3://b/p.db", "--timestamp", "2026-12-01T09:00:00"], "--timestamp must be an ISO 8601 time"),
    (["--from-replica", "s3://b/p.db", "--timestamp", "2999-01-01T00:00:00Z"],
     "--timestamp 2999-01-01T00:00:00Z is in the future: leave it out to restore the latest"),
    (["--from-replica", "s3://b/p.db", "--litestream", "/no/such/litestream"],
     "--litestream /no/such/litestream: no such program: name the litestream binary's path"),
    (["{missing}"], "no backup at {missing}: name a file 'prickle backup' wrote"),
    (["{db}"], "{db} is the database itself: name a backup of it"),
    (["{words}"], "{words} is not a database: name a file 'prickle backup' wrote"),
    (["{other}"], "{other} is not a Prickle database: name a file 'prickle backup' wrote"),
    (["{cut}"], "{cut} is not a whole SQLite database (cut short or damaged): nothing was replaced; name a whole "
                "file 'prickle backup' wrote\n"),
])
def test_bad_restores_say_what_to_do_and_change_nothing(world, db_path, tmp_path, args, said):
    backup = str(tmp_path / "b.db")
    world.db.backup_to(backup)
    names = {"backup": backup, "missing": str(tmp_path / "nope.db"), "db": db_path,
             "words": _not_a_database(tmp_path), "other": _not_prickle(tmp_path), "cut": str(tmp_path / "cut.db")}
    whole = Path(backup).read_bytes()
    Path(names["cut"]).write_bytes(whole[:len(whole) // 2])  # a backup cut short (a copy broken off)
    before = heads(db_path)
    code, out, err = run(db_path, "restore", *[a.format(**names) for a in args], ok=False)
    assert code == 1 and out == ""
    assert err.startswith("prickle: " + said.format(**names)), err
    assert heads(db_path) == before
    assert not glob.glob(db_path + ".replaced-*") and not glob.glob(str(tmp_path / ".prickle-restore-*"))


def test_a_replica_restore_says_when_litestream_is_not_installed(world, db_path, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    code, _, err = run(db_path, "restore", "--from-replica", "s3://bucket/prickle.db", ok=False)
    assert code == 1
    assert err == ("prickle: Litestream is not installed (no 'litestream' on PATH): install it "
                   "(https://litestream.io/install, or 'npm install @flydotio/litestream', whose package holds the "
                   "binary), or pass --litestream PATH\n")


def test_a_backup_older_than_this_prickle_is_upgraded_as_it_is_restored(world, db_path, tmp_path):
    from helpers import _database_at_version
    old = _database_at_version(str(tmp_path / "old.db"), 5)
    old.execute("INSERT INTO meta VALUES ('secret', 'x')")
    old.close()
    out = jrun(str(tmp_path / "fresh.db"), "restore", str(tmp_path / "old.db"))
    assert out["chains"] == 1 and out["replaced"] is None
    conn = apsw.Connection(str(tmp_path / "fresh.db"))
    assert conn.pragma("user_version") == len(prickle.MIGRATIONS)
    assert json.loads(conn.execute("SELECT value FROM meta WHERE key = 'restore'").fetchall()[0][0])["chains"] == {}
    conn.close()


def test_a_replaced_file_whose_chain_does_not_continue_the_backups_claims_no_known_gap(world, tmp_path):
    backup = str(tmp_path / "b.db")
    world.db.backup_to(backup)
    other = str(tmp_path / "other" / "prickle.db")  # another deployment, with a project of the same name
    os.makedirs(os.path.dirname(other))
    db = prickle.Database(other)
    prickle.add_person(db, "zed", "Zed")
    prickle.create_project(db, PROJECT, "Not the same", "elsewhere", "zed")
    db.close()
    jrun(other, "restore", backup)
    restored = prickle.Database(other)
    marker = json.loads(restored.scalar("SELECT value FROM meta WHERE key = 'restore'"))
    restored.close()
    assert {chain: known["missing"] for chain, known in marker["chains"].items()} == dict.fromkeys(heads(backup))
    assert marker["chains_missing"] == 0


def test_a_restore_through_a_symlink_replaces_the_file_it_names(world, db_path, tmp_path):
    backup = str(tmp_path / "b.db")
    world.db.backup_to(backup)
    link = str(tmp_path / "link.db")
    os.symlink(db_path, link)
    out = jrun(link, "restore", backup)
    assert out["db"] == db_path and out["replaced"].startswith(db_path + ".replaced-")
    assert os.path.islink(link) and os.path.realpath(link) == db_path
    assert heads(link) == heads(backup)


def test_a_backup_copied_into_place_by_hand_is_recorded_as_a_restore_at_its_first_start(world, tmp_path, clock):
    backup = str(tmp_path / "b.db")
    assert jrun(world.db_path, "backup", backup) == {"backup": backup}
    by_hand = str(tmp_path / "by-hand.db")
    shutil.copyfile(backup, by_hand)
    clock.now = T0 + 3 * MINUTE
    start(by_hand)
    start(by_hand)
    restored = prickle.Database(by_hand)
    for chain, (n, _) in heads(backup).items():
        gap = {"from": "2026-12-01T10:00:00.000Z", "to": "2026-12-01T10:03:00.000Z", "entries": None}
        assert [e["refs"] for e in audit_entries(restored, chain, "chain.restored")] == [
            {"source": "backup", "point": "2026-12-01T10:00:00.000Z", "through": n,
             "gap": gap | ({"chains": None} if chain == "" else {})}], chain
    assert restored.scalar("SELECT count(*) FROM meta WHERE key IN ('restore', 'backup_taken_at')") == 0
    restored.close()


def test_a_restore_never_brings_back_a_closed_account(world, db_path, tmp_path, clock):
    prickle.set_person_email(world.db, "ren", "ren.ito@example.org")
    backup = str(tmp_path / "pre.db")
    assert jrun(db_path, "backup", backup) == {"backup": backup}
    clock.now = T0 + MINUTE
    prickle.close_account(world.db, "ren")
    clock.now = T0 + 2 * MINUTE
    code, said, _ = run(db_path, "restore", backup)
    assert code == 0 and "1 account closed in the replaced file closed again (person.erased)." in said
    restored = prickle.Database(db_path)
    # The copy had ren open: the closing is done again in it, as the operator's erase.
    assert restored.one("SELECT display_name, email, erased_at FROM people WHERE handle = 'ren'") == {
        "display_name": prickle.ERASED_NAME, "email": None, "erased_at": "2026-12-01T10:02:00.000Z"}
    assert [e["refs"]["person"] for e in audit_entries(restored, PROJECT, "person.erased")] == ["ren"]
    assert [e["refs"]["by"] for e in audit_entries(restored, PROJECT, "person.erased")] == [None]
    assert restored.scalar("SELECT count(*) FROM credentials WHERE person = 'ren' AND revoked_at IS NULL") == 0
    assert restored.scalar("SELECT count(*) FROM members WHERE handle = 'ren'") == 0
    restored.close()
    start(db_path)
    with TestClient(prickle.create_app(db_path, prickle.Settings(), port=8321),
                    base_url="http://127.0.0.1:8321") as client:
        r = client.get("/api/me", headers={"Authorization": f"Bearer {world.tokens['ren']}"})
        assert r.status_code == 401, r.text
    for path in glob.glob(db_path + "*"):
        if ".replaced-" not in path:
            data = Path(path).read_bytes()
            assert b"Ren Ito" not in data and b"ren.ito@example.org" not in data, path
    # Restoring the same backup again over the restored file closes it again too.
    assert jrun(db_path, "restore", backup)["closures_reapplied"] == 1
