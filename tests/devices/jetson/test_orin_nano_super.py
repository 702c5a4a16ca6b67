"""Orin Nano Super as its own kind: how the board says it is one, its conf's modes, and 7W behind a reboot.

The fake of tests/fakes/fakeboard.py carries NVIDIA's nvpmodel_p3767_0003_super.conf (15W, 25W, MAXN_SUPER,
TPC_PG_MASK 240, one CPU section per core) plus 7W as id 3 with the stock conf's lines (TPC_PG_MASK 252): once a
GPU context exists nvpmodel declines 7W from the others and the others from 7W (the golden-context rule).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml
from clirun import in_process
from fakeboard import FakeBoard, board_export, make_fake_board, quick_measure

from tuner.devices.jetson import JetsonDevice, detect_kind
from tuner.errors import UserError

RUN = ("run", "-m", "tiny-cnn", "-d", "orin-nano-super", "--max-latency", "500ms", "--sampler", "random")


@pytest.fixture(autouse=True)
def _state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TUNE_STATE_DIR", str(tmp_path / "state"))


def _board(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, start: str, desktop: bool) -> FakeBoard:
    board = make_fake_board(tmp_path / "b", "orin-nano-super", "l4t36", seed=4, start=start, desktop=desktop)
    board.install(monkeypatch)
    monkeypatch.setattr(JetsonDevice, "measure", quick_measure)
    return board


def test_a_super_is_told_by_its_compatible_string_or_its_conf(tmp_path: Path) -> None:
    board = make_fake_board(tmp_path / "b", "orin-nano-super", "l4t36", seed=4)
    assert detect_kind(board.root) == "orin-nano-super"
    with pytest.raises(UserError, match=r"Orin Nano Super \(orin-nano-super\).*--device orin-nano-super"):
        JetsonDevice("orin-nano", sysfs_root=board.root, nvpmodel=str(board.nvpmodel))
    # the stock board identity, but /etc/nvpmodel.conf linked to the Super conf (as the boot links it on a Super)
    (board.root / "proc/device-tree/compatible").write_bytes(b"nvidia,p3768-0000+p3767-0005\0nvidia,tegra234\0")
    assert detect_kind(board.root) == "orin-nano-super"
    nano = make_fake_board(tmp_path / "nano", "orin-nano", "l4t36", seed=4)
    assert detect_kind(nano.root) == "orin-nano"
    with pytest.raises(UserError, match=r"Orin Nano \(orin-nano\).*--device orin-nano\b"):
        JetsonDevice("orin-nano-super", sysfs_root=nano.root, nvpmodel=str(nano.nvpmodel))
    # the Super conf copied over /etc/nvpmodel.conf (as public setup notes do): its MAXN_SUPER mode says so
    link = board.root / "etc/nvpmodel.conf"
    text = (board.root / "etc/nvpmodel/nvpmodel_p3767_0003_super.conf").read_text()
    os.remove(link)
    link.write_text(text)
    assert detect_kind(board.root) == "orin-nano-super"
    # linked back to the stock conf (as a non-Super boot links it): the stock kind again
    os.remove(link)
    os.symlink("/etc/nvpmodel/nvpmodel_p3767_0003.conf", link)
    (board.root / "etc/nvpmodel/nvpmodel_p3767_0003.conf").write_text(text.replace("MAXN_SUPER", "MAXN"))
    assert detect_kind(board.root) == "orin-nano"


def test_its_space_is_the_super_conf_and_7w_is_behind_another_mask(tmp_path: Path) -> None:
    board = make_fake_board(tmp_path / "b", "orin-nano-super", "l4t36", seed=4, start="MAXN_SUPER")
    dev = JetsonDevice("orin-nano-super", sysfs_root=board.root, nvpmodel=str(board.nvpmodel))
    space = dev.space()
    assert space.knobs["nvpmodel"].values == ["15W", "25W", "MAXN_SUPER"]
    assert space.knobs["nvpmodel"].default == "MAXN_SUPER"
    assert space.knobs["gpu_mhz"].values[-1] == 1020 and space.knobs["emc_mhz"].values[-1] == 3199
    assert space.modes["25W"].caps["gpu_mhz"] == 918 and space.modes["15W"].caps["cpu_mhz"] == 1497.6
    assert not dev.board.dla_caps  # the Orin Nano has no DLA
    board.set_mode(3)
    dev = JetsonDevice("orin-nano-super", sysfs_root=board.root, nvpmodel=str(board.nvpmodel))
    assert dev.space().knobs["nvpmodel"].values == ["7W"]
    assert dev.space().modes["7W"].properties["tpc_pg_mask"] == 252


@pytest.mark.parametrize("desktop", [False, True], ids=["headless", "desktop-image"])
def test_apply_of_7w_from_maxn_super_says_reboot_before_any_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, desktop: bool
) -> None:
    board = _board(tmp_path, monkeypatch, "MAXN_SUPER", desktop)
    before = board.snapshot()
    knobs = {"nvpmodel": "7W", "gpu_mhz": 408, "emc_mhz": 2133, "cpu_cores": 4, "cpu_mhz": 960}
    export = tmp_path / "best.yaml"
    export.write_text(yaml.safe_dump(board_export(knobs, device="orin-nano-super", device_kind="orin-nano-super")))
    for extra in ((), ("--dry-run",)):
        code, stdout, stderr = in_process("apply", str(export), *extra)
        assert code == 2, stderr
        assert "TPC_PG_MASK 252" in stderr and "reboot" in stderr and "nothing was written" in stderr
        assert "would write" not in stdout
        assert board.snapshot() == before and board.mode_id() == 2


@pytest.mark.parametrize("start", ["MAXN_SUPER", "7W"])
def test_a_study_naming_every_mode_leaves_the_super_byte_identical(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, start: str
) -> None:
    """Both ways across the mask: nvpmodel declines the other group, the study goes on, the board is as it was."""
    board = _board(tmp_path, monkeypatch, start, True)
    before, mode = board.snapshot(), board.mode_id()
    out = tmp_path / "studies"
    every = ("--modes", "15W,25W,MAXN_SUPER,7W", "--knobs", "nvpmodel", "--batch-sizes", "1,4", "--seed", "0")
    code, _stdout, stderr = in_process(*RUN, *every, "--trials", "8", "--out", str(out))
    assert code == 0, stderr
    assert board.snapshot() == before and board.mode_id() == mode and not board.reboot_requested()
    assert "needs a reboot" in next(out.rglob("trials.csv")).read_text()


def test_a_study_from_maxn_super_keeps_its_mask(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    board = _board(tmp_path, monkeypatch, "MAXN_SUPER", False)
    before = board.snapshot()
    out = tmp_path / "studies"
    run = (*RUN, "--knobs", "nvpmodel,gpu_mhz", "--batch-sizes", "1,4", "--trials", "5", "--seed", "0")
    code, stdout, stderr = in_process(*run, "--out", str(out), "--json")
    assert code == 0, stderr
    assert board.has_gpu_context() and board.snapshot() == before and board.mode_id() == 2
    assert json.loads(stdout)["best"]["config"]["nvpmodel"] in ("15W", "25W", "MAXN_SUPER")
    assert "7W" not in next(out.rglob("trials.csv")).read_text()
