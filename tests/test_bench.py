"""The search benchmark and what it measures: strategies through run_study, scored against the noise-free sweep."""

import json
import math

import numpy as np
import optuna
import pytest
from clirun import run_cli

from tuner.bench import (
    BenchSettings,
    add_board_run_arguments,
    board_runs,
    build_landscapes,
    markdown,
    quick_settings,
    run_bench,
    run_one,
    run_record,
    text_rows,
    true_logs,
    twin_runs,
)
from tuner.devices.base import WindowSettings
from tuner.devices.twin import TwinDevice
from tuner.errors import UserError
from tuner.records import recommended
from tuner.run_options import RunOptions
from tuner.sampling import make_sampler
from tuner.space import Config
from tuner.study import MEMORY_STORAGE, run_study

SMALL = BenchSettings(
    devices=["sim:orin-nano"],
    models=["mobilenet_v2"],
    bounds=["tight", "loose"],
    strategies=["ours"],
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
    """Ours on the Orin Nano twin (tight bound): reaches 5% within 12 trials; the curve is monotone."""
    landscape = build_landscapes(SMALL)[0]
    result = run_one(landscape, 0, "ours", 0, 12, "p99")
    assert result.measured == 12
    assert result.reach["5%"] is not None and result.reach["5%"] <= 12
    assert result.reach["2%"] is None or result.reach["2%"] >= result.reach["5%"]
    assert result.final_regret is not None and result.final_regret < 0.05
    assert 0 <= result.violation <= 1
    record = run_record(landscape, result)
    # What the variant scripts pair run by run on: the landscape's identity and the run's three scores.
    assert record == {
        "device": "sim:orin-nano",
        "suite": "twins",
        "model": "mobilenet_v2",
        "bound": "tight",
        "reach": result.reach["2%"],
        "final_regret": result.final_regret,
        "violation": result.violation,
    }
    assert json.loads(json.dumps(record)) == record


@pytest.mark.slow  # a bench run on a generated board per seed
def test_board_runs_prepare_each_landscape_before_its_run_and_record_it():
    seen = []
    runs = board_runs([0], [2000], 0, lambda i, land: seen.append((i, land.device)))
    assert seen == [(0, "gen:0"), (1, "gen:2000")]
    assert [(r["device"], r["suite"]) for r in runs] == [("gen:0", "tune boards"), ("gen:2000", "judge boards")]
    assert all(r["reach"] is None or 1 <= r["reach"] <= 40 for r in runs)


def test_variant_scripts_compare_on_the_development_boards_never_the_judged_ones():
    import argparse
    from pathlib import Path

    from tuner.landscapes import board_seeds

    parser = argparse.ArgumentParser()
    add_board_run_arguments(parser)
    args = parser.parse_args([])
    boards = board_seeds(args.tune_boards) + board_seeds(args.judge_boards)
    assert len(boards) == 60 and not set(boards) & set(range(1000, 1050))
    assert args.seed == 0 and args.out is None
    assert parser.parse_args(["--seed", "2", "--out", "r.json"]).out == Path("r.json")


@pytest.mark.slow  # bench runs on twins, every seed
def test_twin_runs_prepare_each_landscape_once_and_record_every_seed():
    seen, shown = [], []
    runs = twin_runs(
        "sim:orin-nano", ["mobilenet_v2"], [0, 1], lambda i, land: seen.append((i, land.bound)), shown.append
    )
    assert seen == [(0, "tight"), (1, "medium"), (2, "loose")]
    assert [(r["bound"], r["seed"]) for r in runs] == [(b, s) for b in ("tight", "medium", "loose") for s in (0, 1)]
    assert shown == runs
    assert all(r["device"] == "sim:orin-nano" and (r["reach"] is None or 1 <= r["reach"] <= 40) for r in runs)


def test_true_logs_put_each_landscape_optimum_at_its_grid_row():
    land = build_landscapes(BenchSettings(devices=[], models=[], tune_boards=[0], judge_boards=[]))[0]
    table, log_e, log_l = true_logs(land)
    assert len(log_e) == len(log_l) == len(table.grid)
    best = Config(knobs=land.optimum["config"], batch_size=land.optimum["batch_size"])
    row = table.grid.position(json.dumps(best.key()))
    assert row is not None
    assert log_e[row] == pytest.approx(math.log(land.optimum_j))
    feasible = np.exp(log_l) <= land.max_latency_ms
    assert log_e[feasible].min() == pytest.approx(log_e[row])


def test_quick_bench_reports_twins_tuning_and_judged_boards_separately():
    stages = []
    report = run_bench(
        quick_settings(devices=["sim:orin-nano"], strategies=["random", "ours"]),
        progress=lambda done, total, stage: stages.append(stage),
    )
    assert {row["strategy"] for row in report.summary} == {"random", "ours"}
    scopes = {row["scope"] for row in report.summary}
    assert {"twins", "tune boards", "judge boards", "sim:orin-nano"} <= scopes
    assert [land.device for land in report.landscapes if land.suite == "judge boards"] == ["gen:1001"]
    assert stages[0] == "sweeps" and stages[-1] == "runs"
    table = markdown(report)
    assert "| ours | judge boards | 1 |" in table and "| ours | twins | 1 |" in table
    # 12 trials: no regret after 20 or 40 trials is claimed ("no feasible" would say none met the bound)
    assert all(math.isnan(row["regret@20"]) and math.isnan(row["regret@40"]) for row in report.summary)
    assert all(line.count("| - | - |") == 1 for line in table.splitlines() if line.startswith("| ours "))
    columns, rows = text_rows(report)
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(columns)]
    assert sum(widths) + 2 * (len(columns) - 1) <= 80  # the terminal table (compact: two spaces between columns)


@pytest.mark.parametrize("sampler", ["ours", "tpe", "random"])
def test_the_best_is_judged_on_the_mean_of_its_confirmed_windows(sampler):
    """Every strategy's answer is a confirmed trial: the mean of three windows, and a margin on its constraint."""
    dev = TwinDevice("sim:orin")
    options = RunOptions(
        model="resnet50", max_latency_ms=60, trials=24, seed=3, sampler=sampler, storage=MEMORY_STORAGE
    )
    study, summary = run_study(dev, options)
    assert summary.measured == 24
    best = recommended(study)
    windows = best.user_attrs["windows"]
    assert best.user_attrs["measurements"] == len(windows) == 3
    assert best.value == pytest.approx(sum(w["j_per_query"] for w in windows) / 3)
    mean_p99 = sum(w["p99_ms"] for w in windows) / 3
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
    assert out["best"]["feasible"] and out["best"]["windows"] == 3


def test_every_strategy_is_a_sampler_choice():
    for name in ("ours", "gp", "tpe", "random", "two-phase"):
        assert make_sampler(name, 0) is not None


def test_tune_bench_quick_cli(tmp_path):
    r = run_cli(
        "bench", "--quick", "--devices", "sim:orin-nano", "--sampler", "tpe,ours", "--out", str(tmp_path), "--json"
    )
    assert r.returncode == 0, r.stderr
    payload = json.loads(r.stdout)
    assert payload["runs"] == 2
    saved = json.loads((tmp_path / "bench" / "search.json").read_text())
    assert saved["version"] == 1 and len(saved["runs"]) == 2
    assert all(not math.isnan(row["violation"]) for row in payload["summary"])


def test_bench_defaults_to_samplers_the_install_can_run(monkeypatch):
    """The core install has no PyTorch: the default strategies leave gp out, and asking for gp fails at once."""
    import tuner.strategies

    monkeypatch.setattr(tuner.strategies, "has_torch", lambda: False)
    monkeypatch.setattr(tuner.sampling, "has_torch", lambda: False)
    assert "gp" not in quick_settings().strategies and "tpe" in quick_settings().strategies
    with pytest.raises(UserError, match="needs PyTorch"):
        run_bench(SMALL.model_copy(update={"strategies": ["gp"]}))


def test_generated_boards_are_seeded_plausible_devices():
    from tuner.devices.registry import open_device
    from tuner.landscapes import GeneratedBoard, board_seeds

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


def _search_pair():
    """benchmarks/search_pair.py as a module (the benchmarks are scripts, not a package)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "search_pair.py"
    spec = importlib.util.spec_from_file_location("search_pair", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_search_pair_pairs_runs_by_landscape_and_seed_across_file_formats(tmp_path):
    pair = _search_pair()
    base = {
        "landscapes": [
            {"device": "gen:1", "model": "wl-mlp", "bound": "tight"},
            {"device": "gen:2", "model": "wl-conv", "bound": "loose"},
        ],
        "runs": [
            {"landscape": 0, "seed": 0, "reach": {"2%": 10, "5%": 4}, "violation": 0.0},
            {"landscape": 1, "seed": 0, "reach": {"2%": None, "5%": 9}, "violation": 0.1},
            {"landscape": 0, "seed": 1, "reach": {"2%": 30, "5%": 9}, "violation": 0.0},
        ],
    }
    variant = {
        "seed": 0,
        "runs": [
            {"device": "gen:2", "model": "wl-conv", "bound": "loose", "reach": 21, "violation": 0.0},
            {"device": "gen:1", "model": "wl-mlp", "bound": "tight", "reach": 12, "violation": 0.0},
            {"device": "gen:9", "model": "wl-mlp", "bound": "tight", "reach": 1, "violation": 0.0},
        ],
    }
    (tmp_path / "base.json").write_text(json.dumps(base))
    (tmp_path / "nested.json").write_text(json.dumps({"dev": variant}))
    line = pair.compare(pair.load(str(tmp_path / "base.json")), pair.load(f"{tmp_path / 'nested.json'}:dev"))
    # Only gen:1 and gen:2 at seed 0 are in both: (12 - 10) and (21 - 41, a miss counted as 41).
    assert line.startswith("2 runs: median >40 -> 21, p90 >40 -> 21, mean (miss = 41) 25.50 -> 16.50")
    assert "difference -9.00 +- 11.00" in line
    assert "better / worse 1 / 1" in line
    assert "export violates 5.0% -> 0.0%" in line
