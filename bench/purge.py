#!/usr/bin/env python3
"""The cost of purging a deleted project: run by bench/run.py in a process of its own, prints one JSON object.

A fresh database in ``--dir`` gets a project with ``--messages`` messages (written as a post writes
them: the message, its outbox event, its audit entry and its search-index row), another project
beside it with a few, and the project is deleted. With Prickle's clock moved past the recovery
window, the retention worker's steps run one after another (as the server's ``retention`` piece
runs them, each one short transaction of at most PURGE_BATCH rows) until the content is purged.
Reported: the steps, their total time, the longest step (what a writer may wait behind), and the
file's size before and after.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import prickle  # noqa: E402  (the repository's prickle.py)

PROJECT = "big"


def fill(db: prickle.Database, messages: int) -> None:
    prickle.add_person(db, "oj", "Oj")
    prickle.create_project(db, PROJECT, "Big", "bench", "oj")
    prickle.create_project(db, "beside", "Beside", "bench", "oj")
    prickle.add_agent(db, "oj/muse", "Muse", "m", "claude-code", "", [], [PROJECT, "beside"])
    agent = prickle.resolve_token(db, prickle.create_token(db, "client", agent_id="oj/muse")[1], ("client",))
    for start in range(0, messages, 5000):
        with db.transaction():
            for n in range(start, min(start + 5000, messages)):
                prickle.write_message(db, agent, PROJECT, f"Message {n}: the copy for the hero section, draft {n}.")
    with db.transaction():
        for n in range(10):
            prickle.write_message(db, agent, "beside", f"Beside {n}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", required=True, help="an empty folder for the database")
    parser.add_argument("--messages", type=int, default=100_000)
    args = parser.parse_args()
    path = os.path.join(args.dir, "purge.db")
    db = prickle.Database(path)
    filled = time.monotonic()
    fill(db, args.messages)
    filled = time.monotonic() - filled
    prickle.delete_project(db, PROJECT, "oj")
    later = prickle.utcnow() + prickle.RECOVERY_WINDOW + dt.timedelta(seconds=1)
    prickle.utcnow = lambda: later  # the recovery window has passed
    db.conn.wal_checkpoint(mode=prickle.apsw.SQLITE_CHECKPOINT_TRUNCATE)
    size_before = os.path.getsize(path)
    steps, longest, started = 0, 0.0, time.monotonic()
    while True:
        t = time.monotonic()
        done = prickle.retention_step(db)
        longest = max(longest, time.monotonic() - t)
        if done is None:
            break
        steps += 1
    total = time.monotonic() - started
    db.conn.wal_checkpoint(mode=prickle.apsw.SQLITE_CHECKPOINT_TRUNCATE)
    left = db.scalar("SELECT count(*) FROM messages WHERE project = ?", (PROJECT,))
    state = db.scalar("SELECT state FROM projects WHERE slug = ?", (PROJECT,))
    beside = db.scalar("SELECT count(*) FROM messages WHERE project = 'beside'")
    db.close()
    print(json.dumps({"messages": args.messages, "fill_s": round(filled, 1), "steps": steps, "purge_s": round(total, 2),
                      "longest_step_ms": round(longest * 1000, 1), "batch": prickle.PURGE_BATCH,
                      "file_mb_before": round(size_before / 2**20, 1), "file_mb_after": round(os.path.getsize(path) / 2**20, 1),
                      "ok": left == 0 and state == "purged" and beside == 10}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
