"""tune run, tune sweep, tune measure: the commands that measure."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from tuner import api
from tuner.cli import common, options
from tuner.cli.progress import trial_progress
from tuner.cli.root import BOUND_UNMET
from tuner.devices.base import Device
from tuner.devices.hardware_session import hold
from tuner.devices.registry import check_meter
from tuner.errors import UserError
from tuner.llm import applying_knobs, bounds_text, hidden_knobs
from tuner.measure.session import meter_lost
from tuner.measure.settings import WindowSettings
from tuner.measurement import Measurement
from tuner.models import check_model
from tuner.pareto import results_dir
from tuner.plumbing import interrupts
from tuner.plumbing.units import MAX_BATCH, check_count, check_seconds
from tuner.records import recommendation_change
from tuner.run_options import DEFAULT_SAMPLER
from tuner.sampling import SAMPLERS, canonical
from tuner.scenario import label as scenario_label
from tuner.scenario import window_for
from tuner.space import Config, parse_assignments
from tuner.storage import DEFAULT_HEARTBEAT_S
from tuner.study import StudyResult, measure_space, narrowed_space
from tuner.sweep import (
    LARGE_SWEEP,
    SweepRow,
    characterization,
    expected_seconds,
    optimum,
    plot_sweep,
    repeat_summary,
    run_sweep,
    size_warning,
    write_sweep_csv,
)

Bound = typer.Option(
    None,
    "--max-latency",
    "-l",
    help="latency bound, e.g. 50ms, 50 ms, 0.05s, 50000us (an LLM may give --max-ttft/--max-tpot only)",
)
Trials = typer.Option(
    None,
    "--trials",
    "-n",
    help="most configurations to measure (repeats of a measured one are free) [default: 40]; "
    "the study stops sooner once its answer is known",
)
EarlyStop = typer.Option(
    True,
    "--early-stop/--no-early-stop",
    help="stop once no unmeasured configuration could save more than a window resolves (--ci)",
)
WarmStart = typer.Option(
    True,
    "--warm-start/--no-warm-start",
    help="a new study first measures again the cheapest configurations that studies of this model on this "
    "device kind at other bounds or scenarios found (same storage)",
)
StudyTrials = typer.Option(
    None,
    "--study-trials",
    help="fleets: stop once the study holds this many completed trials from all workers together",
)
WorkerId = typer.Option(None, "--worker-id", help="name of this worker in the study (default host:pid)")
Heartbeat = typer.Option(
    DEFAULT_HEARTBEAT_S,
    "--heartbeat",
    help="seconds between heartbeats; a trial silent for 3 heartbeats is failed and retried",
)
Timeout = typer.Option(None, "--timeout", help="stop after this many seconds")
Sampler = typer.Option(
    DEFAULT_SAMPLER,
    "--sampler",
    help="auto (= learned: GPs with a roofline prior), learned, gp, tpe, random, two-phase",
)
SweepBound = typer.Option(None, "--max-latency", "-l", help="report the optimum under this bound")
SweepSeed = typer.Option(None, "--seed", help="twins: add seeded measurement noise (default noise-free)")
BatchSize = typer.Option(..., "--batch-size", "-b", help="batch size to measure, e.g. 8")
Assignments = typer.Option(
    [],
    "--set",
    help="knob=value (repeatable), as the space files write values: channels_last=true (or yes/no), "
    "gpu_mhz=1300; other knobs keep their default",
)
Repeat = typer.Option(1, "--repeat", help="measure this many times")
RunModes = typer.Option(
    None,
    "--modes",
    help="power modes to tune, e.g. MAXN,50W (default: the board's mode and those of its TPC mask; a mode of "
    "another mask needs a reboot to undo, which tune says before the first write)",
)
BaselineOption = typer.Option(
    "default",
    "--baseline",
    help="what the answer is compared against, measured once per study at its batch size: default (the device as "
    "it comes: a twin's or board's default mode, a GPU's unlocked clocks), a mode (MAXN) or knob=value,...",
)
MeasureSeed = typer.Option(None, "--seed", help="twins: add seeded noise (default noise-free)")


@interrupts.deferring
def run(
    model: str = options.Model,
    device: str = options.Device,
    max_latency: str | None = Bound,
    trials: int | None = Trials,
    early_stop: bool = EarlyStop,
    warm_start: bool = WarmStart,
    study_trials: int | None = StudyTrials,
    worker_id: str | None = WorkerId,
    heartbeat: int = Heartbeat,
    timeout: float | None = Timeout,
    seed: int | None = options.Seed,
    batch_sizes: str | None = options.BatchSizes,
    knobs: str | None = options.Knobs,
    modes: str | None = RunModes,
    sampler: str = Sampler,
    storage: str | None = options.Storage,
    out: Path = options.Out,
    window: float = options.window("trial"),
    min_window: float = options.MinWindow,
    ci: str = options.Ci,
    runtime: str = options.Runtime,
    percentile: str = options.Percentile,
    meter: str | None = options.Meter,
    allow_clock_changes: bool = options.AllowClockChanges,
    sysfs_root: Path | None = options.SysfsRoot,
    space: Path | None = options.Space,
    scenario: str = options.Scenario,
    target_qps: float | None = options.TargetQps,
    prompts: str | None = options.Prompts,
    max_ttft: str | None = options.MaxTtft,
    max_tpot: str | None = options.MaxTpot,
    baseline: str = BaselineOption,
    as_json: bool = options.Json,
) -> None:
    """Run (or resume) a study: minimum energy per query (per output token for an LLM) under the bound(s)."""
    trials = _trial_budget(trials, study_trials, heartbeat, timeout)
    measured = options.window_settings(window, percentile, meter, seed, True, min_window, ci, runtime)
    settings = dict(
        trials=trials,
        early_stop=early_stop,
        warm_start=warm_start,
        timeout_s=timeout,
        seed=seed,
        batch_sizes=common.batch_list(batch_sizes),
        knobs=common.knob_list(knobs),
        modes=common.knob_list(modes),
        sampler=common.choice(canonical(sampler), SAMPLERS, "--sampler"),
        storage=common.run_storage(storage, out),
        study_trials=study_trials,
        worker_id=worker_id,
        heartbeat_s=heartbeat,
        out=out,
        window=options.llm_window(window_for(measured, scenario, target_qps), prompts, max_ttft, max_tpot),
        baseline=baseline,
        **options.device_options(allow_clock_changes, sysfs_root, space),
    )
    with trial_progress(study_trials or trials, as_json, study_trials is not None) as on_trial:
        result = api.tune(model, device, max_latency, on_trial=on_trial, on_note=_note, **settings)
    _report_run(result, as_json)


def _report_run(result: StudyResult, as_json: bool) -> None:
    """Print the run's answer; a bound no configuration met ends the command with its own exit code."""
    common.emit_json(_run_payload(result)) if as_json else _print_run(result)
    if result.summary.unmet is not None:
        raise typer.Exit(BOUND_UNMET)


def _note(line: str) -> None:
    """What the device and the study say while tune run runs (a note, where results went), on stderr."""
    typer.echo(line, err=True)


def _trial_budget(trials: int | None, study_trials: int | None, heartbeat: int, timeout: float | None) -> int:
    """The trials this worker measures (40 unless told), the fleet's options checked on the way."""
    if study_trials is not None:
        check_count(study_trials, "--study-trials", 100)
    trials = check_count(trials if trials is not None else study_trials or 40, "--trials", 40)
    check_count(heartbeat, "--heartbeat", 10, maximum=3600)
    check_seconds(timeout, "--timeout", "600")
    return trials


def _run_payload(result: StudyResult) -> dict[str, Any]:
    """What tune run --json prints: the summary, then where and how it ran."""
    return {
        **result.summary.model_dump(),
        **result.model_dump(mode="json", exclude={"summary", "twin_note", "percentile"}),
    }


def _print_run(result: StudyResult) -> None:
    """What tune run prints: the study's recommended configuration, and where its result files are."""
    summary, note = result.summary, result.twin_note
    common.out_console.print(
        f"study {summary.study}: {summary.measured} measured, {summary.total_trials} trials in storage{note}"
    )
    for line in result.strategy_notes:
        common.out_console.print(f"note: {line}")
    if result.proposed_by:
        tally = ", ".join(f"{k} {v}" for k, v in result.proposed_by.items())
        common.out_console.print(f"proposed by: {tally} (per trial: proposed_by, why in trials.csv)")
    if summary.trial_seconds:
        spent = ", ".join(f"{key.removesuffix('_s')} {value:.1f} s" for key, value in summary.trial_seconds.items())
        common.out_console.print(f"trial time: {spent} (per trial: setup_s, windows_s, search_s in trials.csv)")
    for line in summary.reused:
        common.out_console.print(line)
    if summary.stopped:
        common.out_console.print(summary.stopped)
    changed = recommendation_change(summary.previous_best, summary.best)
    if changed:
        common.out_console.print(changed)
    bounds = bounds_text(result.max_latency_ms, result.percentile, result.max_ttft_ms, result.max_tpot_ms)
    if summary.best is None:
        common.out_console.print(summary.unmet or f"no configuration met {bounds}")
    else:
        observe_only = bool(((result.pareto.provenance if result.pareto else None) or {}).get("observe_only"))
        common.out_console.print(
            common.recommended_table(
                summary.best,
                f"recommended for {result.model} on {result.device} ({bounds}, {result.scenario}){note}",
                result.percentile,
                hidden_knobs(summary.best, observe_only),
            )
        )
        if summary.saved is not None:
            common.out_console.print(f"saved: {summary.saved.line}{note}")
    common.out_console.print(f"results: {result.results}/ (pareto.json, pareto.csv, pareto.png, trials.csv)")


@interrupts.deferring
def sweep(
    model: str = options.Model,
    device: str = options.Device,
    max_latency: str | None = SweepBound,
    batch_sizes: str | None = options.BatchSizes,
    knobs: str | None = options.Knobs,
    seed: int | None = SweepSeed,
    out: Path = options.Out,
    window: float = options.window("point"),
    min_window: float = options.MinWindow,
    ci: str = options.Ci,
    runtime: str = options.Runtime,
    percentile: str = options.Percentile,
    meter: str | None = options.Meter,
    allow_clock_changes: bool = options.AllowClockChanges,
    sysfs_root: Path | None = options.SysfsRoot,
    space: Path | None = options.Space,
    as_json: bool = options.Json,
) -> None:
    """Measure every configuration of the (narrowed) space: ground truth and characterization.

    A sweep over 20,000 configurations (or over ten minutes of hardware
    windows) first prints its size, the time to expect here and how to
    narrow it with --knobs or --batch-sizes; the progress bar counts
    configurations, with an ETA. The table shows J/query, and queries/J.
    """
    bound = common.latency(max_latency) if max_latency is not None else None
    settings = options.window_settings(window, percentile, meter, seed, seed is not None, min_window, ci, runtime)
    check_meter(meter, device, model)
    common.check_out_dir(out)
    dev = options.open_for(device, allow_clock_changes, sysfs_root, space)
    check_model(model, runtime, dev.simulated, dev)
    narrowed = narrowed_space(
        dev, common.knob_list(knobs), common.batch_list(batch_sizes), model=model, runtime=runtime
    )
    total = narrowed.size()
    vectorized = getattr(dev, "measure_many", None) is not None
    if total > LARGE_SWEEP or not vectorized:
        warning = size_warning(narrowed, expected_seconds(dev, narrowed, model, settings), floor=not vectorized)
        if warning:
            common.err_console.print(f"warning: {warning}")
    with hold(dev), common.count_progress("sweep", "configurations", as_json) as bar:
        task = bar.add_task("sweep", total=total)
        rows = run_sweep(dev, narrowed, model, settings, progress=lambda done, _n: bar.update(task, completed=done))
    folder = results_dir(out, dev.slug, model)
    write_sweep_csv(rows, folder / "sweep.csv", bound, percentile)
    title = f"{model} on {dev.name}{' [digital twin]' if dev.simulated else ''}"
    plot_sweep(rows, folder / "sweep.png", title, bound, percentile)
    best = optimum(rows, bound, percentile)
    if as_json:
        common.emit_json(_sweep_payload(dev, model, rows, bound, best, folder))
    else:
        _print_sweep(dev, model, rows, bound, percentile, best, folder)


def _sweep_payload(
    dev: Device, model: str, rows: list[SweepRow], bound: float | None, best: SweepRow | None, folder: Path
) -> dict[str, Any]:
    """What tune sweep --json prints: the sweep's size and its optimum."""
    return {
        "device": dev.name,
        "twin": dev.simulated,
        "model": model,
        "configurations": len(rows),
        "failed": sum(1 for r in rows if r.error),
        "max_latency_ms": bound,
        "optimum": None
        if best is None or best.measurement is None
        else {
            "config": best.config.knobs,
            "batch_size": best.config.batch_size,
            **best.measurement.model_dump(include={"j_per_query", "p50_ms", "p90_ms", "p99_ms", "qps", "avg_w"}),
        },
        "results": str(folder),
    }


def _print_sweep(
    dev: Device,
    model: str,
    rows: list[SweepRow],
    bound: float | None,
    percentile: str,
    best: SweepRow | None,
    folder: Path,
) -> None:
    """What tune sweep prints: the best configuration per batch size, then the optimum."""
    note = common.twin_note(dev)
    by_batch = characterization(rows, bound, percentile)
    pinned = common.pinned_knobs([r[1] for r in by_batch if r[1]])
    if pinned:
        common.out_console.print(f"the same in every row: {common.fmt(pinned)}")
    for r in by_batch:
        none = "none valid" if bound is None else "none within the bound"
        r[1] = {k: v for k, v in r[1].items() if k not in pinned} or ("-" if r[1] else none)
    common.out_console.print(
        common.table(
            f"{model} on {dev.name}: best per batch size{note}",
            ["batch", "config", "J/query", "queries/J", f"{percentile} ms", "queries/s", "avg W"],
            by_batch,
        )
    )
    if best is None or best.measurement is None:
        common.out_console.print("no configuration meets the bound")
    else:
        m = best.measurement
        common.out_console.print(
            f"optimum{'' if bound is None else f' within {bound:g} ms'}: {best.config.label()}  "
            f"{m.j_per_query:.4g} J/query, {percentile} {m.latency_ms(percentile):.4g} ms{note}"
        )
    common.out_console.print(f"{len(rows)} configurations -> {folder}/sweep.csv, sweep.png")


@interrupts.deferring
def measure(
    model: str = options.Model,
    device: str = options.Device,
    batch_size: int = BatchSize,
    set_: list[str] = Assignments,
    repeat: int = Repeat,
    seed: int | None = MeasureSeed,
    window: float = options.window("repeat"),
    min_window: float = options.MinWindow,
    ci: str = options.Ci,
    runtime: str = options.Runtime,
    percentile: str = options.Percentile,
    meter: str | None = options.Meter,
    allow_clock_changes: bool = options.AllowClockChanges,
    sysfs_root: Path | None = options.SysfsRoot,
    space: Path | None = options.Space,
    scenario: str = options.Scenario,
    target_qps: float | None = options.TargetQps,
    batch_timeout: float = options.BatchTimeout,
    prompts: str | None = options.Prompts,
    as_json: bool = options.Json,
) -> None:
    """Measure one configuration (repeatably, with --repeat).

    With --repeat N the table ends with the mean and the standard deviation
    of the valid repeats: differences smaller than that spread are noise.
    """
    check_count(repeat, "--repeat", 3, maximum=1000)
    check_count(batch_size, "--batch-size", 8, maximum=MAX_BATCH)
    settings = options.window_settings(window, percentile, meter, seed, seed is not None, min_window, ci, runtime)
    settings = options.llm_window(
        options.scenario_window(settings, scenario, target_qps, batch_timeout), prompts, None, None
    )
    check_meter(meter, device, model)
    dev = options.open_for(device, allow_clock_changes, sysfs_root, space)
    assigned = parse_assignments(set_, measure_space(dev, model))
    effective = api.configuration(dev, {**assigned, "batch_size": batch_size}, model)
    results = api.measure_repeats_of(model, dev, effective, repeat, window=settings)
    observe_only = not getattr(dev, "allow_clock_changes", True)
    shown = applying_knobs(dev.space(), model, effective.knobs, observe_only)
    effective = Config(knobs=shown, batch_size=effective.batch_size)
    lost = [meter_lost(m) for m in results]
    if all(lost):
        raise UserError(
            f"{'--meter ' + meter if meter else dev.name + ' meter'}: no window got energy from it: {lost[-1]}"
        )
    payload = {
        "device": dev.name,
        "twin": dev.simulated,
        "model": model,
        "config": effective.knobs,
        "batch_size": batch_size,
        "scenario": scenario_label(settings),
        "measurements": [m.model_dump() for m in results],
        "summary": repeat_summary(results),
    }
    if as_json:
        common.emit_json(payload)
    else:
        _print_measure(dev, model, effective, settings, results, payload["summary"])


def _print_measure(
    dev: Device,
    model: str,
    config: Config,
    settings: WindowSettings,
    results: list[Measurement],
    summary: dict[str, Any] | None,
) -> None:
    """What tune measure prints: a row per repeat, then their mean and standard deviation."""
    shown = ("j_per_query", "p50_ms", f"{settings.percentile}_ms" if settings.percentile != "p50" else "p99_ms")
    shown += ("qps", "avg_w")
    rows = [
        [i + 1, *(getattr(m, key) for key in shown), "yes" if m.valid else f"no: {m.reason}"]
        for i, m in enumerate(results)
    ]
    if summary is not None:
        rows.append(["mean", *(summary["mean"][key] for key in shown), ""])
        rows.append(["sd", *(summary["sd"][key] for key in shown), ""])
    heads = {"j_per_query": "J/query", "qps": "queries/s", "avg_w": "avg W"}
    common.out_console.print(f"config: {common.fmt(config.knobs)}, batch {config.batch_size}")
    common.out_console.print(
        common.table(
            f"{model} on {dev.name} ({scenario_label(settings)}){common.twin_note(dev)}",
            ["#", *(heads.get(key, key.replace("_ms", " ms")) for key in shown), "valid"],
            rows,
        )
    )
    for i, m in enumerate(results):
        if m.tokens is not None:
            t, p = m.tokens, settings.percentile
            common.out_console.print(
                f"{i + 1}: {t.j_per_token:.4g} J/token, {t.tokens_per_s:.4g} tokens/s, TTFT {p} "
                f"{t.ttft_ms(p):.4g} ms, TPOT {p} {t.tpot_ms(p):.4g} ms ({t.output_tokens} tokens)"
            )
    meters = ", ".join(sorted({m.meter for m in results}))
    spread = "" if summary is None else f"; mean and sd of the {summary['valid']} valid repeats"
    common.out_console.print(f"meter: {meters}{spread}")
