"""The options more than one command takes, each declared once, and what turns them into library settings.

A command names an option here by its constant (``model: str = options.Model``);
an option only one command takes is declared beside that command. The window
options (window, min-window, ci, runtime, percentile, meter, seed, scenario,
target-qps, batch-timeout) become one WindowSettings through
:func:`window_settings` and :func:`scenario_window`; the device options
(device, allow-clock-changes, sysfs-root, space) become a Device through
:func:`open_for`.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import typer
from typer.core import TyperCommand
from typer.models import OptionInfo

from tuner.cli import common
from tuner.devices import base
from tuner.devices.registry import device_help
from tuner.errors import ConfigurationError, UserError
from tuner.measure.prompts import load_prompts
from tuner.measure.settings import WindowSettings
from tuner.plumbing.units import (
    MAX_BATCH_TIMEOUT_MS,
    check_range,
    check_rate,
    check_seconds,
    check_seed,
)
from tuner.scenario import window_for

Model = typer.Option(
    ...,
    "--model",
    "-m",
    help="zoo model (resnet50, mobilenet_v2, efficientnet_b0, bert-base, bert-large, tiny-cnn), "
    "your own PyTorch model as py:module:factory (docs/models.md), path.onnx, a TensorRT path.engine, "
    "or a causal LM: tiny-llm, llama3.2-1b-random, hf:ORG/NAME, a model folder (docs/llm.md)",
)
Device = typer.Option(..., "--device", "-d", help=device_help())
Out = typer.Option(
    Path("studies"),
    "--out",
    help="results folder, the same in every command: the study storage is <out>/tune.db (unless --storage), results "
    "go to <out>/<device>/<model>/, or <out>/<model>/ when --out already ends with the device's folder name "
    "(e.g. --out studies/h200 on an H200); a file such as best.yaml is named with -o, not --out",
)


def _storage_url(value: str | None) -> str | None:
    from tuner.storage import storage_url

    return None if value is None else storage_url(value)


Storage = typer.Option(
    None,
    "--storage",
    callback=_storage_url,
    help="Optuna storage URL (default sqlite:///<out>/tune.db), or the path of an SQLite file (x.db is "
    "sqlite:///x.db); keep PostgreSQL passwords out of it: PGPASSWORD, ~/.pgpass or ?password_env=VAR",
)
Json = typer.Option(False, "--json", help="print one JSON object on stdout and nothing else there")
BatchSizes = typer.Option(None, "--batch-sizes", help="narrow batch sizes, e.g. 1,8,32")
Knobs = typer.Option(None, "--knobs", help="tune only these knobs (others stay at their default), e.g. gpu_mhz,emc_mhz")
Seed = typer.Option(None, "--seed", help="seed for the sampler and the twins' noise")
StudyBound = typer.Option(None, "--max-latency", "-l", help="which study, when several bounds were tuned")
StudyScenario = typer.Option(
    None, "--scenario", help="which study: offline, singlestream, server or server@RATEqps (as tune run named it)"
)
PolicyFile = typer.Argument(..., help="a policy written by tune plan")

# the measuring window
MinWindow = typer.Option(
    2.0, "--min-window", help="adaptive window: shortest window, seconds; equal to --window for a fixed window"
)
Ci = typer.Option(
    "1%", "--ci", help="adaptive window: stop once the 95% interval of J/query is within this relative half-width"
)
Runtime = typer.Option(
    "auto",
    "--runtime",
    help="what runs the model: auto (by the model), torch, onnxruntime, tensorrt (builds .onnx into engines)",
)
Percentile = typer.Option("p99", "--percentile", help="latency percentile the bound applies to: p50, p90 or p99")
Meter = typer.Option(
    None, "--meter", help="energy meter: nvml-energy, nvml-power, rapl, rails, jtop (device default if omitted)"
)
Scenario = typer.Option(
    "offline",
    "--scenario",
    help="MLPerf LoadGen scenario: offline, server (Poisson arrivals at --target-qps, bound on p99, "
    "dynamic batching tuned) or singlestream (one query at a time, bound on p90)",
)
TargetQps = typer.Option(None, "--target-qps", help="server scenario: arrival rate, queries/s")
Prompts = typer.Option(
    None, "--prompts", help="LLM workload: openorca (default), cnndm, or a JSONL file of prompts or token lengths"
)
MaxTtft = typer.Option(None, "--max-ttft", help="LLM bound on time to first token at --percentile, e.g. 500ms")
MaxTpot = typer.Option(None, "--max-tpot", help="LLM bound on time per output token at --percentile, e.g. 30ms")
BatchTimeout = typer.Option(0.0, "--batch-timeout", help="server scenario: dynamic batching timeout, ms (0: greedy)")

# opening the device
AllowClockChanges = typer.Option(
    False, "--allow-clock-changes", help="datacenter GPUs: let the tuner lock clocks and set the power limit"
)
SysfsRoot = typer.Option(None, "--sysfs-root", envvar="TUNE_SYSFS_ROOT", help="Jetson: sysfs root (containers, tests)")
Space = typer.Option(None, "--space", help="a search-space YAML to use instead of the packaged one")

PERCENTILES = ("p50", "p90", "p99")


def window(per: str, adaptive: bool = True) -> OptionInfo:
    """``--window``: the (longest, when the window is adaptive) measured window per trial, point or repeat."""
    what = "longest measured window" if adaptive else "measured window"
    return typer.Option(10.0, "--window", help=f"{what} per {per}, seconds (hardware)")


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
    """The window options, checked, as the library's WindowSettings (the offline scenario)."""
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


def llm_window(
    settings: WindowSettings, prompts: str | None, max_ttft: str | None, max_tpot: str | None
) -> WindowSettings:
    """``settings`` with an LLM's workload (read here, so a bad file is refused first) and token bounds, checked."""
    if prompts is not None:
        load_prompts(prompts)
    update: dict[str, Any] = {"prompts": prompts}
    for flag, key, text in (("--max-ttft", "max_ttft_ms", max_ttft), ("--max-tpot", "max_tpot_ms", max_tpot)):
        if text is not None:
            try:
                update[key] = common.latency(text)
            except UserError as exc:
                raise ConfigurationError(f"{flag}: {exc}") from None
    return settings.model_copy(update=update)


def scenario_window(
    settings: WindowSettings,
    scenario: str,
    target_qps: float | None,
    batch_timeout: float,
    percentile: str | None = None,
    server_only: bool = False,
) -> WindowSettings:
    """``settings`` in ``scenario`` with the dynamic batching timeout (set in the server scenario only, or always)."""
    settings = window_for(settings, scenario, target_qps, percentile)
    if batch_timeout < 0:
        raise UserError("--batch-timeout must be zero or a positive number of ms, e.g. 10")
    if settings.scenario == "server" or not server_only:
        settings.options["batch_timeout_ms"] = batch_timeout
    return settings


def device_options(allow_clock_changes: bool, sysfs_root: Path | None, space: Path | None) -> dict[str, Any]:
    """The device options as tuner.api.tune takes them."""
    return {"allow_clock_changes": allow_clock_changes, "sysfs_root": sysfs_root, "space_file": space}


def open_for(name: str, allow_clock_changes: bool, sysfs_root: Path | None, space: Path | None = None) -> base.Device:
    """The device the device options name, its notes (if any) said on stderr."""
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


# -- every value checked where it enters, before the command runs -------------------------------

# The kernel's pseudo-filesystems: a study database there is a typo or an attack, never a file.
PSEUDO_FILESYSTEMS = ("/proc", "/sys", "/dev")


def check_storage_location(url: str, flag: str = "--storage") -> str:
    """A SQLite storage URL must name a file outside the kernel's pseudo-filesystems."""
    from tuner.storage import sqlite_path

    path = sqlite_path(url)
    if path is not None:
        resolved = Path(os.path.abspath(path))
        pseudo = next((top for top in PSEUDO_FILESYSTEMS if resolved.is_relative_to(top)), None)
        if pseudo is not None:
            raise UserError(f"{flag} {url}: {pseudo} holds the kernel's files, not a database: name another file")
    return url


# Options whose range (or form) is the same wherever they are declared (by flag).
_RANGES = {
    "--storage": check_storage_location,
    "--seed": check_seed,
    "--target-qps": check_rate,
    "--batch-timeout": lambda v, flag: check_range(v, flag, 0.0, MAX_BATCH_TIMEOUT_MS, "10"),
}


def _flag(param: Any) -> str:
    longs = [opt for opt in getattr(param, "opts", []) if opt.startswith("--")]
    return longs[0] if longs else str(param.name)


def _check_number(flag: str, value: Any) -> None:
    """Every decimal number an option takes is finite, whatever else its command checks (counts have their own)."""
    if isinstance(value, float) and not math.isfinite(value):
        raise UserError(f"{flag} must be a finite number, not {value}")


def check_values(ctx: Any, params: list[Any]) -> None:
    """The values a command was given, checked before it runs: finite, in range, consistent."""
    for param in params:
        value = ctx.params.get(param.name)
        if value is None:
            continue
        flag = _flag(param)
        for item in value if isinstance(value, list | tuple) else [value]:
            _check_number(flag, item)
            if flag in _RANGES and not isinstance(item, bool):
                _RANGES[flag](item, flag)
    window, min_window = ctx.params.get("window"), ctx.params.get("min_window")
    if _from_user(ctx, "min_window") and window is not None and min_window is not None and min_window > window:
        raise UserError(
            f"--min-window {min_window:g} is longer than --window {window:g}: the shortest window cannot be "
            f"longer than the longest; e.g. --min-window {min(2.0, window):g} --window {window:g}"
        )


def _from_user(ctx: Any, name: str) -> bool:
    """Whether the user gave the option (a default --min-window above a short --window is clipped, not refused)."""
    source = ctx.get_parameter_source(name)
    return getattr(source, "name", "") in ("COMMANDLINE", "ENVIRONMENT")


class CheckedCommand(TyperCommand):
    """A command whose option values are checked (:func:`check_values`) before its function runs."""

    def invoke(self, ctx: Any) -> Any:
        check_values(ctx, self.params)
        return super().invoke(ctx)
