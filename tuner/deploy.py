"""Exported best-mode configurations: written by ``tune export``, read by ``tune apply``."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import optuna
import yaml
from pydantic import BaseModel, ConfigDict

from tuner import __version__, atomicfile
from tuner.devices.base import Device
from tuner.devices.hardware_session import deployment
from tuner.errors import UserError
from tuner.records import recommended, trial_record
from tuner.space import Config
from tuner.storage import redact
from tuner.units import format_ms
from tuner.yamlfile import load_yaml_model

EXPORT_VERSION = 1


class Provenance(BaseModel):
    """Where an exported mode comes from: the study and trial, and what it was measured on and with.

    ``measured_on`` (hardware name, driver or L4T release, host) and
    ``software`` (tool, torch, onnxruntime, LoadGen versions) are copied from
    the study; exports written before they were recorded lack them.
    """

    model_config = ConfigDict(extra="forbid")

    study: str
    storage: str
    trial: int
    exported_at: str
    tool_version: str = __version__
    meter: str | None = None
    measured_on: dict[str, Any] | None = None
    software: dict[str, str | None] | None = None


class ExportedConfig(BaseModel):
    """A deployable power mode: the knobs and batch size, and what they measured."""

    model_config = ConfigDict(extra="forbid")

    version: int = EXPORT_VERSION
    device_kind: str
    device: str
    twin: bool
    model: str
    batch_size: int
    knobs: dict[str, Any]
    max_latency_ms: float
    percentile: str
    metrics: dict[str, Any]
    provenance: Provenance


def export_config(study: optuna.Study, storage: str) -> ExportedConfig:
    """The study's recommended configuration (tuner.records.recommended) as an export."""
    attrs = study.user_attrs
    percentile = attrs.get("percentile", "p99")
    max_latency_ms = float(attrs["max_latency_ms"])
    trial = recommended(study)
    if trial is None:
        done = len(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)))
        raise UserError(
            f"no configuration of study {study.study_name} meets {format_ms(max_latency_ms)} at {percentile} "
            f"({done} completed trials): run more trials (tune run resumes it) or tune a looser bound"
        )
    record = trial_record(trial)
    metrics = {k: record[k] for k in ("j_per_query", "p50_ms", "p90_ms", "p99_ms", "qps", "avg_w")}
    metrics["meter"] = record["meter"]
    metrics["windows"] = record["windows"]
    metrics["verdict"] = record["verdict"]
    measured = dict(attrs.get("provenance") or {})
    software = measured.pop("software", None)
    return ExportedConfig(
        device_kind=attrs["device_kind"],
        device=attrs["device"],
        twin=bool(attrs.get("twin", False)),
        model=attrs["model"],
        batch_size=int(record["batch_size"]),
        knobs=dict(record["config"]),
        max_latency_ms=max_latency_ms,
        percentile=percentile,
        metrics=metrics,
        provenance=Provenance(
            study=study.study_name,
            storage=redact(storage),
            trial=trial.number,
            exported_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            meter=record["meter"],
            measured_on=measured or None,
            software=software,
        ),
    )


def write_export(config: ExportedConfig, path: Path) -> None:
    header = "# powertune best-mode configuration"
    if config.twin:
        header += " (digital twin: simulated, not measured on hardware)"
    atomicfile.write_text(path, header + "\n" + yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))


def load_export(path: Path) -> ExportedConfig:
    """Read an exported configuration; a corrupt or foreign file is a one-line user error."""
    return load_yaml_model(
        path,
        ExportedConfig,
        "exported configuration",
        "re-create it with tune export",
        version=EXPORT_VERSION,
        trusted=True,
    )


def deploy_config(exported: ExportedConfig, device: Device) -> Config:
    """The configuration an export asks of ``device``, checked before anything is written.

    The device kind must match, and every knob value must be one the device
    supports now (a board's own frequency table, a GPU's supported clocks):
    an export from another board or L4T release fails here, not half-way
    through writing.
    """
    if exported.device_kind != device.kind:
        raise UserError(
            f"this export is for {exported.device_kind}, but {device.name} is {device.kind}: "
            "export a configuration tuned on this kind of device"
        )
    space = device.space()
    config = Config(knobs=dict(exported.knobs), batch_size=exported.batch_size)
    space.validate_config(config)
    return config


def apply_export(exported: ExportedConfig, device: Device, dry_run: bool = False) -> list[str]:
    """Apply an export for deployment; return what was (or, dry-run, would be) written.

    The original state is journaled first and is not restored at exit: the
    mode stays until ``tune restore``. The device is locked meanwhile, and an
    apply that fails or is interrupted is undone (see :func:`deployment`). Applying twice is harmless: the device
    writes only what differs, and the journal keeps the state from before the
    first apply.
    """
    config = deploy_config(exported, device)
    plan = getattr(device, "plan_writes", None)
    steps = [w.shell() for w in plan(config)] if plan is not None else [f"{k}={v}" for k, v in config.knobs.items()]
    if dry_run or device.simulated:
        return steps
    with deployment(device):
        device.apply(config)
    return steps
