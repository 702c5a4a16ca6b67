"""When a trial's repeated windows agree: their interval half-widths, whether they settled, their pooled figures."""

from __future__ import annotations

import math

from tuner.measure.stopping import STOP_COSTLIER, costs_more
from tuner.measurement import METRIC_KEYS, TOKEN_KEYS, Measurement


def half_width(m: Measurement, aimed: float) -> float:
    """A window's relative 95% half-width of energy per query: what it reached, or what it aimed at if unknown.

    Hardware Offline windows record the interval they reached; a window that
    cannot judge its own (no mid-window meter reading, a twin) is taken at
    its aim.
    """
    reached = m.extra.get("ci_achieved")
    if isinstance(reached, int | float) and math.isfinite(reached) and reached > 0:
        return float(reached)
    return aimed


def settled(windows: list[Measurement], aims: list[float], target: float, best: float | None) -> str:
    """Why a contender's confirmation may stop after these windows, or "" to measure another.

    ``agreed``: every confirming window agrees with the first within their
    combined intervals, and the pooled energy per query (:func:`pooled`) is
    within ``target`` (its half-width, from the windows' own, weighted by
    their queries). ``costs-more``: the pooled figure is above ``best`` beyond
    that half-width, so more windows cannot make the trial the best. The
    energy is per query, or per output token for an LLM (Measurement.objective).
    """
    widths = [half_width(m, aim) for m, aim in zip(windows, aims, strict=True)]
    work = sum(m.work for m in windows)
    if work <= 0:
        return ""
    ratio = sum(m.energy_j for m in windows) / work
    spread = math.sqrt(sum((w * m.objective * m.work) ** 2 for w, m in zip(widths, windows, strict=True)))
    width = spread / work / ratio if ratio > 0 else math.inf
    if costs_more(ratio, width, best):
        return STOP_COSTLIER
    first = windows[0]
    agree = all(
        abs(m.objective - first.objective) <= math.hypot(w * m.objective, widths[0] * first.objective)
        for w, m in zip(widths[1:], windows[1:], strict=True)
    )
    return "agreed" if agree and width <= target else ""


def pooled(windows: list[dict[str, float]]) -> dict[str, float]:
    """Several windows as one: energy per query is all their energy over all their queries.

    So ``j_per_query = avg_w / qps`` holds for the pooled figures as it does
    for each window (a mean of per-window ratios would not); latency
    percentiles, energy, queries and duration are per-window means. LLM
    windows pool energy per output token and tokens per second the same way.
    """
    n = len(windows)
    keys = [*METRIC_KEYS, *(k for k in TOKEN_KEYS if all(k in w for w in windows))]
    mean = {k: sum(w[k] for w in windows) / n for k in keys}
    energy, queries, seconds = mean["energy_j"], mean["queries"], mean["duration_s"]
    if queries > 0 and seconds > 0:
        mean.update(j_per_query=energy / queries, qps=queries / seconds, avg_w=energy / seconds)
    tokens = mean.get("output_tokens", 0.0)
    if tokens > 0 and seconds > 0:
        mean.update(j_per_token=energy / tokens, tokens_per_s=tokens / seconds)
    return mean


def engine_rates(windows: list[Measurement], qps: float) -> dict[str, float]:
    """Per-engine throughput of several windows (GPU and DLA lanes sharing a queue), at the pooled rate.

    Each engine's share of the queries these windows completed, times the
    trial's pooled ``qps``: the engines of a confirmed trial add up to its
    throughput as one window's do (the last window's rates would not).
    """
    served: dict[str, float] = {}
    for m in windows:
        for key, value in m.extra.items():
            if key.startswith("engine_") and key.endswith("_qps"):
                served[key] = served.get(key, 0.0) + float(value) * m.duration_s
    total = sum(served.values())
    return {key: qps * count / total for key, count in served.items()} if total > 0 else {}


def rel_std(values: list[float]) -> float:
    """Sample standard deviation relative to the mean (0 for fewer than two values)."""
    if len(values) < 2:
        return 0.0
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) / mean
