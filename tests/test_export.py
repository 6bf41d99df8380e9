"""Exporting a project (chapter 41), and the audit chain's hash versions (chapter 6) an export carries."""

import hashlib
import json

import pytest

import prickle
from conftest import audit_entries
from helpers import _database_at_version, jrun, run

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
    conn = _database_at_version(db_path, len(prickle.MIGRATIONS) - 1)
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
                                              "hash_version": 1}]
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
        {"chain": "p", "entries": 4, "ok": True, "broken_at": None, "hash_version": 2}]
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
    assert code == 1 and out.strip() == "p: 3 entries, BROKEN at entry 2 (hash version 1)"


def test_a_version_2_entry_that_claims_version_1_fails_the_check(db_path):
    _older_file(db_path)
    db = prickle.Database(db_path)
    jrun(db_path, "audit", "rehash", "p")
    # going back down a version is out of place, even with a hash made right for it
    e = audit_entries(db, "p")[3]
    e1 = e | {"hash_version": 1}
    db.execute("UPDATE audit SET hash_version = 1, hash = ? WHERE chain = 'p' AND n = 4", (hash_v1(e1),))
    assert prickle.verify_audit(db, "p")[0]["broken_at"] == 4
