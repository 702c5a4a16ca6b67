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


def batch_size_extras(arrived: dict[int, int], executed: dict[int, int]) -> dict[str, str | float]:
    """A Server window's batches as a measurement's extras: counts per size as ``size:count`` lists, and padding.

    ``arrived`` counts batches by the samples they held, ``executed`` by the
    size that ran them (a CUDA graph ladder's size, or the arrived one);
    padding is the fraction of executed slots that held no sample. Hardware
    windows and twins write the same keys, so one reader serves both.
    """
    slots = sum(size * count for size, count in executed.items())
    samples = sum(size * count for size, count in arrived.items())
    return {
        "batch_sizes_arrived": " ".join(f"{size}:{count}" for size, count in sorted(arrived.items()) if count),
        "batch_sizes_executed": " ".join(f"{size}:{count}" for size, count in sorted(executed.items()) if count),
        "padding": 1.0 - samples / slots if slots else 0.0,
    }
