"""A meter plugin for tests: constant power over a clock the test moves, so energies are exact."""

from __future__ import annotations

from tuner.measure.meters import EnergyReading


class ManualClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class ConstantMeter:
    """``watts`` for as long as the clock says the window lasted; the factory for ``py:fakemeter:ConstantMeter``."""

    min_window_s = 0.5

    def __init__(self, spec: str = "", watts: float = 42.0, clock=None) -> None:
        import time

        self.name = "constant"
        self.rails = ["test rail"]
        self.watts = watts
        self.clock = clock or time.monotonic
        self._t0 = 0.0

    def start(self) -> None:
        self._t0 = self.clock()

    def energy_now(self):
        t = self.clock()
        return t, (t - self._t0) * self.watts

    def stop(self) -> EnergyReading:
        duration = self.clock() - self._t0
        return EnergyReading(duration * self.watts, duration, self.watts, self.name, list(self.rails), 2)


def not_a_meter(spec: str) -> object:
    """A broken plugin: returns something that is not a meter."""
    return object()
