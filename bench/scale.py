#!/usr/bin/env python3
"""Prickle at scale: the same calls on a project filled with history and on a fresh one, as ratios.

Two ``prickle serve --demo`` servers run side by side on 127.0.0.1, each on its own database in
a temporary folder. One is filled through its own MCP endpoint, as agents would fill it: 2,000
handoffs from oj/muse to oj/bench (the same owner, so each is routed at once and stays open),
then 100,000 ``post_message`` calls from 16 agents (wrk ``-t2 -c16``, each message's text
different). The other stays fresh but for 20 handoffs from oj/muse to ren/builder (held at ren's
gate), so that ``read_room`` lists as many task threads on both (20, the most it lists) and both
answers have the same shape; what differs is the history behind them. Then these calls are
measured on both, interleaved (each round runs every call on one server and then on the other, the
order swapped each round; wrk kept to one core):

- ``post_message`` with a mention (``@ren/builder``), 1 agent (``wrk -t1 -c1``) and 16 agents
  (``-t2 -c16``);
- ``read_room`` with ``limit`` 50, ``get_project_context`` and ``check_inbox`` (as oj/bench: on the
  filled project it lists the 2,000 open tasks), 1 agent each.

Once straight after the fill (the first round starts the moment the last post was answered) and
once after the filled server has settled (its CPU still for 5 s). A call's rate on a server is the
median of its rounds; the ratio is the median of the rounds' own filled/fresh ratios; p99 is the
median of the rounds' p99 latencies as wrk measured them. The server's CPU a call is its process's
CPU time over the run (``/proc``, the background threads' included) over the calls answered; the
capacity ratio is the median of the rounds' fresh/filled CPU a call: how many calls the filled
server can answer in a second of a core, against the fresh one. wrk shares the machine's cores
with both servers, so calls/s move with whatever else runs; the CPU a call moves less. The bytes
stored per message are the filled file's used pages (``page_count - freelist_count``, once the
write-ahead log is copied in) less the fresh one's, over the messages the fill added.

    python bench/scale.py                  # the full measurement: about 15 minutes on 2 cores
    python bench/scale.py --messages 10000 --rounds 2 --seconds 2   # a smaller fill, for a quick look

wrk is needed (Debian's ``wrk`` package). Every process it starts is stopped on the way out and a
watchdog ends the run after ``--budget`` seconds. It exits 0 when the measurement ran (a missed
target is part of the report) and non-zero only when the measurement itself failed.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import json
import os
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

import mcp_clients  # bench/mcp_clients.py: the script's folder is on sys.path
import run as bench  # bench/run.py

PROJECT = "website-v2"
#: The packet each fill handoff carries ({n}: a number of its own).
PACKET = {"task": "Scale task {n}: check the copy of page {n}", "deliverable_type": "doc",
          "acceptance_criteria": ["Every heading has at most 8 words.", "The call to action is there."],
          "context": "A collaboration tool for small teams.", "files": []}
#: What a fill message says ({n}: a number of its own), about as long as a message in a busy room.
FILL_BODY = ("Fill message {n}: read through section {n} of the draft, the headings are fine, two typos "
             "fixed and the call to action moved up as agreed.")

#: Each measured call: label, tool, agents (connections), who calls (a demo agent, oj/bench or the
#: 16 bench agents), its arguments.
CALLS = (
    ("post_message with a mention, c=1", "post_message", 1, "oj/muse",
     {"project": PROJECT, "body": "@ren/builder scale check {n}"}),
    ("post_message with a mention, c=16", "post_message", 16, "agents",
     {"project": PROJECT, "body": "@ren/builder scale check {n}"}),
    ("read_room (limit 50)", "read_room", 1, "oj/muse", {"project": PROJECT, "limit": 50}),
    ("get_project_context", "get_project_context", 1, "oj/muse", {"project": PROJECT}),
    ("check_inbox (oj/bench: 2,000 open tasks when filled)", "check_inbox", 1, "oj/bench", {}),
)
#: The calls wrk only counts (their answers are checked by size; see wrk): a check_inbox answer of 2,000
#: tasks is about 3 MB, and handing that to wrk's Lua costs the client more than the server spends.
COUNT_ONLY = {"check_inbox"}
#: The target ratio of each call (filled / fresh).
TARGETS = {"check_inbox": 0.3}
DEFAULT_TARGET = 0.9
#: Where wrk runs, on a machine with two CPUs or more: on the last core alone, so it never takes more than one
#: core's time slices; the servers may use every core, as a server does (its checkpoint runs on a thread).
LOAD_CPUS = {max(os.sched_getaffinity(0))}
#: The handoffs the fresh server gets: read_room lists at most 20 task threads (its reference text says so).
FRESH_THREADS = 20


@dataclasses.dataclass
class Settings:
    messages: int = 100_000
    tasks: int = 2_000
    rounds: int = 5
    seconds: float = 3.0
    settle_max: float = 900.0
    budget: int = 3600
    prickle: str = ""
    load: str = "wrk"
    waiters: int = 100  # for bench.start_prickle: connections the server keeps


@dataclasses.dataclass
class Side:
    """One of the two servers, with its keys."""

    name: str
    served: bench.Served
    db: Path
    keys: dict[str, str]
    agents: list[str]


def wrk(url: str, tool: str, keys: list[str], arguments: dict, seconds: float, tmp: Path,
        until: tuple[Path, str, int] | None = None, answer_bytes: int | None = None) -> dict:
    """One wrk run of ``tool`` for ``seconds``; with ``until`` (a file, a table, a count), until the table
    has that many rows (wrk's threads stop themselves near it, the run is then interrupted).

    With ``answer_bytes`` (the length of a good answer's body) wrk only counts (bench/mcp_call.lua,
    MCP_CALL_COUNT_ONLY): a call counts as good when the bytes read per call were at least that many.
    """
    threads = 1 if len(keys) == 1 else 2
    keyfile, argsfile = tmp / f"keys-{tool}-{len(keys)}.txt", tmp / f"args-{tool}.json"
    keyfile.write_text("\n".join(keys) + "\n")
    argsfile.write_text(json.dumps(arguments))
    cmd = ["wrk", f"-t{threads}", f"-c{len(keys)}", f"-d{max(1, round(seconds))}s", "--timeout", "20s",
           "-s", str(bench.LUA), url, "--", tool, str(keyfile), str(threads), str(argsfile)]
    if until is not None:
        db, table_name, count = until
        cmd.append(str(-(-(count - rows(db, table_name)) // threads)))
    env = dict(os.environ, MCP_CALL_COUNT_ONLY="1" if answer_bytes else "0")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=on_load_cpus)
    try:
        if until is not None:
            # wrk sleeps out its whole duration even once every thread stopped: interrupt it then.
            while proc.poll() is None and rows(db, table_name) < count:
                time.sleep(0.5)
            proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=seconds + 60)
    finally:
        bench.stop(proc)
    lines = [ln for ln in stdout.splitlines() if ln.startswith("BENCH_JSON ")]
    if not lines:
        raise bench.BenchError(f"wrk failed ({proc.returncode}): {(stderr or stdout)[-500:]}")
    out = json.loads(lines[-1][len("BENCH_JSON "):])
    errors = out["bad_status"] + out["tool_errors"] + out["socket_errors"] + out["timeouts"]
    if answer_bytes and out["bytes"] < answer_bytes * out["requests"]:
        errors += out["ok"]  # shorter answers than a good one: errors (an error's answer is short)
    return {"rps": out["ok"] / (out["duration_us"] / 1e6), "ok": out["ok"], "errors": errors,
            "p99_ms": out["latency_p99_us"] / 1000, "p50_ms": out["latency_p50_us"] / 1000}


def on_load_cpus() -> None:
    """Keep this process (wrk, about to start) on LOAD_CPUS."""
    os.sched_setaffinity(0, LOAD_CPUS)


def call(url: str, key: str, tool: str, arguments: dict) -> tuple[dict, int]:
    """Call ``tool`` once (httpx, the bench's MCP client); check it succeeded; its output and the length of
    its answer's body."""
    with httpx.Client(timeout=60) as client:
        response = client.post(url, content=mcp_clients.call_body(tool, arguments),
                               headers=mcp_clients.call_headers(tool, key))
        return mcp_clients.tool_output(response), len(response.content)  # raises unless a tool result, no error


def rows(db: Path, table_name: str) -> int:
    """How many rows ``table_name`` has (read through SQLite, the server running)."""
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)) as conn:
        return conn.execute(f"SELECT count(*) FROM {table_name}").fetchone()[0]


def start_side(cfg: Settings, name: str, tmp: Path, procs: bench.Processes) -> Side:
    folder = tmp / name
    folder.mkdir()
    served = bench.start_prickle(cfg, folder, procs)
    db = Path(served.info["db"])
    if not db.is_absolute():
        db = folder / db
    agents = bench.make_agents(str(db), bench.AGENTS, folder)
    task_agent = bench.make_task_agent(str(db), folder)
    keys = dict(served.info["demo"]["keys"]) | {task_agent["agent"]: task_agent["key"]}
    return Side(name, served, db, keys, list(agents.values()))


def fill(cfg: Settings, side: Side, tmp: Path) -> dict:
    """The handoffs, then the messages, through the server's MCP endpoint; returns what it took."""
    url = side.served.mcp
    started = time.monotonic()
    tasks, messages_before = rows(side.db, "tasks"), rows(side.db, "messages")
    made = wrk(url, "handoff", [side.keys["oj/muse"]] * 4, {"project": PROJECT, "to": "oj/bench", "packet": PACKET},
               3600, tmp, (side.db, "tasks", tasks + cfg.tasks))
    bench.log(f"  {made['ok']} handoffs ({made['errors']} errors) in {time.monotonic() - started:.0f} s")
    if made["errors"]:
        raise bench.BenchError(f"{made['errors']} fill handoffs failed")
    posted_from = time.monotonic()
    posted = wrk(url, "post_message", side.agents, {"project": PROJECT, "body": FILL_BODY}, 3600, tmp,
                 (side.db, "messages", messages_before + cfg.messages))
    took = time.monotonic() - posted_from
    bench.log(f"  {posted['ok']} messages ({posted['errors']} errors) in {took:.0f} s ({posted['rps']:.0f}/s)")
    if posted["errors"]:
        raise bench.BenchError(f"{posted['errors']} fill posts failed")
    wal = Path(f"{side.db}-wal")
    return {"tasks": made["ok"], "messages": posted["ok"], "seconds": took, "rps": posted["rps"],
            "wal_mb": wal.stat().st_size / 1e6 if wal.exists() else 0.0}


def give_threads(side: Side) -> None:
    """FRESH_THREADS handoffs from oj/muse to ren/builder on the fresh server: read_room then lists as many
    task threads there as on the filled one (its newest ROOM_THREADS of 2,000)."""
    for n in range(FRESH_THREADS):
        packet = {k: v.format(n=n) if isinstance(v, str) else v for k, v in PACKET.items()}
        call(side.served.mcp, side.keys["oj/muse"], "handoff",
             {"project": PROJECT, "to": "ren/builder", "packet": packet})


def same_shape(fresh: Side, filled: Side) -> None:
    """Both read_room answers list as many threads and messages (else the ratio compares different answers)."""
    shapes = []
    for side in (fresh, filled):
        room, _ = call(side.served.mcp, side.keys["oj/muse"], "read_room", {"project": PROJECT, "limit": 50})
        shapes.append((len(room["threads"]), len(room["messages"])))
    if shapes[0] != shapes[1]:
        raise bench.BenchError(f"read_room's answers differ in shape (threads, messages): fresh {shapes[0]}, "
                               f"filled {shapes[1]}")


def measure(cfg: Settings, fresh: Side, filled: Side, tmp: Path, phase: str) -> dict:
    """Every call on both servers, ``cfg.rounds`` rounds, interleaved; per call and server its runs."""
    runs: dict[tuple[str, str], list[dict]] = {}
    for r in range(cfg.rounds):
        for label, tool, agents, who, arguments in CALLS:
            order = (fresh, filled) if r % 2 == 0 else (filled, fresh)
            for side in order:
                keys = side.agents[:agents] if who == "agents" else [side.keys[who]] * agents
                size = call(side.served.mcp, keys[0], tool, arguments)[1] if tool in COUNT_ONLY else None
                ticks = bench.cpu_ticks(side.served.proc.pid)
                out = wrk(side.served.mcp, tool, keys, arguments, cfg.seconds, tmp, answer_bytes=size)
                # The server's CPU per answered call (ms; /proc counts hundredths of a second).
                out["cpu_ms"] = (bench.cpu_ticks(side.served.proc.pid) - ticks) * 10 / max(1, out["ok"])
                if out["errors"]:
                    raise bench.BenchError(f"{label} on the {side.name} server: {out['errors']} errors")
                runs.setdefault((label, side.name), []).append(out)
            f, g = runs[(label, "fresh")][-1], runs[(label, "filled")][-1]
            bench.log(f"  {phase}, round {r + 1}: {label}: fresh {f['rps']:.0f}/s, filled {g['rps']:.0f}/s "
                      f"({g['rps'] / f['rps']:.2f}), p99 {f['p99_ms']:.1f} / {g['p99_ms']:.1f} ms, server CPU "
                      f"{f['cpu_ms']:.2f} / {g['cpu_ms']:.2f} ms a call ({f['cpu_ms'] / g['cpu_ms']:.2f})")
    return runs


def summary(runs: dict, label: str) -> dict:
    fresh, filled = runs[(label, "fresh")], runs[(label, "filled")]
    return {"fresh": statistics.median(r["rps"] for r in fresh), "filled": statistics.median(r["rps"] for r in filled),
            "ratio": statistics.median(g["rps"] / f["rps"] for f, g in zip(fresh, filled)),
            "cpu_fresh": statistics.median(r["cpu_ms"] for r in fresh),
            "cpu_filled": statistics.median(r["cpu_ms"] for r in filled),
            "capacity": statistics.median(f["cpu_ms"] / g["cpu_ms"] for f, g in zip(fresh, filled)),
            "p99_fresh": statistics.median(r["p99_ms"] for r in fresh),
            "p99_filled": statistics.median(r["p99_ms"] for r in filled)}


def settle(cfg: Settings, side: Side) -> float:
    """Wait until the server's CPU stays still for 5 s (at most cfg.settle_max); returns the seconds waited."""
    pid, start = side.served.proc.pid, time.monotonic()
    last, still_since = bench.cpu_ticks(pid), time.monotonic()
    while time.monotonic() - start < cfg.settle_max:
        time.sleep(0.5)
        ticks, now = bench.cpu_ticks(pid), time.monotonic()
        if ticks - last > 5:  # more than 50 ms of CPU in half a second: still at work
            last, still_since = ticks, now
        elif now - still_since >= 5:
            break
    return time.monotonic() - start


def used_bytes(db: Path) -> int:
    """The file's pages in use, the write-ahead log's included (read through SQLite, the server running)."""
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)) as conn:
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]
        pages = conn.execute("PRAGMA page_count").fetchone()[0] - conn.execute("PRAGMA freelist_count").fetchone()[0]
    return pages * page_size


def table(cfg: Settings, after: dict, settled: dict, filled_info: dict, per_message: float) -> list[str]:
    rows = ["| call | fresh calls/s | filled, straight after the fill | ratio | filled, settled | ratio "
            "| p99 fresh / after fill / settled (ms) | server CPU a call, fresh / after fill / settled (ms) "
            "| capacity ratio, after fill / settled | target | calls/s ok | capacity ok |",
            "| --- | ---: | ---: | ---: | ---: | ---: | --- | --- | --- | --- | --- | --- |"]
    for label, tool, *_ in CALLS:
        a, s = summary(after, label), summary(settled, label)
        target = TARGETS.get(tool, DEFAULT_TARGET)
        p99_ok = tool in TARGETS or (a["p99_filled"] <= 2 * a["p99_fresh"] and s["p99_filled"] <= 2 * s["p99_fresh"])
        ok = a["ratio"] >= target and s["ratio"] >= target and p99_ok
        capacity_ok = a["capacity"] >= target and s["capacity"] >= target
        cpu = (f"{statistics.median([a['cpu_fresh'], s['cpu_fresh']]):.2f} / {a['cpu_filled']:.2f} / "
               f"{s['cpu_filled']:.2f}")
        fresh = statistics.median([a["fresh"], s["fresh"]])
        p99 = (f"{statistics.median([a['p99_fresh'], s['p99_fresh']]):.1f} / {a['p99_filled']:.1f} / "
               f"{s['p99_filled']:.1f}")
        what = f">= {target}x" + ("" if tool in TARGETS else ", p99 within 2x")
        rows.append(f"| {label} | {fresh:.0f} | {a['filled']:.0f} | {a['ratio']:.2f} | {s['filled']:.0f} "
                    f"| {s['ratio']:.2f} | {p99} | {cpu} | {a['capacity']:.2f} / {s['capacity']:.2f} | {what} "
                    f"| {'yes' if ok else '**no**'} | {'yes' if capacity_ok else '**no**'} |")
    rows += ["", f"- the fill: {filled_info['tasks']:,} handoffs, then {filled_info['messages']:,} messages in "
             f"{filled_info['seconds']:.0f} s ({filled_info['rps']:.0f}/s from 16 agents); the write-ahead log was "
             f"{filled_info['wal_mb']:.0f} MB when it ended; the filled server settled "
             f"{filled_info['settled_s']:.0f} s after the first measurement",
             f"- bytes stored per message: {per_message:,.0f} (the filled file's used pages less the fresh one's, "
             f"{filled_info['used_mb']:.0f} MB in all, over the {filled_info['added']:,} messages the filled file "
             "has more)"]
    return rows


def header(cfg: Settings) -> list[str]:
    now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    load = Path("/proc/loadavg").read_text().split()[:3]
    return ["## Prickle at scale", "",
            f"- date: {now}; commit {bench.git_commit()}",
            f"- machine: {os.cpu_count()} CPUs ({bench.cpu_model()}); load average at the start "
            f"{' '.join(load)} (other work on the machine shows up as noise)",
            f"- {bench.versions()}; wrk; {cfg.rounds} rounds of {cfg.seconds:g} s per call and server", ""]


def run(cfg: Settings, tmp: Path, procs: bench.Processes) -> list[str]:
    lines = header(cfg)
    # The servers run the repository's prickle.py, and so does what adds the bench's agents.
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, (str(bench.ROOT), os.environ.get("PYTHONPATH"))))
    bench.log(f"starting two servers in {tmp} ...")
    fresh = start_side(cfg, "fresh", tmp, procs)
    give_threads(fresh)
    filled = start_side(cfg, "filled", tmp, procs)
    bench.log(f"filling one with {cfg.tasks:,} handoffs and {cfg.messages:,} messages ...")
    info = fill(cfg, filled, tmp)
    # The fresh room's first 50 messages: its read_room answers a whole page, as the filled one does.
    wrk(fresh.served.mcp, "post_message", [fresh.keys["oj/muse"]], {"project": PROJECT, "body": FILL_BODY}, 60, tmp,
        (fresh.db, "messages", rows(fresh.db, "messages") + 60))
    same_shape(fresh, filled)
    bench.log("straight after the fill ...")
    measured_from = time.monotonic()
    after = measure(cfg, fresh, filled, tmp, "after the fill")
    bench.log("waiting for the filled server to settle ...")
    settle(cfg, filled)
    info["settled_s"] = time.monotonic() - measured_from
    settled = measure(cfg, fresh, filled, tmp, "settled")
    settle(cfg, filled)
    info["added"] = rows(filled.db, "messages") - rows(fresh.db, "messages")
    used = used_bytes(filled.db) - used_bytes(fresh.db)
    info["used_mb"] = used / 1e6
    for side in (fresh, filled):
        if side.served.proc.poll() is not None:
            raise bench.BenchError(f"the {side.name} server exited ({side.served.proc.returncode}) during the run")
    return lines + table(cfg, after, settled, info, used / max(1, info["added"]))


def parse_args(argv: list[str] | None) -> Settings:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=100_000, help="messages the fill posts (default 100,000)")
    parser.add_argument("--tasks", type=int, default=2_000, help="tasks the fill hands off (default 2,000)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds per phase (default 5)")
    parser.add_argument("--seconds", type=float, default=3.0, help="seconds per call, server and round (default 3)")
    parser.add_argument("--prickle", default="", metavar="CMD", help="command that runs prickle (default: this Python and the repository's prickle.py)")
    parser.add_argument("--budget", type=int, default=3600, help="watchdog: give up after this many seconds")
    args = parser.parse_args(argv)
    if not shutil.which("wrk"):
        parser.error("wrk is not installed (apt-get install wrk)")
    return Settings(messages=args.messages, tasks=args.tasks, rounds=max(1, args.rounds), seconds=args.seconds,
                    budget=args.budget, prickle=args.prickle or f"{sys.executable} {bench.ROOT / 'prickle.py'}")


def main(argv: list[str] | None = None) -> int:
    cfg = parse_args(argv)
    procs = bench.Processes()
    tmp = Path(tempfile.mkdtemp(prefix="prickle-scale-"))
    try:
        bench.install_signals(cfg.budget)
        lines = run(cfg, tmp, procs)
    except (bench.BenchError, OSError, subprocess.SubprocessError, json.JSONDecodeError, KeyError,
            sqlite3.Error, RuntimeError, httpx.HTTPError) as e:
        bench.log(f"the measurement failed: {type(e).__name__}: {e}")
        return 1
    finally:
        signal.alarm(0)
        procs.stop_all()
        shutil.rmtree(tmp, ignore_errors=True)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
