"""The result of measuring one configuration: what every trial, sweep row and export carries."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

METRIC_KEYS = ("j_per_query", "p50_ms", "p90_ms", "p99_ms", "qps", "avg_w", "energy_j", "queries", "duration_s")
"""The metrics every trial and export carries, in this order."""


class Measurement(BaseModel):
    """Energy and latency of one measured window.

    ``j_per_query`` is device energy over the window divided by the queries
    completed in it; ``meter`` and ``rails`` say what that energy covers.
    ``valid`` is False when the number must not be trusted (throttling, a
    window too short for the meter, a runner error); ``reason`` says why.
    """

    model_config = ConfigDict(extra="forbid")

    j_per_query: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    qps: float
    avg_w: float
    energy_j: float
    queries: int
    duration_s: float
    meter: str
    rails: list[str] = Field(default_factory=list)
    twin: bool = False
    throttled: bool = False
    temps_c: dict[str, float] = Field(default_factory=dict)
    valid: bool = True
    reason: str = ""
    extra: dict[str, float | str] = Field(default_factory=dict)

    def latency_ms(self, percentile: str = "p99") -> float:
        return {"p50": self.p50_ms, "p90": self.p90_ms, "p99": self.p99_ms}[percentile]
