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

from tuner.baseline import Saved
from tuner.measurement import Measurement
from tuner.plumbing import atomicfile
from tuner.space import Config

REPORT_VERSION = 3
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


class StudyAnswer(BaseModel):
    """A study's recommended configuration (Optuna's best trial, as ``tune export`` names it), read by --from-study.

    When the report's bound and percentile are the study's, this is the
    report's recommended configuration: one answer, whatever the report's
    own grid of modes and batch sizes holds. ``saved``: the answer against
    the study's baseline (tuner.baseline; version 3 on), when it measured one.
    """

    model_config = ConfigDict(extra="forbid")

    device: str
    model: str
    study: str
    trial: int
    max_latency_ms: float
    percentile: str
    config: Config
    measurement: Measurement
    saved: Saved | None = None

    def point(self) -> Point:
        """The answer as a report point (plots and the power trace draw points)."""
        return Point(
            device=self.device,
            model=self.model,
            group=f"study trial {self.trial}",
            config=self.config,
            measurement=self.measurement,
            source=f"study {self.study} trial {self.trial}",
        )


class DeviceInfo(BaseModel):
    """Where a device's figures come from: hardware or twin, driver or L4T, host, versions, meter and rails."""

    model_config = ConfigDict(extra="forbid")

    device: str
    twin: bool
    provenance: dict[str, Any]
    meters: list[str] = Field(default_factory=list)
    rails: list[str] = Field(default_factory=list)
    meter_details: dict[str, str] = Field(default_factory=dict)
    notes: list[str] = Field(default_factory=list)


class ReportData(BaseModel):
    """Everything the report shows; report.md and report.html are drawn from this alone."""

    model_config = ConfigDict(extra="forbid")

    version: Literal[1, 2, 3] = REPORT_VERSION
    created: str
    command: str
    scenario: str
    percentile: str
    max_latency_ms: float | None = None
    models: list[str]
    devices: list[DeviceInfo]
    points: list[Point]
    traces: list[Trace] = Field(default_factory=list)
    answers: list[StudyAnswer] = Field(default_factory=list)
    saved: dict[str, Saved] = Field(default_factory=dict)
    """The grid's own recommendation against the grid's default point (``device|model``), where no study answers."""

    def device_info(self, name: str) -> DeviceInfo:
        return next(d for d in self.devices if d.device == name)

    def answer(self, device: str, model: str) -> StudyAnswer | None:
        """The study answer that is this report's recommendation: same device, model, bound and percentile."""
        return next(
            (
                a
                for a in self.answers
                if (a.device, a.model, a.max_latency_ms, a.percentile)
                == (device, model, self.max_latency_ms, self.percentile)
            ),
            None,
        )


def write_data(data: ReportData, path: Path) -> None:
    atomicfile.write_text(path, data.model_dump_json(indent=2))
