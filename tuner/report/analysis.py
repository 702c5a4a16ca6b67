"""What the report concludes from its points: the energy/latency front and the recommended configuration."""

from __future__ import annotations

from tuner.report.data import Point


def usable(points: list[Point]) -> list[Point]:
    """Points with a valid measurement (a failed or invalid window is listed, never plotted)."""
    return [p for p in points if p.ok]


def front(points: list[Point], percentile: str) -> list[Point]:
    """The points no other point beats on both energy per query and tail latency, by rising latency."""
    ranked = sorted(usable(points), key=lambda p: (p.measurement.latency_ms(percentile), p.measurement.j_per_query))
    out: list[Point] = []
    for p in ranked:
        if not out or p.measurement.j_per_query < out[-1].measurement.j_per_query:
            out.append(p)
    return out


def recommended(points: list[Point], percentile: str, bound_ms: float | None) -> Point | None:
    """The lowest energy per query within the latency bound (any latency when there is none)."""
    ok = [p for p in usable(points) if bound_ms is None or p.measurement.latency_ms(percentile) <= bound_ms]
    return min(ok, key=lambda p: p.measurement.j_per_query) if ok else None


def best_per_batch(points: list[Point]) -> dict[int, Point]:
    """Per batch size, the group with the lowest energy per query: how devices compare on one model."""
    best: dict[int, Point] = {}
    for p in usable(points):
        b = p.config.batch_size
        if b not in best or p.measurement.j_per_query < best[b].measurement.j_per_query:
            best[b] = p
    return dict(sorted(best.items()))
