"""tune govern against a fake AGX Orin: switches, journal, restore on SIGTERM / SIGINT / kill -9, bad input."""

import json
import os
import signal
import subprocess
import sys

import pytest
from clirun import in_process, run_cli, wait_while_running
from fakeboard import make_fake_board
from policies import two_band_policy

from tuner.serve.policy import write_policy


@pytest.fixture
def board(tmp_path, monkeypatch):
    # MAXN: its TPC mask is 50W's too, so the governor can switch between them without a reboot
    return make_fake_board(tmp_path / "board", "orin-agx", "l4t36", seed=1, start="MAXN").install(monkeypatch)


def board_policy(path, kind="orin-agx", model="resnet50"):
    """Two bands the fake board supports: 50W below 100 q/s, MAXN above (one TPC mask)."""
    from tuner.devices.registry import open_device

    space = open_device("orin").space()
    policy = two_band_policy(space, model=model, device="orin", device_kind=kind, twin=False, low_mode="50W")
    write_policy(policy, path)
    return policy


def set_rate(path, text):
    """Replace the rate file atomically, as docs/serve.md asks of a server: no read can find it empty.

    An in-place rewrite is read again when found empty (tuner/serve/rates.py), but
    a writer descheduled for longer than the retries on a loaded machine would
    still send the governor to its safe band: the switch this test checks.
    """
    scratch = path.with_suffix(".new")
    scratch.write_text(text)
    os.replace(scratch, path)


def start(tmp_path, policy, rate, *extra):
    cmd = [sys.executable, "-m", "tuner", "govern", str(policy), "--device", "orin", "--rate-source", str(rate)]
    cmd += ["--interval", "0.05", "--min-dwell", "0", "--log", str(tmp_path / "switches.jsonl"), *extra]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow  # signals delivered to tune govern subprocesses
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL, signal.SIGHUP, signal.SIGQUIT])
def test_governor_follows_the_rate_and_the_board_comes_back_however_it_ends(board, tmp_path, sig):
    original = board.snapshot()
    policy, rate = tmp_path / "policy.yaml", tmp_path / "rate"
    board_policy(policy)
    rate.write_text("50\n")
    proc = start(tmp_path, policy, rate, "--state-file", str(tmp_path / "state.json"))
    state = tmp_path / "state.json"
    # band 0: 50W
    wait_while_running(lambda: state.exists() and json.loads(state.read_text())["band"] == 0, proc, timeout=90)
    wait_while_running(lambda: board.snapshot() != original, proc, timeout=90)
    low = board.snapshot()
    set_rate(rate, "250\n")
    wait_while_running(lambda: json.loads(state.read_text())["band"] == 1, proc, timeout=90)
    wait_while_running(lambda: board.snapshot() != low, proc, timeout=90)
    os.kill(proc.pid, sig)
    proc.wait(timeout=60)
    switches = [json.loads(line) for line in (tmp_path / "switches.jsonl").read_text().splitlines()]
    assert [(s["from_band"], s["to_band"]) for s in switches[:2]] == [(None, 0), (0, 1)]
    assert switches[1]["rate_qps"] == 250 and switches[1]["applied"]
    if sig == signal.SIGKILL:
        assert board.snapshot() != original  # nobody restored it: the journal must
        r = run_cli("restore")
        assert r.returncode == 0 and "restored: orin" in r.stdout
    else:
        assert proc.returncode == 128 + sig  # SIGHUP and SIGQUIT end it, restored, like SIGTERM
    assert board.snapshot() == original


def test_observe_only_prints_what_it_would_do_and_writes_nothing(board, tmp_path):
    original = board.snapshot()
    policy, rate = tmp_path / "policy.yaml", tmp_path / "rate"
    board_policy(policy)
    rate.write_text("50\n")
    r = run_cli(
        "govern", str(policy), "--device", "orin", "--rate-source", f"file:{rate}", "--observe-only",
        "--interval", "0.05", "--duration", "0.3",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "would switch at rate 50 q/s: start -> band 0" in r.stdout
    assert board.snapshot() == original


def test_bad_input_is_one_line_exit_2_and_the_board_untouched(board, tmp_path):
    original = board.snapshot()
    rate = tmp_path / "rate"
    rate.write_text("50\n")
    other = tmp_path / "h200.yaml"
    board_policy(other, kind="h200")
    mine = tmp_path / "policy.yaml"
    board_policy(mine)
    cases = [
        (("govern", str(other), "--device", "orin", "--rate-source", str(rate)), "for h200, but the device is"),
        (
            ("govern", str(mine), "--device", "orin", "--rate-source", str(rate), "--model", "bert-base"),
            "not bert-base",
        ),
        (("govern", str(mine), "--device", "orin", "--rate-source", str(tmp_path / "none")), "unreadable rate source"),
        (("govern", str(tmp_path / "missing.yaml"), "--device", "orin", "--rate-source", str(rate)), "cannot read"),
        (("govern", str(mine), "--device", "orin", "--rate-source", str(rate), "--smoothing", "-1"), "--smoothing"),
    ]
    for i, (args, message) in enumerate(cases):
        if i == 0:  # as a user's shell runs it; the rest in-process (the message and the board are the point)
            r = run_cli(*args)
            code, err = r.returncode, r.stderr
        else:
            code, _, err = in_process(*args)
        assert code == 2, (args, err)
        errors = [line for line in err.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and message in errors[0] and "Traceback" not in err
    assert board.snapshot() == original
