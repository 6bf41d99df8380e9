#!/usr/bin/env python3
"""Schedules benchmark: 1,000 schedules on one ``prickle serve``; the scheduler's CPU while idle and how
late a due run starts. Prints Markdown table rows.

    python bench/schedules.py          # about a minute on 2 cores
    python bench/schedules.py --quick  # shorter idle windows, for a smoke check

The bench makes 25 people in one team project, each with an agent and 40 schedules (daily, at times
spread over the day, none due while it measures): 1,000 in all, made by create_schedule itself (each
owner's personal token is marked as having confirmed it's them, in the file, as a passkey would). It
then measures, each on a fresh ``prickle serve --port 0`` of the same file:

1. The server's CPU while idle, with the 1,000 schedules and, for comparison, on a copy of the
   file with none: the process's user+system ticks over the idle window, as a share of one core,
   after a settling pause. The scheduler sleeps until the next due time, so the two should match.
2. One scheduler look over the 1,000 with none due (run_due_schedules, in this process), median of 50.
3. A due run's lateness: 5 of the schedules are moved (in the file, before the server starts) to fall
   due 8 to 16 s later; for each, the time its run was recorded (schedule_runs.at, the
   Task request already posted) minus its due time. Median and largest.

Traffic stays on 127.0.0.1; every process it starts is stopped on the way out.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import prickle
from run import cpu_ticks, stop  # bench/run.py: a process's CPU ticks; terminate, then kill after 5 s

OWNERS, PER_OWNER, DUE = 25, 40, 5
PROJECT = "bench"
TICK = os.sysconf("SC_CLK_TCK")


def seed(path: str) -> None:
    db = prickle.Database(path)
    prickle.add_person(db, "lead", "Lead")
    prickle.create_project(db, PROJECT, "Bench", "bench", "lead")
    now = prickle.utcnow()
    for i in range(OWNERS):
        handle = f"p{i}"
        prickle.add_person(db, handle, f"Person {i}")
        prickle.add_to_team(db, "bench", handle)
        prickle.add_member(db, PROJECT, handle, by="lead")
        prickle.add_agent(db, f"{handle}/helper", "Helper", "bench", "bench", "", [], [PROJECT])
        record, _ = prickle.create_token(db, "person", person=handle)
        db.execute("UPDATE credentials SET confirmed_at = ? WHERE id = ?", (prickle.iso(now), record["id"]))
        person = prickle.Actor("person", record["id"], "person", handle=handle)
        for j in range(PER_OWNER):
            # Daily, at least two hours away from now: nothing falls due while the bench measures.
            at = now + dt.timedelta(hours=2, minutes=(i * PER_OWNER + j) * 79 % (20 * 60))
            prickle.create_schedule(db, person, {
                "agent": f"{handle}/helper", "project": PROJECT, "text": f"Bench schedule {i}-{j}.",
                "recurrence": {"freq": "daily", "hour": at.hour, "minute": at.minute}, "timezone": "UTC"})
    db.close()


def serve(path: str, tmp: Path) -> tuple[subprocess.Popen, dict]:
    out = open(tmp / f"serve-{time.monotonic_ns()}.out", "w+")
    # The prickle.py this bench imported (a checkout's, say), not whichever is installed.
    proc = subprocess.Popen([sys.executable, prickle.__file__, "serve", "--db", path, "--port", "0", "--json"],
                            stdout=out, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, cwd=tmp)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        out.seek(0)
        line = out.readline()
        if line.endswith("\n"):
            return proc, json.loads(line)
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.kill()
    raise SystemExit("prickle serve did not start")


def idle_cpu(path: str, tmp: Path, settle: float, window: float) -> float:
    """The server's CPU over ``window`` idle seconds, as a percentage of one core."""
    proc, _ = serve(path, tmp)
    try:
        time.sleep(settle)
        before, start = cpu_ticks(proc.pid), time.monotonic()
        time.sleep(window)
        return 100 * (cpu_ticks(proc.pid) - before) / TICK / (time.monotonic() - start)
    finally:
        stop(proc)


def one_look(path: str) -> float:
    """Milliseconds of one scheduler look over every schedule with none due (median of 50)."""
    db = prickle.Database(path)
    times = []
    for _ in range(50):
        start = time.perf_counter()
        assert prickle.run_due_schedules(db)["runs"] == []
        times.append((time.perf_counter() - start) * 1000)
    db.close()
    return statistics.median(times)


def lateness(path: str, tmp: Path) -> list[float]:
    """Milliseconds each of DUE schedules' runs started after its due time."""
    db = prickle.Database(path)
    ids = [r["id"] for r in db.rows("SELECT id FROM schedules ORDER BY id LIMIT ?", (DUE,))]
    start = prickle.utcnow()
    with db.transaction():
        for k, sid in enumerate(ids):
            due = start + dt.timedelta(seconds=8 + 2 * k)  # the server is up by then
            db.execute("UPDATE schedules SET next_run_at = ? WHERE id = ?", (prickle.iso(due), sid))
    proc, _ = serve(path, tmp)
    try:
        deadline = time.monotonic() + 8 + 2 * DUE + 20
        while time.monotonic() < deadline:
            if db.scalar("SELECT count(*) FROM schedule_runs") >= DUE:
                break
            time.sleep(0.2)
        runs = db.rows("SELECT due_at, at, outcome FROM schedule_runs ORDER BY id")
    finally:
        stop(proc)
        db.close()
    if len(runs) != DUE or any(r["outcome"] != "asked" for r in runs):
        raise SystemExit(f"expected {DUE} runs that asked their agent, got {runs}")
    return [(prickle.parse_iso(r["at"]) - prickle.parse_iso(r["due_at"])).total_seconds() * 1000 for r in runs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    quick = parser.parse_args().quick
    settle, window = (2.0, 5.0) if quick else (5.0, 20.0)
    tmp = Path(tempfile.mkdtemp(prefix="prickle-bench-schedules-"))
    try:
        path, empty = str(tmp / "schedules.db"), str(tmp / "empty.db")
        prickle.Database(empty).close()
        started = time.monotonic()
        seed(path)
        made = time.monotonic() - started
        with_schedules = idle_cpu(path, tmp, settle, window)
        without = idle_cpu(empty, tmp, settle, window)
        look = one_look(path)
        late = lateness(path, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    n = OWNERS * PER_OWNER
    print(f"| server CPU while idle, {n:,} schedules (none due) / no schedules | {with_schedules:.1f}% / "
          f"{without:.1f}% of a core | n/a | no more than with none | "
          f"{'yes' if with_schedules <= without + 0.5 else '**no**'} |")
    print(f"| one scheduler look over {n:,} schedules, none due (median of 50) | {look:.2f} ms | n/a | - | - |")
    print(f"| a due run's lateness, {DUE} runs: median / largest | {statistics.median(late):.0f} / {max(late):.0f} ms "
          f"| n/a | < 1 s | {'yes' if max(late) < 1000 else '**no**'} |")
    print(f"- the {n:,} schedules were made in {made:.1f} s (create_schedule, {OWNERS} owners)")


if __name__ == "__main__":
    main()
