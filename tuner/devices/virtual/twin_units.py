"""The units of a fleet of identical twins (``sim:orin#unit=3``): each its own power and speed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from tuner.errors import UserError

if TYPE_CHECKING:
    from tuner.measurement import Measurement

UNIT_POWER_SIGMA = 0.04
UNIT_TIME_SIGMA = 0.03
UNIT_SEED = 20261202


@dataclass(frozen=True)
class UnitVariation:
    """One unit of a fleet of identical twins (``sim:orin#unit=3``): its own power and speed, seeded by its number.

    A test device for fleet verification, not a model of any board: unit n
    draws a power factor and a time factor from normal distributions (sigma
    UNIT_POWER_SIGMA and UNIT_TIME_SIGMA, clipped at 2.5 sigma) seeded by n,
    and every window it measures is scaled by them (power, latency, energy per
    query). The spreads are assumptions, smaller than the unit-to-unit
    variation measured on nominally identical parts (six identical Core
    i5-540M drew 12-17% different power at the same load, UCSD, reported in EE
    Journal 2015-12-09; Sinha et al., "Not All GPUs Are Created Equal", SC22,
    measured performance and power variation across identical GPUs of
    production clusters); none was measured on Jetson boards here.
    """

    unit: int
    power: float
    time: float

    @classmethod
    def parse(cls, option: str, name: str) -> UnitVariation:
        key, _, value = option.partition("=")
        if key != "unit" or not value.isdigit() or not 0 <= int(value) <= 9999:
            raise UserError(f"twin option {option!r} in {name!r} is not unit=N (0..9999): e.g. sim:orin#unit=3")
        rng = np.random.default_rng([UNIT_SEED, int(value)])
        draw = np.clip(rng.standard_normal(2), -2.5, 2.5)
        return cls(int(value), 1.0 + UNIT_POWER_SIGMA * float(draw[0]), 1.0 + UNIT_TIME_SIGMA * float(draw[1]))

    def apply(self, m: Measurement) -> Measurement:
        """The window as this unit measures it: power x ``power``, every duration x ``time``."""
        queries = max(1, round(m.queries / self.time))
        return m.model_copy(
            update={
                "j_per_query": m.j_per_query * self.power * self.time,
                "p50_ms": m.p50_ms * self.time,
                "p90_ms": m.p90_ms * self.time,
                "p99_ms": m.p99_ms * self.time,
                "qps": m.qps / self.time,
                "avg_w": m.avg_w * self.power,
                "energy_j": m.energy_j * self.power,
                "queries": queries,
            }
        )
