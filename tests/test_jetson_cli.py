"""A new user's session against a fake AGX Orin, through the CLI: run, export, apply, restore, crashes."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml
from clirun import run_cli
from fakeboard import make_fake_board

pytest.importorskip("torch")
pytest.importorskip("mlperf_loadgen")


@pytest.fixture
def board(tmp_path, monkeypatch):
    fake = make_fake_board(tmp_path / "board", "orin-agx", "l4t36", seed=1)
    for key, value in fake.env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("TUNE_TORCH_DEVICE", "cpu")
    return fake


RUN = (
    "run",
    "--model",
    "tiny-cnn",
    "--device",
    "orin",
    "--max-latency",
    "500ms",
    "--knobs",
    "nvpmodel,gpu_mhz",
    "--batch-sizes",
    "1,4",
    "--sampler",
    "random",
    "--window",
    "1",
    "--seed",
    "0",
)


def test_run_export_apply_restore(board, tmp_path):
    original = board.snapshot()
    out = tmp_path / "studies"
    r = run_cli(*RUN, "--trials", "3", "--out", str(out), "--json")
    assert r.returncode == 0, r.stderr
    payload = json.loads(r.stdout)
    assert payload["measured"] == 3 and payload["twin"] is False
    assert payload["best"]["meter"] == "ina3221"
    assert board.snapshot() == original  # the study restored the board

    best = tmp_path / "best.yaml"
    r = run_cli(
        "export",
        "--model",
        "tiny-cnn",
        "--device",
        "orin",
        "--max-latency",
        "500ms",
        "-o",
        str(best),
        "--out",
        str(out),
    )
    assert r.returncode == 0, r.stderr
    data = yaml.safe_load(best.read_text())
    data["knobs"].update({"nvpmodel": "15W", "gpu_mhz": 318.75})  # a mode that surely differs from the board's
    best.write_text(yaml.safe_dump(data))

    r = run_cli("apply", str(best), "--dry-run")
    assert r.returncode == 0, r.stderr
    assert f"would write: {board.nvpmodel} -m 1" in r.stdout
    assert board.snapshot() == original

    r = run_cli("apply", str(best))
    assert r.returncode == 0, r.stderr
    assert board.mode_id() == 1
    assert int((board.gpu_dir / "max_freq").read_text()) == 318750000
    again = run_cli("apply", str(best))
    assert again.returncode == 0 and "already runs this configuration" in again.stdout

    r = run_cli("restore", "--device", "orin")
    assert r.returncode == 0 and "restored: orin" in r.stdout
    assert board.snapshot() == original
    assert "nothing to restore" in run_cli("restore").stdout


def test_unsupported_frequency_in_an_export_writes_nothing(board, tmp_path):
    original = board.snapshot()
    best = tmp_path / "best.yaml"
    best.write_text(
        yaml.safe_dump(
            {
                "version": 1,
                "device_kind": "orin-agx",
                "device": "orin",
                "twin": False,
                "model": "resnet50",
                "batch_size": 8,
                "knobs": {"nvpmodel": "MAXN", "gpu_mhz": 1236.75, "emc_mhz": 3199, "cpu_cores": 12, "cpu_mhz": 2201.6},
                "max_latency_ms": 50.0,
                "percentile": "p99",
                "metrics": {},
                "provenance": {"study": "s", "storage": "x", "trial": 0, "exported_at": "now"},
            }
        )
    )
    r = run_cli("apply", str(best))
    assert r.returncode == 2
    assert "gpu_mhz=1236.75 is not supported" in r.stderr and "Traceback" not in r.stderr
    assert board.snapshot() == original
    best.write_text("version: 1\ndevice_kind: [broken")
    r = run_cli("apply", str(best))
    assert r.returncode == 2 and "not valid YAML" in r.stderr
    assert board.snapshot() == original


def start_run(tmp_path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "tuner", *RUN, "--trials", "2", "--window", "20", "--out", str(tmp_path / "s")]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_until_applied(board, original, proc, timeout=90.0) -> None:
    """Until the first trial has written to the board (the journal was written before)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        if board.snapshot() != original:
            return
        time.sleep(0.2)
    raise AssertionError("the run never changed the board")


LOST_SIGNAL = pytest.mark.xfail(
    reason="open bug: in some clean-clone CI runs a SIGINT or SIGTERM sent just after the first board write "
    "was lost and the run went on to finish (the board was still restored at its end); SIGKILL always passes",
    strict=False,
)


@pytest.mark.parametrize(
    "sig",
    [signal.SIGKILL, pytest.param(signal.SIGTERM, marks=LOST_SIGNAL), pytest.param(signal.SIGINT, marks=LOST_SIGNAL)],
)
def test_killed_mid_trial_and_the_board_comes_back_byte_for_byte(board, tmp_path, sig):
    original = board.snapshot()
    proc = start_run(tmp_path)
    wait_until_applied(board, original, proc)
    os.kill(proc.pid, sig)
    proc.wait(timeout=180)  # generous: CI machines are shared; a clean exit is seconds
    if sig == signal.SIGKILL:
        assert board.snapshot() != original  # nobody restored it: the journal must
        r = run_cli("restore")
        assert r.returncode == 0 and "restored: orin" in r.stdout
    else:
        assert proc.returncode != 0
    assert board.snapshot() == original


def test_devices_finds_the_board(board):
    r = run_cli("devices", "--json")
    boards = [d for d in json.loads(r.stdout)["devices"] if not d["twin"] and d["kind"] == "orin-agx"]
    assert [d["name"] for d in boards] == ["orin"]
