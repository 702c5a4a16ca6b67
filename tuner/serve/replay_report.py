"""What a replay found: each way of serving the trace (its energy, queries over the bound, switches) and the savings."""

from __future__ import annotations

from dataclasses import dataclass, field

from tuner.serve.policy import Policy
from tuner.serve.trace import Trace

STRATEGIES = ("default", "default_locked", "static", "governor")


@dataclass
class StrategyResult:
    """One way of serving the trace: totals and a timeline (one entry per trace row)."""

    name: str
    energy_j: float = 0.0
    queries: float = 0.0
    over_bound: float = 0.0
    switches: int = 0
    switch_s: float = 0.0
    bands: list[int] = field(default_factory=list)
    power_w: list[float] = field(default_factory=list)
    labels: set[str] = field(default_factory=set)

    @property
    def over_fraction(self) -> float:
        return self.over_bound / self.queries if self.queries else 0.0

    def row(self) -> dict:
        return {
            "strategy": self.name,
            "energy_kj": round(self.energy_j / 1000, 3),
            "j_per_query": self.energy_j / self.queries if self.queries else float("nan"),
            "queries": round(self.queries),
            "over_bound": round(self.over_bound),
            "over_bound_pct": round(100 * self.over_fraction, 3),
            "switches": self.switches,
            "switching_s": round(self.switch_s, 3),
            "configurations": sorted(self.labels),
        }


@dataclass
class ReplayReport:
    """The three strategies over one trace."""

    trace: Trace
    policy: Policy
    device: str
    results: dict[str, StrategyResult]

    def savings(self) -> dict[str, float]:
        g = self.results["governor"].energy_j
        return {
            f"governor_vs_{name}_pct": round(100 * (1 - g / self.results[name].energy_j), 2)
            for name in ("static", "default", "default_locked")
        }

    def above_top(self) -> dict | None:
        """Where the trace's rate exceeds the policy's top band (planned for no such rate): None if nowhere."""
        top = self.policy.bands[self.policy.top]
        over = self.trace.rates > top.max_qps
        if not over.any():
            return None
        seconds = float(self.trace.durations[over].sum())
        return {
            "top_band_max_qps": top.max_qps,
            "peak_qps": float(self.trace.rates.max()),
            "seconds": round(seconds, 3),
            "trace_pct": round(100 * seconds / float(self.trace.durations.sum()), 3),
            "governor_over_bound_pct": round(100 * self.results["governor"].over_fraction, 3),
        }

    def summary(self) -> dict:
        return {
            "trace": self.trace.name,
            "device": self.device,
            "twin": True,
            "model": self.policy.model,
            "bound": f"{self.policy.percentile} <= {self.policy.max_latency_ms:g} ms",
            "hours": round(float(self.trace.durations.sum()) / 3600, 3),
            "peak_qps": float(self.trace.rates.max()),
            "strategies": [self.results[n].row() for n in STRATEGIES],
            "above_top_band": self.above_top(),
            **self.savings(),
        }
