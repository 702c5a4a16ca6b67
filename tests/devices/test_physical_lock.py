"""One lock and one journal per physical board, whatever name or home folder reached it.

`orin` and `orin-agx` are one AGX Orin (tuner.devices.journal.device_key, JetsonDevice.physical_key);
root's journals live in /var/lib/powertune, so `sudo tune` and a root shell find the same one.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from fakeboard import FakeBoard, make_fake_board
from locations import REPO

from tuner.devices.hardware_session import hold, restore_device
from tuner.devices.jetson import jetson_device
from tuner.devices.journal import device_key, journal_path, lock_path, state_dir, write_journal
from tuner.errors import UserError


@pytest.fixture
def board(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeBoard:
    return make_fake_board(tmp_path / "board", "orin-agx", "l4t36", seed=1, start="MAXN").install(monkeypatch)


def test_orin_and_orin_agx_are_one_lock_and_one_journal(board: FakeBoard) -> None:
    a, b = jetson_device("orin"), jetson_device("orin-agx")
    assert device_key(a) == device_key(b)
    assert lock_path(device_key(a)) == lock_path(device_key(b))
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time\n"
            "from tuner.devices.jetson import jetson_device\n"
            "from tuner.devices.hardware_session import hold\n"
            "with hold(jetson_device('orin')):\n"
            "    print('held', flush=True)\n"
            "    time.sleep(120)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"},
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(UserError, match=rf"orin-agx is in use by PID {holder.pid}"):
            with hold(b):
                pass
    finally:
        holder.kill()
        holder.wait()


def test_a_journal_left_under_one_name_is_restored_under_the_other(board: FakeBoard) -> None:
    before = board.snapshot()
    a = jetson_device("orin")
    write_journal(a, a.read_state())
    board.set_mode(3)  # a crashed run left the board in 50W
    assert board.snapshot() != before
    assert restore_device(jetson_device("orin-agx"))
    assert board.snapshot() == before and not journal_path(device_key(a)).exists()


def test_the_board_serial_number_names_the_board(board: FakeBoard) -> None:
    (board.root / "proc/device-tree/serial-number").write_bytes(b"1421022012345\0")
    assert jetson_device("orin").physical_key == "orin-agx-1421022012345"


def test_root_keeps_one_state_folder_whatever_home_says(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("TUNE_STATE_DIR")
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    for home in ("/root", str(tmp_path / "user-home")):  # a root shell, and sudo keeping the user's HOME
        monkeypatch.setenv("HOME", home)
        monkeypatch.setenv("XDG_STATE_HOME", f"{home}/.local/state")
        assert state_dir() == Path("/var/lib/powertune")
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert state_dir() == Path(f"{tmp_path}/user-home/.local/state/powertune")
    monkeypatch.setenv("TUNE_STATE_DIR", str(tmp_path / "state"))
    assert state_dir() == tmp_path / "state"
