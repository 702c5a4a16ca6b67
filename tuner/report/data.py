"""The report's data file (report.json): every figure with where it came from.

A point is one device, model, group (power mode or runner-knob combination)
and batch size, with its measurement or the error that stopped it. The file is
versioned; twin figures carry ``twin`` in their measurement and provenance.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from tuner import atomicfile
from tuner.measurement import Measurement
from tuner.space import Config

REPORT_VERSION = 1
TWIN_LABEL = "digital twin"


class Point(BaseModel):
    """One configuration: ``source`` is "measured", "digital twin" or "study <name> trial <n>" (reused)."""

    model_config = ConfigDict(extra="forbid")

    device: str
    model: str
    group: str
    config: Config
    measurement: Measurement | None = None
    error: str = ""
    source: str

    @property
    def ok(self) -> bool:
        m = self.measurement
        return m is not None and m.valid and math.isfinite(m.j_per_query) and m.j_per_query > 0


class Trace(BaseModel):
    """Power over time during one window; ``kind`` "sampled" is read from the device, "twin-mean" is modelled."""

    model_config = ConfigDict(extra="forbid")

    device: str
    model: str
    group: str
    batch_size: int
    kind: Literal["sampled", "twin-mean"]
    t_s: list[float]
    watts: list[float]
    note: str = ""


class DeviceInfo(BaseModel):
    """Where a device's figures come from: hardware or twin, driver or L4T, host, versions, meter and rails."""

    model_config = ConfigDict(extra="forbid")

    device: str
    twin: bool
    provenance: dict[str, Any]
    meters: list[str] = Field(default_factory=list)
    rails: list[str] = Field(default_factory=list)
    meter_details: dict[str, str] = Field(default_factory=dict)


class ReportData(BaseModel):
    """Everything the report shows; report.md and report.html are drawn from this alone."""

    model_config = ConfigDict(extra="forbid")

    version: Literal[1] = REPORT_VERSION
    created: str
    command: str
    scenario: str
    percentile: str
    max_latency_ms: float | None = None
    models: list[str]
    devices: list[DeviceInfo]
    points: list[Point]
    traces: list[Trace] = Field(default_factory=list)

    def device_info(self, name: str) -> DeviceInfo:
        return next(d for d in self.devices if d.device == name)


def write_data(data: ReportData, path: Path) -> None:
    atomicfile.write_text(path, data.model_dump_json(indent=2))
