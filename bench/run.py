#!/usr/bin/env python3
"""Prickle benchmark: starts the real server on 127.0.0.1 and prints a Markdown table.

What it measures, against ``prickle serve --demo`` on a fresh database in a temporary folder:

1. ``post_message`` calls/s at 1 and at 16 concurrent agents (16 keys), side by side with a
   bare MCP ``echo`` tool on the same MCP SDK / Starlette / uvicorn stack
   (``bench/echo_server.py``), same run, same load generator: ``wrk`` with
   ``bench/mcp_call.lua`` (``-t1 -c1`` and ``-t2 -c16``), or, when wrk is missing, several
   Python processes (the output says which). A 2 s warm-up of each, then 6 rounds of echo for
   3 s and ``post_message`` for 3 s back to back; the table gives each server's median round
   and the median of the rounds' shares. Target: Prickle at least 70% of echo.
2. Wake latency: a waiter process holds ``wait_for_mention`` as oj/muse; a poster process
   posts ``@oj/muse ping N`` as ren/builder 50 ms after the waiter sent its call; latency is
   the waiter's answer fully read minus the poster's answer fully read (``time.monotonic()``,
   one clock for the whole machine). About 300 samples; p50 and p99. Target: p99 under 5 ms.
3. The server's RSS (``VmRSS`` of the ``prickle serve`` process) while 10,000
   ``wait_for_mention`` calls are held at once (four asyncio processes, 16 agents' keys; the
   server's ``max_connections`` set above that), read once ``/healthz`` counts every wait and
   again once the calls went over to SSE (16 s later); a wait that reaches the reference's
   50 s maximum is asked again at once. Then, once every waiter holds a wait, one post that
   mentions all 16 agents: how long the post itself took to be answered, and how long until the waiters
   returned. Target: under 600 MB, every waiter woken.
4. Handoff-to-wake latency: a waiter process holds ``wait_for_mention`` as oj/bench (an agent
   the bench adds, same owner as oj/muse, so the gate routes at once); a poster process calls
   ``handoff`` to oj/bench as oj/muse 50 ms after the waiter sent its call; latency is the
   waiter's answer (kind ``task``, the task just handed over) fully read minus the handoff's
   answer fully read. About 200 samples; p50 and p99.
5. Full task lives: handoff (oj/muse to oj/bench) -> accept_task -> checkpoint -> return_result
   (oj/bench) -> accept_result (oj/muse) -> the owner oj's final acceptance over HTTP
   (``POST /api/tasks/{id}/accept`` with a personal token): 5 MCP calls and 1 HTTP call per
   life. 4 Python processes run 2 lives at a time each (8 connections), 2 s warm-up then
   8 s; reported as lives/s and calls/s, with calls/s as a share of echo's at 16 connections
   measured in 1. Every answer must be a success; failures are counted.
6. A 4 MiB attachment: oj uploads a 4 MiB CSV to their private room (``POST
   /api/projects/{room}/attachments``), posts a message with it, and reads it back (``GET
   /api/attachments/{id}``, its bytes compared), one after another over HTTP with a personal
   token; each sample's bytes differ, so each is stored anew. 20 samples (5 with --quick);
   the median of the upload plus the post, and of the read.
7. A purge: ``bench/purge.py`` (a process of its own, the repository's prickle.py) fills a database
   with a project of 100,000 messages (10,000 with --quick), deletes it, moves Prickle's clock past
   the recovery window and runs the retention worker's steps (one short transaction each) until the
   content is purged: the total time and the longest step.
8. An export: ``bench/export.py`` (a process of its own) fills a database with a project of 100,000
   messages (10,000 with --quick), exports its whole content to a zip as its owner and checks the zip
   as ``prickle audit verify --file`` does: how long each took, and the memory the export added.
9. Schedules: ``bench/schedules.py`` (a process of its own) puts 1,000 schedules on one ``prickle
   serve``: the server's CPU while idle with them and with none, one scheduler look over them all,
   and how late 5 due runs start (see that file).

Run it from the repository with the project's virtualenv active (``wrk`` from Debian's
``wrk`` package; without it the Python load generator is used)::

    python bench/run.py            # about two and a half minutes on 2 cores
    python bench/run.py --quick    # shorter runs and fewer samples, for a smoke check
    python bench/run.py --load python
    python bench/run.py --prickle "python /path/to/patched/prickle.py"

Traffic goes to 127.0.0.1 only; every loop is bounded in count and time, a watchdog ends the
run after --budget seconds, and every process it starts is stopped on the way out, error or
not. It exits 0 when the benchmark ran (missed targets are part of the report) and non-zero
only when the benchmark itself failed.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import importlib.metadata
import json
import multiprocessing
import os
import platform
import queue as queue_module
import resource
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

import mcp_clients  # bench/mcp_clients.py: the script's folder is on sys.path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
LUA = BENCH / "mcp_call.lua"
AGENTS = 16
WAITERS = 10_000
#: The waiters come from this many processes, so one client's event loop is not what is measured.
WAIT_PROCESSES = 4
#: Task lives: this many processes, each running this many lives at a time.
LIFE_PROCESSES = 4
LIFE_CONCURRENT = 2
MPX = multiprocessing.get_context("spawn")  # clean children: no inherited threads or sockets


class BenchError(Exception):
    """The benchmark itself failed (as opposed to a target being missed)."""


class Watchdog(BenchError):
    """The run went over its time budget."""


@dataclasses.dataclass
class Settings:
    attachment_samples: int = 20
    purge_messages: int = 100_000
    warmup: float = 2.0
    measure: float = 3.0
    rounds: int = 6
    wake_samples: int = 300
    handoff_samples: int = 200
    waiters: int = WAITERS
    load: str = "wrk"
    budget: int = 600
    prickle: str = ""


# -- processes ----------------------------------------------------------------


class Processes:
    """Every process the bench starts, stopped in reverse order by :meth:`stop_all`."""

    def __init__(self) -> None:
        self.started: list[Any] = []

    def add(self, proc: Any) -> Any:
        self.started.append(proc)
        return proc

    def stop_all(self) -> None:
        for proc in reversed(self.started):
            stop(proc)
        self.started.clear()


def stop(proc: Any) -> None:
    """Stop one subprocess.Popen or multiprocessing.Process: terminate, then kill after 5 s."""
    if isinstance(proc, subprocess.Popen):
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
    elif proc.pid is not None and proc.exitcode is None:
        proc.terminate()
        proc.join(5)
        if proc.exitcode is None:
            proc.kill()
            proc.join(5)


@dataclasses.dataclass
class Served:
    """A server the bench started: its process, MCP address and log files."""

    name: str
    proc: subprocess.Popen
    mcp: str
    stderr: Path
    info: dict


def prickle_command(cfg: Settings) -> list[str]:
    if cfg.prickle:
        return shlex.split(cfg.prickle)
    for candidate in (Path(sys.executable).parent / "prickle", shutil.which("prickle")):
        if candidate and Path(candidate).exists():
            return [str(candidate)]
    raise BenchError("no 'prickle' command: activate the project's virtualenv (. .venv/bin/activate)")


def first_line(path: Path, proc: subprocess.Popen, timeout: float) -> str:
    """The first complete line a server wrote to ``path``, waiting up to ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = path.read_text()
        if "\n" in text:
            return text.split("\n", 1)[0]
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    if proc.poll() is not None:
        raise BenchError(f"{path.stem} exited with code {proc.returncode} before printing its first line")
    raise BenchError(f"{path.stem} printed no first line in {timeout:.0f} s")


def start_prickle(cfg: Settings, tmp: Path, procs: Processes) -> Served:
    out, err = tmp / "prickle.stdout", tmp / "prickle.stderr"
    db = tmp / "bench.db"
    with open(out, "w") as o, open(err, "w") as e:
        # cwd=tmp: no ./prickle.toml from the repository changes the settings; this one keeps a
        # connection for every waiter.
        (tmp / "prickle.toml").write_text(f"max_connections = {cfg.waiters + 500}\n")
        proc = procs.add(subprocess.Popen(prickle_command(cfg) + ["serve", "--db", str(db), "--port", "0", "--demo",
                                                               "--json"],
                                          stdin=subprocess.DEVNULL, stdout=o, stderr=e, cwd=tmp))
    try:
        info = json.loads(first_line(out, proc, 30))
    except (json.JSONDecodeError, BenchError) as exc:
        raise BenchError(f"prickle serve did not start: {exc}; stderr: {err.read_text()[-500:]}") from None
    if not info["mcp"].startswith("http://127.0.0.1:"):
        raise BenchError(f"prickle serve is not on 127.0.0.1: {info['mcp']}")
    return Served("prickle", proc, info["mcp"], err, info)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise BenchError(f"nothing listens on 127.0.0.1:{port} after {timeout:.0f} s (exit code {proc.poll()})")


def start_echo(tmp: Path, procs: Processes) -> Served:
    err = tmp / "echo.stderr"
    port = free_port()
    with open(err, "w") as e:
        proc = procs.add(subprocess.Popen([sys.executable, str(BENCH / "echo_server.py"), str(port)],
                                          stdin=subprocess.DEVNULL, stdout=e, stderr=e, cwd=tmp))
    try:
        wait_for_port(port, proc, 30)
    except BenchError as exc:
        raise BenchError(f"echo server did not start: {exc}; output: {err.read_text()[-500:]}") from None
    return Served("echo", proc, f"http://127.0.0.1:{port}/mcp", err, {"port": port})


def make_agents(db: str, count: int, tmp: Path) -> dict[str, str]:
    """``count`` more agents in the demo project, with a client key each (bench/make_agents.py)."""
    result = subprocess.run([sys.executable, str(BENCH / "make_agents.py"), db, str(count)], cwd=tmp,
                            capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        raise BenchError(f"making agents failed: {(result.stderr or result.stdout)[-500:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def make_task_agent(db: str, tmp: Path) -> dict[str, str]:
    """oj/bench (same owner as oj/muse) with a client key, and a personal token for oj (bench/make_agents.py)."""
    result = subprocess.run([sys.executable, str(BENCH / "make_agents.py"), db, "tasks"], cwd=tmp,
                            capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        raise BenchError(f"making the task agent failed: {(result.stderr or result.stdout)[-500:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


# -- /proc --------------------------------------------------------------------


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise BenchError(f"no VmRSS for pid {pid}")


def cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def socket_count(pid: int) -> int:
    count = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            count += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
        except OSError:
            pass
    return count


def wait_until_settled(pid: int, sockets: int, at_least: float, at_most: float) -> dict:
    """Wait until the server holds ``sockets`` sockets and its CPU time stops moving (0.5 s)."""
    start = time.monotonic()
    last_ticks, still_since = cpu_ticks(pid), time.monotonic()
    while time.monotonic() - start < at_most:
        time.sleep(0.25)
        ticks, now = cpu_ticks(pid), time.monotonic()
        if ticks - last_ticks > 1:
            last_ticks, still_since = ticks, now
        held = socket_count(pid)
        if held >= sockets and now - still_since >= 0.5 and now - start >= at_least:
            return {"sockets": held, "seconds": now - start, "settled": True}
    return {"sockets": socket_count(pid), "seconds": time.monotonic() - start, "settled": False}


# -- throughput ---------------------------------------------------------------


def run_wrk(url: str, tool: str, keyfile: Path, threads: int, conns: int, seconds: float) -> dict:
    cmd = ["wrk", f"-t{threads}", f"-c{conns}", f"-d{max(1, round(seconds))}s", "--timeout", "10s", "-s", str(LUA),
           url, "--", tool, str(keyfile), str(threads)]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 30)
    lines = [ln for ln in result.stdout.splitlines() if ln.startswith("BENCH_JSON ")]
    if result.returncode != 0 or not lines:
        raise BenchError(f"wrk failed ({result.returncode}): {(result.stderr or result.stdout)[-500:]}")
    out = json.loads(lines[-1][len("BENCH_JSON "):])
    seconds_run = out["duration_us"] / 1e6
    return {"rps": out["ok"] / seconds_run, "ok": out["ok"],
            "errors": out["bad_status"] + out["tool_errors"] + out["socket_errors"] + out["timeouts"],
            "detail": out}


def run_python_load(url: str, tool: str, keys: list[str], conns: int, seconds: float) -> dict:
    """The fallback load generator: ``conns`` keep-alive connections over up to 4 processes (4+ for 16)."""
    nprocs = 1 if conns == 1 else 4
    share = [[keys[i % len(keys)] for i in range(conns) if i % nprocs == p] for p in range(nprocs)]
    queue = MPX.Queue()
    workers = [MPX.Process(target=mcp_clients.load_worker, args=(url, tool, ks, seconds, queue), daemon=True)
               for ks in share]
    try:
        for w in workers:
            w.start()
        counts = [queue.get(timeout=seconds + 60) for _ in workers]
    except queue_module.Empty:
        raise BenchError("a Python load worker did not report") from None
    finally:
        for w in workers:
            stop(w)
    ok, bad = sum(c["ok"] for c in counts), sum(c["bad"] for c in counts)
    return {"rps": ok / seconds, "ok": ok, "errors": bad, "detail": {"processes": nprocs, "connections": conns}}


def load(cfg: Settings, url: str, tool: str, keys: list[str], keyfile: Path, threads: int, seconds: float) -> dict:
    if cfg.load == "wrk":
        keyfile.write_text("\n".join(keys) + "\n")
        return run_wrk(url, tool, keyfile, threads, len(keys), seconds)
    return run_python_load(url, tool, keys, len(keys), seconds)


def measure_throughput(cfg: Settings, prickle: Served, echo: Served, keys: list[str], tmp: Path) -> dict:
    """calls/s for echo and post_message at 1 agent (-t1 -c1) and 16 agents (-t2 -c16).

    After a warm-up of each, ``cfg.rounds`` rounds run echo then post_message back to back, so
    both see the same machine; a server's calls/s is the median of its rounds, and Prickle's
    share of echo is the median of the rounds' own shares (a busy moment moves a pair, not
    the whole result).
    """
    results = {}
    for agents, threads in ((1, 1), (AGENTS, 2)):
        keyfile = tmp / f"keys-{agents}.txt"
        pair = ((echo, "echo"), (prickle, "post_message"))
        for server, tool in pair:
            load(cfg, server.mcp, tool, keys[:agents], keyfile, threads, cfg.warmup)
        rounds: dict[str, list[dict]] = {"echo": [], "prickle": []}
        for n in range(cfg.rounds):
            for server, tool in pair:
                r = load(cfg, server.mcp, tool, keys[:agents], keyfile, threads, cfg.measure)
                rounds[server.name].append(r)
                log(f"  round {n + 1}: {server.name:8} {agents:2} agent(s): {r['rps']:8.1f} calls/s, "
                    f"{r['errors']} errors")
        shares = [p["rps"] / e["rps"] if e["rps"] else 0.0 for p, e in zip(rounds["prickle"], rounds["echo"])]
        for name, runs in rounds.items():
            by_rps = sorted(runs, key=lambda r: r["rps"])
            middle = by_rps[len(by_rps) // 2]
            results[(name, agents)] = {
                "rps": statistics.median(r["rps"] for r in runs), "ok": sum(r["ok"] for r in runs),
                "errors": sum(r["errors"] for r in runs), "detail": middle["detail"],
                "rounds": [r["rps"] for r in runs]}
        results[("prickle", agents)]["share"] = statistics.median(shares)
        results[("prickle", agents)]["shares"] = shares
    return results


# -- wake latency -------------------------------------------------------------


def receive(conn: Any, timeout: float, what: str) -> Any:
    if not conn.poll(timeout):
        raise BenchError(f"no {what} within {timeout:.0f} s")
    return conn.recv()


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(p / 100 * len(ordered) + 0.5) - 1))]


def measure_wake_latency(cfg: Settings, prickle: Served, waiter_key: str, poster_key: str,
                         procs: Processes) -> dict:
    """post_message done (poster) -> wait_for_mention done (waiter), in ms, over cfg.wake_samples posts."""
    return _measure_wakes(cfg.wake_samples, prickle, procs, waiter_key, mcp_clients.wake_poster, (poster_key,),
                          lambda i: f"@oj/muse ping {i}", lambda body: body, "post_message")


def measure_handoff_wake(cfg: Settings, prickle: Served, requester_key: str, assignee: str, assignee_key: str,
                         procs: Processes) -> dict:
    """handoff done (requester) -> wait_for_mention done (assignee), in ms, over cfg.handoff_samples handoffs."""
    return _measure_wakes(cfg.handoff_samples, prickle, procs, assignee_key, mcp_clients.handoff_poster,
                          (requester_key, assignee), lambda i: f"Bench task {i}", lambda title: f"task: {title}",
                          "handoff")


def _measure_wakes(samples: int, prickle: Served, procs: Processes, waiter_key: str, poster: Any,
                   poster_args: tuple, item: Any, label: Any, what: str) -> dict:
    """One waiter holds wait_for_mention; one poster makes each wake; latency = waiter done - poster done."""
    warm = 5
    total = samples + warm
    waiter_end, waiter_child = MPX.Pipe()
    poster_end, poster_child = MPX.Pipe()
    waiter_proc = procs.add(MPX.Process(target=mcp_clients.wake_waiter, daemon=True,
                                        args=(prickle.mcp, waiter_key, total, waiter_child)))
    poster_proc = procs.add(MPX.Process(target=poster, daemon=True,
                                        args=(prickle.mcp, *poster_args, poster_child)))
    waiter_proc.start()
    poster_proc.start()
    latencies, mismatched = [], 0
    for i in range(total):
        receive(waiter_end, 30, f"'ready' from the {what} waiter")
        time.sleep(0.05)  # the waiter's call is in the server's hands by now
        sent = item(i)
        poster_end.send(sent)
        done, error = receive(poster_end, 30, f"answer from the {what} poster")
        if error:
            raise BenchError(f"{what} failed: {error}")
        kind, _, woke, status, labels = receive(waiter_end, 60, f"wake from the {what} waiter")
        if kind != "done":
            raise BenchError(f"wait_for_mention failed: {status}")
        if status != "events" or labels != [label(sent)]:
            mismatched += 1
        elif i >= warm:
            latencies.append((woke - done) * 1000)
    poster_end.send(None)
    for p in (waiter_proc, poster_proc):
        p.join(10)
    if not latencies:
        raise BenchError(f"no {what}-to-wake sample")
    return {"p50": percentile(latencies, 50), "p99": percentile(latencies, 99), "max": max(latencies),
            "min": min(latencies), "samples": len(latencies), "mismatched": mismatched}



def measure_task_lives(cfg: Settings, prickle: Served, keys: dict[str, str], assignee: str,
                       procs: Processes) -> dict:
    """Task lives (handoff to completed) from LIFE_PROCESSES x LIFE_CONCURRENT connections over one window."""
    ends, workers = [], []
    for n in range(LIFE_PROCESSES):
        end, child = MPX.Pipe()
        ends.append(end)
        workers.append(procs.add(MPX.Process(target=mcp_clients.task_life_worker, daemon=True,
                                             args=(prickle.mcp, keys, assignee, LIFE_CONCURRENT, cfg.warmup,
                                                   cfg.measure, str(n), child))))
    for w in workers:
        w.start()
    for end in ends:
        receive(end, 60, "'ready' from a task-life worker")
    start = time.monotonic() + 0.2
    for end in ends:
        end.send(start)
    pid, tck = prickle.proc.pid, os.sysconf("SC_CLK_TCK")
    time.sleep(max(0.0, start + cfg.warmup - time.monotonic()))
    ticks = cpu_ticks(pid)
    time.sleep(max(0.0, start + cfg.warmup + cfg.measure - time.monotonic()))
    server_cpu = (cpu_ticks(pid) - ticks) / tck / cfg.measure
    reports = [receive(end, 120, "report from a task-life worker")[1] for end in ends]
    for w in workers:
        w.join(10)
    steps = {s: [v for r in reports for v in r["steps"][s]] for s in mcp_clients.LIFE_STEPS}
    lives, calls = sum(r["lives"] for r in reports), sum(r["calls"] for r in reports)
    return {"lives": lives, "calls": calls, "lives_per_s": lives / cfg.measure, "calls_per_s": calls / cfg.measure,
            "failures": sum(r["failures"] for r in reports), "started": sum(r["started"] for r in reports),
            "errors": [e for r in reports for e in r["errors"]][:3],
            "client_cpu": sum(r["client_cpu_s"] for r in reports) / (cfg.warmup + cfg.measure),
            "server_cpu": server_cpu,
            "steps": {s: (percentile(v, 50), percentile(v, 99), len(v)) for s, v in steps.items() if v}}


# -- a 4 MiB attachment --------------------------------------------------------

#: The reference's largest attachment.
ATTACHMENT_BYTES = 4 * 1024 * 1024


def measure_attachment(cfg: Settings, prickle: Served, person_token: str) -> dict:
    """Upload a 4 MiB file to the person's private room, post it with a message, read it back; medians in ms."""
    base = prickle.mcp.removesuffix("/mcp")
    posting, reading = [], []
    with httpx.Client(base_url=base, timeout=60, headers={"Authorization": f"Bearer {person_token}"}) as http:
        rooms = [p["slug"] for p in http.get("/api/projects").json()["projects"] if p["kind"] == "private"]
        if not rooms:
            raise BenchError("the demo's person has no private room to attach a file in")
        for n in range(cfg.attachment_samples):
            head = f"sample,{n}\n".encode()
            data = head + b"x" * (ATTACHMENT_BYTES - len(head) - 1) + b"\n"
            started = time.monotonic()
            r = http.post(f"/api/projects/{rooms[0]}/attachments", params={"name": "bench.csv"}, content=data)
            if r.status_code != 200:
                raise BenchError(f"the upload was refused: {r.status_code} {r.text[:200]}")
            attachment = r.json()["attachment"]["id"]
            r = http.post(f"/api/projects/{rooms[0]}/messages", json={"body": f"bench {n}", "attachments": [attachment]})
            if r.status_code != 200:
                raise BenchError(f"the message was refused: {r.status_code} {r.text[:200]}")
            posted = time.monotonic()
            r = http.get(f"/api/attachments/{attachment}")
            if r.status_code != 200 or r.content != data:
                raise BenchError(f"the attachment did not come back whole: {r.status_code}")
            posting.append((posted - started) * 1000)
            reading.append((time.monotonic() - posted) * 1000)
    return {"samples": len(posting), "post_ms": statistics.median(posting), "read_ms": statistics.median(reading)}


# -- 1,000 waiters ------------------------------------------------------------


def measure_schedules(cfg: Settings) -> tuple[list[str], list[str]]:
    """Run bench/schedules.py; its table rows and its detail lines."""
    quick = ["--quick"] if cfg.purge_messages < 100_000 else []
    out = subprocess.run([sys.executable, str(BENCH / "schedules.py"), *quick], capture_output=True, text=True,
                         timeout=max(120, cfg.budget))
    if out.returncode != 0:
        raise BenchError(f"bench/schedules.py failed: {(out.stderr or out.stdout).strip()[-300:]}")
    lines = out.stdout.strip().splitlines()
    return [ln for ln in lines if ln.startswith("|")], [ln for ln in lines if ln.startswith("- ")]


def run_script(name: str, cfg: Settings, tmp: Path, broken: str) -> dict:
    """Run bench/NAME.py on a folder of its own over cfg.purge_messages messages; its JSON. Raises
    BenchError when it fails, or with ``broken`` when its answer says ``ok`` is false."""
    folder = tmp / name
    folder.mkdir()
    out = subprocess.run([sys.executable, str(BENCH / f"{name}.py"), "--dir", str(folder), "--messages",
                          str(cfg.purge_messages)], capture_output=True, text=True, timeout=max(60, cfg.budget))
    if out.returncode != 0:
        raise BenchError(f"bench/{name}.py failed: {out.stderr.strip()[-300:]}")
    result = json.loads(out.stdout)
    if not result["ok"]:
        raise BenchError(f"{broken}: {result}")
    return result


def measure_purge(cfg: Settings, tmp: Path) -> dict:
    """bench/purge.py's JSON (steps, purge_s, longest_step_ms, ...)."""
    return run_script("purge", cfg, tmp, "the purge left the project's content behind")


def measure_export(cfg: Settings, tmp: Path) -> dict:
    """bench/export.py's JSON (export_s, check_s, zip_mb, rss_*_mb, ...)."""
    return run_script("export", cfg, tmp, "the export did not hold every message or did not check out")


def waits_held(base: str) -> int:
    """How many waits the server holds now (``/healthz``'s ``waits``)."""
    try:
        return httpx.get(f"{base}/healthz", timeout=10).json().get("waits", 0)
    except (httpx.HTTPError, ValueError):
        return 0


def measure_waiters(cfg: Settings, prickle: Served, agents: dict[str, str], poster_key: str,
                    procs: Processes) -> dict:
    """Server RSS with cfg.waiters wait_for_mention calls held at once (once all are in, and past the SSE
    switch, 15 s later); then one post that mentions every waiting agent: how soon it is answered and
    how soon each waiter returns. The waiters come from WAIT_PROCESSES processes, so the client keeps up."""
    pid = prickle.proc.pid
    before = rss_mb(pid)
    base = prickle.mcp.rsplit("/mcp", 1)[0]
    wake_body = " ".join(f"@{a}" for a in agents) + " wake up"
    share = [cfg.waiters // WAIT_PROCESSES + (i < cfg.waiters % WAIT_PROCESSES) for i in range(WAIT_PROCESSES)]
    ends = []
    started = time.monotonic()
    for count in (c for c in share if c):
        end, child = MPX.Pipe()
        procs.add(MPX.Process(target=mcp_clients.hold_waiters, daemon=True,
                              args=(prickle.mcp, list(agents.values()), count, child))).start()
        ends.append(end)
    for end in ends:
        receive(end, 120, "'launched' from a waiters' process")
    while waits_held(base) < cfg.waiters and time.monotonic() - started < 120:
        time.sleep(0.5)
    held = waits_held(base)
    settled = wait_until_settled(pid, cfg.waiters + 1, at_least=1.0, at_most=30.0)
    settled["seconds"] = time.monotonic() - started
    rss_5s = rss_mb(pid)
    log(f"  {held:,} waits held after {settled['seconds']:.1f} s; RSS {rss_5s:.1f} MB")
    time.sleep(16.5)  # each call commits to SSE after 15 s of silence
    rss_sse = rss_mb(pid)
    sockets_late = socket_count(pid)
    # A wait that timed out is asked again; post once every waiter holds one.
    until = time.monotonic() + 60
    while waits_held(base) < cfg.waiters and time.monotonic() < until:
        time.sleep(0.2)
    held_at_post = waits_held(base)
    ticks = cpu_ticks(pid)
    with httpx.Client(timeout=30) as poster:
        sent = time.monotonic()
        response = poster.post(prickle.mcp, content=mcp_clients.call_body("post_message", {
            "project": mcp_clients.PROJECT, "body": wake_body}), headers=mcp_clients.call_headers("post_message",
                                                                                                poster_key))
        posted = time.monotonic()
    mcp_clients.tool_output(response)
    for end in ends:
        end.send("collect")
    reports = [receive(end, 90, "report from a waiters' process")[1] for end in ends]
    wake_cpu_ms = (cpu_ticks(pid) - ticks) * 1000 / os.sysconf("SC_CLK_TCK")
    times = sorted(t for r in reports for t in r.get("times", []))
    return {"in_flight": sum(r["in_flight"] for r in reports), "held": held, "held_at_post": held_at_post,
            "early": [e for r in reports for e in r["early"]][:5], "early_count": sum(r["early_count"] for r in reports),
            "woken": len(times), "finished": sum(r.get("finished", 0) for r in reports),
            "other": sorted({o for r in reports for o in r.get("other", [])})[:5],
            "client_cpu_ms": sum(r.get("client_cpu_ms", 0.0) for r in reports), "post_ms": (posted - sent) * 1000,
            "p50_ms": (times[len(times) // 2] - posted) * 1000 if times else None,
            "last_ms": (times[-1] - posted) * 1000 if times else None,
            "before": before, "rss_5s": rss_5s, "rss_sse": rss_sse, "settled": settled,
            "sockets_late": sockets_late, "server_cpu_ms": wake_cpu_ms}


# -- report -------------------------------------------------------------------


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def versions() -> str:
    names = ("prickle", "mcp", "starlette", "uvicorn", "httpx", "apsw")
    found = []
    for name in names:
        try:
            found.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            found.append(f"{name} ?")
    return ", ".join(found)


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "?"


def git_commit() -> str:
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=10)
        return out.stdout.strip() or "?"
    except (OSError, subprocess.TimeoutExpired):
        return "?"


def load_generator(cfg: Settings) -> str:
    if cfg.load == "wrk":
        out = subprocess.run(["wrk", "-v"], capture_output=True, text=True, timeout=10)
        return (out.stdout or out.stderr).splitlines()[0].split(" Copyright")[0]
    why = "wrk was not found" if not shutil.which("wrk") else "chosen with --load python"
    return f"Python processes (httpx, keep-alive; 4 processes for 16 connections; {why}): it may be the bottleneck"


def yes_no(ok: bool) -> str:
    return "yes" if ok else "**no**"


def table(cfg: Settings, tput: dict, wake: dict, waiters: dict, echo_rss: float, prickle_idle: float,
          handoff: dict, lives: dict, attachment: dict, purge: dict, export: dict) -> list[str]:
    rows = ["| measure | Prickle | echo baseline | target | ok |", "| --- | ---: | ---: | --- | --- |"]
    for agents in (1, AGENTS):
        p, e = tput[("prickle", agents)], tput[("echo", agents)]
        ratio = p["share"]
        how = (f"wrk -t{1 if agents == 1 else 2} -c{agents}" if cfg.load == "wrk"
               else f"{agents} connection{'s' if agents > 1 else ''}")
        label = f"`post_message` calls/s, {agents} agent{'s' if agents > 1 else ''} ({how})"
        rows.append(f"| {label} | {p['rps']:.0f} ({ratio:.1%} of echo) | {e['rps']:.0f} | >= 70% of echo "
                    f"| {yes_no(ratio >= 0.70 and p['errors'] == 0)} |")
    rows.append(f"| wake latency p50 ({wake['samples']} wakes) | {wake['p50']:.2f} ms | n/a | - | - |")
    rows.append(f"| wake latency p99 | {wake['p99']:.2f} ms | n/a | < 5 ms | {yes_no(wake['p99'] < 5)} |")
    rows.append(f"| server RSS, idle after start | {prickle_idle:.1f} MB | {echo_rss:.1f} MB | - | - |")
    rows.append(f"| server RSS before the waiters | {waiters['before']:.1f} MB | n/a | - | - |")
    peak = max(waiters["rss_5s"], waiters["rss_sse"])
    n = cfg.waiters
    rows.append(f"| server RSS, {n:,} agents waiting (all in / SSE 16 s later) | {waiters['rss_5s']:.1f} / "
                f"{waiters['rss_sse']:.1f} MB | n/a | < 600 MB | {yes_no(peak < 600 and waiters['held'] >= n)} |")
    if waiters.get("last_ms") is not None:
        rows.append(f"| the post that wakes {n:,} waiters, answered in | {waiters['post_ms']:.0f} ms | n/a | - | - |")
        rows.append(f"| {n:,} waiters woken by it: p50 / last return | {waiters['p50_ms']:.0f} / "
                    f"{waiters['last_ms']:.0f} ms | n/a | all woken | {yes_no(waiters['woken'] == n)} |")
    rows.append(f"| handoff-to-wake latency p50 ({handoff['samples']} handoffs) | {handoff['p50']:.2f} ms | n/a "
                "| - | - |")
    rows.append(f"| handoff-to-wake latency p99 | {handoff['p99']:.2f} ms | n/a | - | - |")
    echo = tput[("echo", AGENTS)]["rps"]
    ratio = lives["calls_per_s"] / echo if echo else 0.0
    conns = LIFE_PROCESSES * LIFE_CONCURRENT
    rows.append(f"| full task lives/s (handoff to completed; {conns} lives at a time, Python clients) "
                f"| {lives['lives_per_s']:.1f} | n/a | - | - |")
    rows.append(f"| task-life calls/s (5 MCP + 1 HTTP per life; vs echo at {AGENTS} connections) "
                f"| {lives['calls_per_s']:.0f} ({ratio:.0%} of echo) | {echo:.0f} | no failures "
                f"| {yes_no(lives['failures'] == 0 and lives['lives'] > 0)} |")
    rows.append(f"| a message with a 4 MiB attachment: upload and post, median ({attachment['samples']} samples) "
                f"| {attachment['post_ms']:.0f} ms | n/a | - | - |")
    rows.append(f"| that attachment read back (GET /api/attachments/ID), median | {attachment['read_ms']:.0f} ms "
                "| n/a | - | - |")
    rows.append(f"| purge of a deleted project of {purge['messages']:,} messages: total ({purge['steps']} steps of "
                f"<= {purge['batch']} rows) / longest step | {purge['purge_s']:.1f} s / {purge['longest_step_ms']:.0f} ms "
                "| n/a | - | - |")
    rows.append(f"| export of a project of {export['messages']:,} messages (everything, a {export['zip_mb']:.1f} MB zip): "
                f"written / checked with no database; memory it added | {export['export_s']:.1f} s / "
                f"{export['check_s']:.1f} s; {export['rss_peak_mb'] - export['rss_before_mb']:+.0f} MB | n/a | - | - |")
    return rows


def details(tput: dict, wake: dict, waiters: dict, server_errors: list[str], handoff: dict,
            lives: dict) -> list[str]:
    lines = ["", "Details:", ""]
    for (name, agents), r in sorted(tput.items()):
        d = r["detail"]
        extra = (f"; in a middle round: latency p50 {d['latency_p50_us'] / 1000:.1f} ms, p99 "
                 f"{d['latency_p99_us'] / 1000:.1f} ms, non-200 {d['bad_status']}, tool errors {d['tool_errors']}, "
                 f"socket errors {d['socket_errors']}, timeouts {d['timeouts']}") if "latency_p50_us" in d else ""
        rounds = ", ".join(f"{x:.0f}" for x in r["rounds"])
        shares = (f"; share of echo by round {', '.join(f'{x:.1%}' for x in r['shares'])}"
                  if "shares" in r else "")
        lines.append(f"- {name}, {agents} agent(s): {r['ok']} calls ok, {r['errors']} failed; calls/s by round "
                     f"{rounds}{shares}{extra}")
    lines.append(f"- wake latency: min {wake['min']:.2f} ms, max {wake['max']:.2f} ms; {wake['mismatched']} "
                 "wakes did not carry exactly the post just made")
    s = waiters["settled"]
    early = f" ({'; '.join(waiters['early'])})" if waiters["early"] else ""
    lines.append(f"- waiters: {waiters['in_flight']:,} calls open when measured ({waiters['held']:,} waits held by "
                 f"the server; {waiters['held_at_post']:,} when the wake was posted), {waiters['early_count']} had "
                 f"returned early{early}; the server held {s['sockets']} sockets after {s['seconds']:.1f} s"
                 f"{'' if s['settled'] else ' (never settled)'} and {waiters['sockets_late']} 16 s later")
    if "woken" in waiters:
        other = f" (other answers: {'; '.join(waiters['other'])})" if waiters["other"] else ""
        lines.append(f"- the wake post: {waiters['woken']:,} waiters returned with events, {waiters['finished']:,} "
                     f"returned within 30 s{other}; the server spent {waiters['server_cpu_ms']:.0f} ms of CPU on "
                     f"it and the waiters' own client {waiters['client_cpu_ms']:.0f} ms, which the return times "
                     "include")
    lines.append(f"- handoff-to-wake latency: min {handoff['min']:.2f} ms, max {handoff['max']:.2f} ms; "
                 f"{handoff['mismatched']} wakes did not carry exactly the task just handed over")
    errors = f" ({'; '.join(lives['errors'])})" if lives["errors"] else ""
    per_life = lives["server_cpu"] * 1000 / lives["lives_per_s"] if lives["lives_per_s"] else 0.0
    lines.append(f"- task lives: {lives['lives']} completed and {lives['calls']} calls answered in the measured "
                 f"window, {lives['started']} lives started in all (warm-up included), {lives['failures']} failed"
                 f"{errors}; the server used {lives['server_cpu']:.0%} of a CPU ({per_life:.1f} ms of CPU a life), the "
                 f"{LIFE_PROCESSES} client processes {lives['client_cpu']:.0%} of one ({os.cpu_count()} CPUs)")
    steps = ", ".join(f"{s} {p50:.1f} / {p99:.1f}" for s, (p50, p99, _) in lives["steps"].items())
    lines.append(f"- task-life call latency p50 / p99 in ms, under load: {steps}")
    tail = f", the last: {' | '.join(server_errors[-3:])[:600]}" if server_errors else ""
    lines.append(f"- server stderr: {len(server_errors)} line(s){tail}")
    return lines


def hints(tput: dict, wake: dict) -> list[str]:
    """Likely causes of patterns in the numbers; nothing when no pattern shows."""
    p1 = tput[("prickle", 1)]["detail"].get("latency_p50_us", 0) / 1000
    e1 = tput[("echo", 1)]["detail"].get("latency_p50_us", 0) / 1000
    stalled = 35 <= p1 <= 50 and e1 < 10
    if not (stalled or 35 <= wake["p50"] <= 50):
        return []
    return ["", "Hint: answers about 40 ms late (`post_message` p50 on one connection "
            f"{p1:.1f} ms vs echo {e1:.1f} ms; wake p50 {wake['p50']:.1f} ms) are the delayed-ACK timer: the "
            "response leaves in two writes (headers, then body), and without TCP_NODELAY Nagle holds the second "
            "until the client ACKs the first, which it delays ~40 ms. asyncio sets TCP_NODELAY only on sockets "
            "whose proto is IPPROTO_TCP; one made with socket.socket(family, SOCK_STREAM) has proto 0, and so "
            "do the connections it accepts. The echo server lets uvicorn bind (proto 6)."]


def header(cfg: Settings) -> list[str]:
    now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return [
        "## Prickle benchmark",
        "",
        f"- date: {now}; commit {git_commit()}",
        f"- machine: {os.cpu_count()} CPUs ({cpu_model()}), {platform.system()} {platform.release()}; "
        f"load average at the start {Path('/proc/loadavg').read_text().split()[0]} (other work on the machine "
        "shows up as noise)",
        f"- Python {platform.python_version()}; {versions()}",
        f"- load generator: {load_generator(cfg)}; {cfg.warmup:g} s warm-up, then {cfg.rounds} rounds of "
        f"{cfg.measure:g} s per server",
        "",
    ]


# -- main ---------------------------------------------------------------------


def raise_nofile_limit(wanted: int = 2 * WAITERS + 1000) -> None:
    """Room for a socket per waiter on each side; the servers and client processes inherit it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


def install_signals(budget: int) -> None:
    def on_alarm(signum: int, frame: Any) -> None:
        raise Watchdog(f"the benchmark went over its {budget} s budget")

    def on_term(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGALRM, on_alarm)
    signal.signal(signal.SIGTERM, on_term)
    signal.alarm(budget)


def parse_args(argv: list[str] | None) -> Settings:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 s warm-ups, 2 rounds of 2 s runs, 60 wake, 40 handoff and 5 attachment samples")
    parser.add_argument("--load", choices=("wrk", "python"), default=None,
                        help="load generator (default: wrk if installed, else Python processes)")
    parser.add_argument("--waiters", type=int, default=WAITERS, help="waiters held at once (default 10,000; at most 20,000; 2,000 with --quick)")
    parser.add_argument("--prickle", default="", metavar="CMD",
                        help="command that runs prickle, e.g. to compare a patched build (default: the venv's)")
    parser.add_argument("--budget", type=int, default=600, help="watchdog: give up after this many seconds")
    args = parser.parse_args(argv)
    cfg = Settings(waiters=max(1, min(args.waiters, 20_000)), budget=args.budget, prickle=args.prickle)
    if args.quick:
        cfg.warmup, cfg.measure, cfg.rounds, cfg.wake_samples, cfg.handoff_samples = 1.0, 2.0, 2, 60, 40
        cfg.attachment_samples = 5
        cfg.purge_messages = 10_000
        cfg.waiters = min(cfg.waiters, 2000) if args.waiters == WAITERS else cfg.waiters
    cfg.load = args.load or ("wrk" if shutil.which("wrk") else "python")
    if cfg.load == "wrk" and not shutil.which("wrk"):
        parser.error("wrk is not installed (apt-get install wrk), use --load python")
    return cfg


def run(cfg: Settings, tmp: Path, procs: Processes, started: float) -> list[str]:
    log(f"starting prickle and the echo server in {tmp} ...")
    prickle = start_prickle(cfg, tmp, procs)
    echo = start_echo(tmp, procs)
    demo_keys = prickle.info["demo"]["keys"]
    agents = make_agents(prickle.info["db"], AGENTS, tmp)
    prickle_idle, echo_rss = rss_mb(prickle.proc.pid), rss_mb(echo.proc.pid)
    log(f"throughput ({cfg.load}) ...")
    tput = measure_throughput(cfg, prickle, echo, list(agents.values()), tmp)
    stop(echo.proc)
    log("wake latency ...")
    wake = measure_wake_latency(cfg, prickle, demo_keys["oj/muse"], demo_keys["ren/builder"], procs)
    log(f"  p50 {wake['p50']:.2f} ms, p99 {wake['p99']:.2f} ms")
    log(f"{cfg.waiters:,} waiters ...")
    waiters = measure_waiters(cfg, prickle, agents, demo_keys["ren/builder"], procs)
    # After the other measurements, so the tasks they leave in the database change none of them.
    task_agent = make_task_agent(prickle.info["db"], tmp)
    log("handoff-to-wake latency ...")
    handoff = measure_handoff_wake(cfg, prickle, demo_keys["oj/muse"], task_agent["agent"], task_agent["key"], procs)
    log(f"  p50 {handoff['p50']:.2f} ms, p99 {handoff['p99']:.2f} ms")
    log(f"task lives ({LIFE_PROCESSES} processes x {LIFE_CONCURRENT}) ...")
    lives = measure_task_lives(cfg, prickle, {"requester": demo_keys["oj/muse"], "assignee": task_agent["key"],
                                              "person": task_agent["person_token"]}, task_agent["agent"], procs)
    log(f"  {lives['lives_per_s']:.1f} lives/s, {lives['calls_per_s']:.0f} calls/s, {lives['failures']} failures")
    log("a 4 MiB attachment ...")
    attachment = measure_attachment(cfg, prickle, task_agent["person_token"])
    log(f"  upload and post {attachment['post_ms']:.0f} ms, read {attachment['read_ms']:.0f} ms")
    if prickle.proc.poll() is not None:
        raise BenchError(f"prickle serve exited ({prickle.proc.returncode}) during the run")
    server_errors = [ln for ln in prickle.stderr.read_text().splitlines() if ln.strip()]
    stop(prickle.proc)  # the purge runs alone on the machine
    log(f"a purge of {cfg.purge_messages:,} messages ...")
    purge = measure_purge(cfg, tmp)
    log(f"  {purge['purge_s']:.1f} s in {purge['steps']} steps, longest {purge['longest_step_ms']:.0f} ms")
    log(f"an export of {cfg.purge_messages:,} messages ...")
    export = measure_export(cfg, tmp)
    log(f"  written in {export['export_s']:.1f} s, checked in {export['check_s']:.1f} s")
    log("1,000 schedules ...")
    schedule_rows, schedule_details = measure_schedules(cfg)
    took = [f"- the measurements took {time.monotonic() - started:.0f} s"]
    return (header(cfg) + table(cfg, tput, wake, waiters, echo_rss, prickle_idle, handoff, lives, attachment, purge,
                                 export) + schedule_rows
            + details(tput, wake, waiters, server_errors, handoff, lives) + schedule_details + took + hints(tput, wake))


def main(argv: list[str] | None = None) -> int:
    cfg = parse_args(argv)
    raise_nofile_limit(2 * cfg.waiters + 1000)
    started = time.monotonic()
    procs = Processes()
    tmp = Path(tempfile.mkdtemp(prefix="prickle-bench-"))
    try:
        install_signals(cfg.budget)
        lines = run(cfg, tmp, procs, started)
    except (BenchError, OSError, subprocess.SubprocessError, json.JSONDecodeError, KeyError) as e:
        log(f"benchmark failed: {type(e).__name__}: {e}")
        return 1
    finally:
        signal.alarm(0)
        procs.stop_all()
        shutil.rmtree(tmp, ignore_errors=True)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
