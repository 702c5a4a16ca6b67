"""Orin NX as its own kind: its device tree, its conf's modes and TPC masks, its two DLAs capped per core.

The fake Orin NX 16 GB of tests/fakes/fakeboard.py carries the modes of NVIDIA's nvpmodel_p3767_0000.conf
(MAXN and 25W gate TPCs 240, 10W and 15W 252; 10W caps DLA0 at 153.6 MHz and DLA1 at 115 MHz).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from clirun import in_process
from fakeboard import make_fake_board, quick_measure

from tuner.devices.jetson import JetsonDevice, detect_kind
from tuner.devices.jetson.clocks import ClockMonitor
from tuner.errors import UserError
from tuner.space import Config


@pytest.fixture(autouse=True)
def _state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TUNE_STATE_DIR", str(tmp_path / "state"))


def test_an_orin_nx_is_not_an_orin_nano(tmp_path: Path) -> None:
    board = make_fake_board(tmp_path / "b", "orin-nx", "l4t36", seed=5)
    assert detect_kind(board.root) == "orin-nx"
    with pytest.raises(UserError, match=r"Orin NX \(orin-nx\).*--device orin-nx"):
        JetsonDevice("orin-nano", sysfs_root=board.root, nvpmodel=str(board.nvpmodel))
    nano = make_fake_board(tmp_path / "nano", "orin-nano", "l4t36", seed=5)
    assert detect_kind(nano.root) == "orin-nano"


def test_its_space_keeps_the_mask_it_starts_in_and_has_dlas(tmp_path: Path) -> None:
    board = make_fake_board(tmp_path / "b", "orin-nx", "l4t36", seed=5)  # the conf's default, 15W
    dev = JetsonDevice("orin-nx", sysfs_root=board.root, nvpmodel=str(board.nvpmodel))
    assert dev.space().knobs["nvpmodel"].values == ["10W", "15W"]
    dev.use_runtime("tensorrt")
    assert {"dla_cores", "dla_mhz"} <= set(dev.space().knobs) and len(dev.board.dla_caps) == 2


def test_a_journal_of_10w_with_its_per_core_dla_caps_restores(tmp_path: Path) -> None:
    """10W caps DLA1 below any value of the space (115 MHz): the journal's value is the board's own, not refused."""
    board = make_fake_board(tmp_path / "b", "orin-nx", "l4t36", seed=5, start="10W")
    dev = JetsonDevice("orin-nx", sysfs_root=board.root, nvpmodel=str(board.nvpmodel))
    dev.use_runtime("tensorrt")
    before = board.snapshot()
    state = dev.read_state()
    assert state["dla"] == {"0": "153600000", "1": "115000000"}
    dev.apply(Config(knobs={**dev.space().default_config().knobs, "nvpmodel": "15W", "dla_mhz": 614.4}, batch_size=1))
    dev.restore(state)
    assert board.snapshot() == before


def test_a_study_from_maxn_leaves_the_orin_nx_as_it_was(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    board = make_fake_board(tmp_path / "b", "orin-nx", "l4t36", seed=5, start="MAXN").install(monkeypatch)
    monkeypatch.setattr(JetsonDevice, "measure", quick_measure)
    before = board.snapshot()
    run = ("run", "-m", "tiny-cnn", "-d", "orin-nx", "--max-latency", "500ms", "--knobs", "nvpmodel,gpu_mhz")
    code, stdout, stderr = in_process(*run, "--trials", "3", "--seed", "0", "--out", str(tmp_path / "o"), "--json")
    assert code == 0, stderr
    assert json.loads(stdout)["best"]["config"]["nvpmodel"] in ("MAXN", "25W")
    assert board.snapshot() == before and board.mode_id() == 0


def test_each_dla_rate_is_sampled_on_its_own(tmp_path: Path) -> None:
    """10W caps DLA0 at 153.6 and DLA1 at 115 MHz (BPMP nafll_dla0_core / nafll_dla1_core): two columns, not one."""
    board = make_fake_board(tmp_path / "b", "orin-nx", "l4t36", seed=5, start="10W")
    dev = JetsonDevice("orin-nx", sysfs_root=board.root, nvpmodel=str(board.nvpmodel))
    monitor = ClockMonitor(dev.board.clocks)  # type: ignore[arg-type]
    monitor.start()
    extras = monitor.stop().extras()
    assert extras["dla_mhz_max"] == 153.6 and extras["dla1_mhz_max"] == 115
    assert extras["dla1_mhz_min"] == extras["dla1_mhz_mean"] == 115
