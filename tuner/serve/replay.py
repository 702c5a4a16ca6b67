"""``tune replay``: an arrival-rate trace through three ways of serving it, on a twin.

(a) ``default``: the device's default configuration (MAXN on a Jetson, the
card's default clocks on a GPU), with the batching of (b); (b) ``static``: the
policy's band for the trace's peak rate, held all day (what a one-off tuning
for the peak would deploy); (c) ``governor``: the policy's bands, switched by
:class:`~tuner.serve.governor.Governor` with its real rules.

Each trace row holds a rate until the next row. The governor polls every
``interval_s`` and sees the rate of the last poll interval (a Poisson count,
so it is noisy): in each row the first interval still runs the band chosen
before it, the rest the band chosen on that observation. Every piece is
served by the twin's queueing model (tuner/devices/queueing.py) with Poisson
arrivals; a piece longer than ``sim_cap_s`` is simulated for ``sim_cap_s`` and
scaled, and pieces of the same configuration, rate (within 1%) and length
share one simulation. Not modelled: the queue carried over from one piece to
the next, and the time and energy a mode switch itself costs.
"""

from __future__ import annotations

import csv
import math
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from runners.profile import load_profile
from tuner.devices.queueing import QueueOutcome, ServingProfile, poisson_arrivals, serving_profile, simulate
from tuner.devices.twin import TwinDevice
from tuner.errors import UserError
from tuner.serve.governor import DEFAULT_DWELL_S, DEFAULT_HEADROOM, DEFAULT_HYSTERESIS, Governor
from tuner.serve.policy import Band, Policy, check_policy
from tuner.space import Config

SIM_CAP_S = 20.0
DEFAULT_INTERVAL_S = 1.0
STRATEGIES = ("default", "static", "governor")


@dataclass
class Trace:
    """Rate steps: ``rates[i]`` queries/s from ``times[i]`` until ``times[i+1]`` (the last for one more step)."""

    times: np.ndarray
    rates: np.ndarray
    name: str = ""

    @property
    def durations(self) -> np.ndarray:
        step = float(np.median(np.diff(self.times))) if len(self.times) > 1 else 60.0
        return np.diff(np.append(self.times, self.times[-1] + step))


def load_trace(path: Path, scale: float = 1.0) -> Trace:
    """Read ``t_s,rate_qps`` rows; a bad file is a one-line user error."""
    try:
        with open(path, newline="") as fh:
            rows = [row for row in csv.DictReader(line for line in fh if not line.startswith("#"))]
    except OSError as exc:
        raise UserError(f"cannot read trace {path}: {exc.strerror}; check the path") from None
    try:
        times = np.array([float(r["t_s"]) for r in rows])
        rates = np.array([float(r["rate_qps"]) for r in rows]) * scale
    except (KeyError, TypeError, ValueError):
        raise UserError(f"trace {path} must be CSV with columns t_s,rate_qps and numbers in every row") from None
    if len(times) < 2 or np.any(np.diff(times) <= 0) or np.any(rates < 0) or not np.all(np.isfinite(rates)):
        raise UserError(f"trace {path} needs two or more rows, increasing t_s and non-negative rates")
    return Trace(times=times, rates=rates, name=path.stem)


@dataclass
class StrategyResult:
    """One way of serving the trace: totals and a timeline (one entry per trace row)."""

    name: str
    energy_j: float = 0.0
    queries: float = 0.0
    over_bound: float = 0.0
    switches: int = 0
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
            "configurations": sorted(self.labels),
        }


class Replayer:
    """Serves trace pieces on a twin with caching; see the module docstring."""

    def __init__(self, device: TwinDevice, policy: Policy, seed: int, sim_cap_s: float = SIM_CAP_S) -> None:
        self.device = device
        self.policy = policy
        self.profile = load_profile(policy.model)
        self.seed = seed
        self.sim_cap_s = sim_cap_s
        self.bound_s = policy.max_latency_ms / 1000.0
        self._profiles: dict[tuple, ServingProfile] = {}
        self._windows: dict[tuple, QueueOutcome] = {}

    def serving(self, config: Config) -> ServingProfile:
        key = config.key()
        if key not in self._profiles:
            self._profiles[key] = serving_profile(self.device.model, self.profile, config)
        return self._profiles[key]

    def piece(self, config: Config, timeout_ms: float, rate: float, seconds: float) -> tuple[float, float, float]:
        """Energy (J), queries and queries over the bound of ``seconds`` at ``rate`` under a configuration."""
        if seconds <= 0:
            return 0.0, 0.0, 0.0
        serving = self.serving(config)
        if rate <= 0:
            return serving.idle_w * seconds, 0.0, 0.0
        bucket = round(math.log(rate) / math.log(1.01))
        sim_s = min(seconds, self.sim_cap_s)
        key = (config.key(), timeout_ms, bucket, round(sim_s, 3))
        if key not in self._windows:
            rng = np.random.default_rng(zlib.crc32(repr((self.seed, key)).encode()))
            arrivals = poisson_arrivals(1.01**bucket, sim_s, rng)
            self._windows[key] = simulate(arrivals, serving, config.batch_size, timeout_ms / 1000.0, sim_s, rng)
        out = self._windows[key]
        scale = seconds / sim_s
        extra_idle = max(out.duration_s - sim_s, 0.0)
        energy = (out.energy_j - serving.idle_w * extra_idle) * scale
        return energy, out.queries * scale, out.over(self.bound_s) * scale

    def fixed(self, name: str, config: Config, timeout_ms: float, trace: Trace, band: int) -> StrategyResult:
        result = StrategyResult(name=name, labels={f"{config.label()} timeout={timeout_ms:g}ms"})
        for rate, seconds in zip(trace.rates, trace.durations, strict=True):
            e, q, o = self.piece(config, timeout_ms, float(rate), float(seconds))
            result.energy_j += e
            result.queries += q
            result.over_bound += o
            result.bands.append(band)
            result.power_w.append(e / seconds)
        return result

    def governed(
        self, trace: Trace, interval_s: float, headroom: float, hysteresis: float, min_dwell_s: float
    ) -> StrategyResult:
        result = StrategyResult(name="governor")
        clock = {"t": 0.0}
        governor = Governor(
            self.policy,
            apply=lambda band: None,
            headroom=headroom,
            hysteresis=hysteresis,
            min_dwell_s=min_dwell_s,
            clock=lambda: clock["t"],
        )
        rng = np.random.default_rng(self.seed)
        governor.observe(float(trace.rates[0]), now=0.0)
        for start, rate, seconds in zip(trace.times, trace.rates, trace.durations, strict=True):
            first = min(interval_s, float(seconds))
            before = governor.band
            assert before is not None
            e1, q1, o1 = self.piece(before.config(), before.batch_timeout_ms, float(rate), first)
            seen = rng.poisson(float(rate) * interval_s) / interval_s
            governor.observe(float(seen), now=float(start) + first)
            after = governor.band
            assert after is not None
            e2, q2, o2 = self.piece(after.config(), after.batch_timeout_ms, float(rate), float(seconds) - first)
            result.energy_j += e1 + e2
            result.queries += q1 + q2
            result.over_bound += o1 + o2
            result.bands.append(int(governor.current or 0))
            result.power_w.append((e1 + e2) / float(seconds))
        result.switches = len(governor.switches) - 1
        result.labels = {self.policy.bands[s.to_band].label() for s in governor.switches}
        return result


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
            for name in ("static", "default")
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
            **self.savings(),
        }


def default_band(device: TwinDevice, static: Band) -> tuple[Config, float]:
    """The device's default knobs (MAXN / default clocks) with the peak band's batching."""
    space = device.space()
    config = space.effective(Config(knobs=space.default_config().knobs, batch_size=static.batch_size))
    return config, static.batch_timeout_ms


def replay(
    policy: Policy,
    device: TwinDevice,
    trace: Trace,
    seed: int = 0,
    interval_s: float = DEFAULT_INTERVAL_S,
    headroom: float = DEFAULT_HEADROOM,
    hysteresis: float = DEFAULT_HYSTERESIS,
    min_dwell_s: float = DEFAULT_DWELL_S,
) -> ReplayReport:
    """Run the trace through the three strategies; the policy must be for this twin's kind."""
    if not getattr(device, "simulated", False) or not isinstance(device, TwinDevice):
        raise UserError(f"replay runs on a digital twin, not {device.name}: pass --device sim:<kind>")
    check_policy(policy, device.kind)
    if interval_s <= 0:
        raise UserError("--interval must be a positive number of seconds, e.g. 1")
    replayer = Replayer(device, policy, seed)
    peak = float(trace.rates.max())
    static_index = policy.band_for(peak)
    static_index = policy.top if static_index is None else static_index
    static = policy.bands[static_index]
    maxn, maxn_timeout = default_band(device, static)
    results = {
        "default": replayer.fixed("default", maxn, maxn_timeout, trace, -1),
        "static": replayer.fixed("static", static.config(), static.batch_timeout_ms, trace, static_index),
        "governor": replayer.governed(trace, interval_s, headroom, hysteresis, min_dwell_s),
    }
    return ReplayReport(trace=trace, policy=policy, device=device.name, results=results)


def plot_replay(report: ReplayReport, path: Path) -> None:
    """Rate, the governor's band and the power of each strategy over the trace."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    hours = report.trace.times / 3600.0
    fig, axes = plt.subplots(3, 1, figsize=(9, 7), sharex=True)
    axes[0].step(hours, report.trace.rates, where="post", color="k")
    axes[0].set_ylabel("rate (q/s)")
    axes[1].step(hours, report.results["governor"].bands, where="post", color="tab:green", label="governor")
    axes[1].axhline(report.results["static"].bands[0], color="tab:orange", ls="--", label="static (peak)")
    axes[1].set_ylabel("band")
    axes[1].legend(fontsize=7)
    for name, colour in (("default", "tab:red"), ("static", "tab:orange"), ("governor", "tab:green")):
        axes[2].step(hours, report.results[name].power_w, where="post", color=colour, label=name)
    axes[2].set_ylabel("power (W)")
    axes[2].set_xlabel("time (h)")
    axes[2].legend(fontsize=7)
    p = report.policy
    axes[0].set_title(
        f"{p.model} on {report.device} [digital twin], {p.percentile} <= {p.max_latency_ms:g} ms, "
        f"trace {report.trace.name}"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
