"""A twin's Offline window cut as a hardware window would be (tuner.measure.stopping)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tuner.measure.stopping import (
    CHECK_PERIOD_S,
    MIN_CUT_BLOCKS,
    QUANTILES,
    STOP_COSTLIER,
    STOP_TAIL,
    TailProof,
    costs_more,
)

if TYPE_CHECKING:
    from tuner.measure.settings import WindowSettings
    from tuner.measurement import Measurement
    from tuner.space import Config


def offline_cut(m: Measurement, config: Config, settings: WindowSettings) -> Measurement:
    """A twin's Offline window cut as a hardware window would be (tuner.measure.stopping).

    Every batch of a twin's window takes its median latency, so when that is
    past the bound each batch is, and the tail is proven after the same few
    batches a hardware window needs (beside DLA lanes, by the query count
    alone); a window whose energy per query is above ``cut_j_per_query`` (it
    reaches the interval it aims for, ``ci``, so it can then no longer be
    cheaper by more than that) ends once it has the blocks that interval
    needs. Both keep the window's
    figures per query and scale its length, queries and energy down.
    """
    batch = max(config.batch_size, 1)
    batches = max(1, m.queries // batch)
    cut, length = "", batches
    extra: dict[str, float | str] = {}
    if settings.bound_ms is not None and m.p50_ms > settings.bound_ms:
        # Beside DLA lanes the engines' batches are not alike: only the query count proves it (as on hardware).
        alike = not any(key.startswith("engine_dla") for key in m.extra)
        proof = TailProof(settings.bound_ms / 1000.0, QUANTILES.get(settings.percentile, 0.99), m.queries, alike=alike)
        length = 0
        while length < batches and not proof.proven():
            proof.add([m.p50_ms / 1000.0] * batch)
            length += 1
        cut = STOP_TAIL if proof.proven() else ""
        extra = {"tail_over_queries": float(proof.over), "tail_over_needed": float(proof.needed)}
    elif costs_more(m.j_per_query, settings.ci, settings.cut_j_per_query, settings.ci):
        blocks_s = CHECK_PERIOD_S * (MIN_CUT_BLOCKS + 1)
        cut, length = STOP_COSTLIER, max(1, min(batches, int(blocks_s / (m.duration_s / batches)) + 1))
    if not cut or length >= batches:
        return m
    share = length / batches
    return m.model_copy(
        update={
            "queries": length * batch,
            "duration_s": m.duration_s * share,
            "energy_j": m.j_per_query * length * batch,
            "extra": {**m.extra, **extra, "cut": cut, "stop_rule": cut},
        }
    )
