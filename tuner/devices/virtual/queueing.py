"""Queueing and dynamic batching on a twin: MLPerf's Server scenario as a seeded discrete-event simulation.

Queries arrive as a Poisson process at the target rate (LoadGen's Server
scenario draws its issue times the same way). One model instance serves
them: when it is free and a query waits, it starts a batch as soon as the
maximum batch size has queued or the oldest query has waited the batching
timeout, whichever comes first, and then takes every waiting query up to the
maximum (the policy of Triton's dynamic batcher and of ``BatchingSUT`` in
tuner/measure/sut.py). The batch size knob is that maximum; a batch of n
runs n samples (eager) or, with captured CUDA graphs (``graph=cudagraphs``),
the smallest size of the runner's ladder (1, 2, 4, ..., maximum) that holds
n, as the runners do. It takes the twin's time per batch at the size it
runs, times the twin's run-to-run noise, plus exponential host jitter
(mean ``p50_jitter_ms``); the board draws the twin's power at batch n while
busy and its idle power between batches (static, leakage and memory
background at the configured clocks: no dynamic power).

Per-query latency runs from arrival to the completion of its batch, as LoadGen
measures it. Energy is busy energy plus idle power over the idle time of the
window, which is why the cheapest mode at 50 queries/s is not the one at 500.
The simulation runs one batch per loop turn over NumPy arrival arrays, so a
10 s window at a few hundred queries/s costs milliseconds. docs/twin.md
("Queueing and batching") says what it leaves out.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from runners.base import ladder
from tuner.measure.loadgen_settings import SERVER_MIN_QUERIES
from tuner.measure.settings import WindowSettings
from tuner.measure.stopping import QUANTILES, STOP_TAIL, over_needed
from tuner.measurement import Measurement, batch_size_extras
from tuner.space import Config

# Enough queries for a stable p99 (about 200 above it) without simulating
# a fast card's whole window one query at a time.
MAX_SIMULATED_QUERIES = 20_000
# A query is past the bound once it has waited longer than it: a microsecond after.
PAST_S = 1e-6


@dataclass
class Reaction:
    """Frequency governors (devfreq, cpufreq) that follow the load with a delay instead of holding clocks.

    After a batch the clocks stay up for ``delay_s`` (idle at ``held_w``) before
    they fall to the floor (the profile's ``idle_w``); a batch that starts after
    they fell runs its first ``delay_s`` at the floor clocks (``service_s`` and
    ``busy_w`` per batch size, as the profile's arrays) until they have risen.
    """

    delay_s: float
    held_w: float
    service_s: np.ndarray
    busy_w: np.ndarray


@dataclass
class ServingProfile:
    """A configuration's batch costs: index n holds a batch of n arrived samples (index 0 unused).

    ``executed[n]`` is the size that runs n samples (the CUDA graph ladder's
    size holding n; n itself when None), for the window's batch-size counts.
    """

    service_s: np.ndarray
    busy_w: np.ndarray
    idle_w: float
    jitter_s: float = 0.0
    noise: float = 0.0
    reaction: Reaction | None = None
    executed: np.ndarray | None = None

    @property
    def max_batch(self) -> int:
        return len(self.service_s) - 1


@dataclass
class QueueOutcome:
    """What one simulated window saw."""

    latencies_s: np.ndarray
    duration_s: float
    busy_s: float
    energy_j: float
    batches: int
    busy_j: float = 0.0
    free_at: float = 0.0
    arrived: np.ndarray | None = None

    @property
    def queries(self) -> int:
        return len(self.latencies_s)

    def batch_extras(self, serving: ServingProfile) -> dict[str, str | float]:
        """Batches by arrived and by executed size, and the padding, as the hardware window reports them."""
        counts = self.arrived if self.arrived is not None else np.zeros(1, dtype=int)
        sizes = serving.executed if serving.executed is not None else np.arange(len(counts))
        arrived: dict[int, int] = {}
        executed: dict[int, int] = {}
        for n in np.flatnonzero(counts):
            arrived[int(n)] = int(counts[n])
            executed[int(sizes[n])] = executed.get(int(sizes[n]), 0) + int(counts[n])
        return batch_size_extras(arrived, executed)

    def over(self, bound_s: float) -> int:
        return int(np.count_nonzero(self.latencies_s > bound_s))


def poisson_arrivals(rate_qps: float, duration_s: float, rng: np.random.Generator) -> np.ndarray:
    """Arrival times of a Poisson process of ``rate_qps`` over ``[0, duration_s)``."""
    if rate_qps <= 0 or duration_s <= 0:
        return np.zeros(0)
    expected = rate_qps * duration_s
    n = int(expected + 6 * np.sqrt(expected) + 16)
    times = np.cumsum(rng.exponential(1.0 / rate_qps, size=n))
    while times[-1] < duration_s:
        more = times[-1] + np.cumsum(rng.exponential(1.0 / rate_qps, size=n))
        times = np.concatenate([times, more])
    return times[times < duration_s]


def simulate(
    arrivals: np.ndarray,
    serving: ServingProfile,
    max_batch: int,
    timeout_s: float,
    duration_s: float,
    rng: np.random.Generator | None = None,
    free_at: float = 0.0,
    stop_s: float = np.inf,
) -> QueueOutcome:
    """Serve ``arrivals`` (sorted seconds) with dynamic batching; see the module docstring.

    ``free_at`` is when the instance can start its first batch (a window that
    follows another, or a pause), and no batch starts at or after ``stop_s``:
    the queries left then are the queue a following window inherits (the
    outcome's latencies cover the served ones only, the first
    ``len(latencies_s)``).
    """
    n = len(arrivals)
    latencies = np.empty(n)
    origin = free_at
    i, busy, busy_j, batches, held_s = 0, 0.0, 0.0, 0, 0.0
    max_batch = max(1, min(max_batch, serving.max_batch))
    arrived = np.zeros(max_batch + 1, dtype=int)
    while i < n:
        ready = max(free_at, arrivals[i])
        fill_at = arrivals[i + max_batch - 1] if i + max_batch - 1 < n else np.inf
        start = max(ready, min(arrivals[i] + timeout_s, fill_at))
        if start >= stop_s:
            break
        size = min(max_batch, int(np.searchsorted(arrivals, start, side="right")) - i)
        t = float(serving.service_s[size])
        if rng is not None:
            t *= float(rng.lognormal(0.0, serving.noise)) if serving.noise else 1.0
            t += float(rng.exponential(serving.jitter_s)) if serving.jitter_s else 0.0
        work_j = t * float(serving.busy_w[size])
        if serving.reaction is not None:
            t, work_j, held = _react(serving.reaction, size, t, work_j, start - free_at)
            held_s += held
        done = start + t
        latencies[i : i + size] = done - arrivals[i : i + size]
        busy += t
        busy_j += work_j
        batches += 1
        arrived[size] += 1
        free_at = done
        i += size
    end = max(duration_s, free_at)
    energy = busy_j + serving.idle_w * max(end - origin - busy, 0.0)
    if serving.reaction is not None:
        held_s += min(end - free_at, serving.reaction.delay_s)
        energy += (serving.reaction.held_w - serving.idle_w) * held_s
    return QueueOutcome(
        latencies_s=latencies[:i],
        duration_s=end,
        busy_s=busy,
        energy_j=energy,
        batches=batches,
        busy_j=busy_j,
        free_at=free_at,
        arrived=arrived,
    )


def _react(reaction: Reaction, size: int, t: float, work_j: float, gap_s: float) -> tuple[float, float, float]:
    """A batch under delayed governors: its time and energy, and the idle seconds before it at held clocks."""
    if gap_s <= reaction.delay_s:
        return t, work_j, max(gap_s, 0.0)
    slow_s = float(reaction.service_s[size])
    pace = t / slow_s if slow_s > t else 1.0  # the fraction of the batch done per second at the floor clocks
    floor_w = float(reaction.busy_w[size])
    if t <= reaction.delay_s * pace:
        return t / pace, floor_w * t / pace, reaction.delay_s
    rest = t - reaction.delay_s * pace
    return reaction.delay_s + rest, floor_w * reaction.delay_s + work_j * rest / t, reaction.delay_s


def executed_sizes(config: Config) -> list[int]:
    """The batch size that runs n samples, for n = 1..maximum: n, or its ladder size under captured graphs."""
    n = list(range(1, config.batch_size + 1))
    if str(config.knobs.get("graph", "eager")) != "cudagraphs":
        return n
    sizes = ladder(config.batch_size)
    return [min(s for s in sizes if s >= k) for k in n]


def tail_cut_at(arrivals: np.ndarray, latencies_s: np.ndarray, bound_s: float, needed: int) -> float | None:
    """When a Server window's tail is proven past the bound: the first moment ``needed`` queries are past it.

    A query is past the bound at ``arrival + bound`` if it has not completed
    by then (served later, or never in the simulated window); the count at
    any moment is exact, as the hardware window counts completed and waiting
    queries (tuner.measure.stopping.TailProof).
    """
    flagged = np.ones(len(arrivals), dtype=bool)
    flagged[: len(latencies_s)] = latencies_s > bound_s
    which = np.flatnonzero(flagged)
    if len(which) < needed:
        return None
    return float(arrivals[which[needed - 1]] + bound_s) + PAST_S


def server_measurement(serving: ServingProfile, config: Config, settings: WindowSettings) -> Measurement:
    """One simulated Server window at ``settings.options['server_target_qps']``.

    Arrivals and service noise are seeded by the settings' seed (0 when none);
    with ``noise`` off the service times are exact and only arrivals are random.
    With ``settings.bound_ms`` the window is cut, as on hardware, once enough
    queries are past the bound that the percentile is over it whatever follows.
    """
    rate = float(settings.options["server_target_qps"])
    timeout_s = float(settings.options.get("batch_timeout_ms", 0.0)) / 1000.0
    duration = min(settings.window_s, max(1.0, MAX_SIMULATED_QUERIES / rate))
    rng = np.random.default_rng(settings.seed if settings.seed is not None else 0)
    arrivals = poisson_arrivals(rate, duration, rng)
    out = simulate(arrivals, serving, config.batch_size, timeout_s, duration, rng if settings.noise else None)
    cut: dict[str, str | float] = {}
    tail_ms: np.ndarray | None = None
    if settings.bound_ms is not None and len(arrivals):
        expected = rate * settings.window_s
        total = max(SERVER_MIN_QUERIES, int(np.ceil(expected + 6 * np.sqrt(expected)))) + 1
        needed = over_needed(total, QUANTILES.get(settings.percentile, 0.99))
        at = tail_cut_at(arrivals, out.latencies_s, settings.bound_ms / 1000.0, needed)
        if at is not None and at < out.duration_s:
            arrivals = arrivals[arrivals < at]
            rng = np.random.default_rng(settings.seed if settings.seed is not None else 0)
            noise = rng if settings.noise else None
            out = simulate(arrivals, serving, config.batch_size, timeout_s, at, noise, stop_s=at)
            served = out.latencies_s
            done = arrivals[: len(served)] + served <= at
            # What the window saw at the cut: completed queries, and the rest waiting since they arrived.
            seen = np.concatenate([served[done], at - arrivals[: len(served)][~done], at - arrivals[len(served) :]])
            cut = {"cut": STOP_TAIL, "stop_rule": STOP_TAIL, "tail_over_needed": float(needed)}
            cut["tail_over_queries"] = float(np.count_nonzero(seen > settings.bound_ms / 1000.0))
            out.energy_j *= min(1.0, at / out.duration_s)
            out.duration_s = at
            out.latencies_s = served[done]
            tail_ms = seen * 1000.0
    lat_ms = out.latencies_s * 1000.0 if out.queries else np.array([np.inf])
    if tail_ms is not None:
        lat_ms = tail_ms
    p50, p90, p99 = (float(np.percentile(lat_ms, q)) for q in (50, 90, 99))
    queries = max(out.queries, 1)
    return Measurement(
        j_per_query=out.energy_j / queries,
        p50_ms=p50,
        p90_ms=p90,
        p99_ms=p99,
        qps=out.queries / out.duration_s,
        avg_w=out.energy_j / out.duration_s,
        energy_j=out.energy_j,
        queries=out.queries,
        duration_s=out.duration_s,
        meter="twin",
        rails=["twin:board"],
        twin=True,
        extra={
            "scenario": "server",
            "target_qps": rate,
            "batch_timeout_ms": timeout_s * 1000.0,
            "mean_batch": out.queries / max(out.batches, 1),
            "utilization": out.busy_s / out.duration_s,
            "idle_w": serving.idle_w,
            "batches": float(out.batches),
            **out.batch_extras(serving),
            **cut,
        },
    )
