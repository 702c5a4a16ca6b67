"""The serving policy: arrival-rate bands, each with the configuration to run and what it measured.

Written by ``tune plan``, read by ``tune govern`` and ``tune replay``. Bands are
contiguous from 0 queries/s up to the highest rate the plan found feasible;
each holds the cheapest feasible Server configuration at its upper edge (the
hardest rate it must serve), with that configuration's energy per query and
tail latency there and the study trial it came from.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any, Literal

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from tuner import __version__
from tuner.errors import ConfigurationError
from tuner.plumbing import atomicfile
from tuner.plumbing.yamlfile import load_yaml_model
from tuner.space import Config

POLICY_VERSION = 1


class BandProvenance(BaseModel):
    """Where a band's configuration came from: a study trial, found there or measured by the plan."""

    model_config = ConfigDict(extra="forbid")

    study: str
    storage: str
    trial: int
    measured_by_plan: bool


class BandPoint(BaseModel):
    """A band's configuration measured at one planned rate (the plan's cross-check measures every pair)."""

    model_config = ConfigDict(extra="forbid")

    rate_qps: float = Field(gt=0, allow_inf_nan=False)
    j_per_query: float = Field(gt=0, allow_inf_nan=False)
    latency_ms: float = Field(ge=0)  # infinite where the plan measured no latency


class Band(BaseModel):
    """Rates in (min_qps, max_qps] run ``knobs`` with dynamic batching up to ``batch_size``.

    ``measured`` holds the configuration's energy per query at the planned
    rates, so a governor can weigh what a switch to it would save at the rate
    it observes; empty in policies planned before it was recorded.
    """

    model_config = ConfigDict(extra="forbid")

    min_qps: float = Field(ge=0, allow_inf_nan=False)
    max_qps: float = Field(gt=0, allow_inf_nan=False)
    knobs: dict[str, Any] = Field(min_length=1)
    batch_size: int = Field(gt=0)
    batch_timeout_ms: float = Field(ge=0, allow_inf_nan=False)
    j_per_query: float = Field(gt=0, allow_inf_nan=False)
    latency_ms: float = Field(ge=0, allow_inf_nan=False)
    avg_w: float = Field(gt=0, allow_inf_nan=False)
    provenance: BandProvenance
    measured: list[BandPoint] = Field(default_factory=list)

    def config(self) -> Config:
        """The device's configuration (the serving knobs are not device knobs)."""
        return Config(knobs=dict(self.knobs), batch_size=self.batch_size)

    def label(self) -> str:
        return f"{self.config().label()} timeout={self.batch_timeout_ms:g}ms"

    def j_per_query_at(self, rate_qps: float) -> float | None:
        """Energy per query at a rate, interpolated between the planned rates it was measured at; None unmeasured."""
        points = sorted(self.measured, key=lambda p: p.rate_qps)
        if not points:
            return None
        rates = [p.rate_qps for p in points]
        return float(np.interp(rate_qps, rates, [p.j_per_query for p in points]))


class PlanPoint(BaseModel):
    """The cheapest feasible configuration found at one planned rate (for the plot and the record)."""

    model_config = ConfigDict(extra="forbid")

    rate_qps: float
    feasible: bool
    j_per_query: float | None = None
    latency_ms: float | None = None
    label: str = ""
    study: str = ""
    trial: int | None = None
    """The rate's study and its recommended trial (what tune export --scenario server@RATEqps names)."""


class Policy(BaseModel):
    """A versioned rate-to-configuration table for one model, device kind, scenario and bound."""

    model_config = ConfigDict(extra="forbid")

    version: int = POLICY_VERSION
    model: str
    device: str
    device_kind: str
    twin: bool
    scenario: Literal["server"] = "server"
    percentile: Literal["p50", "p90", "p99"]
    max_latency_ms: float = Field(gt=0, allow_inf_nan=False)
    bands: list[Band] = Field(min_length=1)
    points: list[PlanPoint] = Field(default_factory=list)
    created_at: str = ""
    tool_version: str = __version__

    @model_validator(mode="after")
    def _contiguous(self) -> Policy:
        edge = 0.0
        for band in self.bands:
            if abs(band.min_qps - edge) > 1e-9 or band.max_qps <= band.min_qps:
                raise ValueError(f"bands must be contiguous from 0 and increasing; a band starts at {band.min_qps}")
            edge = band.max_qps
        return self

    @property
    def top(self) -> int:
        """The highest-throughput band: the safe choice when the rate is unknown or above every band."""
        return len(self.bands) - 1

    def band_for(self, rate_qps: float) -> int | None:
        """The band whose (min, max] holds the rate; None above every band."""
        for i, band in enumerate(self.bands):
            if rate_qps <= band.max_qps:
                return i
        return None


def stamp() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def write_policy(policy: Policy, path: Path) -> None:
    """Write the policy atomically: a full disk or a refused folder leaves the old policy as it was."""
    header = "# powertune serving policy: arrival-rate bands -> configuration"
    if policy.twin:
        header += " (planned on a digital twin, not hardware)"
    atomicfile.write_text(path, header + "\n" + yaml.safe_dump(policy.model_dump(mode="json"), sort_keys=False))


def load_policy(path: Path) -> Policy:
    """Read a policy; a missing, corrupt or foreign file is a one-line user error."""
    return load_yaml_model(
        path, Policy, "serving policy", "re-create it with tune plan", version=POLICY_VERSION, trusted=True
    )


def check_policy(policy: Policy, device_kind: str, model: str | None = None) -> None:
    """Refuse a policy planned for another kind of device or another model, before anything is applied."""
    if policy.device_kind != device_kind:
        raise ConfigurationError(
            f"this policy is for {policy.device_kind}, but the device is {device_kind}: "
            "plan one on this kind of device with tune plan"
        )
    if model is not None and model != policy.model:
        raise ConfigurationError(
            f"this policy is for model {policy.model}, not {model}: plan one for {model} with tune plan"
        )
