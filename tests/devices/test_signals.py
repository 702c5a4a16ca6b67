"""Signals, one tuner per device, and journals nobody else can subvert (issue 10 items 1-3, 5, 8, 13, 14)."""

import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import optuna
import pytest
from clirun import run_cli, wait_while_running
from fakeboard import every_mode, make_fake_board, tiny_run
from journals import pending_journals
from locations import FAKES, REPO, SUPPORT

from tuner.devices.hardware_session import deployment, hardware_session, hold, restore_device
from tuner.devices.jetson import JetsonDevice
from tuner.devices.journal import journal_path, lock_path, state_dir
from tuner.devices.virtual.twin import TwinDevice
from tuner.errors import Terminated, UserError
from tuner.plumbing import atomicfile, interrupts
from tuner.space import Config
from tuner.study import RunOptions, run_study

pytestmark = pytest.mark.slow  # signals delivered to tune subprocesses


@pytest.fixture
def board(tmp_path, monkeypatch):
    return make_fake_board(tmp_path / "board", "orin-nano", "l4t36", seed=1).install(monkeypatch)


def jetson(board) -> JetsonDevice:
    return JetsonDevice("orin-nano", name="orin-nano", sysfs_root=board.root, nvpmodel=str(board.nvpmodel))


@pytest.fixture
def sigint_ignored():
    """As in a process started in the background by a non-interactive shell."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    yield
    signal.signal(signal.SIGINT, previous)


# -- handlers only record; safe points raise ------------------------------------


def test_a_signal_inside_held_is_recorded_and_raised_when_it_ends(sigint_ignored):
    went_on = False
    with pytest.raises(KeyboardInterrupt):
        with interrupts.held():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.01)  # the handler has run: nothing was raised here
            went_on = True
            assert interrupts.pending() == signal.SIGINT
    assert went_on
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN  # the inherited disposition is back


def test_sigterm_becomes_terminated_at_the_next_safe_point():
    reached = []
    with pytest.raises(Terminated):
        with interrupts.held():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.01)
            reached.append("before")
            interrupts.check()
            reached.append("after")
    assert reached == ["before"]
    assert interrupts.last_signal() == signal.SIGTERM


def test_an_error_caused_by_the_signal_unwinds_as_the_signal():
    with pytest.raises(KeyboardInterrupt) as info:
        with interrupts.held():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.01)
            raise RuntimeError("nvpmodel exited -2")  # the child died of the same Ctrl-C
    assert isinstance(info.value.__cause__, RuntimeError)


def test_a_second_signal_raises_at_once_but_never_during_a_restore():
    with pytest.raises(KeyboardInterrupt):
        with interrupts.held():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.01)
            with interrupts.restoring():
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.01)  # recorded only: a restore is never cut short
            with pytest.raises(KeyboardInterrupt):
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.01)
            raise KeyboardInterrupt


# -- one tuner per device ---------------------------------------------------------


def test_a_lock_left_by_a_killed_holder_is_taken_over(board, tmp_path):
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time\n"
            "from tuner.devices.lock import device_lock\n"
            "from tuner.devices.journal import journal_dir, lock_path\n"
            "journal_dir()\n"
            "with device_lock(lock_path('orin-nano'), 'orin-nano'):\n"
            "    print('held', flush=True)\n"
            "    time.sleep(120)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert holder.stdout.readline().strip() == "held"
    dev = jetson(board)
    with pytest.raises(UserError, match=rf"orin-nano is in use by PID {holder.pid} \("):
        with hold(dev):
            pass
    holder.kill()
    holder.wait()
    assert json.loads(lock_path("orin-nano").read_text())["pid"] == holder.pid  # stale: its holder is dead
    with hold(dev):
        assert json.loads(lock_path("orin-nano").read_text())["pid"] == os.getpid()


def test_a_second_run_on_a_board_being_tuned_refuses_and_the_first_restores(board, tmp_path):
    original = board.snapshot()
    marker, release = tmp_path / "measuring", tmp_path / "release"
    env = {**os.environ, "RUN_MARKER": str(marker), "RUN_RELEASE": str(release), "PYTHONPATH": str(REPO)}
    args = [*tiny_run(), "--trials", "2", "--seed", "0", "--out", str(tmp_path / "s")]
    first = subprocess.Popen(
        [sys.executable, str(SUPPORT / "blocking_run.py"), *args, "--json"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_while_running(marker.exists, first)
        during = board.snapshot()
        assert during != original  # the first run has applied its first configuration
        second = run_cli(*args, "--out", str(tmp_path / "s2"))
        assert second.returncode == 2
        lines = [line for line in second.stderr.strip().splitlines() if not line.startswith("note: ")]
        assert len(lines) == 1 and f"PID {first.pid}" in lines[0] and "tune run --model tiny-cnn" in lines[0]
        restore = run_cli("restore")
        assert restore.returncode == 2 and f"PID {first.pid}" in restore.stderr
        assert board.snapshot() == during  # neither touched the board under the first run
        assert not (tmp_path / "s2").exists()
        release.write_text("go")
        out, err = first.communicate(timeout=120)
    finally:
        release.write_text("go")
        if first.poll() is None:
            first.kill()
    assert first.returncode == 0, err
    assert json.loads(out)["measured"] == 2
    assert board.snapshot() == original
    assert pending_journals() == []


# -- the journal: private, never through a link, only to its own board ----------------


def test_journal_files_are_private_and_a_planted_tmp_link_is_never_followed(board, tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    folder = journal_path("orin-nano").parent
    folder.mkdir(parents=True)
    (folder / "orin-nano.tmp").symlink_to(victim)
    (folder / ".orin-nano.tmp").symlink_to(victim)
    dev = jetson(board)
    with hardware_session(dev):
        info = os.lstat(journal_path("orin-nano"))
        assert stat.S_ISREG(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o600
        assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    assert victim.read_text() == "precious\n"
    assert pending_journals() == []


def restore_cli(*extra: str) -> subprocess.CompletedProcess:
    return run_cli("restore", *extra)


def one_line_error(r: subprocess.CompletedProcess) -> str:
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = [line for line in r.stderr.strip().splitlines() if not line.startswith("note: ")]  # board notes
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    return lines[0]


def test_restore_never_loads_a_plugin_that_a_journal_names(board, tmp_path):
    (tmp_path / "evil.py").write_text(
        f"from pathlib import Path\nPath({str(tmp_path / 'pwned')!r}).write_text('ran')\nDevice = None\n"
    )
    write_journal_file("py:evil:Device", "orin-nano", {"version": 1})
    original = board.snapshot()
    r = run_cli("restore", env={"PYTHONPATH": f"{tmp_path}:{REPO}"})
    line = one_line_error(r)
    assert "py:evil:Device" in line and "not a built-in board or GPU" in line
    assert not (tmp_path / "pwned").exists()
    assert board.snapshot() == original


def write_journal_file(device: str, kind: str, state: dict, name: str | None = None) -> Path:
    path = journal_path(name or device)
    path.parent.mkdir(parents=True, exist_ok=True)
    entry = {"version": 1, "device": device, "kind": kind, "pid": 1, "written_at": 0.0, "state": state}
    path.write_text(json.dumps(entry))
    return path


def test_path_traversal_in_a_journal_changes_nothing_outside_the_board(board, tmp_path):
    elsewhere = make_fake_board(tmp_path / "elsewhere", "orin-nano", "l4t36", seed=2)
    victim = tmp_path / "victim"
    victim.write_text("1\n")
    outside = {"elsewhere": elsewhere.snapshot(), "victim": victim.read_bytes()}
    original = board.snapshot()
    state = jetson(board).read_state()
    state["sysfs_root"] = str(elsewhere.root)
    state["online"]["../../../../../../victim"] = "0"
    path = write_journal_file("orin-nano", "orin-nano", state)
    line = one_line_error(restore_cli())
    assert str(path) in line
    assert {"elsewhere": elsewhere.snapshot(), "victim": victim.read_bytes()} == outside
    assert board.snapshot() == original
    renamed = write_journal_file("../../victim", "orin-nano", jetson(board).read_state(), name="orin-nano")
    assert "not the one it is filed for" in one_line_error(restore_cli())
    assert victim.read_bytes() == outside["victim"] and renamed.exists()


def test_a_journal_that_is_a_link_or_corrupt_is_one_line_naming_the_file(board, tmp_path):
    original = board.snapshot()
    target = tmp_path / "elsewhere.json"
    target.write_text("{}")
    path = journal_path("orin-nano")
    path.parent.mkdir(parents=True)
    path.symlink_to(target)
    with pytest.raises(UserError, match=f"cannot read journal {path}"):
        restore_device(jetson(board))
    path.unlink()
    path.write_text('{"version": 1, "device": "orin", "kind"')
    line = one_line_error(restore_cli())
    assert f"journal {path} is corrupt" in line and "remove it" in line
    r = run_cli(
        "run", "--model", "tiny-cnn", "--device", "orin-nano", "--max-latency", "500ms", "--out", str(tmp_path / "s")
    )
    assert f"journal {path} is corrupt" in one_line_error(r)
    assert board.snapshot() == original


# -- twins: signals, honest messages, the results of completed trials -------------


def test_sigterm_on_a_twin_run_ends_cleanly_and_keeps_the_completed_trials(tmp_path):
    marker = tmp_path / "parked"
    args = ["run", "--model", "resnet50", "--device", "sim:orin", "--max-latency", "50ms", "--trials", "20"]
    args += [
        "--knobs",
        "gpu_mhz",
        "--batch-sizes",
        "1,8",
        "--sampler",
        "random",
        "--seed",
        "1",
        "--out",
        str(tmp_path / "s"),
    ]
    env = {**os.environ, "FLEET_HANG_AFTER": "3", "FLEET_MARKER": str(marker), "PYTHONPATH": str(REPO)}
    worker = subprocess.Popen(
        [sys.executable, str(SUPPORT / "fleet_worker.py"), *args], env=env, stderr=subprocess.PIPE, text=True
    )
    wait_while_running(marker.exists, worker)
    worker.send_signal(signal.SIGTERM)
    _, err = worker.communicate(timeout=60)
    assert worker.returncode == 143
    assert "terminated: no hardware was changed" in err and "hardware state restored" not in err
    folder = tmp_path / "s" / "sim-orin" / "resnet50"
    pareto = json.loads((folder / "pareto.json").read_text())
    assert pareto["trials_completed"] == 3 and pareto["twin"] is True  # three configurations were measured
    study = optuna.load_study(study_name=pareto["study"], storage=f"sqlite:///{tmp_path / 's' / 'tune.db'}")
    states = [t.state for t in study.trials]
    assert states[-1] == optuna.trial.TrialState.FAIL and optuna.trial.TrialState.RUNNING not in states
    assert len((folder / "trials.csv").read_text().splitlines()) == 1 + len(states)
    assert not list(folder.glob(".*tmp*"))


def test_ctrl_c_between_twin_trials_writes_results_and_leaves_no_trial_running(tmp_path):
    def interrupt_after_two(study, trial, measured):
        if measured == 2:
            os.kill(os.getpid(), signal.SIGINT)

    written = []
    options = RunOptions(
        model="resnet50",
        max_latency_ms=50,
        trials=10,
        knobs=["gpu_mhz"],
        batch_sizes=[1, 8],
        sampler="random",
        seed=3,
        out=tmp_path,
    )
    with pytest.raises(KeyboardInterrupt):
        run_study(TwinDevice("sim:orin"), options, on_trial=interrupt_after_two, on_interrupt=written.append)
    (study,) = written
    states = [t.state for t in study.trials]
    assert states[-1] == optuna.trial.TrialState.COMPLETE and optuna.trial.TrialState.RUNNING not in states
    assert len({t.user_attrs["effective_key"] for t in study.trials}) == 2  # stopped after the second measurement


def test_ctrl_c_while_optuna_starts_a_heartbeat_neither_hangs_nor_leaves_the_trial_running(tmp_path, monkeypatch):
    from optuna.storages._heartbeat import HeartbeatThread

    start = HeartbeatThread.start

    def start_and_interrupt(self):
        os.kill(os.getpid(), signal.SIGINT)  # lands while Optuna sets the trial up
        start(self)

    monkeypatch.setattr(HeartbeatThread, "start", start_and_interrupt)
    options = RunOptions(
        model="resnet50",
        max_latency_ms=50,
        trials=5,
        knobs=["gpu_mhz"],
        batch_sizes=[1, 8],
        sampler="random",
        out=tmp_path,
        heartbeat_s=1,
    )
    with pytest.raises(KeyboardInterrupt):
        run_study(TwinDevice("sim:orin"), options)
    study = optuna.load_study(
        study_name=optuna.get_all_study_names(f"sqlite:///{tmp_path / 'tune.db'}")[0],
        storage=f"sqlite:///{tmp_path / 'tune.db'}",
    )
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.FAIL]
    beating = [
        t for t in threading.enumerate() if getattr(getattr(t, "_target", None), "__name__", "") == "_record_heartbeat"
    ]
    assert not beating


def test_an_interrupted_apply_puts_back_what_was_there(board):
    original = board.snapshot()
    # 7W gates other TPCs than 15W: named, as --modes names it, and entered before any GPU context exists,
    # so nvpmodel switches back to 15W without a reboot (the golden-context rule of tests/fakes/fakeboard.py)
    dev = every_mode(jetson(board))
    assert not board.has_gpu_context()
    default = dev.space().default_config(8)
    config = Config(knobs={**default.knobs, "nvpmodel": "7W", "gpu_mhz": 318.75}, batch_size=8)

    def apply_then_signal(c):
        JetsonDevice.apply(dev, c)
        os.kill(os.getpid(), signal.SIGTERM)

    dev.apply = apply_then_signal
    with pytest.raises(Terminated):
        with deployment(dev):
            dev.apply(config)
            assert board.snapshot() != original
    assert board.snapshot() == original
    assert pending_journals() == []
    assert stat.S_IMODE(os.stat(state_dir()).st_mode) == 0o700


# -- result files: whole or not at all ----------------------------------------------


def test_an_interrupted_result_write_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "pareto.json"
    target.write_text("old\n")
    with pytest.raises(Terminated):
        with atomicfile.replacing(target) as tmp:
            tmp.write_text("half")
            raise Terminated()
    assert target.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pareto.json"]
    atomicfile.write_text(target, "new\n")
    assert target.read_text() == "new\n" and stat.S_IMODE(target.stat().st_mode) == 0o666 & ~atomicfile._umask()


# -- signals at seeded random moments (the full 50 are benchmarks/signal_stress.py) -------------

MOMENTS = 6


def test_signals_at_random_moments_always_end_the_run_with_the_board_restored(tmp_path):
    """From a background shell (SIGINT inherited as ignored); a hang fails the test at its timeout."""
    driver = [sys.executable, str(SUPPORT / "signal_moments.py"), str(tmp_path / "board"), str(tmp_path / "s")]
    env = {**os.environ, "PYTHONPATH": f"{FAKES}:{SUPPORT}:{REPO}", "TUNE_STATE_DIR": str(tmp_path / "state")}
    proc = subprocess.run(
        ["sh", "-c", '"$@" & wait $!', "sh", *driver, str(MOMENTS), "7"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    first, *rows = [json.loads(line) for line in proc.stdout.splitlines()]
    assert first["sigint_ignored"]  # as inherited from the background shell
    assert len(rows) == MOMENTS
    for row in rows:
        assert row["outcome"] in ("interrupted", "late"), row
        assert row["restored"] and row["journals"] == 0 and row["running"] == 0, row
    assert any(row["outcome"] == "interrupted" for row in rows)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_a_signal_after_the_command_ended_exits_with_its_code_and_no_traceback(signum):
    # The command returns, then the signal lands while the interpreter shuts down (an atexit callback sends it):
    # delivered synchronously, so nothing here depends on timing.
    script = (
        "import atexit, os, sys, tuner.cli\n"
        "def command(argv=None):\n"
        "    print('done', flush=True)\n"
        f"    atexit.register(lambda: os.kill(os.getpid(), {int(signum)}))\n"
        "tuner.cli.main = command\n"
        "from tuner import launch\n"
        "sys.argv = ['tune', 'status']\n"
        "launch.main()\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 128 + signum
    assert done.stdout == "done\n" and "Traceback" not in done.stderr and "Exception ignored" not in done.stderr


def test_a_signal_as_the_command_returns_is_one_line_and_its_exit_code():
    # The signal lands in the CLI's last lines, after the command's own handling: it leaves cli.main as Terminated.
    script = (
        "import os, signal, sys, tuner.cli\n"
        "def command(argv=None):\n"
        "    print('done', flush=True)\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "tuner.cli.main = command\n"
        "from tuner import launch\n"
        "sys.argv = ['tune', 'status']\n"
        "launch.main()\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 128 + signal.SIGTERM and done.stdout == "done\n"
    assert done.stderr.strip() == "terminated: after the command had ended"
