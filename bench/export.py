#!/usr/bin/env python3
"""The cost of exporting a project: run by bench/run.py in a process of its own, prints one JSON object.

A fresh database in ``--dir`` gets a project with ``--messages`` messages (written as a post writes
them: the message, its outbox event, its audit entry and its search-index row). Its owner exports
the whole content (``part`` content, as the page's Export everything does) into a zip, and the
export is checked as ``prickle audit verify --file`` checks it. Reported: how long each took, the
zip's size, and the process's peak memory during the export (VmHWM, reset just before it) beside its
memory before, which says whether the export was held in memory.
"""

from __future__ import annotations

import argparse
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
    prickle.add_agent(db, "oj/muse", "Muse", "m", "claude-code", "", [], [PROJECT])
    agent = prickle.resolve_token(db, prickle.create_token(db, "client", agent_id="oj/muse")[1], ("client",))
    for start in range(0, messages, 5000):
        with db.transaction():
            for n in range(start, min(start + 5000, messages)):
                prickle.write_message(db, agent, PROJECT, f"Message {n}: the copy for the hero section, draft {n}.")


def memory_mb(field: str) -> float:
    """``VmRSS`` or ``VmHWM`` (the peak since the last reset) of this process, in MB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", required=True, help="an empty folder for the database and the export")
    parser.add_argument("--messages", type=int, default=100_000)
    args = parser.parse_args()
    db = prickle.Database(os.path.join(args.dir, "export.db"))
    fill(db, args.messages)
    db.conn.wal_checkpoint(mode=prickle.apsw.SQLITE_CHECKPOINT_TRUNCATE)
    zip_path = os.path.join(args.dir, "export.zip")
    before = memory_mb("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM starts again from the RSS of now
    started = time.monotonic()
    with open(zip_path, "wb") as out:
        manifest = prickle.export_project(db, "oj", PROJECT, "content", out)
    export_s = time.monotonic() - started
    peak = memory_mb("VmHWM")
    started = time.monotonic()
    report = prickle.check_export(zip_path)
    check_s = time.monotonic() - started
    lines = {f["name"]: f["lines"] for f in manifest["files"]}
    db.close()
    print(json.dumps({"messages": args.messages, "export_s": round(export_s, 2), "check_s": round(check_s, 2),
                      "zip_mb": round(os.path.getsize(zip_path) / 2**20, 1), "rss_before_mb": round(before, 1),
                      "rss_peak_mb": round(peak, 1), "audit_entries": report["entries"],
                      "ok": report["ok"] and lines["messages.jsonl"] == args.messages}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
