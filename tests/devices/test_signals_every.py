"""Every signal restores: SIGHUP (a dropped SSH session) and SIGQUIT (Ctrl-\\) end a hold like SIGTERM.

And the message after a signal says what was left: a signal that lands after
``tune apply``'s writes must not say "no hardware was changed" (the mode was
applied to stay, and the message names its undo).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from clirun import in_process, wait_while_running
from fakeboard import board_export, every_mode, make_fake_board, tiny_run
from journals import pending_journals
from locations import REPO, SUPPORT

from tuner.devices.hardware_session import deployment, hardware_session
from tuner.devices.jetson import JetsonDevice
from tuner.errors import Terminated
from tuner.plumbing import interrupts
from tuner.space import Config

SIGNALS = [signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT]
ENDINGS = {signal.SIGINT: "interrupted", signal.SIGTERM: "terminated", signal.SIGHUP: "hung up", signal.SIGQUIT: "quit"}


@pytest.fixture
def board(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNE_STATE_DIR", str(tmp_path / "state"))
    return make_fake_board(tmp_path / "board", "orin-nano", "l4t36", seed=1).install(monkeypatch)


def jetson(board) -> JetsonDevice:
    return JetsonDevice("orin-nano", name="orin-nano", sysfs_root=board.root, nvpmodel=str(board.nvpmodel))


def other_config(dev: JetsonDevice, mode: str = "7W") -> Config:
    default = dev.space().default_config(8)
    return Config(knobs={**default.knobs, "nvpmodel": mode, "gpu_mhz": 318.75}, batch_size=8)


def switching(board) -> JetsonDevice:
    """A device that may enter 7W, whose TPC mask is not 15W's: named (as --modes names it) before any GPU
    context exists, so nvpmodel switches back without a reboot (tests/fakes/fakeboard.py, golden context)."""
    assert not board.has_gpu_context()
    return every_mode(jetson(board))


@pytest.mark.parametrize("sig", SIGNALS, ids=[s.name for s in SIGNALS])
def test_each_signal_mid_session_restores_the_board_byte_identical(board, sig):
    original = board.snapshot()
    dev = switching(board)
    with pytest.raises(Terminated) as caught:
        with hardware_session(dev):
            dev.apply(other_config(dev))
            assert board.snapshot() != original
            os.kill(os.getpid(), sig)  # recorded, not raised: the hold is between safe points
            interrupts.check()
    assert caught.value.signum == sig
    assert board.snapshot() == original and pending_journals() == []


@pytest.mark.parametrize("sig", SIGNALS, ids=[s.name for s in SIGNALS])
def test_each_signal_during_an_apply_puts_back_what_was_there(board, sig):
    original = board.snapshot()
    dev = switching(board)
    with pytest.raises(Terminated):
        with deployment(dev):
            dev.apply(other_config(dev))
            os.kill(os.getpid(), sig)
    assert board.snapshot() == original and pending_journals() == []


def _export(path: Path, dev: JetsonDevice) -> Path:
    config = other_config(dev, "15W")  # tune apply refuses a mode of another TPC mask (7W) before any write
    data = board_export(
        config.knobs, model="tiny-cnn", batch_size=config.batch_size, device="orin-nano", device_kind="orin-nano"
    )
    path.write_text(yaml.safe_dump(data))
    os.chmod(path, 0o600)
    return path


@pytest.mark.parametrize("sig", SIGNALS, ids=[s.name for s in SIGNALS])
def test_a_signal_right_after_applys_writes_says_the_mode_stays_and_how_to_undo(board, tmp_path, monkeypatch, sig):
    import tuner.cli.deploy as deploy_cli

    original = board.snapshot()
    best = _export(tmp_path / "best.yaml", jetson(board))
    real = deploy_cli.apply_export

    def apply_then_signal(*args, **kwargs):
        steps = real(*args, **kwargs)
        os.kill(os.getpid(), sig)  # after the writes, before the command returns
        return steps

    monkeypatch.setattr(deploy_cli, "apply_export", apply_then_signal)
    handlers = {s: signal.getsignal(s) for s in interrupts.SIGNALS}
    try:
        code, _, err = in_process("apply", str(best))
    finally:
        for s, handler in handlers.items():
            signal.signal(s, handler)
    last = err.strip().splitlines()[-1]
    assert code == 128 + sig, err
    assert last.startswith(f"{ENDINGS[sig]}: ") and "no hardware was changed" not in last, err
    assert "orin-nano keeps the mode applied" in last and "tune restore --device orin-nano" in last
    assert board.snapshot() != original and len(pending_journals()) == 1  # applied to stay; the journal undoes it


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGQUIT], ids=["SIGHUP", "SIGQUIT"])
def test_tune_run_hung_up_mid_trial_restores_the_board_and_says_so(board, tmp_path, sig):
    original = board.snapshot()
    marker, release = tmp_path / "measuring", tmp_path / "release"
    env = {**os.environ, "RUN_MARKER": str(marker), "RUN_RELEASE": str(release), "PYTHONPATH": str(REPO)}
    args = [*tiny_run(), "--trials", "2", "--seed", "0", "--out", str(tmp_path / "s")]
    proc = subprocess.Popen(
        [sys.executable, str(SUPPORT / "blocking_run.py"), *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_while_running(marker.exists, proc)
        assert board.snapshot() != original
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        release.write_text("go")
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + sig, err
    assert err.strip().splitlines()[-1] == f"{ENDINGS[sig]}: hardware state restored (orin-nano)", err
    assert board.snapshot() == original and pending_journals() == []
