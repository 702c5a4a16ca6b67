"""When a measured window may end: the adaptive stopping rule and its confidence interval.

Energy per query is a ratio estimator, joules over queries, so its interval
comes from batch means: the window is cut into blocks at the points where
the meter's energy is known exactly (counter updates, power samples), and the
spread of ``energy_i - R * queries_i`` over the blocks gives the standard
error of ``R = sum(energy) / sum(queries)``. Blocks of a few hundred
milliseconds hold many batches, so they are close to independent on a GPU
that is either busy or launch-bound; a drift across the window (warming up)
shows up as spread and keeps the window running.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field

# Points closer together than this add noise, not information.
CHECK_PERIOD_S = 0.25
# Fewer blocks than this give a t-interval too wide to trust its own width.
MIN_BLOCKS = 8

STOP_CI = "ci"
STOP_MAX = "max-duration"
STOP_EXHAUSTED = "queries-exhausted"
STOP_LOADGEN = "loadgen-end"


def relative_half_width(energy: list[float], queries: list[float], z: float | None = None) -> float:
    """95% confidence half-width of sum(energy)/sum(queries), relative to it, from per-block values."""
    n = len(energy)
    total_q = sum(queries)
    if n < 2 or total_q <= 0:
        return math.inf
    ratio = sum(energy) / total_q
    if ratio <= 0:
        return math.inf
    var = sum((e - ratio * q) ** 2 for e, q in zip(energy, queries, strict=True)) / (n - 1)
    quantile = z if z is not None else _t975(n - 1)
    return quantile * math.sqrt(n * var) / total_q / ratio


def _t975(dof: int) -> float:
    """Student's t 97.5% quantile by its Cornish-Fisher expansion around the normal one.

    Within 0.4% of the exact value from 7 degrees of freedom up (the fewest a
    rule ever uses) and cheap: it is evaluated on the worker thread inside the
    window, where importing scipy.stats would stall the runner for seconds.
    """
    z = 1.959963984540054
    return z + (z**3 + z) / (4 * dof) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * dof**2)


@dataclass
class StopRule:
    """Decides after each batch whether the window has measured enough.

    ``energy_now`` returns (time, joules since the window began) at the
    latest instant the meter knows exactly, or None when the meter cannot be
    read mid-window (then the window runs to ``max_s``). With ``adaptive``
    False the rule is a fixed window of ``max_s`` and the interval is only
    recorded.
    """

    min_s: float
    max_s: float
    ci: float
    min_queries: int
    adaptive: bool
    energy_now: Callable[[], tuple[float, float] | None] | None
    check_period_s: float = CHECK_PERIOD_S
    t0: float = 0.0
    achieved: float = math.inf
    _done_t: list[float] = field(default_factory=list)
    _done_q: list[int] = field(default_factory=list)
    _points: list[tuple[float, float, float]] = field(default_factory=list)
    _next_check: float = 0.0

    def begin(self, t0: float) -> None:
        self.t0 = t0
        self._done_t, self._done_q = [t0], [0]
        self._points = [(t0, 0.0, 0.0)]
        self._next_check = t0 + self.check_period_s

    def queries_at(self, t: float) -> float:
        """Completed queries at ``t``, linear between batch completions (work is continuous)."""
        i = bisect.bisect_right(self._done_t, t)
        if i >= len(self._done_t):
            return float(self._done_q[-1])
        ta, tb = self._done_t[i - 1], self._done_t[i]
        qa, qb = self._done_q[i - 1], self._done_q[i]
        return qa + (qb - qa) * (t - ta) / (tb - ta) if tb > ta else float(qb)

    def observe(self, now: float, queries: int) -> str | None:
        """Record a batch completion; return why the window ends here, or None to go on."""
        self._done_t.append(now)
        self._done_q.append(queries)
        if now >= self._next_check:
            self._next_check = now + self.check_period_s
            self._add_point()
            self.achieved = self.interval()
            if (
                self.adaptive
                and now - self.t0 >= self.min_s
                and queries >= self.min_queries
                and self.achieved <= self.ci
            ):
                return STOP_CI
        if now - self.t0 >= self.max_s:
            return STOP_MAX
        return None

    def _add_point(self) -> None:
        if self.energy_now is None:
            return
        point = self.energy_now()
        if point is None:
            return
        t, joules = point
        # A meter read just now (RAPL, a test's) is microseconds past the last completion: count it there.
        t = min(t, self._done_t[-1])
        if t <= self._points[-1][0]:
            return
        self._points.append((t, joules, self.queries_at(t)))

    def interval(self) -> float:
        """Relative 95% half-width over the blocks so far (inf while there are too few)."""
        if len(self._points) <= MIN_BLOCKS:
            return math.inf
        pairs = list(itertools.pairwise(self._points))
        energy = [b[1] - a[1] for a, b in pairs]
        queries = [b[2] - a[2] for a, b in pairs]
        return relative_half_width(energy, queries)

    @property
    def blocks(self) -> int:
        return max(len(self._points) - 1, 0)
