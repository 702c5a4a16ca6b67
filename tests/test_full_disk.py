"""A real full disk (a small tmpfs, see fulldisk.py) under each command that writes: one line, exit 2,
nothing damaged: the study database intact, no journal folder left behind, an old log file whole."""

from __future__ import annotations

import sqlite3

from clirun import run_cli
from fulldisk import small_disk

RUN = ("run", "-m", "resnet50", "-d", "sim:orin", "-l", "50ms", "--knobs", "gpu_mhz", "--seed", "1")


def one_error_line(r) -> str:
    errors = [line for line in r.stderr.splitlines() if line.startswith("error: ")]
    assert r.returncode == 2 and len(errors) == 1 and "Traceback" not in r.stderr, r.stderr
    return errors[0]


def test_run_with_tune_db_on_a_disk_that_fills_is_one_line_and_the_study_stays_readable(tmp_path):
    with small_disk(tmp_path / "disk", 1200) as disk:
        r = run_cli(*RUN, "--trials", "30", "--out", str(disk / "out"))
        line = one_error_line(r)
        assert "disk is full" in line and "free some space" in line, line
        with sqlite3.connect(disk / "out" / "tune.db") as conn:
            assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
            done = conn.execute("SELECT count(*) FROM trials WHERE state = 'COMPLETE'").fetchone()[0]
        assert 0 < done < 30
