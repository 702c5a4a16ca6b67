"""The clocks a Jetson ran: throttled windows never count, trials.csv carries what ran, and a user other than root.

On the fake AGX Orin (tests/fakes/fakeboard.py): ``board.throttle`` holds the running clocks below the limits
and makes the over-current counter rise, as soctherm does on a board; windows are quick_window's 0.1 s
rail readings with the device's own clock sampling through them (what is checked is what the device
makes of a window, not the model's figures).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import yaml
from clirun import in_process
from fakeboard import FakeBoard, as_user, board_export, make_fake_board, quick_window

from tuner.devices.jetson import JetsonDevice, sysfs
from tuner.devices.jetson.clocks import ClockMonitor
from tuner.space import Config

KNOBS = {"nvpmodel": "MAXN", "gpu_mhz": 612, "emc_mhz": 3199, "cpu_cores": 12, "cpu_mhz": 2201.6}
ONE = ("--knobs", "gpu_mhz", "--batch-sizes", "1")
RUN = ("run", "-m", "tiny-cnn", "-d", "orin", "--max-latency", "500ms", "--sampler", "random", "--seed", "0")


@pytest.fixture
def board(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeBoard:
    monkeypatch.setenv("TUNE_STATE_DIR", str(tmp_path / "state"))
    fake = make_fake_board(tmp_path / "board", "orin-agx", "l4t36", seed=1, start="MAXN", grid="jp6")
    fake.install(monkeypatch)
    monkeypatch.setattr(JetsonDevice, "_window", quick_window)
    return fake


def _rows(out: Path) -> list[dict[str, str]]:
    return list(csv.DictReader(next(out.rglob("trials.csv")).open()))


def test_a_window_whose_gpu_clock_did_not_hold_is_marked_and_never_recommended(board: FakeBoard, tmp_path) -> None:
    board.throttle(gpu_hz=1020000000)  # soctherm holds the GPU at 1020 MHz whatever max_freq says
    before = board.snapshot()
    out = tmp_path / "studies"
    code, stdout, stderr = in_process(*RUN, *ONE, "--trials", "8", "--out", str(out), "--json")
    assert code == 0, stderr
    assert board.snapshot() == before
    rows = _rows(out)
    above = [r for r in rows if float(r["gpu_mhz"]) > 1020 * 1.02]
    below = [r for r in rows if float(r["gpu_mhz"]) <= 1020]
    assert above and below  # the seed proposes both
    for r in above:
        assert r["state"] == "FAIL" and r["throttled"] == "yes" and r["recommended"] == "no"
        assert "throttled: gpu_mhz asked" in r["fail_reason"] and "ran 1020-1020 MHz" in r["fail_reason"]
        assert float(r["gpu_mhz_max"]) == 1020
    for r in below:
        assert r["throttled"] == "no" and r["state"] == "COMPLETE"
        assert float(r["gpu_mhz_min"]) == float(r["gpu_mhz"]) == float(r["gpu_mhz_max"])  # it held
        assert float(r["cpu_mhz_mean"]) == 2201.6 and float(r["emc_mhz_mean"]) == 3199
        assert r["oc_events"] == "0.0"
    best = json.loads(stdout)["best"]
    assert float(best["config"]["gpu_mhz"]) <= 1020 and best["throttled"] is False
    assert best["clocks_ran"]["gpu_mhz_mean"] == float(best["config"]["gpu_mhz"])


def test_a_window_in_which_the_over_current_counter_rose_does_not_count(board: FakeBoard, tmp_path) -> None:
    board.throttle(oc_events=3)
    out = tmp_path / "studies"
    code, _stdout, stderr = in_process(*RUN, *ONE, "--trials", "2", "--out", str(out))
    assert code != 0 and "Traceback" not in stderr
    rows = _rows(out)
    assert rows and all(r["state"] == "FAIL" and r["throttled"] == "yes" for r in rows)
    assert all("over-current events (oc3 +" in r["fail_reason"] and float(r["oc_events"]) > 0 for r in rows)
    assert not any(r["recommended"] == "yes" for r in rows)


def test_the_dla_cap_is_recorded_as_the_rate_the_dla_ran(board: FakeBoard) -> None:
    dev = JetsonDevice("orin-agx", sysfs_root=board.root, nvpmodel=str(board.nvpmodel))
    dev.use_runtime("tensorrt")
    knobs = {**dev.space().default_config().knobs, "dla_mhz": 614.4}
    dev.apply(Config(knobs=knobs, batch_size=1))
    board.throttle(dla_hz=500000000)
    monitor = ClockMonitor(dev.board.clocks)  # type: ignore[arg-type]
    monitor.start()
    monitor.stop()
    extras = monitor.extras()
    assert extras["dla_mhz_max"] == 500 and extras["gpu_mhz_max"] == 1300.5
    assert monitor.throttles(dev._asked) == []  # the DLA is a cap: its rate is recorded, not judged


def test_limits_clamp_as_the_kernel_resolves_them(board: FakeBoard) -> None:
    """max below min: min reads back as the max; raising the max brings the min request back (L4T 35/36)."""
    gpu = board.gpu_dir
    sysfs.write(board.root, gpu / "min_freq", "816000000")
    sysfs.write(board.root, gpu / "max_freq", "612000000")
    assert board.read(f"{gpu.relative_to(board.root)}/min_freq") == "612000000"
    assert board.read(f"{gpu.relative_to(board.root)}/cur_freq") == "612000000"
    sysfs.write(board.root, gpu / "max_freq", "1300500000")
    assert board.read(f"{gpu.relative_to(board.root)}/min_freq") == "816000000"
    policy = board.policy(0)
    sysfs.write(board.root, policy / "scaling_max_freq", "1500000")  # off the table: the entry at or below
    assert board.read("sys/devices/system/cpu/cpufreq/policy0/scaling_max_freq") == "1497600"


def test_the_board_as_another_user_says_needs_root_before_any_read_that_would_fail(
    board: FakeBoard, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    as_user(monkeypatch)
    before = board.snapshot()
    out = tmp_path / "studies"
    code, _stdout, stderr = in_process(*RUN, *ONE, "--trials", "1", "--out", str(out))
    assert code == 2, stderr
    lines = [line for line in stderr.splitlines() if "needs root" in line]
    assert len(lines) == 1 and "sudo" in lines[0] and "Traceback" not in stderr
    assert "BPMP debugfs" in stderr  # the rates it cannot sample, said once
    assert stderr.count("are not sampled") == 1
    export = tmp_path / "best.yaml"
    export.write_text(yaml.safe_dump(board_export(KNOBS)))
    code, _stdout, stderr = in_process("apply", str(export))
    assert code == 2 and "needs root" in stderr and "sudo" in stderr and "Traceback" not in stderr
    assert board.snapshot() == before
    journal = tmp_path / "state" / "journal"
    assert not journal.exists() or not list(journal.glob("*.json"))
