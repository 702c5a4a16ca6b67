"""Modes that need a reboot: a study stays within the board's TPC mask, and what would need a reboot is said first.

On the fake AGX Orin with nvpmodel's golden-context rule (tests/fakes/fakeboard.py: from boot on a desktop
image, else from the first measured window; jetson-stats jtop/core/nvpmodel.py refuses such a switch
as "has a different mask ..., is not compatible"). Windows are quick_measure's rail readings: what
these tests check is what a command does to the board.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from clirun import in_process
from fakeboard import FakeBoard, board_export, make_fake_board, quick_measure

from tuner.devices.jetson import JetsonDevice, RestoreIncomplete
from tuner.errors import NeedsReboot
from tuner.space import Config


@pytest.fixture(autouse=True)
def _state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TUNE_STATE_DIR", str(tmp_path / "state"))


def _board(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, start: str, desktop: bool) -> FakeBoard:
    board = make_fake_board(tmp_path / "board", "orin-agx", "l4t36", seed=1, start=start, desktop=desktop)
    board.install(monkeypatch)
    monkeypatch.setattr(JetsonDevice, "measure", quick_measure)
    return board


RUN = ("run", "-m", "tiny-cnn", "-d", "orin", "--max-latency", "500ms", "--sampler", "random", "--seed", "0")


@pytest.mark.parametrize("desktop", [False, True], ids=["context-from-first-window", "desktop-image"])
def test_a_study_from_maxn_with_the_mode_knob_leaves_the_board_byte_identical(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, desktop: bool
) -> None:
    board = _board(tmp_path, monkeypatch, "MAXN", desktop)
    before = board.snapshot()
    out = tmp_path / "studies"
    code, stdout, stderr = in_process(
        *RUN, "--knobs", "nvpmodel", "--batch-sizes", "1,4", "--trials", "4", "--out", str(out), "--json"
    )
    assert code == 0, stderr
    assert board.has_gpu_context()  # the rule was in force: the windows ran
    assert board.snapshot() == before and board.mode_id() == 0 and not board.reboot_requested()
    payload = json.loads(stdout)
    assert payload["measured"] >= 1
    assert payload["best"]["config"]["nvpmodel"] in ("MAXN", "50W")  # the modes of mask 0, none of another
    trials = next(out.rglob("trials.csv")).read_text()
    assert "needs a reboot" not in trials and "30W" not in trials and "15W" not in trials  # never proposed


def test_the_space_starts_in_the_current_mode_and_keeps_its_mask(tmp_path: Path, monkeypatch) -> None:
    board = _board(tmp_path, monkeypatch, "MAXN", False)
    knob = JetsonDevice("orin-agx", sysfs_root=board.root, nvpmodel=str(board.nvpmodel)).space().knobs["nvpmodel"]
    assert knob.default == "MAXN" and knob.values == ["MAXN", "50W"]
    board.set_mode(2)
    knob = JetsonDevice("orin-agx", sysfs_root=board.root, nvpmodel=str(board.nvpmodel)).space().knobs["nvpmodel"]
    assert knob.default == "30W" and knob.values == ["30W"]


@pytest.mark.parametrize("desktop", [False, True], ids=["headless", "desktop-image"])
def test_apply_of_a_mode_with_another_mask_says_reboot_before_any_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, desktop: bool
) -> None:
    board = _board(tmp_path, monkeypatch, "MAXN", desktop)
    before = board.snapshot()
    knobs = {"nvpmodel": "30W", "gpu_mhz": 318.75, "emc_mhz": 3199, "cpu_cores": 8, "cpu_mhz": 1728}
    export = tmp_path / "best.yaml"
    export.write_text(yaml.safe_dump(board_export(knobs)))
    for extra in ((), ("--dry-run",)):
        code, stdout, stderr = in_process("apply", str(export), *extra)
        assert code == 2, stderr
        assert "TPC_PG_MASK 240" in stderr and "reboot" in stderr and "nothing was written" in stderr
        assert "Traceback" not in stderr and "would write" not in stdout
        assert board.snapshot() == before and board.mode_id() == 0
    assert not (tmp_path / "state" / "journal").exists() or not list((tmp_path / "state" / "journal").glob("*.json"))


def test_a_mode_of_the_same_mask_still_applies(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    board = _board(tmp_path, monkeypatch, "MAXN", True)
    knobs = {"nvpmodel": "50W", "gpu_mhz": 318.75, "emc_mhz": 3199, "cpu_cores": 12, "cpu_mhz": 1497.6}
    export = tmp_path / "best.yaml"
    export.write_text(yaml.safe_dump(board_export(knobs)))
    code, _stdout, stderr = in_process("apply", str(export))
    assert code == 0, stderr
    assert board.mode_id() == 3


def test_a_named_mode_of_another_mask_is_said_first_and_the_restore_refuses_before_writing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    board = _board(tmp_path, monkeypatch, "MAXN", False)
    dev = JetsonDevice("orin-agx", sysfs_root=board.root, nvpmodel=str(board.nvpmodel))
    with pytest.raises(NeedsReboot, match="nothing was written") as refused:
        dev.apply(Config(knobs={**dev.space().default_config().knobs, "nvpmodel": "15W"}, batch_size=1))
    assert refused.value.exit_code == 2 and board.mode_id() == 0
    lines = dev.offer_modes(["MAXN", "15W"])
    assert len(lines) == 1 and "15W" in lines[0] and "reboot" in lines[0] and lines[0] in dev.notes
    assert dev.space().knobs["nvpmodel"].values == ["MAXN", "15W", "50W"]
    state = dev.read_state()
    dev.apply(Config(knobs={**dev.space().default_config().knobs, "nvpmodel": "15W"}, batch_size=1))
    assert board.mode_id() == 1
    board.create_gpu_context()  # the first window ran
    during = board.snapshot()
    with pytest.raises(RestoreIncomplete) as err:
        dev.restore(state)
    assert "refused before any write" in str(err.value) and "sudo nvpmodel -m 0" in str(err.value)
    assert board.snapshot() == during and not board.reboot_requested()


def test_run_names_modes_with_modes_and_says_the_reboot_first(tmp_path: Path, monkeypatch) -> None:
    board = _board(tmp_path, monkeypatch, "MAXN", True)
    before = board.snapshot()
    out = ("--out", str(tmp_path / "studies"))
    code, _stdout, stderr = in_process(*RUN, "--modes", "MAXN,15W", "--knobs", "nvpmodel", "--trials", "1", *out)
    assert "restoring the board will need one" in stderr
    # a desktop image holds the context from boot: nvpmodel declines 15W, so nothing changed
    assert board.snapshot() == before, (code, stderr)
    code, _stdout, stderr = in_process(*RUN, "--modes", "MAXN,99W", "--knobs", "nvpmodel", *out)
    assert code == 2 and "unknown nvpmodel mode(s) 99W" in stderr


def test_nvpmodel_gets_no_answer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The prompt is never answered: nvpmodel runs with standard input closed (DEVNULL), so it reads end of input."""
    board = _board(tmp_path, monkeypatch, "MAXN", True)
    dev = JetsonDevice("orin-agx", sysfs_root=board.root, nvpmodel=str(board.nvpmodel))
    dev.offer_modes(["15W"])
    before = board.snapshot()
    with pytest.raises(Exception, match="needs a reboot"):
        dev.set_mode(1)
    assert board.snapshot() == before and not board.reboot_requested()
