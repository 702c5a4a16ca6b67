"""Power-mode switches: their time is counted and reported, a mode that asks for a reboot is never entered.

On the strict fake AGX Orin (tests/fakes/fakeboard.py: nvpmodel takes the time it is told, and once the GPU
has run it asks for a reboot to change the TPC mask, as a real board does) and on the twin, whose
switch time is modelled (tuner.devices.switching). No test depends on how long anything takes beyond
a lower bound the fake itself sleeps.
"""

from __future__ import annotations

import csv
from pathlib import Path

import optuna
import pytest
from fakeboard import FakeBoard, every_mode, make_fake_board, quick_measure

from tuner.devices.jetson import ApplyError, JetsonDevice, ModeNeedsReboot
from tuner.devices.switching import SwitchCosts, switch_seconds
from tuner.devices.virtual.twin import TwinDevice
from tuner.errors import NeedsReboot
from tuner.pareto import write_trials_csv
from tuner.run_options import RunOptions
from tuner.space import Config
from tuner.strategies import LearnedSampler
from tuner.study import MEMORY_STORAGE, run_study


@pytest.fixture(autouse=True)
def _state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TUNE_STATE_DIR", str(tmp_path / "state"))


def _orin(tmp_path: Path) -> FakeBoard:
    """An AGX Orin in MODE_30W (TPC mask 240): MAXN, 15W and 50W all have another mask."""
    return make_fake_board(tmp_path / "board", "orin-agx", "l4t36", seed=1, start="MODE_30W")


def _device(board: FakeBoard) -> JetsonDevice:
    return every_mode(JetsonDevice(board.model, sysfs_root=board.root, nvpmodel=str(board.nvpmodel)))


def _config(mode: str) -> Config:
    return Config(
        knobs={"nvpmodel": mode, "gpu_mhz": 318.75, "emc_mhz": 2133, "cpu_cores": 4, "cpu_mhz": 1113.6}, batch_size=1
    )


def test_a_mode_switch_counts_the_time_nvpmodel_takes(tmp_path: Path) -> None:
    board = _orin(tmp_path)
    pause = 0.2 * SwitchCosts().mode_s
    board.set_switch_time(pause)
    dev = _device(board)
    dev.apply(_config("15W"))
    assert board.mode_id() == 1
    assert dev.last_switch_s is not None and dev.last_switch_s >= pause


def test_a_mode_that_needs_a_reboot_is_refused_and_the_board_left_as_it_was(tmp_path: Path) -> None:
    board = _orin(tmp_path)
    board.create_gpu_context()
    before = board.snapshot()
    dev = _device(board)
    with pytest.raises(ModeNeedsReboot) as err:
        dev.apply(_config("MAXN"))
    assert isinstance(err.value, NeedsReboot) and isinstance(err.value, ApplyError)
    message = str(err.value)
    assert "needs a reboot" in message and "never reboots" in message and "sudo nvpmodel -m 0" in message
    assert board.mode_id() == 2 and board.snapshot() == before
    assert not board.reboot_requested()


def test_a_study_skips_a_mode_that_needs_a_reboot_and_reports_switch_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The trials in a refused mode fail with the reason, the strategy stops proposing that mode, nothing reboots."""
    board = _orin(tmp_path)
    board.create_gpu_context()
    monkeypatch.setattr(JetsonDevice, "measure", quick_measure)
    before = board.snapshot()
    dev = _device(board)
    options = RunOptions(
        model="tiny-cnn",
        max_latency_ms=500.0,
        trials=8,
        seed=0,
        knobs=["nvpmodel", "gpu_mhz"],
        batch_sizes=[1, 4],
        storage=MEMORY_STORAGE,
        out=tmp_path / "studies",
    )
    study, _ = run_study(dev, options, sampler=LearnedSampler(seed=0))
    assert board.snapshot() == before and not board.reboot_requested()
    trials = sorted(study.trials, key=lambda t: t.number)
    refused = [t for t in trials if t.user_attrs.get("needs_reboot")]
    measured = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE and "qps" in t.user_attrs]
    assert refused and measured and all(t.user_attrs["effective"]["nvpmodel"] == "30W" for t in measured)
    assert all("switch_s" in t.user_attrs for t in measured)
    for t in refused:
        assert t.state == optuna.trial.TrialState.FAIL
        assert "needs a reboot" in t.user_attrs["fail_reason"] and t.user_attrs["verdict"].startswith("skipped")
        later = [u for u in trials if u.number > t.number and "effective" in u.user_attrs]
        assert all(u.user_attrs["effective"]["nvpmodel"] != t.user_attrs["needs_reboot"] for u in later)


def test_twin_trials_carry_the_modelled_switch_time(tmp_path: Path) -> None:
    dev = TwinDevice("sim:orin")
    space = dev.space()
    default = space.default_config()
    other = default.model_copy(update={"knobs": {**default.knobs, "nvpmodel": "30W"}})
    dev.apply(other)
    assert dev.last_switch_s == switch_seconds(space, SwitchCosts(), default, other) >= SwitchCosts().mode_s
    dev.apply(other)
    assert dev.last_switch_s == 0.0

    options = RunOptions(model="resnet50", max_latency_ms=50.0, trials=6, seed=1, storage=MEMORY_STORAGE)
    study, _ = run_study(TwinDevice("sim:orin"), options)
    measured = [t for t in study.trials if "qps" in t.user_attrs and "reused_from" not in t.user_attrs]
    assert measured and all(t.user_attrs["switch_s"] >= 0 for t in measured)
    write_trials_csv(study, tmp_path / "trials.csv")
    rows = list(csv.DictReader((tmp_path / "trials.csv").open()))
    assert [float(r["switch_s"]) for r in rows if r["switch_s"]] == [t.user_attrs["switch_s"] for t in measured]
