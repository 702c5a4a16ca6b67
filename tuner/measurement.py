"""The result of measuring one configuration: what every trial, sweep row and export carries."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

METRIC_KEYS = ("j_per_query", "p50_ms", "p90_ms", "p99_ms", "qps", "avg_w", "energy_j", "queries", "duration_s")
"""The metrics every trial and export carries, in this order."""
TOKEN_KEYS = (
    "j_per_token",
    "output_tokens",
    "tokens_per_s",
    "ttft_p50_ms",
    "ttft_p90_ms",
    "ttft_p99_ms",
    "tpot_p50_ms",
    "tpot_p90_ms",
    "tpot_p99_ms",
)
"""The token metrics an LLM trial carries beside :data:`METRIC_KEYS` (flat user attributes, trials.csv columns)."""
TOKEN_BOUNDS = {"ttft": "max_ttft_ms", "tpot": "max_tpot_ms"}
"""An LLM study's token constraints (named as Optuna's) and the run option that bounds each."""


class TokenMetrics(BaseModel):
    """What an LLM window generated, on LoadGen's token clock (``latency_clock``).

    Counts are tokens; ``j_per_token`` is the window's device energy (J) over
    its output tokens, the objective of an LLM study; ``tokens_per_s`` is
    output tokens per second of the window. TTFT (time to first token: from a
    query's issue to its first token) and TPOT (time per output token after
    the first: ``(latency - TTFT) / (output tokens - 1)``, as LoadGen computes
    it) are percentiles in milliseconds over the window's queries.
    """

    model_config = ConfigDict(extra="forbid")

    output_tokens: int
    input_tokens: int
    j_per_token: float
    tokens_per_s: float
    ttft_p50_ms: float
    ttft_p90_ms: float
    ttft_p99_ms: float
    tpot_p50_ms: float
    tpot_p90_ms: float
    tpot_p99_ms: float
    latency_clock: str = "loadgen"

    def ttft_ms(self, percentile: str = "p99") -> float:
        return {"p50": self.ttft_p50_ms, "p90": self.ttft_p90_ms, "p99": self.ttft_p99_ms}[percentile]

    def tpot_ms(self, percentile: str = "p99") -> float:
        return {"p50": self.tpot_p50_ms, "p90": self.tpot_p90_ms, "p99": self.tpot_p99_ms}[percentile]


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
    tokens: TokenMetrics | None = None

    @property
    def objective(self) -> float:
        """What a study minimises: J per output token for an LLM window, else J per query."""
        return self.tokens.j_per_token if self.tokens is not None else self.j_per_query

    @property
    def work(self) -> int:
        """What the objective divides energy by: output tokens for an LLM window, else queries."""
        return self.tokens.output_tokens if self.tokens is not None else self.queries

    def figures(self) -> dict[str, float]:
        """The window's metrics as one flat record: :data:`METRIC_KEYS`, and :data:`TOKEN_KEYS` for an LLM."""
        record = {key: float(getattr(self, key)) for key in METRIC_KEYS}
        if self.tokens is not None:
            record.update({key: float(getattr(self.tokens, key)) for key in TOKEN_KEYS})
        return record

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
