"""When a measured window may end: the adaptive stopping rule and its confidence interval.

Energy per query is a ratio estimator, joules over queries, so its interval
comes from batch means: the window is cut into blocks at the points where
the meter's energy is known exactly (counter updates, power samples), and the
spread of ``energy_i - R * queries_i`` over the blocks gives the standard
error of ``R = sum(energy) / sum(queries)``. Blocks of a few hundred
milliseconds hold many batches, so they are close to independent on a GPU
that is either busy or launch-bound; a drift across the window (warming up)
shows up as spread and keeps the window running.

A window also ends once its verdict cannot change (a cut, :data:`CUT_REASONS`):
the latency percentile is proven over the bound (:class:`TailProof`: more
queries are already past it than the whole window may hold there), or the
energy per query is above the best feasible figure and its interval rules out
its being cheaper by more than the window's own target (:func:`costs_more`).
Hardware windows and twins use these same rules.
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
# The costlier cut needs the whole interval above the best, so a wide interval
# only delays it: it may use fewer blocks (exact t quantiles below 7 dof).
MIN_CUT_BLOCKS = 4
T975_SMALL = {3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447}

STOP_CI = "ci"
STOP_MAX = "max-duration"
STOP_UNREACHABLE = "ci-out-of-reach"
# A window whose interval, extrapolated to the longest window (as 1/sqrt(time)), would still be this many times
# the target ends at its minimum: the longest window cannot give the precision asked, and running on buys little.
OUT_OF_REACH = 2.0
STOP_EXHAUSTED = "queries-exhausted"
STOP_LOADGEN = "loadgen-end"
STOP_TAIL = "tail-over-bound"
STOP_COSTLIER = "costs-more"
CUT_REASONS = (STOP_TAIL, STOP_COSTLIER)
# Offline batches are alike and independent: the tail is proven over once the
# lower 99.9% (one-sided) Wilson bound of the share of batches past the bound
# is above 1 - quantile, after at least this many batches.
MIN_TAIL_BATCHES = 5
TAIL_Z = 3.09
# The tail is known within the bound once this many alike batches all met it: with none of n past it, the share
# past it is below 1 - quantile at this confidence when quantile ** n <= 1 - confidence (p99: 299 batches).
TAIL_WITHIN_CONFIDENCE = 0.95
QUANTILES = {"p50": 0.5, "p90": 0.9, "p99": 0.99}


def over_needed(total: int, quantile: float) -> int:
    """Queries past the bound that put the ``quantile`` of any window of at most ``total`` queries past it.

    With k of N latencies above the bound, numpy's interpolated percentile at
    rank ``quantile * (N - 1)`` lies above it once k >= N - floor(quantile *
    (N - 1)), which is at most ceil((1 - quantile) * N + quantile) and grows
    with N: a count that proves it for ``total`` proves it for any shorter window.
    """
    return max(1, math.ceil((1.0 - quantile) * max(total, 1) + quantile - 1e-9))


@dataclass
class TailProof:
    """Counts queries whose latency is already past the bound; proven once they are more than a window may hold.

    ``total`` is the most queries the window can complete (Offline: the
    samples LoadGen issued; Server: its whole schedule). Queries still waiting
    that arrived more than the bound ago count too: whatever happens next,
    their latency is past it. With ``alike`` (Offline on one engine, where
    every batch runs the same work) the share of batches past the bound also
    proves it (:data:`MIN_TAIL_BATCHES`, :data:`TAIL_Z`), and enough batches
    none past it put the percentile within it (:meth:`within`).
    """

    bound_s: float
    quantile: float
    total: int
    alike: bool = False
    over: int = 0
    batches: int = 0
    batches_over: int = 0

    @property
    def needed(self) -> int:
        return over_needed(self.total, self.quantile)

    def add(self, latencies_s: list[float] | tuple[float, ...]) -> None:
        """One batch's query latencies."""
        over = sum(1 for latency in latencies_s if latency > self.bound_s)
        self.over += over
        self.batches += 1
        self.batches_over += over > 0

    def proven(self, waiting_over: int = 0) -> bool:
        if self.over + waiting_over >= self.needed:
            return True
        if not self.alike or self.batches < MIN_TAIL_BATCHES:
            return False
        return wilson_low(self.batches_over, self.batches, TAIL_Z) > 1.0 - self.quantile

    def within(self) -> bool:
        """The percentile is known within the bound: enough alike batches, none past it (:func:`within_needed`)."""
        return self.alike and self.batches_over == 0 and self.batches >= within_needed(self.quantile)


def within_needed(quantile: float) -> int:
    """Alike batches, none past the bound, that put the ``quantile`` within it (:data:`TAIL_WITHIN_CONFIDENCE`)."""
    return max(MIN_TAIL_BATCHES, math.ceil(math.log(1.0 - TAIL_WITHIN_CONFIDENCE) / math.log(quantile)))


def wilson_low(k: int, n: int, z: float) -> float:
    """Lower end of the Wilson score interval for a share of k in n."""
    if n <= 0:
        return 0.0
    p = k / n
    centre = p + z * z / (2 * n)
    spread = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return (centre - spread) / (1 + z * z / n)


def costs_more(ratio: float, half_width: float, best: float | None, resolution: float = 0.0) -> bool:
    """True once energy per query ``ratio`` is above ``best`` and, at the low end of its interval, not below it
    by more than ``resolution`` (a share of ``best``).

    With ``resolution`` the study's own interval, a window above the best
    ends once it can no longer prove itself cheaper by more than a
    confirmation could resolve; it still holds a value above the best, so it
    can never become the best.
    """
    if best is None or not math.isfinite(half_width) or half_width >= 1.0 or ratio <= best:
        return False
    return ratio * (1.0 - half_width) > best * (1.0 - resolution)


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

    Within 0.4% of the exact value from 7 degrees of freedom up, and the
    tabulated exact values below that (the costlier cut uses 3 and more); cheap:
    it is evaluated on the worker thread inside the window, where importing
    scipy.stats would stall the runner for seconds.
    """
    if dof in T975_SMALL:
        return T975_SMALL[dof]
    z = 1.959963984540054
    return z + (z**3 + z) / (4 * dof) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * dof**2)


@dataclass
class StopRule:
    """Decides after each batch whether the window has measured enough.

    ``energy_now`` returns (time, joules since the window began) at the
    latest instant the meter knows exactly, or None when the meter cannot be
    read mid-window (then the window runs to ``max_s``). With ``adaptive``
    False the rule is a fixed window of ``max_s`` and the interval is only
    recorded. An adaptive window whose interval could not come within
    :data:`OUT_OF_REACH` times ``ci`` even at ``max_s`` ends from ``min_s`` on
    (:data:`STOP_UNREACHABLE`, not a cut: its figures are recorded as any
    window's). Either adaptive end waits for ``min_queries``, or for fewer
    once the tail is known within the bound (``tail_within`` in :meth:`observe`):
    the query count is for the tail, the interval comes from the meter's
    blocks. ``cut_j_per_query`` ends the window as soon as its energy per
    query is above that figure and not below it by more than ``ci`` at the
    low end of its interval (:func:`costs_more`).
    """

    min_s: float
    max_s: float
    ci: float
    min_queries: int
    adaptive: bool
    energy_now: Callable[[], tuple[float, float] | None] | None
    cut_j_per_query: float | None = None
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

    def observe(self, now: float, queries: int, tail_within: bool = False) -> str | None:
        """Record a batch completion; return why the window ends here, or None to go on.

        ``tail_within``: the window's latency percentile is already known within
        the study's bound (:meth:`TailProof.within`), so ``min_queries`` no longer holds it.
        """
        self._done_t.append(now)
        self._done_q.append(queries)
        if now >= self._next_check:
            self._next_check = now + self.check_period_s
            self._add_point()
            self.achieved = self.interval()
            if costs_more(self.ratio, self.interval(MIN_CUT_BLOCKS), self.cut_j_per_query, self.ci):
                return STOP_COSTLIER
            if self.adaptive and now - self.t0 >= self.min_s and (queries >= self.min_queries or tail_within):
                if self.achieved <= self.ci:
                    return STOP_CI
                reach = self.achieved * math.sqrt((now - self.t0) / self.max_s)
                if math.isfinite(reach) and reach > OUT_OF_REACH * self.ci:
                    return STOP_UNREACHABLE
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

    def interval(self, min_blocks: int = MIN_BLOCKS) -> float:
        """Relative 95% half-width over the blocks so far (inf while there are fewer than ``min_blocks``)."""
        if len(self._points) <= min_blocks:
            return math.inf
        pairs = list(itertools.pairwise(self._points))
        energy = [b[1] - a[1] for a, b in pairs]
        queries = [b[2] - a[2] for a, b in pairs]
        return relative_half_width(energy, queries)

    @property
    def ratio(self) -> float:
        """Energy per query over the blocks so far (inf before the first)."""
        _, joules, queries = self._points[-1] if self._points else (0.0, 0.0, 0.0)
        return joules / queries if queries > 0 else math.inf

    @property
    def blocks(self) -> int:
        return max(len(self._points) - 1, 0)
