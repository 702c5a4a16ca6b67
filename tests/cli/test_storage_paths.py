"""``--storage`` as users type it: a plain path is an SQLite file; a folder that is not there is refused.

Both drive the CLI; the refusal must create nothing (as root, a silently
created ``/nonexistent/dir`` would be a folder nobody asked for).
"""

from __future__ import annotations

import sqlite3

from clirun import run_cli

RUN = ("run", "-m", "resnet50", "-d", "sim:orin", "-l", "50ms", "--trials", "2", "--knobs", "gpu_mhz")


def test_a_plain_path_is_taken_as_an_sqlite_file(tmp_path):
    db = tmp_path / "x.db"
    r = run_cli(*RUN, "--out", str(tmp_path / "out"), "--storage", str(db))
    assert r.returncode == 0, r.stderr
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM trials").fetchone()[0] == 2
    pareto = run_cli("pareto", "-m", "resnet50", "-d", "sim:orin", "--out", str(tmp_path / "out"), "--storage", "x.db",
                     cwd=tmp_path)  # fmt: skip
    assert pareto.returncode == 0 and "2 completed trials" in pareto.stdout, pareto.stderr


def test_a_storage_folder_that_does_not_exist_is_refused_and_nothing_is_created(tmp_path):
    missing = tmp_path / "nonexistent" / "dir"
    r = run_cli(*RUN, "--out", str(tmp_path / "out"), "--storage", f"sqlite:///{missing}/x.db")
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "does not exist" in lines[0] and "mkdir -p" in lines[0], r.stderr
    assert not (tmp_path / "nonexistent").exists() and not (tmp_path / "out").exists()
