"""The search benchmark behind ``tune bench``: how many trials each strategy needs to reach the optimum.

A landscape is a device, a model and a latency bound. Its ground truth is the
noise-free sweep; bounds are quantiles of the sweep's tail latencies (5%,
25%, 60%), never closer than 15%, 50% and 200% above the fastest
configuration, so that noise around a launch-bound floor does not decide the
result. Each strategy runs through run_study (the code path of ``tune run``)
with in-memory storage and the device's seeded noise; after every measured
trial (a reused configuration is free; a trial that confirms its window
with two more counts once) the configuration it would report (its
recommended trial so far) is
scored by its true energy: it reaches x% only if it truly meets the bound and
is within x% of the optimum. The exported best is re-measured with fresh
noise to count bound violations.

Suites, reported separately: the twins, measured boards (``measured:h200``,
a real card's windows replayed; bounds q25/q50/q75) and generated boards
(``gen:SEED``, tuner/devices/virtual/generated.py), split into the boards the strategy was
tuned on and the boards it is judged on. docs/search.md has the figures.

A signal (Ctrl-C, SIGTERM, SIGHUP, SIGQUIT) is only recorded while the
benchmark runs (tuner.plumbing.interrupts, as in ``tune run``) and acted on at the next
safe point: between sweep chunks, between trials of a run (run_study), between
runs and between re-measurements; parallel workers are then terminated.
"""

from __future__ import annotations

import json
import math
import multiprocessing
import signal
import time
from collections.abc import Callable

import numpy as np
import optuna
from pydantic import BaseModel, Field

from tuner.devices.base import Device
from tuner.devices.registry import open_device
from tuner.devices.virtual.generated import WORKLOADS
from tuner.errors import UserError
from tuner.measure.settings import WindowSettings
from tuner.plumbing import interrupts
from tuner.records import recommended_of
from tuner.run_options import RunOptions
from tuner.sampling import available_samplers, canonical, make_sampler
from tuner.space import Config
from tuner.study import MEMORY_STORAGE, narrowed_space, run_study
from tuner.sweep import optimum, run_sweep

BENCH_VERSION = 1
BOUND_QUANTILES = {"tight": 0.05, "medium": 0.25, "loose": 0.6, "q25": 0.25, "q50": 0.5, "q75": 0.75}
BOUND_FLOORS = {"tight": 1.15, "medium": 1.5, "loose": 3.0, "q25": 1.15, "q50": 1.15, "q75": 1.15}
DEFAULT_BOUNDS = ("tight", "medium", "loose")
GEN_BOUNDS = ("tight", "medium", "loose")
STRATEGIES = ("random", "tpe", "gp", "two-phase", "learned")
DEFAULT_DEVICES = ("sim:orin", "sim:h200", "sim:orin-nano")
DEFAULT_MODELS = ("resnet50", "mobilenet_v2", "efficientnet_b0", "bert-base", "bert-large")
TUNE_BOARDS = tuple(range(0, 20))
JUDGE_BOARDS = tuple(range(1000, 1060))
SUITES = ("twins", "measured", "tune boards", "judge boards")
# Suites of named devices: every seed runs on each landscape, and each device is also reported on its own.
DEVICE_SUITES = ("twins", "measured")
TARGETS = (0.02, 0.05)
REGRET_AT = (10, 20, 40)
RECHECKS = 10
POLL_S = 0.2  # how often the parent looks for a signal while its workers run
# A terminal sends these to the whole process group: the parent acts on them, its pool workers ignore them.
TERMINAL_SIGNALS = (signal.SIGINT, signal.SIGQUIT)

_TRUTH: dict[tuple[str, str], dict[str, tuple[float, float]]] = {}
_DEVICES: dict[str, Device] = {}


class Landscape(BaseModel):
    suite: str = "twins"
    device: str
    model: str
    bound: str
    max_latency_ms: float
    optimum_j: float
    optimum: dict
    feasible_fraction: float


class RunResult(BaseModel):
    """One strategy on one landscape with one seed."""

    landscape: int
    strategy: str
    seed: int
    measured: int
    reach: dict[str, int | None]
    regret: dict[str, float | None]
    final_regret: float | None
    violation: float | None
    seconds: float


class BenchSettings(BaseModel):
    devices: list[str] = Field(default_factory=lambda: list(DEFAULT_DEVICES))
    models: list[str] = Field(default_factory=lambda: list(DEFAULT_MODELS))
    bounds: list[str] = Field(default_factory=lambda: list(DEFAULT_BOUNDS))
    strategies: list[str] = Field(default_factory=lambda: default_strategies())
    seeds: int = 3
    board_runs: int = 1
    trials: int = 40
    random_trials: int = 200
    jobs: int = 2
    percentile: str = "p99"
    tune_boards: list[int] = Field(default_factory=lambda: list(TUNE_BOARDS))
    judge_boards: list[int] = Field(default_factory=lambda: list(JUDGE_BOARDS))


class BenchReport(BaseModel):
    version: int = BENCH_VERSION
    settings: BenchSettings
    landscapes: list[Landscape]
    runs: list[RunResult]
    summary: list[dict]
    seconds: float


def device(name: str) -> Device:
    if name not in _DEVICES:
        _DEVICES[name] = open_device(name)
    return _DEVICES[name]


def truth(name: str, model: str, percentile: str) -> dict[str, tuple[float, float]]:
    """Noise-free energy per query and tail latency of every effective configuration, by effective key."""
    if (name, model) not in _TRUTH:
        dev = device(name)
        rows = run_sweep(dev, narrowed_space(dev, None, None), model, WindowSettings(noise=False, seed=None))
        _TRUTH[(name, model)] = {
            json.dumps(r.config.key()): (r.measurement.j_per_query, r.measurement.latency_ms(percentile))
            for r in rows
            if r.measurement is not None and r.measurement.valid
        }
    return _TRUTH[(name, model)]


def build_landscapes(settings: BenchSettings, progress: Callable[[int, int], None] | None = None) -> list[Landscape]:
    """Twins: one landscape per device, model and bound; generated boards: one per seed. Bounds: sweep quantiles."""
    unknown = [b for b in settings.bounds if b not in BOUND_QUANTILES]
    if unknown:
        raise UserError(f"unknown bound(s) {', '.join(unknown)}: choose from {', '.join(BOUND_QUANTILES)}")
    plan: list[tuple[str, str, str, list[str]]] = [
        ("measured" if name.startswith("measured:") else "twins", name, model, settings.bounds)
        for name in settings.devices
        for model in settings.models
    ]
    for suite, seeds in (("tune boards", settings.tune_boards), ("judge boards", settings.judge_boards)):
        for seed in seeds:
            plan.append((suite, f"gen:{seed}", WORKLOADS[seed % len(WORKLOADS)], [GEN_BOUNDS[(seed // 3) % 3]]))
    out = []
    for done, (suite, name, model, bounds) in enumerate(plan):
        interrupts.check()
        out += _landscapes(suite, name, model, bounds, settings.percentile)
        if progress:
            progress(done + 1, len(plan))
    return out


def _landscapes(suite: str, name: str, model: str, bounds: list[str], percentile: str) -> list[Landscape]:
    dev = device(name)
    rows = run_sweep(dev, narrowed_space(dev, None, None), model, WindowSettings(noise=False, seed=None))
    valid = [r for r in rows if r.measurement is not None and r.measurement.valid]
    if not valid:
        raise UserError(f"{name} measured no valid configuration of {model}: check the device")
    _TRUTH[(name, model)] = {
        json.dumps(r.config.key()): (r.measurement.j_per_query, r.measurement.latency_ms(percentile)) for r in valid
    }
    lats = np.array([r.measurement.latency_ms(percentile) for r in valid])
    out = []
    for bound in bounds:
        limit = max(float(np.quantile(lats, BOUND_QUANTILES[bound])), BOUND_FLOORS[bound] * lats.min())
        best = optimum(rows, limit, percentile)
        out.append(
            Landscape(
                suite=suite,
                device=name,
                model=model,
                bound=bound,
                max_latency_ms=limit,
                optimum_j=best.measurement.j_per_query,
                optimum={"config": best.config.knobs, "batch_size": best.config.batch_size},
                feasible_fraction=float((lats <= limit).mean()),
            )
        )
    return out


def counts_as_trial(trial: optuna.trial.FrozenTrial) -> bool:
    """Whether a finished trial costs a trial in the benchmark: it measured (a reuse is free) a configuration."""
    return "reused_from" not in trial.user_attrs and "effective_key" in trial.user_attrs


def run_one(landscape: Landscape, index: int, strategy: str, seed: int, trials: int, percentile: str) -> RunResult:
    """Run one strategy through run_study to its cap and score its trajectory against the noise-free truth.

    Early stop is off: the trajectory is scored at every trial count up to the
    cap (benchmarks/early_stop.py scores the stop on the same trajectories).
    """
    started = time.monotonic()
    dev = device(landscape.device)
    table = truth(landscape.device, landscape.model, percentile)
    options = RunOptions(
        model=landscape.model,
        max_latency_ms=landscape.max_latency_ms,
        trials=trials,
        seed=seed,
        sampler=strategy,
        storage=MEMORY_STORAGE,
        early_stop=False,
        window=WindowSettings(seed=seed, percentile=percentile),
    )
    study, _ = run_study(dev, options)
    opt = landscape.optimum_j
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE or t.state.is_finished()]
    done = sorted(done, key=lambda t: t.number)
    curve: list[float] = []
    measured = 0
    for i, t in enumerate(done):
        if not counts_as_trial(t):
            continue
        measured += 1
        complete = [x for x in done[: i + 1] if x.state == optuna.trial.TrialState.COMPLETE]
        curve.append(true_ratio(recommended_of(complete), table, landscape.max_latency_ms, opt))
    reach = {f"{round(x * 100)}%": next((n + 1 for n, r in enumerate(curve) if r <= 1 + x), None) for x in TARGETS}
    regret = {
        str(k): (curve[k - 1] - 1 if len(curve) >= k and math.isfinite(curve[k - 1]) else None) for k in REGRET_AT
    }
    final = recommended_of([t for t in done if t.state == optuna.trial.TrialState.COMPLETE])
    final_ratio = true_ratio(final, table, landscape.max_latency_ms, opt) if final else math.inf
    return RunResult(
        landscape=index,
        strategy=strategy,
        seed=seed,
        measured=measured,
        reach=reach,
        regret=regret,
        final_regret=final_ratio - 1 if math.isfinite(final_ratio) else None,
        violation=_violation(dev, landscape, final, seed, percentile) if final else None,
        seconds=round(time.monotonic() - started, 2),
    )


def true_ratio(trial: optuna.trial.FrozenTrial | None, table: dict, bound: float, opt: float) -> float:
    """True energy over the optimum of a reported configuration; infinite if none or truly infeasible."""
    if trial is None:
        return math.inf
    j, latency = table.get(trial.user_attrs["effective_key"], (math.inf, math.inf))
    return j / opt if latency <= bound else math.inf


def _violation(dev: Device, landscape: Landscape, trial: optuna.trial.FrozenTrial, seed: int, percentile: str) -> float:
    """Share of fresh noisy re-measurements of the exported configuration that exceed the bound."""
    config = Config(knobs=trial.user_attrs["effective"], batch_size=trial.user_attrs["batch_size"])
    over = 0
    for k in range(RECHECKS):
        interrupts.check()
        settings = WindowSettings(seed=10_000 + seed * 100 + k, percentile=percentile)
        m = dev.measure(landscape.model, config, settings)
        over += m.latency_ms(percentile) > landscape.max_latency_ms
    return over / RECHECKS


def _task(args: tuple) -> RunResult:
    return run_one(*args)


def run_bench(settings: BenchSettings, progress: Callable[[int, int, str], None] | None = None) -> BenchReport:
    """Build the landscapes (sweeps) once, then run every strategy x landscape x seed, in parallel.

    Twins run ``settings.seeds`` times each; a generated board runs
    ``settings.board_runs`` times (once by default: its seed already varies the
    landscape), each at its own run seed. One run per board is a noisy
    figure (docs/search.md), so comparing two strategies wants several.
    ``progress(done, total, stage)`` is called through both stages ("sweeps",
    then "runs"). Signals are held for the whole call, whoever calls it (the
    pool's workers, forked inside the hold, leave them to this process).
    """
    with interrupts.held():
        return _run_bench(settings, progress)


def _run_bench(settings: BenchSettings, progress: Callable[[int, int, str], None] | None) -> BenchReport:
    settings = settings.model_copy(update={"strategies": [canonical(s) for s in settings.strategies]})
    unknown = [s for s in settings.strategies if s not in STRATEGIES]
    if unknown:
        raise UserError(f"unknown strategy {', '.join(unknown)}: choose from {', '.join(STRATEGIES)}")
    for strategy in settings.strategies:
        make_sampler(strategy, 0)
    interrupts.check()
    started = time.monotonic()
    landscapes = build_landscapes(settings, None if progress is None else lambda d, t: progress(d, t, "sweeps"))
    tasks = []
    for seed in range(max(settings.seeds, settings.board_runs)):
        for i, land in enumerate(landscapes):
            if seed >= (settings.seeds if land.suite in DEVICE_SUITES else settings.board_runs):
                continue
            for strategy in settings.strategies:
                trials = settings.random_trials if strategy == "random" else settings.trials
                tasks.append((land, i, strategy, seed, trials, settings.percentile))
    runs: list[RunResult] = []
    if settings.jobs > 1 and len(tasks) > 1 and "fork" in multiprocessing.get_all_start_methods():
        # Leaving the block on a signal terminates the pool: its workers die at once (_worker).
        with multiprocessing.get_context("fork").Pool(settings.jobs, initializer=_worker) as pool:
            results = pool.imap_unordered(_task, tasks)
            while len(runs) < len(tasks):
                interrupts.check()
                try:
                    runs.append(results.next(timeout=POLL_S))
                except multiprocessing.TimeoutError:
                    continue
                if progress:
                    progress(len(runs), len(tasks), "runs")
    else:
        for task in tasks:
            interrupts.check()
            runs.append(_task(task))
            if progress:
                progress(len(runs), len(tasks), "runs")
    runs.sort(key=lambda r: (r.landscape, r.strategy, r.seed))
    return BenchReport(
        settings=settings,
        landscapes=landscapes,
        runs=runs,
        summary=summarize(runs, landscapes, settings),
        seconds=round(time.monotonic() - started, 1),
    )


def _worker() -> None:
    """A pool worker: signals are the parent's to act on, and one torch thread.

    The parent records a signal and terminates the pool at its next check, so
    a worker dies at once on SIGTERM and SIGHUP (the defaults, in place of the
    parent's recording handlers it was forked with) and ignores Ctrl-C and
    Ctrl-\\, which a terminal sends to the whole process group (SIGQUIT's
    default would dump a core per worker). Workers share
    two cores: one torch thread each keeps the GP sampler from oversubscribing.
    """
    for sig in interrupts.SIGNALS:
        signal.signal(sig, signal.SIG_IGN if sig in TERMINAL_SIGNALS else signal.SIG_DFL)
    try:
        import torch

        torch.set_num_threads(1)
    except ImportError:
        pass


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.array(values, dtype=float), q, method="higher")) if values else math.nan


def summarize(runs: list[RunResult], landscapes: list[Landscape], settings: BenchSettings) -> list[dict]:
    """Per strategy and suite (and twin device): trials to 2%/5% (median, p90), regret at 10/20/40, violations.

    A suite of one device has no separate row for it (the two would be the same).

    A run that never got within the target counts as infinitely many trials,
    so a median or p90 beyond the budget reads as "> budget"; regret at k
    is NaN (shown "-") where the budget is under k trials.
    """
    rows = []
    groups: dict[tuple[str, str], list[RunResult]] = {}
    devices = {suite: {land.device for land in landscapes if land.suite == suite} for suite in DEVICE_SUITES}
    for r in runs:
        land = landscapes[r.landscape]
        groups.setdefault((r.strategy, land.suite), []).append(r)
        if land.suite in DEVICE_SUITES and len(devices[land.suite]) > 1:  # one device: its row is the suite's
            groups.setdefault((r.strategy, land.device), []).append(r)
    order = {name: i for i, name in enumerate(SUITES)}
    for (strategy, scope), members in sorted(
        groups.items(), key=lambda kv: (order.get(kv[0][1], len(SUITES)), kv[0][1], STRATEGIES.index(kv[0][0]))
    ):
        row: dict = {"strategy": strategy, "scope": scope, "runs": len(members)}
        for target in ("2%", "5%"):
            values = [r.reach[target] if r.reach[target] is not None else math.inf for r in members]
            row[f"median_{target}"] = _pct(values, 50)
            row[f"p90_{target}"] = _pct(values, 90)
            row[f"reached_{target}"] = sum(math.isfinite(v) for v in values) / len(values)
        budget = settings.random_trials if strategy == "random" else settings.trials
        for k in REGRET_AT:
            if k > budget:
                row[f"regret@{k}"] = math.nan  # the runs stopped before trial k: there is no regret to report
                continue
            values = [r.regret[str(k)] if r.regret[str(k)] is not None else math.inf for r in members]
            row[f"regret@{k}"] = _pct(values, 50)
        finals = [r.final_regret if r.final_regret is not None else math.inf for r in members]
        row["final_regret"] = _pct(finals, 50)
        violations = [r.violation for r in members if r.violation is not None]
        row["violation"] = float(np.mean(violations)) if violations else math.nan
        row["budget"] = budget
        rows.append(row)
    return rows


def markdown(report: BenchReport) -> str:
    """The summary as Markdown tables (overall, then per device)."""
    head = (
        "| strategy | scope | runs | median to 2% | p90 to 2% | reached 2% | median to 5% | p90 to 5% | "
        "regret@10 | regret@20 | regret@40 | final regret | exported best violates |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    lines = []
    for row in report.summary:
        lines.append(
            f"| {row['strategy']} | {row['scope']} | {row['runs']} | {_n(row['median_2%'], row['budget'])} | "
            f"{_n(row['p90_2%'], row['budget'])} | {row['reached_2%']:.0%} | {_n(row['median_5%'], row['budget'])} | "
            f"{_n(row['p90_5%'], row['budget'])} | {_r(row['regret@10'])} | {_r(row['regret@20'])} | "
            f"{_r(row['regret@40'])} | {_r(row['final_regret'])} | {row['violation']:.1%} |"
        )
    note = (
        "\nregret@k: median regret after k trials (- : the runs had fewer than k trials); "
        "no feasible: none met the bound by then.\n"
    )
    return head + "\n".join(lines) + "\n" + note


def text_rows(report: BenchReport) -> tuple[list[str], list[list[str]]]:
    """The summary for a terminal: the columns that fit 80 characters (the rest are in search.md and search.json)."""
    columns = ["strategy", "scope", "runs", "to 2%", "reached", "to 5%", "final regret", "violates"]
    rows = [
        [
            row["strategy"],
            row["scope"],
            str(row["runs"]),
            _n(row["median_2%"], row["budget"]),
            f"{row['reached_2%']:.0%}",
            _n(row["median_5%"], row["budget"]),
            _r(row["final_regret"]),
            f"{row['violation']:.0%}" if math.isfinite(row["violation"]) else "-",
        ]
        for row in report.summary
    ]
    return columns, rows


def _n(value: float, budget: int) -> str:
    return f">{budget}" if value is None or not math.isfinite(value) else f"{value:.0f}"


def _r(value: float) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return "no feasible" if not math.isfinite(value) else f"{value:.1%}"


def default_strategies() -> list[str]:
    """Every strategy this installation can run (gp needs PyTorch; the others run on the core install)."""
    return [s for s in STRATEGIES if s in available_samplers()]


def quick_settings(devices: list[str] | None = None, strategies: list[str] | None = None) -> BenchSettings:
    """One twin landscape, one tuning board and one judged board, one seed, few trials: a first look in seconds."""
    return BenchSettings(
        devices=devices or ["sim:orin-nano"],
        models=["resnet50"],
        bounds=["medium"],
        strategies=strategies or default_strategies(),
        seeds=1,
        trials=12,
        random_trials=12,
        jobs=1,
        tune_boards=[0],
        judge_boards=[1001],
    )
