"""Serving policies for tests: two bands of an AGX Orin space, built from the space itself."""

from __future__ import annotations

from tuner.serve.policy import Band, BandProvenance, Policy
from tuner.space import SearchSpace


def two_band_policy(
    space: SearchSpace, *, model: str, device: str, device_kind: str, twin: bool, low_mode: str = "15W"
) -> Policy:
    """``low_mode`` below 100 q/s, the space's default mode above (batch 8, 5 ms timeout), every other knob at the
    space's default. A board offers only the modes of its TPC mask: from MAXN, 50W is one (15W is not)."""
    base = space.default_config().knobs

    def band(lo: float, hi: float, **knobs) -> Band:
        return Band(
            min_qps=lo,
            max_qps=hi,
            knobs={**base, **knobs},
            batch_size=8,
            batch_timeout_ms=5.0,
            j_per_query=0.2,
            latency_ms=30.0,
            avg_w=20.0,
            provenance=BandProvenance(study="s", storage="x", trial=0, measured_by_plan=True),
        )

    low = space.effective(band(0, 1, nvpmodel=low_mode).config()).knobs
    return Policy(
        model=model,
        device=device,
        device_kind=device_kind,
        twin=twin,
        percentile="p99",
        max_latency_ms=50.0,
        bands=[band(0, 100, **low), band(100, 300)],
    )
