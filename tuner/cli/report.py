"""tune report: the characterization study of models on devices, written up as one folder."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import typer

from tuner import interrupts
from tuner.cli import common
from tuner.cli.tuning import ScenarioOpt, TargetQpsOpt, check_meter, open_for, window_settings
from tuner.devices.registry import device_help
from tuner.errors import UserError
from tuner.models import check_model
from tuner.report.collect import make_report, plans_for
from tuner.report.document import write_report
from tuner.scenario import window_for
from tuner.storage import sqlite_path


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


def register(app: typer.Typer) -> None:
    @app.command()
    @interrupts.deferring
    def report(
        models: list[str] = typer.Option(..., "--model", "-m", help="model to characterize (repeatable)"),
        devices: list[str] = typer.Option(..., "--device", "-d", help="device (repeatable): " + device_help()),
        modes: str | None = typer.Option(
            None, "--modes", help="power modes to characterize, e.g. MAXN,15W,30W (default: every mode of each device)"
        ),
        knobs: str | None = typer.Option(
            None, "--knobs", help="knobs to vary besides the mode, e.g. precision,graph (others stay at the default)"
        ),
        batch_sizes: str | None = common.BatchOpt,
        scenario: str = ScenarioOpt,
        target_qps: float | None = TargetQpsOpt,
        batch_timeout: float = typer.Option(
            0.0, "--batch-timeout", help="server scenario: dynamic batching timeout, ms (0: greedy)"
        ),
        max_latency: str | None = typer.Option(
            None, "--max-latency", "-l", help="latency bound for the recommended configuration (default: none)"
        ),
        from_study: str | None = typer.Option(
            None, "--from-study", help="reuse the measurements of the studies in this tune.db (or its folder)"
        ),
        out: Path = typer.Option(Path("report"), "--out", help="report folder (report.md, report.html, figures)"),
        window: float = typer.Option(10.0, "--window", help="longest measured window per point, seconds (hardware)"),
        min_window: float = common.MinWindowOpt,
        ci: str = common.CiOpt,
        runtime: str = common.RuntimeOpt,
        percentile: str = common.PercentileOpt,
        meter: str | None = typer.Option(
            None,
            "--meter",
            help="energy meter: the device's own (nvml-energy, rails, rapl, ...; default) or an outside one, "
            "read with the device's: ptd://HOST:PORT, remote://HOST:PORT, py:module:Class (docs/meters.md)",
        ),
        seed: int | None = typer.Option(None, "--seed", help="twins: add seeded measurement noise (default none)"),
        allow_clock_changes: bool = common.ClockOpt,
        sysfs_root: Path | None = common.SysfsOpt,
    ) -> None:
        """Measure models on devices across power modes and batch sizes; write report.md and report.html."""
        settings = window_for(
            window_settings(window, percentile, meter, seed, seed is not None, min_window, ci, runtime),
            scenario,
            target_qps,
            None if percentile == "p99" else percentile,
        )
        if batch_timeout < 0:
            raise UserError("--batch-timeout must be zero or a positive number of ms, e.g. 10")
        if settings.scenario == "server":
            settings.options["batch_timeout_ms"] = batch_timeout
        bound = common.latency(max_latency) if max_latency is not None else None
        storage = study_storage(from_study) if from_study is not None else None
        common.check_out_dir(out)
        names = list(dict.fromkeys(devices))
        for name in names:
            check_meter(meter, name)
        opened = [open_for(name, allow_clock_changes, sysfs_root) for name in names]
        for model in dict.fromkeys(models):
            for dev in opened:
                check_model(model, runtime, dev.simulated, dev)
        plans = plans_for(
            opened, settings, common.knob_list(modes), common.knob_list(knobs), common.batch_list(batch_sizes)
        )
        with common.count_progress("report", "points", False) as bar:
            task = bar.add_task("report", total=None)

            def tick(label: str, done: int, total: int) -> None:
                bar.update(task, description=label, completed=done, total=total)

            data = make_report(
                plans,
                list(dict.fromkeys(models)),
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
