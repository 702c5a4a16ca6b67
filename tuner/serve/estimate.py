"""The governor's estimate of the arrival rate from noisy per-interval observations.

A rate read over one second is a Poisson count: at 20 queries/s it is off by
22% one time in three, at 100 queries/s by 10%. Choosing a band on each raw
reading (with switches up at once) chases that noise upwards and then holds the
faster band for the dwell time, which over-provisions all day. The estimate
here is an exponentially weighted mean with time constant ``smoothing_s`` (the
noise of a mean over about that many seconds), except that a reading too far
above the estimate for Poisson noise to explain (``burst_sigmas`` standard
deviations of the count, plus one query) replaces it at once: a real burst is
followed within one reading, so the bound is not broken while the mean
catches up. ``smoothing_s`` 0 gives the raw readings back.
"""

from __future__ import annotations

import math

DEFAULT_SMOOTHING_S = 10.0
DEFAULT_BURST_SIGMAS = 4.0


class RateEstimate:
    """Exponentially weighted arrival rate with a jump on a significant rise; see the module docstring."""

    def __init__(self, smoothing_s: float = DEFAULT_SMOOTHING_S, burst_sigmas: float = DEFAULT_BURST_SIGMAS) -> None:
        if smoothing_s < 0 or burst_sigmas <= 0:
            raise ValueError("smoothing_s must be >= 0 and burst_sigmas positive")
        self.smoothing_s = smoothing_s
        self.burst_sigmas = burst_sigmas
        self.value: float | None = None
        self.at: float | None = None

    def update(self, rate_qps: float, now: float) -> float:
        """Fold in the rate read over the interval that ended at ``now``; returns the new estimate."""
        if self.value is None or self.at is None or self.smoothing_s == 0:
            self.value, self.at = rate_qps, now
            return rate_qps
        dt = max(now - self.at, 0.0)
        self.at = now
        if dt > 0 and self.significant_rise(rate_qps, dt):
            self.value = rate_qps
            return rate_qps
        weight = 1.0 - math.exp(-dt / self.smoothing_s)
        self.value += weight * (rate_qps - self.value)
        return self.value

    def significant_rise(self, rate_qps: float, dt: float) -> bool:
        """Whether a reading over ``dt`` seconds is above the estimate by more than Poisson noise explains."""
        assert self.value is not None
        expected = self.value * dt
        return rate_qps * dt > expected + self.burst_sigmas * math.sqrt(expected) + 1.0
