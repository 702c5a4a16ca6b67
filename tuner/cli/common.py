"""Options and output helpers shared by the commands."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from tuner.devices.base import Device
from tuner.devices.registry import device_help, open_device
from tuner.units import parse_int_list, parse_latency_ms

out_console = Console(markup=False)
err_console = Console(stderr=True, markup=False)

ModelOpt = typer.Option(
    ...,
    "--model",
    "-m",
    help="model name (resnet50, mobilenet_v2, efficientnet_b0, bert-base, bert-large, tiny-cnn) or path.onnx",
)
DeviceOpt = typer.Option(..., "--device", "-d", help=device_help())
OutOpt = typer.Option(Path("studies"), "--out", help="results folder; the study storage defaults to <out>/tune.db")
StorageOpt = typer.Option(None, "--storage", help="Optuna storage URL (default sqlite:///<out>/tune.db)")
JsonOpt = typer.Option(False, "--json", help="print one JSON object on stdout and nothing else there")
BatchOpt = typer.Option(None, "--batch-sizes", help="narrow batch sizes, e.g. 1,8,32")
PercentileOpt = typer.Option("p99", "--percentile", help="latency percentile the bound applies to: p50, p90 or p99")
MeterOpt = typer.Option(
    None, "--meter", help="energy meter: nvml-energy, nvml-power, rapl, rails, jtop (device default if omitted)"
)
ClockOpt = typer.Option(
    False, "--allow-clock-changes", help="datacenter GPUs: let the tuner lock clocks and set the power limit"
)
SysfsOpt = typer.Option(None, "--sysfs-root", envvar="TUNE_SYSFS_ROOT", help="Jetson: sysfs root (containers, tests)")
SpaceOpt = typer.Option(None, "--space", help="a search-space YAML to use instead of the packaged one")
KnobsOpt = typer.Option(
    None, "--knobs", help="tune only these knobs (others stay at their default), e.g. gpu_mhz,emc_mhz"
)


def latency(text: str) -> float:
    return parse_latency_ms(text)


def batch_list(text: str | None) -> list[int] | None:
    return None if text is None else parse_int_list(text, "--batch-sizes")


def knob_list(text: str | None) -> list[str] | None:
    return None if text is None else [k.strip() for k in text.split(",") if k.strip()]


def device(name: str, **options: Any) -> Device:
    return open_device(name, **options)


def emit_json(obj: Any) -> None:
    """The whole stdout of a --json command: one JSON document."""
    typer.echo(json.dumps(obj, indent=2, default=str))


def twin_note(device: Device) -> str:
    return " [digital twin: simulated, not measured on hardware]" if device.simulated else ""


def table(title: str, columns: list[str], rows: list[list[Any]]) -> Table:
    t = Table(title=title)
    for c in columns:
        t.add_column(c, justify="right" if c not in ("config", "front") else "left")
    for r in rows:
        t.add_row(*[fmt(v) for v in r])
    return t


def fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict):
        return " ".join(f"{k}={v}" for k, v in value.items())
    return str(value)


def count_progress(label: str, unit: str, quiet: bool) -> Progress:
    """A transient progress bar on stderr that counts ``unit`` done out of a total, with ETA."""
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}" + (f" {unit}" if unit else "")),
        TimeRemainingColumn(),
        console=err_console,
        disable=quiet,
        transient=True,
    )
