"""A thermal cap that lowers the limits' read-back: caught as throttling, never saved as the user's original.

On the fake AGX Orin (tests/fakes/fakeboard.py): ``board.thermal_cap`` moves the GPU's and every cluster's cooling
device to a state above 0, as Linux's devfreq and cpufreq cooling do through a PM QoS max-frequency request, so
``max_freq`` and ``scaling_max_freq`` read back capped while the user's own request is kept (tests/fakes/fakekernel.py).
Windows are quick_window's 0.1 s rail readings with the device's own clock sampling through them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from clirun import in_process
from fakeboard import FakeBoard, board_export, make_fake_board, quick_window

from tuner.devices.jetson import JetsonDevice, sysfs

RUN = ("run", "-m", "tiny-cnn", "-d", "orin", "--max-latency", "500ms", "--sampler", "random", "--seed", "0")
CAP_HZ = 816000000


@pytest.fixture
def board(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeBoard:
    monkeypatch.setenv("TUNE_STATE_DIR", str(tmp_path / "state"))
    fake = make_fake_board(tmp_path / "board", "orin-agx", "l4t36", seed=2, start="MAXN", grid="jp6")
    fake.install(monkeypatch)
    monkeypatch.setattr(JetsonDevice, "_window", quick_window)
    return fake


def _gpu(board: FakeBoard, leaf: str) -> str:
    return board.read(f"{board.gpu_dir.relative_to(board.root)}/{leaf}")


def test_the_fake_cap_lowers_the_read_back_and_keeps_the_request(board: FakeBoard) -> None:
    sysfs.write(board.root, board.gpu_dir / "max_freq", "1224000000")
    board.thermal_cap(gpu_hz=CAP_HZ, cpu_khz=1497600)
    assert _gpu(board, "max_freq") == str(CAP_HZ) and _gpu(board, "cur_freq") == str(CAP_HZ)
    assert board.read("sys/devices/system/cpu/cpufreq/policy0/scaling_max_freq") == "1497600"
    sysfs.write(board.root, board.gpu_dir / "max_freq", "1020000000")  # a store while capped reads back capped
    assert _gpu(board, "max_freq") == str(CAP_HZ)
    board.thermal_cap()
    assert _gpu(board, "max_freq") == "1020000000"  # the last request, back when the cap lifts
    assert board.read("sys/devices/system/cpu/cpufreq/policy0/scaling_max_freq") == "2201600"


def test_a_run_started_under_a_cap_is_refused_before_the_capped_limits_are_saved(board: FakeBoard, tmp_path) -> None:
    before = board.snapshot()
    board.thermal_cap(gpu_hz=CAP_HZ)
    out = tmp_path / "studies"
    run = (*RUN, "--knobs", "gpu_mhz", "--batch-sizes", "1", "--trials", "2", "--out", str(out))
    code, _stdout, stderr = in_process(*run)
    assert code == 2, stderr
    assert "thermal cap is in force" in stderr and "devfreq-17000000.gpu" in stderr and "nothing was changed" in stderr
    export = tmp_path / "best.yaml"
    knobs = {"nvpmodel": "MAXN", "gpu_mhz": 612, "emc_mhz": 3199, "cpu_cores": 12, "cpu_mhz": 2201.6}
    export.write_text(yaml.safe_dump(board_export(knobs)))
    code, _stdout, stderr = in_process("apply", str(export))
    assert code == 2 and "thermal cap is in force" in stderr, stderr
    journal = tmp_path / "state" / "journal"
    assert not journal.exists() or not list(journal.glob("*.json"))
    board.thermal_cap()
    assert board.snapshot() == before  # had the capped 816 MHz been journaled, restore would have kept it


def test_a_cap_during_a_study_is_throttling_and_restore_writes_the_users_limits(
    board: FakeBoard, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The user's GPU max is the cap's value (816 MHz): while capped it reads back as saved although the study's
    request (above it) is what the kernel holds; a restore that trusted the read-back would leave that request."""
    sysfs.write(board.root, board.gpu_dir / "max_freq", str(CAP_HZ))
    before = board.snapshot()
    windows = {"n": 0}

    def capped_window(self: Any, *args: Any) -> Any:
        windows["n"] += 1
        if windows["n"] == 1:
            board.thermal_cap(gpu_hz=CAP_HZ)  # the board heats up in the first window and stays capped
        return quick_window(self, *args)

    monkeypatch.setattr(JetsonDevice, "_window", capped_window)
    out = tmp_path / "studies"
    trials = ("--knobs", "gpu_mhz", "--batch-sizes", "1", "--trials", "6", "--out", str(out))
    code, _stdout, stderr = in_process(*RUN, *trials)
    assert "Traceback" not in stderr, stderr
    # the first window: asked above the cap, ran at it (the 2% rule on what ran, not on max_freq's read-back)
    assert "trial 0 finished (0/6): fail: throttled: gpu_mhz asked 918 MHz ran 816-816 MHz" in stderr
    # the next apply reads its limits back capped: the study stops and says why
    assert code != 0 and "did not take the configuration" in stderr and "thermal cap is in force" in stderr
    assert _gpu(board, "max_freq") == str(CAP_HZ)  # as the user had it, though the study had asked 918 MHz
    board.thermal_cap()
    assert _gpu(board, "max_freq") == str(CAP_HZ) and board.snapshot() == before
