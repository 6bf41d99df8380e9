"""Prickle's checkpointer beside Litestream: what it does, and what it costs writers.

Starts an S3 stand-in (moto), then for each setting a fresh ``prickle serve --demo`` replicated
by ``litestream replicate`` while four writers post; stops both, restores the replica's latest
state and prints one row per setting: posts/s, post latency, the longest log Prickle's
checkpointer saw, what its checkpoints did (copied the log, restarted it, or were refused),
Litestream's generations and the restored file's messages and integrity check.

    python bench/litestream.py [--posts 4000] [--writers 4]

Needs the litestream binary (on PATH, or where .ci/run installs it) and moto (the test extra).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import apsw
import httpx

ROOT = Path(__file__).resolve().parent.parent
ARCH = {"x86_64": "x64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
NPM_BINARY = ROOT / ".cache" / "litestream" / "node_modules" / "@flydotio" / f"litestream-linux-{ARCH}" / "litestream"
KEYS = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench"}

# The server, with its checkpoints written down as they happen (and, for the forced case, a lower
# restart threshold than the real one, so a restart is tried while Litestream runs).
SERVE = """
import os, sys, apsw, prickle
inner, log, forced = prickle.checkpoint_wal, open(os.environ["CHECKPOINTS"], "a", buffering=1), os.environ.get("FORCE")
def checkpoint(conn, restart_frames=prickle.WAL_RESTART_FRAMES):
    frames = conn.wal_checkpoint(mode=apsw.SQLITE_CHECKPOINT_PASSIVE)[0]
    try:
        done = inner(conn, int(forced) if forced and restart_frames is not None else restart_frames)
    except apsw.BusyError:
        log.write(f"refused {frames}\\n")
        raise
    log.write(f"{done} {frames}\\n")
    return done
prickle.checkpoint_wal = checkpoint
sys.exit(prickle.main(sys.argv[1:]))
"""

CASES = (("prickle", None), ("litestream", None), ("prickle", 2000))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(http: httpx.Client, url: str, key: str, n: int) -> None:
    meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientInfo": {"name": "bench", "version": "1"},
            "io.modelcontextprotocol/clientCapabilities": {}}
    r = http.post(url, headers={"Authorization": f"Bearer {key}", "Accept": "application/json, text/event-stream",
                                "MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/call",
                                "Mcp-Name": "post_message"},
                  json={"jsonrpc": "2.0", "id": n, "method": "tools/call", "params": {
                      "name": "post_message", "arguments": {"project": "website-v2", "body": f"post {n} " + "x" * 200},
                      "_meta": meta}})
    r.raise_for_status()


def one_case(binary: str, port: int, folder: str, checkpoints: str, forced: int | None, posts: int,
             writers: int) -> dict:
    db = os.path.join(folder, "prickle.db")
    Path(folder, "prickle.toml").write_text(f'checkpoints = "{checkpoints}"\n')
    config = Path(folder, "litestream.yml")
    config.write_text(f"dbs:\n  - path: {db}\n    replicas:\n      - type: s3\n        bucket: bench\n"
                      f"        path: {os.path.basename(folder)}\n        endpoint: http://127.0.0.1:{port}\n"
                      "        region: us-east-1\n        force-path-style: true\n        sync-interval: 1s\n")
    log = os.path.join(folder, "checkpoints.log")
    env = os.environ | KEYS | {"CHECKPOINTS": log} | ({"FORCE": str(forced)} if forced else {})
    serve = subprocess.Popen([sys.executable, "-c", SERVE, "serve", "--db", db, "--port", "0", "--demo", "--json"],
                             cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    replicate = subprocess.Popen([binary, "replicate", "-config", str(config)], env=env,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        info = json.loads(serve.stdout.readline())
        key, latencies = info["demo"]["keys"]["oj/muse"], []

        def writer(first: int) -> None:
            with httpx.Client(timeout=30) as http:
                for n in range(first, posts, writers):
                    began = time.perf_counter()
                    post(http, info["mcp"], key, n)
                    latencies.append(time.perf_counter() - began)

        began = time.perf_counter()
        threads = [threading.Thread(target=writer, args=(w,)) for w in range(writers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        took = time.perf_counter() - began
    finally:
        serve.terminate()
        serve.wait(30)
        replicate.terminate()  # it syncs what is left as it stops
        replicate.wait(30)
    generations = subprocess.run([binary, "generations", "-config", str(config), db], env=env, capture_output=True,
                                 text=True).stdout.splitlines()[1:]
    restored = os.path.join(folder, "restored.db")
    subprocess.run([binary, "restore", "-config", str(config), "-o", restored, db], env=env, check=True,
                   capture_output=True)
    conn = apsw.Connection(restored)
    messages = conn.execute("SELECT count(*) FROM messages").fetchall()[0][0]
    integrity = conn.execute("PRAGMA integrity_check").fetchall()[0][0]
    conn.close()
    outcomes = collections.Counter(line.split()[0] for line in open(log))
    longest = max((int(line.split()[1]) for line in open(log)), default=0)
    latencies.sort()
    return {"checkpoints": checkpoints + (f" (restart forced at {forced} frames)" if forced else ""),
            "posts/s": round(posts / took), "p50 ms": round(latencies[len(latencies) // 2] * 1000, 1),
            "p99 ms": round(latencies[int(len(latencies) * 0.99)] * 1000, 1), "longest log (frames)": longest,
            "checkpoints done": ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items())),
            "generations": len([g for g in generations if g.strip()]),
            "restored messages": f"{messages} of {posts + 1}", "integrity": integrity}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--posts", type=int, default=4000)
    parser.add_argument("--writers", type=int, default=4)
    args = parser.parse_args()
    binary = str(NPM_BINARY) if NPM_BINARY.exists() else shutil.which("litestream")
    if binary is None:
        sys.exit("litestream is not installed: put it on PATH (or run .ci/run, which installs it into .cache)")
    port = free_port()
    moto = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(300):
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.05)
        httpx.put(f"http://127.0.0.1:{port}/bench").raise_for_status()
        version = subprocess.run([binary, "version"], capture_output=True, text=True).stdout.strip()
        with tempfile.TemporaryDirectory(prefix="prickle-litestream-") as tmp:
            rows = [one_case(binary, port, os.path.join(tmp, f"case{i}"), checkpoints, forced, args.posts,
                             args.writers) for i, (checkpoints, forced) in enumerate(CASES)
                    if not os.makedirs(os.path.join(tmp, f"case{i}"))]
    finally:
        moto.terminate()
        moto.wait(15)
    print(f"Litestream {version}, {args.posts} posts from {args.writers} writers per case\n")
    print("| " + " | ".join(rows[0]) + " |")
    print("|" + " --- |" * len(rows[0]))
    for row in rows:
        print("| " + " | ".join(str(v) for v in row.values()) + " |")


if __name__ == "__main__":
    main()
