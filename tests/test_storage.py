"""Storage: schema versions, transactions, the outbox, the audit chain, the server lock."""

import datetime
import math
import os
import re
import threading
import time

import apsw
import pydantic
import pytest

import prickle
from starlette.testclient import TestClient
from conftest import PROJECT, audit_entries
from helpers import _database_at_version, make_task
from runner_util import wait_until


def test_new_database_is_wal_with_current_schema(db_path):
    db = prickle.Database(db_path)
    assert db.conn.pragma("user_version") == len(prickle.MIGRATIONS)
    assert db.conn.pragma("journal_mode") == "wal"
    assert db.conn.pragma("foreign_keys") == 1
    assert db.conn.pragma("cache_size") == -64 * 1024  # KiB: the posts' pages stay cached through a merge
    db.close()
    # opening again changes nothing
    again = prickle.Database(db_path)
    assert again.conn.pragma("user_version") == len(prickle.MIGRATIONS)


def test_a_file_is_opened_while_another_connection_writes(world, db_path):
    # A command or a second look opened while the server holds the write lock waits its turn: the
    # settings a new connection gets as it opens (PRAGMA optimize may write) wait as long as a write does.
    holder = apsw.Connection(db_path)
    holder.execute("BEGIN IMMEDIATE")
    done = threading.Timer(0.3, lambda: holder.execute("COMMIT"))
    done.start()
    try:
        other = prickle.Database(db_path)
    finally:
        done.join()
    assert other.conn.execute("PRAGMA busy_timeout").fetchall() == [(prickle.BUSY_TIMEOUT_MS,)]
    plain = apsw.Connection(db_path)  # any connection, Prickle's or not: what its opening ANALYZE deletes is zeroed
    assert plain.pragma("secure_delete") == 1 and plain.execute("PRAGMA busy_timeout").fetchall() == [
        (prickle.BUSY_TIMEOUT_MS,)]
    plain.close()
    assert other.scalar("SELECT count(*) FROM projects") == world.db.scalar("SELECT count(*) FROM projects") > 0
    other.close()
    holder.close()


def test_a_newer_schema_is_refused(db_path):
    conn = apsw.Connection(db_path)
    conn.pragma("user_version", len(prickle.MIGRATIONS) + 1)
    conn.close()
    with pytest.raises(prickle.StorageError, match="newer than this Prickle knows"):
        prickle.Database(db_path)


def test_upgrading_keeps_messages_and_events_and_drops_autoincrement(db_path):
    conn = _database_at_version(db_path, 5)
    with conn:
        conn.execute("INSERT INTO people (handle, display_name, created_at) VALUES ('oj', 'OJ', 'x')")
        conn.execute("INSERT INTO projects (slug, team, name, created_by, created_at) VALUES ('p', 't', 'P', 'oj', 'x')")
        for n in (1, 2, 3):
            conn.execute("INSERT INTO messages (id, project, author_kind, author, body, mentions, created_at, "
                         "task_request) VALUES (?, 'p', 'person', 'oj', ?, '[]', 'x', ?)",
                         (f"msg_{n}", f"hello {n}", "t_1" if n == 2 else None))
            conn.execute("INSERT INTO outbox (id, project, at, type, payload) VALUES (?, 'p', 'x', 'message.posted', '{}')",
                         (f"ev_{n}",))
        conn.execute("INSERT INTO wakes (seq, agent_id, kind, project) VALUES (3, 'oj/muse', 'mention', 'p')")
    before = {t: conn.execute(f"SELECT * FROM {t} ORDER BY seq").fetchall() for t in ("messages", "outbox", "wakes")}
    assert {name for (name,) in conn.execute("SELECT name FROM sqlite_sequence")} == {"messages", "outbox"}
    conn.close()

    db = prickle.Database(db_path)
    assert db.conn.pragma("user_version") == len(prickle.MIGRATIONS)
    assert db.conn.pragma("foreign_keys") == 1
    after = {t: db.conn.execute(f"SELECT * FROM {t} ORDER BY seq").fetchall() for t in before}
    # Later migrations add columns (a message's attachments): every value that was there is kept.
    assert {t: [row[:len(before[t][0])] for row in rows] for t, rows in after.items()} == before
    for table in ("messages", "outbox"):
        assert "AUTOINCREMENT" not in db.scalar("SELECT sql FROM sqlite_schema WHERE name = ?", (table,))
    assert db.rows("SELECT name FROM sqlite_sequence") == []
    indexes = {r["name"] for r in db.rows("SELECT name FROM sqlite_schema WHERE type = 'index' AND tbl_name IN "
                                          "('messages', 'outbox', 'wakes')")}
    # outbox_by_project came back in a later step: a stream reads only its projects' events
    # and wakes_again, for wakes an owner's retry hands out once more; messages_by_project for the story's
    # round numbers
    assert indexes == {"messages_by_old_id", "messages_by_room", "wakes_by_seq", "wakes_unheard", "outbox_by_project",
                       "wakes_again", "messages_by_project"}
    # the next rows continue after the last ones, and references are still enforced
    with db.transaction():
        db.execute("INSERT INTO messages (id, project, author_kind, author, body, mentions, created_at) "
                   "VALUES ('msg_4', 'p', 'person', 'oj', 'again', '[]', 'x')")
        assert db.conn.last_insert_rowid() == 4
        assert prickle.append_event(db, "p", "message.posted", {"message": {}})["seq"] == 4
    with pytest.raises(apsw.ConstraintError):
        with db.transaction():
            db.execute("INSERT INTO messages (id, project, author_kind, author, body, mentions, created_at) "
                       "VALUES ('msg_5', 'nowhere', 'person', 'oj', 'x', '[]', 'x')")


def _old_message_with_a_dash(conn):
    """Person oj, project p and a message whose id has the form early versions made, '-' included."""
    conn.execute("INSERT INTO people (handle, display_name, created_at) VALUES ('oj', 'OJ', 'x')")
    conn.execute("INSERT INTO projects (slug, team, name, created_by, created_at) VALUES ('p', 't', 'P', 'oj', 'x')")
    conn.execute("INSERT INTO messages (id, project, author_kind, author, body, mentions, created_at) "
                 "VALUES ('msg_4UkTdVwvv-KTlW94', 'p', 'person', 'oj', 'kept', '[]', 'x')")


def _query_plan(db, sql, params):
    return " ".join(r["detail"] for r in db.rows("EXPLAIN QUERY PLAN " + sql, params))


def test_message_ids_carry_their_seq_and_older_ids_are_still_found(db_path):
    conn = _database_at_version(db_path, 6)
    with conn:
        conn.execute("INSERT INTO people (handle, display_name, created_at) VALUES ('oj', 'OJ', 'x')")
        conn.execute("INSERT INTO projects (slug, team, name, created_by, created_at) VALUES ('p', 't', 'P', 'oj', 'x')")
        conn.execute("INSERT INTO members (project, handle, role, joined_at) VALUES ('p', 'oj', 'owner', 'x')")
        # the two forms older versions made: 24 hex digits, and 16 URL-safe characters ('-' too)
        for old_id in ("msg_0123456789abcdef01234567", "msg_4UkTdVwvv-KTlW94", "msg_abc-0123456789ab"):
            conn.execute("INSERT INTO messages (id, project, author_kind, author, body, mentions, created_at) "
                         "VALUES (?, 'p', 'person', 'oj', ?, '[]', '2026-01-01T00:00:00.000Z')",
                         (old_id, f"from before: {old_id}"))
    conn.close()
    db = prickle.Database(db_path)
    oj = prickle.Actor("person", "", "", handle="oj")
    for old_id in ("msg_4UkTdVwvv-KTlW94", "msg_abc-0123456789ab"):
        assert prickle.get_message(db, old_id)["body"] == f"from before: {old_id}"
    old = prickle.get_message(db, "msg_0123456789abcdef01234567")
    assert old["body"] == "from before: msg_0123456789abcdef01234567"
    # a reply to a message from before the upgrade finds its parent; the new message's id carries seq 4
    reply = prickle.post_message(db, oj, "p", "and after", in_reply_to=old["id"])
    assert reply["in_reply_to"] == old["id"]
    assert re.fullmatch(r"msg-4-[0-9a-f]{12}", reply["id"]) and prickle.message_seq(reply["id"]) == 4
    assert prickle.get_message(db, reply["id"])["body"] == "and after"
    # each lookup uses the primary key or the older ids' own index, never a scan of messages
    for message_id, uses in ((reply["id"], "INTEGER PRIMARY KEY"), (old["id"], "INDEX messages_by_old_id")):
        where, params = prickle.by_message_id(message_id)
        assert uses in _query_plan(db, f"SELECT * FROM messages WHERE {where}", params)
    # an id that only looks current (wrong random part, or a seq too big) and text that is no id find nothing
    for wrong in (reply["id"][:-1] + "x", "msg-4-000000000000", "msg-" + "f" * 16 + "-000000000000", "msg-4",
                  "MSG-4-" + reply["id"][-12:], "msg_nope", ""):
        assert prickle.get_message(db, wrong) is None
    # the next id counts every message, however it was written, and nothing a rollback took back
    with db.transaction():
        db.execute("INSERT INTO messages (id, project, author_kind, author, body, mentions, created_at) "
                   "VALUES ('msg_written_directly', 'p', 'person', 'oj', 'x', '[]', 'x')")
    with pytest.raises(prickle.InvalidInput):
        with db.transaction():
            prickle.post_message(db, oj, "p", "rolled back")
            prickle.post_message(db, oj, "p", " ")
    assert prickle.message_seq(prickle.post_message(db, oj, "p", "next")["id"]) == 6
    # ids from before stay unique
    with pytest.raises(apsw.ConstraintError):
        with db.transaction():
            db.execute("INSERT INTO messages (id, project, author_kind, author, body, mentions, created_at) "
                       "VALUES ('msg_0123456789abcdef01234567', 'p', 'person', 'oj', 'twice', '[]', 'x')")


@pytest.mark.parametrize("left_out", [
    # what version 4 lacked in the builds made while it was the newest, earliest first
    ("wakes ADD COLUMN delivered", "DROP TABLE agent_cursors", "TABLE actions", "make_action", "made_by_action",
     "served"),
    ("wakes ADD COLUMN delivered", "DROP TABLE agent_cursors", "served"),
    ("served",),
])
def test_a_version_4_file_from_an_earlier_build_gets_what_it_lacks(db_path, left_out):
    conn = apsw.Connection(db_path)
    conn.pragma("journal_mode", "wal")
    with conn:
        for statements in prickle.MIGRATIONS[:3]:
            for sql in statements:
                conn.execute(sql)
        for sql in prickle.MIGRATIONS[3]:
            if not any(part in sql for part in left_out):
                conn.execute(sql)
        _old_message_with_a_dash(conn)
        conn.pragma("user_version", 4)
    conn.close()
    db = prickle.Database(db_path)
    assert db.conn.pragma("user_version") == len(prickle.MIGRATIONS)
    for table, column in (("wakes", "delivered"), ("attempts", "served"), ("messages", "make_action"),
                          ("messages", "made_by_action"), ("actions", "status")):
        assert db.one("SELECT 1 FROM pragma_table_info(?) WHERE name = ?", (table, column)), (table, column)
    assert db.one("SELECT 1 FROM sqlite_schema WHERE name = 'agent_cursors'") is None
    assert prickle.get_message(db, "msg_4UkTdVwvv-KTlW94")["body"] == "kept"


def test_a_schema_7_file_with_the_first_older_ids_index_gets_the_right_one(db_path):
    conn = _database_at_version(db_path, 7)
    with conn:
        conn.execute("DROP INDEX messages_by_old_id")
        conn.execute("CREATE UNIQUE INDEX messages_by_old_id ON messages(id) WHERE instr(id, '-') = 0")
        _old_message_with_a_dash(conn)
    conn.close()
    db = prickle.Database(db_path)
    where, params = prickle.by_message_id("msg_4UkTdVwvv-KTlW94")
    assert "INDEX messages_by_old_id" in _query_plan(db, f"SELECT * FROM messages WHERE {where}", params)
    assert prickle.get_message(db, "msg_4UkTdVwvv-KTlW94")["body"] == "kept"


def test_an_upgrade_refuses_a_database_with_broken_references(db_path):
    conn = _database_at_version(db_path, 5)
    conn.pragma("foreign_keys", False)
    conn.execute("INSERT INTO messages (id, project, author_kind, author, body, mentions, created_at) "
                 "VALUES ('msg_1', 'nowhere', 'person', 'oj', 'x', '[]', 'x')")
    conn.close()
    with pytest.raises(prickle.StorageError, match="references are broken"):
        prickle.Database(db_path)
    conn = apsw.Connection(db_path)
    assert conn.pragma("user_version") == 5  # nothing was changed
    assert "AUTOINCREMENT" in conn.execute("SELECT sql FROM sqlite_schema WHERE name = 'messages'").fetchall()[0][0]


def test_failed_operation_writes_nothing(world):
    db = world.db
    counts = {t: db.scalar(f"SELECT count(*) FROM {t}") for t in ("outbox", "audit", "messages", "agents")}
    with pytest.raises(prickle.Forbidden):
        # the owner 'sam' is not in website-v2: the agent row must roll back with the failed project add
        prickle.add_agent(world.db, "sam/helper", "Helper", "m", "c", "", [], ["side", PROJECT])
    assert {t: db.scalar(f"SELECT count(*) FROM {t}") for t in counts} == counts
    assert db.one("SELECT 1 FROM agents WHERE agent_id = 'sam/helper'") is None


def test_a_commit_that_fails_is_rolled_back_like_any_failure(world):
    db = world.db
    calls = []
    db.listeners.append(lambda first, last, projects, agents: calls.append(first))
    before = audit_entries(db, PROJECT)[-1]
    with pytest.raises(apsw.ConstraintError):
        with db.transaction():
            prickle.audit(db, PROJECT, "memory.set", {"key": "k"})
            prickle.append_event(db, PROJECT, "agent.added", {"agent_id": "oj/muse"})
            # the broken reference is found only by COMMIT
            db.conn.pragma("defer_foreign_keys", True)
            db.execute("INSERT INTO project_agents VALUES ('nowhere', 'oj/muse', 'x')")
    assert not db.conn.in_transaction and calls == []
    assert audit_entries(db, PROJECT)[-1] == before
    # nothing of it lingers: the next entry follows the last one that committed, and no wake is owed
    with db.transaction():
        entry = prickle.audit(db, PROJECT, "memory.set", {"key": "k"})
    assert entry["n"] == before["n"] + 1 and calls == []
    assert all(r["ok"] for r in prickle.verify_audit(db))


def test_a_savepoint_that_rolls_back_takes_its_wakes_with_it(world):
    db = world.db
    calls = []
    db.listeners.append(lambda first, last, projects, agents: calls.append((first, last, agents)))
    with db.transaction():
        kept = prickle.append_event(db, PROJECT, "agent.added", {"agent_id": "oj/muse"},
                                    [("oj/muse", "mention", None, None)])
        with pytest.raises(RuntimeError):
            with db.transaction():
                prickle.append_event(db, PROJECT, "agent.added", {"agent_id": "ren/builder"},
                                     [("ren/builder", "mention", None, None)])
                db.after_commit(lambda: calls.append("inner hook"))
                raise RuntimeError("inner failure")
    assert calls == [(kept["seq"], kept["seq"], {"oj/muse"})]
    assert prickle.outbox_head(db) == kept["seq"]


def test_the_servers_checkpoint_survives_a_failure(world, monkeypatch, capsys):
    tries = []

    def full(conn, restart_frames=prickle.WAL_RESTART_FRAMES):
        tries.append(1)
        raise apsw.FullError("disk full")

    monkeypatch.setattr(prickle, "checkpoint_wal", full)
    app = prickle.create_app(world.db.path)
    with TestClient(app, base_url="http://127.0.0.1:8321") as client:
        deadline = time.monotonic() + 10
        while len(tries) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        health = client.get("/healthz").json()
        assert health["ok"] is True
        assert [(d["piece"], d["cause"]) for d in health["degraded"]] == [("checkpoint", "FullError: disk full")]
    assert len(tries) >= 2  # tried again later
    err = capsys.readouterr().err
    assert "prickle: background checkpoint failed, retrying with backoff: FullError: disk full" in err
    assert err.count("background checkpoint failed") == 1  # once per distinct failure


def test_waiters_are_notified_only_after_commit(world):
    calls = []
    world.db.listeners.append(lambda first, last, projects, agents: calls.append((first, last, projects)))
    with pytest.raises(RuntimeError):
        with world.db.transaction():
            prickle.append_event(world.db, PROJECT, "agent.added", {"agent_id": "oj/muse"})
            raise RuntimeError("boom")
    assert calls == []
    with world.db.transaction():
        event = prickle.append_event(world.db, PROJECT, "agent.added", {"agent_id": "oj/muse"})
        assert calls == []
    assert calls == [(event["seq"], event["seq"], {PROJECT})]


def test_outbox_seq_only_grows_and_project_created_comes_first(world):
    seqs = [r["seq"] for r in world.db.rows("SELECT seq FROM outbox ORDER BY rowid")]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    first = world.db.one("SELECT type FROM outbox WHERE project = ? ORDER BY seq LIMIT 1", (PROJECT,))
    assert first["type"] == "project.created"
    events = prickle.read_events(world.db, PROJECT, 0)
    assert [e["type"] for e in events] == ["project.created", "member.joined", "agent.added", "agent.added",
                                          "agent.added"]
    assert events[0]["summary"] == {"slug": PROJECT, "team": "web", "name": "Website v2", "description": "The new site."}
    assert events[0]["by"] == {"kind": "person", "handle": "oj"}
    assert events[1]["member"]["handle"] == "ren" and events[1]["role"] == "member"


def test_audit_chain_links_and_detects_tampering(world):
    entries = audit_entries(world.db, PROJECT)
    assert [e["type"] for e in entries[:3]] == ["project.created", "member.added", "member.added"]
    assert entries[0]["refs"] == {"team": "web", "by": "oj"}
    assert entries[0]["prev_hash"] == "0" * 64
    for prev, entry in zip(entries, entries[1:]):
        assert entry["prev_hash"] == prev["hash"] and entry["n"] == prev["n"] + 1
    assert all(r["ok"] for r in prickle.verify_audit(world.db))
    world.db.execute("UPDATE audit SET refs = ? WHERE chain = ? AND n = 2", ('{"person":"mallory"}', PROJECT))
    report = prickle.verify_audit(world.db, PROJECT)[0]
    assert report == {"chain": PROJECT, "entries": len(entries), "ok": False, "broken_at": 2, "hash_version": 2,
                      "head": entries[-1]["hash"]}
    world.db.execute("UPDATE audit SET refs = ? WHERE chain = ? AND n = 2", (
        prickle.canonical_json(entries[1]["refs"]), PROJECT))
    assert prickle.verify_audit(world.db, PROJECT)[0]["ok"]
    world.db.execute("DELETE FROM audit WHERE chain = ? AND n = 3", (PROJECT,))
    assert prickle.verify_audit(world.db, PROJECT)[0]["broken_at"] == 4
    world.db.execute("DELETE FROM audit WHERE chain = ? AND n >= 3", (PROJECT,))  # a valid prefix again


def test_server_lock_refuses_a_second_server(db_path):
    first = prickle.ServerLock(db_path)
    first.acquire()
    try:
        with pytest.raises(prickle.StorageError, match="another prickle serve is already using"):
            prickle.ServerLock(db_path).acquire()
    finally:
        first.release()
    second = prickle.ServerLock(db_path)
    second.acquire()
    second.release()


def test_backup_is_a_readable_copy(world, tmp_path):
    dest = str(tmp_path / "copy.db")
    world.db.backup_to(dest)
    copy = prickle.Database(dest)
    assert copy.scalar("SELECT count(*) FROM people") == 3
    assert all(r["ok"] for r in prickle.verify_audit(copy))
    assert os.path.getsize(dest) > 0


def test_a_rolled_back_savepoint_leaves_the_audit_chain_whole(world):
    with world.db.transaction():
        prickle.audit(world.db, PROJECT, "context.read", {"reader": "oj", "memory_facts": 0})
        with pytest.raises(RuntimeError):
            with world.db.transaction():
                prickle.audit(world.db, PROJECT, "context.read", {"reader": "ren", "memory_facts": 0})
                raise RuntimeError("inner fails")
        prickle.audit(world.db, PROJECT, "context.read", {"reader": "sam", "memory_facts": 0})
    assert prickle.verify_audit(world.db, PROJECT)[0]["ok"]
    readers = [e["refs"]["reader"] for e in audit_entries(world.db, PROJECT, "context.read")]
    assert readers == ["oj", "sam"]


def test_another_connection_writing_refreshes_what_this_one_knows(world, db_path):
    other = prickle.Database(db_path)
    with world.db.transaction():
        prickle.audit(world.db, PROJECT, "context.read", {"reader": "a", "memory_facts": 0})
    with other.transaction():
        prickle.audit(other, PROJECT, "context.read", {"reader": "b", "memory_facts": 0})
    with world.db.transaction():
        prickle.audit(world.db, PROJECT, "context.read", {"reader": "c", "memory_facts": 0})
    other.close()
    assert prickle.verify_audit(world.db, PROJECT)[0]["ok"]


@pytest.mark.parametrize("text", ["", "website-v2", "2026-11-29T20:42:15.123Z", "message.posted", 'a "quoted" word',
                                  "back\\slash", "tab\tand newline\n", "caf\u00e9 \u2603", "\x7f\x00"])
def test_an_audit_entry_hashes_the_canonical_json_of_its_fields(text):
    refs = {"message": text, "mentions": 2}
    entry = {"chain": text, "n": 7, "at": text, "type": text, "refs": refs}
    assert prickle._entry_json(text, 7, text, text, prickle.canonical_json(refs)) == prickle.canonical_json(entry)



def test_a_long_write_ahead_log_is_started_over(world, db_path):
    world.db.conn.pragma("wal_autocheckpoint", 0)
    checkpointer = apsw.Connection(db_path)
    checkpointer.setbusytimeout(2000)
    muse = world.actor("oj/muse")
    for i in range(30):  # several frames a post: well past 100
        prickle.post_message(world.db, muse, PROJECT, f"note {i}")
    assert prickle.checkpoint_wal(checkpointer, restart_frames=100) == "restart"
    prickle.post_message(world.db, muse, PROJECT, "after the restart")
    log, copied = checkpointer.wal_checkpoint(mode=apsw.SQLITE_CHECKPOINT_PASSIVE)
    assert 0 < log < 30 and copied == log  # that post started the log again from its first frame
    prickle.post_message(world.db, muse, PROJECT, "one more")
    assert prickle.checkpoint_wal(checkpointer, restart_frames=100) == "passive"
    checkpointer.close()
    bodies = [r["body"] for r in world.db.rows("SELECT body FROM messages ORDER BY seq")]
    assert bodies == [f"note {i}" for i in range(30)] + ["after the restart", "one more"]
    assert prickle.verify_audit(world.db, PROJECT)[0]["ok"]


def test_while_requests_come_the_server_restarts_the_log_only_once_it_is_longer(world, db_path, monkeypatch):
    world.db.conn.pragma("wal_autocheckpoint", 0)
    muse = world.actor("oj/muse")
    for i in range(30):  # several frames a post: well past 100, well short of WAL_RESTART_FRAMES_BUSY
        prickle.post_message(world.db, muse, PROJECT, f"note {i}")
    checkpointer = prickle.WalCheckpointer(db_path, restart_frames=100)
    assert checkpointer.run(busy=True) == "passive"  # copied, but writers are not held back for a restart
    assert checkpointer.run(busy=False) == "restart"  # a quiet moment: started over
    checkpointer.close()

    asked = []  # the server's checkpoint piece says whether requests are coming, and whether none came for a while
    real = prickle.WalCheckpointer.run
    monkeypatch.setattr(prickle.WalCheckpointer, "run",
                        lambda self, busy, lull: asked.append((busy, lull)) or real(self, busy, lull))
    app = prickle.create_app(db_path)
    with TestClient(app, base_url="http://127.0.0.1:8321") as client:
        maintenance = app.state.prickle.maintenance
        sent = time.monotonic()
        assert client.get("/healthz").status_code == 200
        assert maintenance.last_request >= sent  # every request is noted
        for ago, told in ((-math.inf, (True, False)),  # a request always just in
                          (prickle.REQUESTS_QUIET_SECONDS + 0.5, (False, False)),  # a pause between requests
                          (math.inf, (False, True))):  # none ever: a lull
            maintenance.last_request = time.monotonic() - ago
            maintenance.wake("checkpoint")
            wait_until(f"a checkpoint told {told}", lambda: asked and asked[-1] == told, timeout=10, every=0.05)


def test_the_log_file_is_shortened_in_a_lull_never_by_a_request(world, db_path):
    world.db.conn.pragma("wal_autocheckpoint", 0)
    app = prickle.create_app(db_path)  # the server's connection: a write after a restart leaves the file as long
    server = app.state.prickle.db
    assert server.conn.pragma("journal_size_limit") == -1
    muse = world.actor("oj/muse")
    for i in range(30):
        prickle.post_message(server, muse, PROJECT, f"note {i}")
    checkpointer = prickle.WalCheckpointer(db_path, restart_frames=10, keep_bytes=1024)
    assert checkpointer.run(busy=True) == "passive"  # requests are coming: the file stays
    long_file = os.path.getsize(db_path + "-wal")
    assert long_file > 100 * 1024
    assert checkpointer.run(busy=False) == "restart"  # a pause between requests: restarted only
    assert os.path.getsize(db_path + "-wal") == long_file
    assert checkpointer.run(busy=False, lull=True) == "truncate"  # no request for a while: emptied
    assert os.path.getsize(db_path + "-wal") == 0
    for i in range(30):
        prickle.post_message(server, muse, PROJECT, f"again {i}")
    grown = os.path.getsize(db_path + "-wal")
    checkpointer.keep_bytes = 10 * grown  # with the limit above the file, a lull only restarts it
    assert checkpointer.run(busy=False, lull=True) == "restart"
    prickle.post_message(server, muse, PROJECT, "after the restart")
    log, copied = checkpointer.conn.wal_checkpoint(mode=apsw.SQLITE_CHECKPOINT_PASSIVE)
    assert 0 < log < 30 and copied == log  # the post started the log again from its first frame
    assert os.path.getsize(db_path + "-wal") == grown  # and did not shorten the file
    checkpointer.close()
    server.close()
    assert world.db.scalar("SELECT count(*) FROM messages") == 61
    assert prickle.verify_audit(world.db, PROJECT)[0]["ok"]


def test_beside_litestream_the_server_keeps_sqlites_limit_on_the_log_file(db_path):
    prickle.Database(db_path).close()
    settings = prickle.Settings(checkpoints="litestream")
    app = prickle.create_app(db_path, settings=settings)
    assert app.state.prickle.db.conn.pragma("journal_size_limit") == prickle.WAL_KEEP_BYTES
    app.state.prickle.db.close()


def test_a_restart_waits_for_a_reader_only_briefly(world, db_path):
    world.db.conn.pragma("wal_autocheckpoint", 0)
    muse = world.actor("oj/muse")
    for i in range(30):
        prickle.post_message(world.db, muse, PROJECT, f"note {i}")
    reader = apsw.Connection(db_path)  # a backup, say, holding the log open
    reader.execute("BEGIN")
    assert reader.execute("SELECT count(*) FROM messages").fetchall() == [(30,)]
    checkpointer = apsw.Connection(db_path)
    checkpointer.setbusytimeout(prickle.CHECKPOINT_WAIT_MS)
    started = time.monotonic()
    with pytest.raises(apsw.BusyError):
        prickle.checkpoint_wal(checkpointer, restart_frames=100)
    assert time.monotonic() - started < 2
    prickle.post_message(world.db, muse, PROJECT, "writers go on")  # not held back once it gave up
    reader.execute("COMMIT")
    assert prickle.checkpoint_wal(checkpointer, restart_frames=100) == "restart"
    reader.close()
    checkpointer.close()


def _seeded_outbox(world):
    """A mention (undelivered), a task handed to ren/builder (its task wake undelivered), a mention
    that was delivered, then one plain event: the newest."""
    db = world.db
    prickle.post_message(db, world.actor("ren/builder"), PROJECT, "@oj/muse unheard mention")
    task_id = make_task(world)
    heard = prickle.post_message(db, world.actor("oj/muse"), PROJECT, "@ren/builder heard mention")
    seq = db.scalar("SELECT seq FROM wakes WHERE agent_id = 'ren/builder' AND message_id = ?", (heard["id"],))
    prickle.note_delivered(db, "ren/builder", [{"seq": seq}])
    with db.transaction():
        newest = prickle.append_event(db, PROJECT, "agent.added", {"agent_id": "oj/scout"})
    return task_id, newest["seq"]


def test_pruning_keeps_the_window_the_newest_event_and_the_task_wakes_a_reader_needs(world):
    db = world.db
    task_id, head = _seeded_outbox(world)
    messages = db.rows("SELECT * FROM messages ORDER BY seq")
    held = {(r["agent_id"], r["seq"], r["kind"]) for r in
            db.rows("SELECT * FROM wakes WHERE delivered = 0 AND task_id IS NOT NULL")}
    assert any(agent == "ren/builder" and kind == "task" for agent, _, kind in held)
    keep = prickle.Settings().outbox_keep_days
    assert keep == 30
    window = datetime.timedelta(days=keep)
    # Nothing is older than the window yet.
    assert prickle.prune_outbox(db, window) == 0
    assert prickle.pruned_through(db) == 0 and prickle.outbox_head(db) == head

    later = prickle.utcnow() + window + datetime.timedelta(days=1)
    total = db.scalar("SELECT count(*) FROM outbox")
    pruned = prickle.prune_outbox(db, window, later)
    kept = {r["seq"] for r in db.rows("SELECT seq FROM outbox")}
    assert kept == {s for _, s, _ in held} | {head}
    assert pruned == total - len(kept)
    assert {(r["agent_id"], r["seq"], r["kind"]) for r in db.rows("SELECT * FROM wakes")} == held
    assert prickle.pruned_through(db) == head - 1
    assert prickle.prune_outbox(db, window, later) == 0  # the newest event always stays
    # The messages, the task and what check_inbox reports of it are untouched.
    assert db.rows("SELECT * FROM messages ORDER BY seq") == messages
    assert [m["id"] for m in prickle.read_room(db, world.person("oj"), PROJECT, limit=100)["messages"]] == \
        [m["id"] for m in messages if m["task_id"] is None]
    inbox = prickle.check_inbox(db, world.actor("ren/builder"), pending_wakes_only=True)
    assert [t["id"] for t in inbox["assigned"]] == [task_id]
    # seq only grows.
    with db.transaction():
        assert prickle.append_event(db, PROJECT, "agent.added", {"agent_id": "oj/muse"})["seq"] == head + 1


def test_pruning_goes_in_small_steps_oldest_first(world):
    db = world.db
    _seeded_outbox(world)
    first = [r["seq"] for r in db.rows("SELECT seq FROM outbox ORDER BY seq LIMIT 3")]
    later = prickle.utcnow() + datetime.timedelta(days=2)
    assert prickle.prune_outbox(db, datetime.timedelta(days=1), later, batch=2) == 2
    assert [r["seq"] for r in db.rows("SELECT seq FROM outbox ORDER BY seq LIMIT 1")] == first[2:]
    assert prickle.pruned_through(db) == first[1]


def test_the_server_prunes_old_events_in_the_background(world):
    db = world.db
    with db.transaction():
        recent = prickle.append_event(db, PROJECT, "agent.added", {"agent_id": "oj/muse"})["seq"]
        db.execute("UPDATE outbox SET at = '2020-01-01T00:00:00.000Z' WHERE seq < ?", (recent - 1,))
    old = db.scalar("SELECT count(*) FROM outbox WHERE seq < ?", (recent - 1,))
    assert old > 0  # the seeded team's events
    app = prickle.create_app(db.path, prickle.Settings(outbox_keep_days=1))
    with TestClient(app, base_url="http://127.0.0.1:8321"):
        deadline = time.monotonic() + 20
        while prickle.pruned_through(db) < recent - 2 and time.monotonic() < deadline:
            time.sleep(0.05)
    # Everything older than a day went; the two recent events stayed.
    assert prickle.pruned_through(db) == recent - 2
    assert [r["seq"] for r in db.rows("SELECT seq FROM outbox")] == [recent - 1, recent]


def test_outbox_keep_days_is_a_setting_with_bounds():
    assert prickle.Settings(outbox_keep_days=7).outbox_keep_days == 7
    for bad in (0, 3651):
        with pytest.raises(pydantic.ValidationError, match="outbox_keep_days"):
            prickle.Settings(outbox_keep_days=bad)
