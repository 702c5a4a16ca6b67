"""The search benchmark and what it measures: strategies through run_study, scored against the noise-free sweep."""

import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import optuna
import pytest
from clirun import in_process, run_cli, wait_while_running
from locations import REPO, SUPPORT

import tuner.bench
from tuner.bench import (
    BenchSettings,
    build_landscapes,
    markdown,
    quick_settings,
    run_bench,
    run_one,
    text_rows,
)
from tuner.devices.virtual.twin import TwinDevice
from tuner.errors import Terminated, UserError
from tuner.measure.settings import WindowSettings
from tuner.plumbing import interrupts
from tuner.records import recommended
from tuner.run_options import RunOptions
from tuner.sampling import make_sampler
from tuner.study import MEMORY_STORAGE, run_study

SMALL = BenchSettings(
    devices=["sim:orin-nano"],
    models=["mobilenet_v2"],
    bounds=["tight", "loose"],
    strategies=["learned"],
    seeds=1,
    tune_boards=[],
    judge_boards=[],
)


def test_landscapes_are_feasible_and_ordered_by_bound():
    tight, loose = build_landscapes(SMALL)
    assert tight.max_latency_ms < loose.max_latency_ms
    assert 0 < tight.feasible_fraction < loose.feasible_fraction < 1
    assert tight.optimum_j >= loose.optimum_j


def test_unknown_bound_and_strategy_are_user_errors():
    with pytest.raises(UserError, match="unknown bound"):
        build_landscapes(SMALL.model_copy(update={"bounds": ["snug"]}))
    with pytest.raises(UserError, match="unknown strategy"):
        run_bench(SMALL.model_copy(update={"strategies": ["magic"]}))


def test_run_is_scored_by_true_energy_and_reaches_the_optimum():
    """The learned strategy on the Orin Nano twin (loose bound): reaches 5% within 12 trials; the curve is monotone.

    Not the tight bound: with 5% of that space feasible, 1 seed in 4 reaches 5% within 12 trials (seeds 0-3)."""
    landscape = build_landscapes(SMALL)[1]
    result = run_one(landscape, 0, "learned", 0, 12, "p99")
    assert result.measured == 12
    assert result.reach["5%"] is not None and result.reach["5%"] <= 12
    assert result.reach["2%"] is None or result.reach["2%"] >= result.reach["5%"]
    assert result.final_regret is not None and result.final_regret < 0.05
    assert 0 <= result.violation <= 1


def test_quick_bench_reports_twins_tuning_and_judged_boards_separately():
    stages = []
    report = run_bench(
        quick_settings(devices=["sim:orin-nano"], strategies=["random", "learned"]),
        progress=lambda done, total, stage: stages.append(stage),
    )
    assert {row["strategy"] for row in report.summary} == {"random", "learned"}
    scopes = {row["scope"] for row in report.summary}
    assert scopes == {"twins", "tune boards", "judge boards"}  # one twin: no row of its own repeating the suite's
    assert [land.device for land in report.landscapes if land.suite == "judge boards"] == ["gen:1001"]
    assert stages[0] == "sweeps" and stages[-1] == "runs"
    table = markdown(report)
    assert "| learned | judge boards | 1 |" in table and "| learned | twins | 1 |" in table
    # 12 trials: no regret after 20 or 40 trials is claimed ("no feasible" would say none met the bound)
    assert all(math.isnan(row["regret@20"]) and math.isnan(row["regret@40"]) for row in report.summary)
    assert all(line.count("| - | - |") == 1 for line in table.splitlines() if line.startswith("| learned "))
    columns, rows = text_rows(report)
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(columns)]
    assert sum(widths) + 2 * (len(columns) - 1) <= 80  # the terminal table (compact: two spaces between columns)


@pytest.mark.parametrize("sampler", ["learned", "tpe", "random"])
def test_the_best_is_judged_on_the_mean_of_its_confirmed_windows(sampler):
    """Every strategy's answer is the mean of its windows, with a noise margin on its constraint.

    Two or three windows for Optuna's samplers; the learned strategy confirms only close calls, so its answer
    may be a clear win's one window (with that window's margin). 12 trials: by then each strategy has confirmed
    its best (seed 3); more trials only cost time."""
    dev = TwinDevice("sim:orin")
    options = RunOptions(
        model="resnet50", max_latency_ms=60, trials=12, seed=3, sampler=sampler, storage=MEMORY_STORAGE
    )
    study, summary = run_study(dev, options)
    assert summary.measured == 12
    best = recommended(study)
    windows = best.user_attrs["windows"]
    assert best.user_attrs["measurements"] == len(windows) >= (1 if sampler == "learned" else 2)
    assert best.user_attrs["latency_margin"] > 0
    # all its windows' energy over all their queries
    assert best.value == pytest.approx(sum(w["energy_j"] for w in windows) / sum(w["queries"] for w in windows))
    assert best.value == pytest.approx(best.user_attrs["avg_w"] / best.user_attrs["qps"])
    mean_p99 = sum(w["p99_ms"] for w in windows) / len(windows)
    assert best.constraints["latency"] == pytest.approx(mean_p99 * (1 + best.user_attrs["latency_margin"]) - 60)
    assert best.constraints["latency"] > mean_p99 - 60


@pytest.mark.slow  # tune run subprocesses
def test_tune_run_with_another_sampler_reports_optunas_best(tmp_path):
    """`tune run --sampler tpe` reports the trial Optuna names best, a confirmed one."""
    r = run_cli(
        *("run", "--model", "resnet50", "--device", "sim:orin", "--max-latency", "60ms", "--trials", "24"),
        *("--sampler", "tpe", "--seed", "3", "--out", str(tmp_path), "--json"),
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    study = optuna.load_study(study_name=out["study"], storage=f"sqlite:///{tmp_path}/tune.db")
    assert out["measured"] == 24 and out["best_trial"] == study.best_trial.number
    assert out["best"]["feasible"] and out["best"]["windows"] >= 2


def test_every_strategy_is_a_sampler_choice():
    for name in ("learned", "gp", "tpe", "random", "two-phase"):
        assert make_sampler(name, 0) is not None


def test_tune_bench_quick_cli(tmp_path):
    """The old name of the default strategy (``ours``) still runs, reported under its current name.

    In-process: test_plugins.py runs tune bench as a process."""
    code, out, err = in_process(
        "bench", "--quick", "--devices", "sim:orin-nano", "--sampler", "tpe,ours", "--out", str(tmp_path), "--json"
    )
    assert code == 0, err
    payload = json.loads(out)
    assert payload["runs"] == 2
    assert {row["strategy"] for row in payload["summary"]} == {"tpe", "learned"}
    saved = json.loads((tmp_path / "bench" / "search.json").read_text())
    assert saved["version"] == 1 and len(saved["runs"]) == 2
    assert all(not math.isnan(row["violation"]) for row in payload["summary"])


def test_bench_defaults_to_samplers_the_install_can_run(monkeypatch):
    """The core install has no PyTorch: the default strategies leave gp out, and asking for gp fails at once."""
    import tuner.strategies.base

    monkeypatch.setattr(tuner.strategies.base, "has_torch", lambda: False)
    monkeypatch.setattr(tuner.sampling, "has_torch", lambda: False)
    assert "gp" not in quick_settings().strategies and "tpe" in quick_settings().strategies
    with pytest.raises(UserError, match="needs PyTorch"):
        run_bench(SMALL.model_copy(update={"strategies": ["gp"]}))


def test_generated_boards_are_seeded_plausible_devices():
    from tuner.devices.registry import open_device
    from tuner.devices.virtual.generated import GeneratedBoard, board_seeds

    a, b = open_device("gen:1003"), GeneratedBoard("gen:1003")
    assert a.space() == b.space() and a.describe()["twin"] is True
    assert 1_000 <= a.size <= 50_000 and 2 <= len(a.space().knobs) <= 6
    grid = a.space().grid()
    assert len(grid) == a.size
    rows = a.measure_many("wl-mlp", grid, WindowSettings(noise=False))
    assert all(m.j_per_query > 0 and m.p99_ms > m.p50_ms for m in rows)
    noisy = [a.measure("wl-mlp", grid[0], WindowSettings(seed=s)).p50_ms for s in range(20)]
    spread = np.std(noisy) / np.mean(noisy)
    assert 0.005 < spread < 0.04
    assert board_seeds("0-2,7") == [0, 1, 2, 7]
    with pytest.raises(UserError, match="gen:SEED"):
        GeneratedBoard("gen:x")


def test_a_generated_board_runs_once_per_board_run_each_at_its_own_seed():
    settings = BenchSettings(
        devices=["sim:orin-nano"],
        models=["mobilenet_v2"],
        bounds=["loose"],
        strategies=["random"],
        seeds=1,
        board_runs=3,
        trials=3,
        random_trials=3,
        jobs=1,
        tune_boards=[0],
        judge_boards=[],
    )
    report = run_bench(settings)
    by_suite = {}
    for run in report.runs:
        by_suite.setdefault(report.landscapes[run.landscape].suite, []).append(run.seed)
    assert sorted(by_suite["tune boards"]) == [0, 1, 2] and by_suite["twins"] == [0]
    assert next(r for r in report.summary if r["scope"] == "tune boards")["runs"] == 3


SIGNALLED = BenchSettings(
    devices=["sim:orin-nano"],
    models=["mobilenet_v2"],
    bounds=["loose"],
    strategies=["random"],
    seeds=3,
    trials=3,
    random_trials=3,
    tune_boards=[0],
    judge_boards=[],
)


@pytest.mark.parametrize(
    ("stage", "jobs"), [("sweeps", 1), ("runs", 1), ("runs", 2)], ids=["sweeps", "runs", "runs-in-a-pool"]
)
def test_a_signal_ends_the_bench_before_its_next_sweep_or_run(stage, jobs, monkeypatch):
    """Recorded (as tune bench holds signals), a SIGTERM ends the benchmark before its next sweep or run starts."""
    seen, started = [], []
    for name in ("_landscapes", "run_one"):  # in this process: the sweeps, and the runs without a pool
        original = getattr(tuner.bench, name)
        monkeypatch.setattr(tuner.bench, name, lambda *a, _o=original, _n=name: started.append(_n) or _o(*a))

    def progress(done: int, total: int, at: str) -> None:
        seen.append((at, done))
        if at == stage and done == 1:
            os.kill(os.getpid(), signal.SIGTERM)

    with pytest.raises(Terminated), interrupts.held():
        run_bench(SIGNALLED.model_copy(update={"jobs": jobs}), progress)
    assert seen[-1] == (stage, 1), seen
    if stage == "sweeps":
        assert started == ["_landscapes"]
    elif jobs == 1:
        assert started.count("run_one") == 1, started


@pytest.mark.parametrize(("stage", "jobs"), [("sweeps", 1), ("runs", 2)], ids=["sweeps", "runs-in-a-pool"])
def test_run_bench_holds_signals_itself_when_its_caller_does_not(stage, jobs):
    """A library caller (benchmarks/search.py) holds nothing: Ctrl-C is still recorded, not raised where it lands,
    and ends the benchmark at its next safe point."""
    returned = []

    def progress(done: int, total: int, at: str) -> None:
        if at == stage and done == 1:
            os.kill(os.getpid(), signal.SIGINT)
            returned.append(at)  # reached only if the signal was recorded rather than raised here

    with pytest.raises(KeyboardInterrupt):
        run_bench(SIGNALLED.model_copy(update={"jobs": jobs}), progress)
    assert returned == [stage]


def _children(pid: int) -> set[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return {int(c) for c in path.read_text().split()} if path.exists() else set()


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.mark.slow
@pytest.mark.parametrize(
    "args",
    [
        ["--quick"],
        [
            *("--devices", "sim:orin-nano", "--models", "resnet50", "--bounds", "medium", "--strategies", "random"),
            *("--seeds", "4", "--trials", "6", "--random-trials", "6", "--jobs", "2"),
        ],
    ],
    ids=["quick", "two-workers"],
)
def test_sigterm_ends_tune_bench_with_143_and_says_nothing_was_changed(tmp_path, args):
    """SIGTERM once a run is measuring: exit code 143 and the one line, no results, no worker left behind.

    The runs' windows wait for a file the test never writes before the signal
    (tests/support/blocking_bench.py), so only the signal can end the command; nothing
    is timed (the timeouts only bound a hung test)."""
    marker, release = tmp_path / "measuring", tmp_path / "release"
    env = {**os.environ, "BENCH_MARKER": str(marker), "BENCH_RELEASE": str(release), "PYTHONPATH": str(REPO)}
    stdout, stderr = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    with stdout.open("w") as out, stderr.open("w") as err:
        proc = subprocess.Popen(
            [sys.executable, str(SUPPORT / "blocking_bench.py"), "bench", *args, "--out", str(tmp_path / "results")],
            env=env,
            stdout=out,
            stderr=err,
        )
    try:
        wait_while_running(marker.exists, proc, timeout=300)
        workers = _children(proc.pid)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=300)
    finally:
        release.write_text("go")
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    said = stderr.read_text()
    assert proc.returncode == 128 + signal.SIGTERM, said
    assert said.strip().splitlines()[-1] == "terminated: no hardware was changed", said
    assert "bench: sweeps" in said and "Traceback" not in said and stdout.read_text() == ""
    assert not (tmp_path / "results" / "bench").exists()
    assert all(_gone(pid) for pid in workers), workers


def test_a_pool_worker_ignores_what_a_terminal_sends_its_group_and_dies_on_the_rest():
    # Run in a child: the worker's dispositions would otherwise replace this test process's own.
    probe = (
        "import signal; from tuner import bench; bench._worker(); "
        "print(*(signal.getsignal(s) is signal.SIG_IGN for s in "
        "(signal.SIGINT, signal.SIGQUIT, signal.SIGTERM, signal.SIGHUP)))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["True", "True", "False", "False"]
