"""tune run, tune sweep, tune measure: the commands that measure."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import optuna
import typer
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from tuner import interrupts
from tuner.cli import common
from tuner.devices.base import Device
from tuner.devices.hardware_session import hold
from tuner.errors import UserError
from tuner.measure.settings import WindowSettings
from tuner.models import check_model
from tuner.pareto import results_dir, write_results
from tuner.run_options import DEFAULT_SAMPLER, RunOptions
from tuner.sampling import SAMPLERS, canonical, make_sampler
from tuner.scenario import label as scenario_label
from tuner.scenario import window_for
from tuner.space import Config, parse_assignments
from tuner.storage import DEFAULT_HEARTBEAT_S
from tuner.strategies import proposal_counts
from tuner.study import RunSummary, narrowed_space, run_study
from tuner.sweep import LARGE_SWEEP, expected_seconds, optimum, plot_sweep, run_sweep, size_warning, write_sweep_csv
from tuner.units import MAX_BATCH, check_count, check_seconds

PERCENTILES = ("p50", "p90", "p99")
ScenarioOpt = typer.Option(
    "offline",
    "--scenario",
    help="MLPerf LoadGen scenario: offline, server (Poisson arrivals at --target-qps, bound on p99, "
    "dynamic batching tuned) or singlestream (one query at a time, bound on p90)",
)
TargetQpsOpt = typer.Option(None, "--target-qps", help="server scenario: arrival rate, queries/s")
METERS = ("nvml-energy", "nvml-power", "rapl", "rails", "ina3221", "jtop")


def check_meter(meter: str | None, device: str) -> None:
    """Built-in devices take the built-in meters, or an external one (docs/meters.md); a plugin may name its own."""
    from tuner.devices.jetson import DEVICE_KINDS
    from tuner.devices.meters.registry import check_external, is_external

    if meter is not None and is_external(meter):
        return check_external(meter, device)

    builtin = device.startswith(("sim:", "cuda:")) or device == "cpu" or device in DEVICE_KINDS
    if meter is not None and builtin:
        common.choice(meter, METERS, "--meter")
    common.check_measurable(device, meter)


def window_settings(
    window: float,
    percentile: str,
    meter: str | None,
    seed: int | None,
    noise: bool,
    min_window: float | None = None,
    ci: str = "1%",
    runtime: str = "auto",
) -> WindowSettings:
    common.choice(percentile, PERCENTILES, "--percentile")
    check_seconds(window, "--window", "10", maximum=3600.0)
    if min_window is not None:
        check_seconds(min_window, "--min-window", "2", maximum=3600.0)
    return WindowSettings(
        window_s=window,
        min_window_s=None if min_window is None else min(min_window, window),
        ci=common.ci_fraction(ci),
        percentile=percentile,
        meter=meter,
        seed=seed,
        noise=noise,
        runtime=runtime,
    )


def open_for(name: str, allow_clock_changes: bool, sysfs_root: Path | None, space: Path | None = None) -> Device:
    options: dict[str, Any] = {}
    if space is not None:
        options["space_file"] = str(space)
    if allow_clock_changes:
        options["allow_clock_changes"] = True
    if sysfs_root is not None:
        options["sysfs_root"] = sysfs_root
    dev = common.device(name, **options)
    for note in getattr(dev, "notes", []):
        typer.echo(f"note: {note}", err=True)
    return dev


def register(app: typer.Typer) -> None:
    @app.command()
    @interrupts.deferring
    def run(
        model: str = common.ModelOpt,
        device: str = common.DeviceOpt,
        max_latency: str = typer.Option(
            ..., "--max-latency", "-l", help="latency bound, e.g. 50ms, 50 ms, 0.05s, 50000us"
        ),
        trials: int | None = typer.Option(
            None, "--trials", "-n", help="configurations to measure (repeats of a measured one are free) [default: 40]"
        ),
        study_trials: int | None = typer.Option(
            None,
            "--study-trials",
            help="fleets: stop once the study holds this many completed trials from all workers together",
        ),
        worker_id: str | None = typer.Option(
            None, "--worker-id", help="name of this worker in the study (default host:pid)"
        ),
        heartbeat: int = typer.Option(
            DEFAULT_HEARTBEAT_S,
            "--heartbeat",
            help="seconds between heartbeats; a trial silent for 3 heartbeats is failed and retried",
        ),
        timeout: float | None = typer.Option(None, "--timeout", help="stop after this many seconds"),
        seed: int | None = typer.Option(None, "--seed", help="seed for the sampler and the twins' noise"),
        batch_sizes: str | None = common.BatchOpt,
        knobs: str | None = common.KnobsOpt,
        sampler: str = typer.Option(
            DEFAULT_SAMPLER,
            "--sampler",
            help="auto (= learned: GPs with a roofline prior), learned, gp, tpe, random, two-phase",
        ),
        storage: str | None = common.StorageOpt,
        out: Path = common.OutOpt,
        window: float = typer.Option(10.0, "--window", help="longest measured window per trial, seconds (hardware)"),
        min_window: float = common.MinWindowOpt,
        ci: str = common.CiOpt,
        runtime: str = common.RuntimeOpt,
        percentile: str = common.PercentileOpt,
        meter: str | None = common.MeterOpt,
        allow_clock_changes: bool = common.ClockOpt,
        sysfs_root: Path | None = common.SysfsOpt,
        space: Path | None = common.SpaceOpt,
        scenario: str = ScenarioOpt,
        target_qps: float | None = TargetQpsOpt,
        as_json: bool = common.JsonOpt,
    ) -> None:
        """Run (or resume) a study: minimum energy per query subject to the latency bound."""
        if study_trials is not None:
            check_count(study_trials, "--study-trials", 100)
        trials = check_count(trials if trials is not None else study_trials or 40, "--trials", 40)
        check_count(heartbeat, "--heartbeat", 10, maximum=3600)
        check_seconds(timeout, "--timeout", "600")
        bound = common.latency(max_latency)
        sampler = common.choice(canonical(sampler), SAMPLERS, "--sampler")
        check_meter(meter, device)
        url = common.run_storage(storage, out)
        dev = open_for(device, allow_clock_changes, sysfs_root, space)
        options = RunOptions(
            model=model,
            max_latency_ms=bound,
            trials=trials,
            timeout_s=timeout,
            seed=seed,
            batch_sizes=common.batch_list(batch_sizes),
            knobs=common.knob_list(knobs),
            sampler=sampler,
            storage=url,
            study_trials=study_trials,
            worker_id=worker_id,
            heartbeat_s=heartbeat,
            out=out,
            window=window_for(
                window_settings(window, percentile, meter, seed, True, min_window, ci, runtime), scenario, target_qps
            ),
        )
        check_model(model, runtime, dev.simulated, dev)
        narrowed_space(dev, options.knobs, options.batch_sizes)
        make_sampler(sampler, seed)
        started = time.monotonic()
        folder = results_dir(out, dev.slug, model)
        if options.window.scenario != "offline":
            folder = folder / scenario_label(options.window).replace("@", "-")
        with (
            hold(dev),
            trial_progress(
                trials if study_trials is None else study_trials, as_json, study_trials is not None
            ) as on_trial,
        ):
            study, summary = run_study(
                dev, options, on_trial=on_trial, on_interrupt=lambda study: _partial_results(study, folder)
            )
        pareto = write_results(study, folder)
        payload = {
            **summary.model_dump(),
            "device": dev.name,
            "twin": dev.simulated,
            "model": model,
            "max_latency_ms": options.max_latency_ms,
            "scenario": scenario_label(options.window),
            "results": str(folder),
            "seconds": round(time.monotonic() - started, 2),
            "pareto_points": len(pareto.fronts.get("global", [])),
            "strategy_notes": study.user_attrs.get("strategy_notes", []),
            "proposed_by": proposal_counts(study),
        }
        if as_json:
            common.emit_json(payload)
            return
        note = common.twin_note(dev)
        common.out_console.print(
            f"study {summary.study}: {summary.measured} measured, {summary.total_trials} trials in storage{note}"
        )
        for line in payload["strategy_notes"]:
            common.out_console.print(f"note: {line}")
        if payload["proposed_by"]:
            tally = ", ".join(f"{k} {v}" for k, v in payload["proposed_by"].items())
            common.out_console.print(f"proposed by: {tally} (per trial: proposed_by, why in trials.csv)")
        changed = resumed_line(summary)
        if changed:
            common.out_console.print(changed)
        if summary.best is None:
            common.out_console.print(
                f"no configuration met {options.max_latency_ms:g} ms: relax --max-latency or widen the space"
            )
        else:
            common.out_console.print(
                common.recommended_table(
                    summary.best,
                    f"recommended for {model} on {dev.name} ({options.window.percentile} <= "
                    f"{options.max_latency_ms:g} ms, {scenario_label(options.window)}){note}",
                    options.window.percentile,
                )
            )
        common.out_console.print(f"results: {folder}/ (pareto.json, pareto.csv, pareto.png, trials.csv)")

    @app.command()
    @interrupts.deferring
    def sweep(
        model: str = common.ModelOpt,
        device: str = common.DeviceOpt,
        max_latency: str | None = typer.Option(None, "--max-latency", "-l", help="report the optimum under this bound"),
        batch_sizes: str | None = common.BatchOpt,
        knobs: str | None = common.KnobsOpt,
        seed: int | None = typer.Option(
            None, "--seed", help="twins: add seeded measurement noise (default noise-free)"
        ),
        out: Path = common.OutOpt,
        window: float = typer.Option(10.0, "--window", help="longest measured window per point, seconds (hardware)"),
        min_window: float = common.MinWindowOpt,
        ci: str = common.CiOpt,
        runtime: str = common.RuntimeOpt,
        percentile: str = common.PercentileOpt,
        meter: str | None = common.MeterOpt,
        allow_clock_changes: bool = common.ClockOpt,
        sysfs_root: Path | None = common.SysfsOpt,
        space: Path | None = common.SpaceOpt,
        as_json: bool = common.JsonOpt,
    ) -> None:
        """Measure every configuration of the (narrowed) space: ground truth and characterization.

        A sweep over 20,000 configurations (or over ten minutes of hardware
        windows) first prints its size, the time to expect here and how to
        narrow it with --knobs or --batch-sizes; the progress bar counts
        configurations, with an ETA. The table shows J/query, and queries/J.
        """
        bound = common.latency(max_latency) if max_latency is not None else None
        settings = window_settings(window, percentile, meter, seed, seed is not None, min_window, ci, runtime)
        check_meter(meter, device)
        common.check_out_dir(out)
        dev = open_for(device, allow_clock_changes, sysfs_root, space)
        check_model(model, runtime, dev.simulated, dev)
        space = narrowed_space(dev, common.knob_list(knobs), common.batch_list(batch_sizes))
        total = space.size()
        vectorized = getattr(dev, "measure_many", None) is not None
        if total > LARGE_SWEEP or not vectorized:
            warning = size_warning(space, expected_seconds(dev, space, model, settings), floor=not vectorized)
            if warning:
                common.err_console.print(f"warning: {warning}")
        with hold(dev), common.count_progress("sweep", "configurations", as_json) as bar:
            task = bar.add_task("sweep", total=total)
            rows = run_sweep(dev, space, model, settings, progress=lambda done, _n: bar.update(task, completed=done))
        folder = results_dir(out, dev.slug, model)
        folder.mkdir(parents=True, exist_ok=True)
        write_sweep_csv(rows, folder / "sweep.csv", bound, percentile)
        plot_sweep(
            rows,
            folder / "sweep.png",
            f"{model} on {dev.name}{' [digital twin]' if dev.simulated else ''}",
            bound,
            percentile,
        )
        best = optimum(rows, bound, percentile)
        payload = {
            "device": dev.name,
            "twin": dev.simulated,
            "model": model,
            "configurations": len(rows),
            "failed": sum(1 for r in rows if r.error),
            "max_latency_ms": bound,
            "optimum": None
            if best is None
            else {
                "config": best.config.knobs,
                "batch_size": best.config.batch_size,
                **best.measurement.model_dump(include={"j_per_query", "p50_ms", "p90_ms", "p99_ms", "qps", "avg_w"}),
            },
            "results": str(folder),
        }
        if as_json:
            common.emit_json(payload)
            return
        note = common.twin_note(dev)
        by_batch = characterization(rows, bound, percentile)
        pinned = common.pinned_knobs([r[1] for r in by_batch])
        if pinned:
            common.out_console.print(f"the same in every row: {common.fmt(pinned)}")
        for r in by_batch:
            r[1] = {k: v for k, v in r[1].items() if k not in pinned} or "-"
        common.out_console.print(
            common.table(
                f"{model} on {dev.name}: best per batch size{note}",
                ["batch", "config", "J/query", "queries/J", f"{percentile} ms", "queries/s", "avg W"],
                by_batch,
            )
        )
        if best is None:
            common.out_console.print("no configuration meets the bound")
        else:
            m = best.measurement
            common.out_console.print(
                f"optimum{'' if bound is None else f' within {bound:g} ms'}: {best.config.label()}  "
                f"{m.j_per_query:.4g} J/query, {percentile} {m.latency_ms(percentile):.4g} ms{note}"
            )
        common.out_console.print(f"{len(rows)} configurations -> {folder}/sweep.csv, sweep.png")

    @app.command()
    @interrupts.deferring
    def measure(
        model: str = common.ModelOpt,
        device: str = common.DeviceOpt,
        batch_size: int = typer.Option(..., "--batch-size", "-b", help="batch size to measure, e.g. 8"),
        set_: list[str] = typer.Option(
            [],
            "--set",
            help="knob=value (repeatable), as the space files write values: channels_last=true (or yes/no), "
            "gpu_mhz=1300; other knobs keep their default",
        ),
        repeat: int = typer.Option(1, "--repeat", help="measure this many times"),
        seed: int | None = typer.Option(None, "--seed", help="twins: add seeded noise (default noise-free)"),
        window: float = typer.Option(10.0, "--window", help="longest measured window per repeat, seconds (hardware)"),
        min_window: float = common.MinWindowOpt,
        ci: str = common.CiOpt,
        runtime: str = common.RuntimeOpt,
        percentile: str = common.PercentileOpt,
        meter: str | None = common.MeterOpt,
        allow_clock_changes: bool = common.ClockOpt,
        sysfs_root: Path | None = common.SysfsOpt,
        space: Path | None = common.SpaceOpt,
        scenario: str = ScenarioOpt,
        target_qps: float | None = TargetQpsOpt,
        batch_timeout: float = typer.Option(
            0.0, "--batch-timeout", help="server scenario: dynamic batching timeout, ms (0: greedy)"
        ),
        as_json: bool = common.JsonOpt,
    ) -> None:
        """Measure one configuration (repeatably, with --repeat).

        With --repeat N the table ends with the mean and the standard deviation
        of the valid repeats: differences smaller than that spread are noise.
        """
        check_count(repeat, "--repeat", 3, maximum=1000)
        check_count(batch_size, "--batch-size", 8, maximum=MAX_BATCH)
        settings = window_for(
            window_settings(window, percentile, meter, seed, seed is not None, min_window, ci, runtime),
            scenario,
            target_qps,
        )
        if batch_timeout < 0:
            raise UserError("--batch-timeout must be zero or a positive number of ms, e.g. 10")
        settings.options["batch_timeout_ms"] = batch_timeout
        check_meter(meter, device)
        dev = open_for(device, allow_clock_changes, sysfs_root, space)
        check_model(model, runtime, dev.simulated, dev)
        space = dev.space()
        config = space.default_config(batch_size)
        config = Config(knobs={**config.knobs, **parse_assignments(set_, space)}, batch_size=batch_size)
        space.validate_config(config)
        effective = space.effective(config)
        results = measure_repeats(dev, model, effective, settings, repeat)
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
            return
        shown = ("j_per_query", "p50_ms", f"{settings.percentile}_ms" if settings.percentile != "p50" else "p99_ms")
        shown += ("qps", "avg_w")
        rows = [
            [i + 1, *(getattr(m, key) for key in shown), "yes" if m.valid else f"no: {m.reason}"]
            for i, m in enumerate(results)
        ]
        summary = payload["summary"]
        if summary is not None:
            rows.append(["mean", *(summary["mean"][key] for key in shown), ""])
            rows.append(["sd", *(summary["sd"][key] for key in shown), ""])
        heads = {"j_per_query": "J/query", "qps": "queries/s", "avg_w": "avg W"}
        common.out_console.print(f"config: {common.fmt(effective.knobs)}, batch {batch_size}")
        common.out_console.print(
            common.table(
                f"{model} on {dev.name} ({scenario_label(settings)}){common.twin_note(dev)}",
                ["#", *(heads.get(key, key.replace("_ms", " ms")) for key in shown), "valid"],
                rows,
            )
        )
        meters = ", ".join(sorted({m.meter for m in results}))
        spread = "" if summary is None else f"; mean and sd of the {summary['valid']} valid repeats"
        common.out_console.print(f"meter: {meters}{spread}")


def _partial_results(study: optuna.Study, folder: Path) -> None:
    """On Ctrl-C or SIGTERM: the result files for the trials that completed (the study itself resumes)."""
    done = sum(t.state == optuna.trial.TrialState.COMPLETE for t in study.get_trials(deepcopy=False))
    if done:
        write_results(study, folder)
        common.err_console.print(f"{done} completed trials kept; results: {folder}/; run the same command to resume")


REPEAT_FIELDS = ("j_per_query", "p50_ms", "p90_ms", "p99_ms", "qps", "avg_w")


def repeat_summary(results: list) -> dict[str, Any] | None:
    """Mean and sample standard deviation of the valid repeats (None for fewer than two).

    The spread is what a study's confirmation margin is made of: a difference
    between configurations smaller than it is noise.
    """
    import statistics

    valid = [m for m in results if m.valid]
    if len(results) < 2 or len(valid) < 2:
        return None
    columns = {key: [float(getattr(m, key)) for m in valid] for key in REPEAT_FIELDS}
    return {
        "valid": len(valid),
        "mean": {key: statistics.fmean(values) for key, values in columns.items()},
        "sd": {key: statistics.stdev(values) for key, values in columns.items()},
    }


def measure_repeats(dev: Device, model: str, config: Config, settings: WindowSettings, repeat: int) -> list:
    """Apply once, measure ``repeat`` windows, restore; each repeat draws its own noise on a twin."""
    from tuner.devices.hardware_session import hardware_session

    results = []
    with hardware_session(dev):
        interrupts.check()
        dev.apply(config)
        for i in range(repeat):
            interrupts.check()
            seed = None if settings.seed is None else settings.seed + i
            results.append(dev.measure(model, config, settings.model_copy(update={"seed": seed})))
    return results


def characterization(rows: list, bound: float | None, percentile: str) -> list[list]:
    """Per batch size, the lowest-energy valid configuration (within the bound when one is given).

    Each row: batch, knobs, J/query, queries/J, latency, queries/s, average W.
    """
    best: dict[int, Any] = {}
    for r in rows:
        m = r.measurement
        if m is None or not m.valid or (bound is not None and m.latency_ms(percentile) > bound):
            continue
        if r.config.batch_size not in best or m.j_per_query < best[r.config.batch_size].measurement.j_per_query:
            best[r.config.batch_size] = r
    return [
        [
            b,
            r.config.knobs,
            r.measurement.j_per_query,
            1 / r.measurement.j_per_query,
            r.measurement.latency_ms(percentile),
            r.measurement.qps,
            r.measurement.avg_w,
        ]
        for b, r in sorted(best.items())
    ]


class trial_progress:
    """A rich progress bar on stderr: trial n/N, the recommended configuration's energy so far, ETA.

    With ``study_wide`` the count is the study's completed trials from every
    worker, which is what ``--study-trials`` aims at.
    """

    def __init__(self, total: int, quiet: bool, study_wide: bool = False) -> None:
        self.total = total
        self.quiet = quiet
        self.study_wide = study_wide
        self.progress = Progress(
            TextColumn("trial {task.completed}/{task.total}"),
            BarColumn(),
            TextColumn("best {task.fields[best]}"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=common.err_console,
            disable=quiet,
            transient=False,
        )
        self.task: TaskID | None = None

    def __enter__(self):
        return self.update

    def update(self, study: optuna.Study, trial: optuna.trial.FrozenTrial, measured: int) -> None:
        """Show the bar from the first finished trial on, so an error before it prints alone."""
        from tuner.records import recommended

        if self.quiet:
            return  # nothing is shown: reading every trial back for the "best" label would be wasted
        if self.task is None:
            self.progress.__enter__()
            self.task = self.progress.add_task("trials", total=self.total, best="-")
        best = recommended(study)
        label = "-" if best is None else f"{best.value:.4g} J/query (trial {best.number})"
        if self.study_wide:
            measured = len(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)))
        self.progress.update(self.task, completed=min(measured, self.total), best=label)

    def __exit__(self, *exc: object) -> None:
        if self.task is not None:
            self.progress.__exit__(*exc)


def resumed_line(summary: RunSummary) -> str:
    """One line when a resumed study's answer changed during this run: which trial replaced which, and why."""
    before, after = summary.previous_best, summary.best
    if before is None or after is None or before["trial"] == after["trial"]:
        return ""
    return (
        f"the recommendation changed: trial {after['trial']} ({after['j_per_query']:.4g} J/query, "
        f"mean of {after['windows']} windows) replaces trial {before['trial']} ({before['j_per_query']:.4g} J/query): "
        "a new configuration met the bound for less energy"
    )
