"""tune verify: check an export on this unit, re-tune locally if it does not hold, record the verdict."""

from __future__ import annotations

from pathlib import Path

import typer

from tuner.cli import common, options
from tuner.cli.deploy import default_device
from tuner.deploy import load_export
from tuner.errors import UserError
from tuner.plumbing import interrupts
from tuner.verify import MAX_WINDOWS, Verdict, verify_unit

ExportArg = typer.Argument(..., help="a YAML file written by tune export (with its digest)")
VerifyDevice = typer.Option(None, "--device", "-d", help="this unit's device (default: the export's own)")
Unit = typer.Option(None, "--unit", help="this unit's name in the fleet (default: host:device)")
Tolerance = typer.Option(0.05, "--tolerance", help="energy per query allowed above the study's, as a fraction")
RetuneTrials = typer.Option(6, "--retune-trials", help="trials of the local re-tune when the export does not hold")
VerifyModel = typer.Option(None, "--model", "-m", help="the model this unit serves: an export of another is refused")


@interrupts.deferring
def verify(
    config_file: Path = ExportArg,
    device: str | None = VerifyDevice,
    model: str | None = VerifyModel,
    unit: str | None = Unit,
    tolerance: float = Tolerance,
    retune_trials: int = RetuneTrials,
    storage: str | None = options.Storage,
    out: Path = options.Out,
    window: float = options.window("window"),
    seed: int | None = options.Seed,
    allow_clock_changes: bool = options.AllowClockChanges,
    sysfs_root: Path | None = options.SysfsRoot,
    as_json: bool = options.Json,
) -> None:
    """Check an export on this unit (at most 3 windows); re-tune locally if it does not hold."""
    exported = load_export(config_file, sealed=True)
    if model is not None and model != exported.model:
        raise UserError(f"{config_file} is an export for model {exported.model}, not {model}: export this model's")
    local = None if storage is not None else common.run_storage(None, out)
    dev = options.open_for(
        device or default_device(exported.device, exported.device_kind), allow_clock_changes, sysfs_root
    )
    settings = options.window_settings(window, exported.percentile, None, seed, True)
    verdict = verify_unit(exported, dev, settings, storage, local, unit, tolerance, retune_trials, seed)
    if as_json:
        common.emit_json(verdict.model_dump(mode="json"))
        return
    print_verdict(verdict)


def print_verdict(v: Verdict) -> None:
    twin = " (digital twin)" if v.device.startswith("sim:") else ""
    common.out_console.print(
        f"{v.unit}{twin}: {v.verdict} after {v.windows} of at most {MAX_WINDOWS} windows: {v.reason} "
        f"({v.j_per_query:.4g} J/query vs the study's {v.study_j_per_query:.4g}, tolerance {v.tolerance:.0%})"
    )
    if v.retune:
        r = v.retune
        common.out_console.print(
            f"re-tuned locally in {r['trials']} trials ({r['seeded']} seeded from the study): trial {r['trial']}, "
            f"batch {r['batch_size']}, {common.fmt(r['knobs'])}: {r['j_per_query']:.4g} J/query, "
            f"{r['latency_ms']:.4g} ms (study {r['study']})"
        )
