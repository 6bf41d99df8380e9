"""One database file, one server, whatever name reaches it; a backup that finishes while the team works.

Real ``prickle serve`` processes and real command-line processes on one file reached by other
names: a hard link, a symlink, a path through '..' under a symlinked folder, a bind mount.
"""

import contextlib
import os
import subprocess
import threading

import httpx
import pytest

import prickle
from conftest import PRICKLE, Served
from test_e2e import _post


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
