"""One database file, one server, whatever name reaches it; a backup that finishes while the team works.

Real ``prickle serve`` processes and real command-line processes on one file reached by other
names: a hard link, a symlink, a path through '..' under a symlinked folder, a bind mount.
"""

import json
import os
import subprocess
import threading

import httpx
import pytest

import prickle
from conftest import PRICKLE, Served
from helpers import _post


def cli(db_path, *args, timeout=60):
    return subprocess.run(PRICKLE + list(args) + ["--db", db_path], capture_output=True, text=True,
                          timeout=timeout)


def other_names(tmp_path):
    """A database file's real path and three other names for it: hard link, symlink, '..' path."""
    os.makedirs(tmp_path / "real" / "a" / "b")
    os.makedirs(tmp_path / "elsewhere")
    real = str(tmp_path / "real" / "prickle.db")
    assert cli(real, "init", "--owner", "oj").returncode == 0
    os.link(real, tmp_path / "elsewhere" / "hard.db")
    os.symlink(real, tmp_path / "soft.db")
    # deep/../../x resolves through the symlink (real/a/b/../..), not the way a string is shortened.
    os.symlink(tmp_path / "real" / "a" / "b", tmp_path / "deep")
    return real, str(tmp_path / "elsewhere" / "hard.db"), str(tmp_path / "soft.db"), str(tmp_path / "deep/../../prickle.db")


def test_a_second_server_is_refused_through_any_name_and_the_cli_is_sent_to_the_servers_name(tmp_path):
    real, hard, soft, dotdot = other_names(tmp_path)
    assert os.path.samefile(dotdot, real) and not os.path.exists(os.path.abspath(dotdot))
    with Served(real) as served:
        pid = served.proc.pid
        for name in (real, hard, soft, dotdot):
            second = subprocess.run(PRICKLE + ["serve", "--db", name, "--port", "0"], capture_output=True,
                                    text=True, timeout=30)
            assert second.returncode == 1, (name, second.stdout)
            assert second.stderr == (f"prickle: another prickle serve is already using {real} (pid {pid}): stop it "
                                     "first, or pass --db to use another file\n"), name
        # A symlink and a '..' path reach the file by the server's own name: commands work through them.
        for handle, name in (("via-symlink", soft), ("via-dotdot", dotdot)):
            made = cli(name, "person", "add", handle, "--name", "P")
            assert made.returncode == 0, made.stderr
        # A hard link would get a write-ahead log of its own: refused before SQLite opens it.
        refused = cli(hard, "person", "add", "kai", "--name", "Kai")
        assert refused.returncode == 1
        assert refused.stderr == (f"prickle: a prickle serve (pid {pid}) is using {hard} under another name, and "
                                  f"opening it by two names loses writes: pass --db {real}, the name it was "
                                  "started with\n")
        assert not os.path.exists(hard + "-wal") and not os.path.exists(hard + "-shm")
    # No server: every name works again, and the refused person was never added.
    assert cli(hard, "person", "add", "kai", "--name", "Kai").returncode == 0
    db = prickle.Database(soft)
    assert sorted(r["handle"] for r in db.rows("SELECT handle FROM people")) == [
        "kai", "oj", "via-dotdot", "via-symlink"]
    db.close()


def test_a_server_killed_with_sigkill_leaves_no_lock_behind(tmp_path):
    db_path = str(tmp_path / "prickle.db")
    os.makedirs(tmp_path / "elsewhere")
    hard = str(tmp_path / "elsewhere" / "hard.db")
    served = Served(db_path)
    os.link(db_path, hard)
    served.stop(kill=True)
    assert os.path.exists(db_path + ".lock")  # its record stays, held by nobody
    assert cli(hard, "init", "--owner", "oj").returncode == 0
    with Served(hard) as again:
        refused = cli(db_path, "token", "list")
        assert refused.stderr == (f"prickle: a prickle serve (pid {again.proc.pid}) is using {db_path} under another "
                                  f"name, and opening it by two names loses writes: pass --db {hard}, the name it "
                                  "was started with\n")
    # A server stopped with SIGTERM takes its records away.
    assert not os.path.exists(hard + ".lock")
    assert [n for n in os.listdir(prickle.SERVER_RECORDS)
            if n == f"prickle-{os.stat(hard).st_dev}-{os.stat(hard).st_ino}.server"] == []


@pytest.fixture
def bind_mounted(tmp_path):
    """The database file bind-mounted at a second path (needs root and mount; skipped elsewhere)."""
    db_path, view = str(tmp_path / "prickle.db"), str(tmp_path / "view.db")
    for path in (db_path, view):
        open(path, "w").close()
    if os.geteuid() != 0 or subprocess.run(["mount", "--bind", db_path, view], capture_output=True).returncode:
        pytest.skip("bind mounts need root and the mount command")
    try:
        yield db_path, view
    finally:
        subprocess.run(["umount", view], check=True)


def test_a_bind_mount_of_the_file_meets_the_same_lock(bind_mounted):
    db_path, view = bind_mounted
    assert cli(db_path, "init", "--owner", "oj").returncode == 0
    with Served(db_path) as served:
        second = subprocess.run(PRICKLE + ["serve", "--db", view, "--port", "0"], capture_output=True, text=True,
                                timeout=30)
        assert second.returncode == 1 and second.stderr.startswith(
            f"prickle: another prickle serve is already using {db_path} (pid {served.proc.pid})")
        refused = cli(view, "token", "list")
        assert refused.returncode == 1 and f"pass --db {db_path}, the name it was started with" in refused.stderr


def fill(db_path, messages):
    """The demo team and ``messages`` posts of about 8,000 characters (4,000 make about 70 MB)."""
    db = prickle.Database(db_path)
    prickle.seed_demo(db)
    oj = prickle.Actor("person", "", "cli", handle="oj")
    words = [f"w{i:05d}x" for i in range(1000)]
    for start in range(0, messages, 500):
        with db.transaction():
            for i in range(start, min(start + 500, messages)):
                prickle.post_message(db, oj, prickle.DEMO_PROJECT, " ".join(words[(i + k * 7) % 1000] for k in range(990)))
    db.close()


def test_backup_finishes_under_steady_writers_and_holds_every_earlier_post(tmp_path):
    db_path, dest = str(tmp_path / "prickle.db"), str(tmp_path / "copy.db")
    fill(db_path, 8000)
    with Served(db_path, "--demo") as served:
        url, key = served.info["mcp"], served.info["demo"]["keys"]["ren/builder"]
        acked, started, stop = [], threading.Barrier(4), threading.Event()

        def writer(n):
            with httpx.Client(timeout=30) as http:
                for i in range(20):
                    acked.append(_post(http, url, key, f"steady {n}.{i}", i))
                started.wait(60)
                while not stop.is_set():
                    i += 1
                    acked.append(_post(http, url, key, f"steady {n}.{i}", i))

        threads = [threading.Thread(target=writer, args=(n,), daemon=True) for n in range(3)]
        for thread in threads:
            thread.start()
        try:
            started.wait(60)
            before = list(acked)
            # A copy made in small steps started over after every write, and under writers it never finished.
            done = cli(db_path, "backup", dest, "--json", timeout=60)
        finally:
            stop.set()
            for thread in threads:
                thread.join(30)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout) == {"backup": dest}
        assert len(before) >= 60 and None not in acked
    assert sorted(os.listdir(tmp_path)) == ["copy.db", "prickle.db"]
    copy = prickle.Database(dest)
    ids = {r["id"] for r in copy.rows("SELECT id FROM messages")}
    assert set(before) <= ids and len(ids) >= 8001 + len(before)
    copy.close()
    verified = cli(dest, "audit", "verify", "--json")
    assert verified.returncode == 0 and json.loads(verified.stdout)["ok"] is True, verified.stdout
