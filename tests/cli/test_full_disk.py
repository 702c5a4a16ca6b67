"""A real full disk (a small tmpfs, see fulldisk.py) under each command that writes: one line, exit 2,
nothing damaged: the study database intact, no journal folder left behind, an old log file whole."""

from __future__ import annotations

import sqlite3

import pytest
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


def test_apply_with_a_full_journal_folder_is_one_line_the_board_untouched_and_no_folder_left(tmp_path, monkeypatch):
    import yaml
    from fakeboard import board_export, make_fake_board
    from fulldisk import fill

    board = make_fake_board(tmp_path / "board", "orin-agx", "l4t36", seed=1).install(monkeypatch)
    best = tmp_path / "best.yaml"
    best.write_text(yaml.safe_dump(board_export()))
    original = board.snapshot()
    with small_disk(tmp_path / "disk", 64) as disk:
        fill(disk)
        r = run_cli("apply", str(best), cwd=tmp_path, env={"TUNE_STATE_DIR": str(disk / "state")})
        line = one_error_line(r)
        assert "No space left on device" in line and "free some space" in line, line
        assert sorted(p.name for p in disk.iterdir()) == ["fill"]
    assert board.snapshot() == original


@pytest.mark.parametrize("old_bytes", [4096, 4000], ids=["the log ends a page", "the line would cross a page"])
def test_govern_log_on_a_full_disk_is_one_line_exit_2_and_the_old_log_whole(tmp_path, monkeypatch, old_bytes):
    from fulldisk import fill
    from policies import two_band_policy

    from tuner.devices.virtual.twin import TwinDevice
    from tuner.serve.policy import write_policy

    space = TwinDevice("sim:orin").space()
    write_policy(two_band_policy(space, model="resnet50", device="sim:orin", device_kind="orin-agx", twin=True),
                 tmp_path / "policy.yaml")  # fmt: skip
    (tmp_path / "rate").write_text("50\n")
    with small_disk(tmp_path / "disk", 64) as disk:
        log = disk / "switches.jsonl"
        old = ("x" * (old_bytes - 2) + "\n").encode()[: old_bytes - 1] + b"\n"
        log.write_bytes(old)
        fill(disk)
        r = run_cli("govern", "policy.yaml", "-d", "sim:orin", "--rate-source", "file:rate", "--duration", "0.2",
                    "--observe-only", "--log", str(log), cwd=tmp_path)  # fmt: skip
        line = one_error_line(r)
        assert "No space left on device" in line, line
        assert log.read_bytes() == old
