"""Prickle beside Litestream: a real ``prickle serve`` replicated to an S3 stand-in (moto), then
``prickle restore --from-replica`` to the latest state and to a time between two batches of posts."""

import datetime as dt
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import apsw
import httpx
import pytest
from starlette.testclient import TestClient

import prickle
from conftest import PROJECT, Served, audit_entries
from helpers import _free_port, _post, jrun

ROOT = Path(__file__).resolve().parent.parent
ARCH = {"x86_64": "x64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
#: Where .ci/run installs the npm package's binary.
NPM_BINARY = ROOT / ".cache" / "litestream" / "node_modules" / "@flydotio" / f"litestream-linux-{ARCH}" / "litestream"
KEYS = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test"}


def litestream_binary() -> str | None:
    return str(NPM_BINARY) if NPM_BINARY.exists() else shutil.which("litestream")


def wait_until(check, what, seconds=60.0):
    """Poll ``check()`` until it is true; fail naming ``what`` after ``seconds``."""
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


@pytest.fixture
def s3():
    """A moto S3 server on a free port with the bucket ``backups``; its port."""
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def listening():
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", port)) == 0

    try:
        wait_until(listening, "the S3 stand-in to listen")
        httpx.put(f"http://127.0.0.1:{port}/backups").raise_for_status()
        yield port
    finally:
        proc.terminate()
        proc.wait(15)


def config_from_the_example(db_path: str, port: int, where: Path) -> str:
    """litestream.example.yml with this test's file, bucket and S3 stand-in filled in."""
    text = (ROOT / "litestream.example.yml").read_text()
    for example, ours in (("/srv/prickle/prickle.db", db_path), ("my-prickle-backups", "backups"),
                          ("# endpoint: https://s3.example.org", f"endpoint: http://127.0.0.1:{port}"),
                          ("# force-path-style: true", "force-path-style: true")):
        assert example in text, example
        text = text.replace(example, ours)
    where.write_text(text)
    return str(where)


def messages(path: str) -> int:
    conn = apsw.Connection(path, flags=apsw.SQLITE_OPEN_READONLY)
    try:
        return conn.execute("SELECT count(*) FROM messages WHERE project = ?", (PROJECT,)).fetchall()[0][0]
    finally:
        conn.close()


def replicated(binary: str, config: str, db_path: str, probe: str, count: int) -> bool:
    """Whether the replica's latest state holds ``count`` messages (a restore to a probe file says)."""
    if os.path.exists(probe):
        os.unlink(probe)
    done = subprocess.run([binary, "restore", "-config", config, "-o", probe, db_path], env=os.environ | KEYS,
                          capture_output=True, text=True, timeout=60)
    return done.returncode == 0 and messages(probe) == count


def test_a_replica_restores_to_the_latest_state_and_to_a_time_between_two_batches(tmp_path, s3, monkeypatch):
    binary = litestream_binary()
    if binary is None:
        pytest.skip("Litestream is not installed: .ci/run installs it from npm (@flydotio/litestream) into "
                    ".cache/litestream, or put litestream on PATH")
    db_path = str(tmp_path / "prickle.db")
    (tmp_path / "prickle.toml").write_text('checkpoints = "litestream"\n')
    config = config_from_the_example(db_path, s3, tmp_path / "litestream.yml")
    served = Served(db_path, "--demo")
    replicating = subprocess.Popen([binary, "replicate", "-config", config], env=os.environ | KEYS,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        key = served.info["demo"]["keys"]["oj/muse"]
        with httpx.Client(timeout=30) as http:
            for n in range(40):
                assert _post(http, served.info["mcp"], key, f"first batch {n}", n)
            wait_until(lambda: replicated(binary, config, db_path, str(tmp_path / "probe.db"), 41),
                       "the first batch to reach the replica")
            # The replica stamps what it holds by the second: the point is a whole second before
            # the second batch's, which starts once the clock has passed it.
            point = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
            wait_until(lambda: dt.datetime.now(dt.timezone.utc) >= point + dt.timedelta(seconds=1.2),
                       "the next second")
            for n in range(40):
                assert _post(http, served.info["mcp"], key, f"second batch {n}", 100 + n)
    finally:
        served.stop()
        replicating.terminate()  # Litestream syncs what is left as it stops
        replicating.wait(30)
    assert messages(db_path) == 81  # the demo's welcome and the two batches
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")

    # The latest state, by the replica's URL, into a new file.
    latest = str(tmp_path / "latest.db")
    url = f"s3://backups.localhost:{s3}/prickle.db"
    out = jrun(latest, "restore", "--from-replica", url, "--litestream", binary)
    newest = max(r[0] for r in apsw.Connection(latest).execute(
        "SELECT max(at) FROM audit UNION ALL SELECT max(at) FROM outbox"))
    assert out == {"db": latest, "source": "replica", "from": url, "point": newest, "replaced": None,
                   "chains": out["chains"], "closures_reapplied": 0}
    assert messages(latest) == 81

    # The time between the batches, by the config file, in place of the server's own file.
    at = prickle.iso(point)
    out = jrun(db_path, "restore", "--litestream-config", config, "--timestamp", at, "--litestream", binary)
    assert out["point"] == at and out["replaced"].startswith(db_path + ".replaced-")
    assert messages(db_path) == 41

    for path, source_point, lost in ((latest, newest, None), (db_path, at, 40)):
        conn = apsw.Connection(path)
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        heads = prickle.chain_heads(conn)
        conn.close()
        assert jrun(path, "audit", "verify")["ok"] is True
        with TestClient(prickle.create_app(path, prickle.Settings(), port=8321), base_url="http://127.0.0.1:8321"):
            pass  # the first start
        db = prickle.Database(path)
        [entry] = audit_entries(db, PROJECT, "chain.restored")
        assert entry["n"] == heads[PROJECT][0] + 1
        assert entry["refs"] == {"source": "replica", "point": source_point, "through": heads[PROJECT][0],
                                 "gap": {"from": source_point, "to": entry["refs"]["gap"]["to"], "entries": lost}}
        # Every chain, and the deployment's own (begun by it here: the demo has no entry of its own there).
        assert db.scalar("SELECT count(*) FROM audit WHERE type = 'chain.restored'") == len(set(heads) | {""})
        assert all(r["ok"] for r in prickle.verify_audit(db))
        db.close()


def test_a_replica_restore_that_finds_nothing_says_so_and_changes_nothing(world, db_path, s3, monkeypatch):
    binary = litestream_binary()
    if binary is None:
        pytest.skip("Litestream is not installed: .ci/run installs it from npm (@flydotio/litestream) into "
                    ".cache/litestream, or put litestream on PATH")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    before = prickle.verify_audit(world.db)
    from helpers import run
    url = f"s3://backups.localhost:{s3}/nothing-here.db"
    code, _, err = run(db_path, "restore", "--from-replica", url, "--litestream", binary, ok=False)
    assert code == 1
    assert err == (f"prickle: litestream could not restore {url}: no matching backups found there: check the "
                   "address; nothing was replaced\n")
    assert prickle.verify_audit(world.db) == before
    assert not list(Path(db_path).parent.glob("prickle.db.replaced-*"))


def test_checkpoints_left_to_litestream_copy_the_log_but_never_restart_it(tmp_path):
    path = str(tmp_path / "x.db")
    writer = apsw.Connection(path)
    writer.pragma("journal_mode", "wal")
    writer.pragma("wal_autocheckpoint", 0)
    writer.execute("CREATE TABLE t (x)")
    for n in range(20):
        writer.execute("INSERT INTO t VALUES (?)", (n,))
    checkpointer = apsw.Connection(path)
    assert prickle.checkpoint_wal(checkpointer, None) == "passive"
    assert prickle.checkpoint_wal(checkpointer, 5) == "restart"
    checkpointer.close()
    writer.close()
    toml = tmp_path / "prickle.toml"
    toml.write_text('checkpoints = "litestream"\n')
    assert prickle.load_settings(str(toml)).checkpoints == "litestream"
    toml.write_text('checkpoints = "sometimes"\n')
    with pytest.raises(prickle.PrickleError, match="checkpoints: String should match pattern"):
        prickle.load_settings(str(toml))
    assert json.loads(json.dumps(prickle.Settings().checkpoints)) == "prickle"
