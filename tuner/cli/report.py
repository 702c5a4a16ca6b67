"""tune report: the characterization study of models on devices, written up as one folder."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import typer

from tuner.cli import common, options
from tuner.devices.registry import check_meter, device_help
from tuner.errors import UserError
from tuner.measure.settings import WindowSettings
from tuner.models import check_model
from tuner.plumbing import interrupts
from tuner.report.collect import Plan, make_report, plans_for
from tuner.report.document import write_report
from tuner.storage import sqlite_path

Models = typer.Option(..., "--model", "-m", help="model to characterize (repeatable)")
Devices = typer.Option(..., "--device", "-d", help="device (repeatable): " + device_help())
Modes = typer.Option(
    None, "--modes", help="power modes to characterize, e.g. MAXN,15W,30W (default: every mode of each device)"
)
ReportKnobs = typer.Option(
    None, "--knobs", help="knobs to vary besides the mode, e.g. precision,graph (others stay at the default)"
)
ReportBound = typer.Option(
    None, "--max-latency", "-l", help="latency bound for the recommended configuration (default: none)"
)
FromStudy = typer.Option(
    None, "--from-study", help="reuse the measurements of the studies in this tune.db (or its folder)"
)
ReportOut = typer.Option(Path("report"), "--out", help="report folder (report.md, report.html, figures)")
ReportMeter = typer.Option(
    None,
    "--meter",
    help="energy meter: the device's own (nvml-energy, rails, rapl, ...; default) or an outside one, "
    "read with the device's: ptd://HOST:PORT, remote://HOST:PORT, py:module:Class (docs/meters.md)",
)
ReportSeed = typer.Option(None, "--seed", help="twins: add seeded measurement noise (default none)")


def study_storage(text: str) -> str:
    """A storage URL, or the path of a study database (tune.db, or the folder holding it)."""
    if "://" in text:
        path = sqlite_path(text)
        if path is not None and not path.is_file():
            raise UserError(f"--from-study {text}: no study database at {path}: give the tune.db of a tune run")
        return text
    path = Path(text)
    if path.is_dir():
        path = path / "tune.db"
    if not path.is_file():
        raise UserError(f"--from-study {text}: no study database there: give a tune.db or the folder holding one")
    return f"sqlite:///{path.as_posix()}"


@interrupts.deferring
def report(
    models: list[str] = Models,
    devices: list[str] = Devices,
    modes: str | None = Modes,
    knobs: str | None = ReportKnobs,
    batch_sizes: str | None = options.BatchSizes,
    scenario: str = options.Scenario,
    target_qps: float | None = options.TargetQps,
    batch_timeout: float = options.BatchTimeout,
    max_latency: str | None = ReportBound,
    from_study: str | None = FromStudy,
    out: Path = ReportOut,
    window: float = options.window("point"),
    min_window: float = options.MinWindow,
    ci: str = options.Ci,
    runtime: str = options.Runtime,
    percentile: str = options.Percentile,
    meter: str | None = ReportMeter,
    seed: int | None = ReportSeed,
    allow_clock_changes: bool = options.AllowClockChanges,
    sysfs_root: Path | None = options.SysfsRoot,
) -> None:
    """Measure models on devices across power modes and batch sizes; write report.md and report.html."""
    settings = options.scenario_window(
        options.window_settings(window, percentile, meter, seed, seed is not None, min_window, ci, runtime),
        scenario,
        target_qps,
        batch_timeout,
        None if percentile == "p99" else percentile,
        server_only=True,
    )
    bound = common.latency(max_latency) if max_latency is not None else None
    storage = study_storage(from_study) if from_study is not None else None
    common.check_out_dir(out)
    names = list(dict.fromkeys(devices))
    for name in names:
        check_meter(meter, name)
    opened = [options.open_for(name, allow_clock_changes, sysfs_root) for name in names]
    for model in dict.fromkeys(models):
        for dev in opened:
            check_model(model, runtime, dev.simulated, dev)
    plans = plans_for(
        opened, settings, common.knob_list(modes), common.knob_list(knobs), common.batch_list(batch_sizes)
    )
    _write_report(plans, list(dict.fromkeys(models)), settings, bound, storage, out)


def _write_report(
    plans: list[Plan],
    models: list[str],
    settings: WindowSettings,
    bound: float | None,
    storage: str | None,
    out: Path,
) -> None:
    """Measure (or reuse) every planned point with a progress bar, write the report, and say what it holds."""
    with common.count_progress("report", "points", False) as bar:
        task = bar.add_task("report", total=None)

        def tick(label: str, done: int, total: int) -> None:
            bar.update(task, description=label, completed=done, total=total)

        data = make_report(
            plans,
            models,
            settings,
            "tune " + shlex.join(sys.argv[1:]) if sys.argv[1:2] == ["report"] else "tune report",
            max_latency_ms=bound,
            from_study=storage,
            progress=tick,
        )
    write_report(data, out)
    reused = sum(1 for p in data.points if p.source.startswith("study "))
    twins = [d.device for d in data.devices if d.twin]
    note = f" ({', '.join(twins)}: digital twin, not hardware)" if twins else ""
    common.out_console.print(
        f"{len(data.points)} points ({len(data.points) - reused} measured, {reused} reused){note} "
        f"-> {out}/report.md, report.html"
    )
    for info in data.devices:
        for note in info.notes:
            common.err_console.print(f"note: {note}")
        for model in models:
            answer = data.answer(info.device, model)
            if answer is not None:
                common.out_console.print(
                    f"recommended for {model} on {info.device}: trial {answer.trial} of study {answer.study} "
                    f"({answer.measurement.j_per_query:.4g} J/query, batch {answer.config.batch_size})"
                )
                if answer.saved is not None:
                    common.out_console.print(f"saved: {answer.saved.line}")
            elif f"{info.device}|{model}" in data.saved:
                common.out_console.print(
                    f"saved for {model} on {info.device}: {data.saved[f'{info.device}|{model}'].line}"
                )
