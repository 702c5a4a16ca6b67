"""The warm-up before a window: settle the runner, estimate the throughput that sizes the LoadGen run."""

from __future__ import annotations

import time

from tuner.measure.lanes import Runner, lanes_of
from tuner.plumbing import interrupts

MIN_WARMUP_ITERS = 3
# A warm-up whose two halves ran within 2% of each other has settled; it runs at
# least MIN_SETTLE_S (or all of a shorter one). A prepared runner on a GPU that
# just ran the previous trial settles at once (docs/architecture.md, "The window's numbers").
SETTLED = 0.02
MIN_SETTLE_S = 0.1


def warm_up(runner: Runner, batch_size: int, warmup_s: float) -> float:
    """Run the runner back to back for up to ``warmup_s``; return its throughput in samples/s.

    The first iteration is left out of the estimate: it carries one-off costs
    (allocation, kernel selection) that would undersize the LoadGen run. The
    warm-up ends early once the two halves of what it ran agree within
    :data:`SETTLED` (never before :data:`MIN_SETTLE_S`): a prepared runner on
    a busy GPU is settled at once, and the rest would only repeat it.
    Every iteration is a safe point for a recorded Ctrl-C or SIGTERM.
    """
    lanes = lanes_of(runner, batch_size)
    total = 0.0
    for _name, size, infer in lanes:
        infer()
        start = time.monotonic()
        span = max(warmup_s, 0.0) / len(lanes)
        deadline, earliest = start + span, start + min(span, MIN_SETTLE_S)
        ends: list[float] = []
        while len(ends) < MIN_WARMUP_ITERS - 1 or time.monotonic() < deadline:
            interrupts.check()
            infer()
            ends.append(time.monotonic())
            if ends[-1] >= earliest and len(ends) >= 2 * MIN_WARMUP_ITERS and _settled(start, ends):
                break
        elapsed = time.monotonic() - start
        total += size * len(ends) / elapsed if elapsed > 0 else float(size) * 1e3
    return total


def _settled(start: float, ends: list[float]) -> bool:
    """True when the first and second half of the iterations ran at rates within SETTLED of each other."""
    half = len(ends) // 2
    first = ends[half - 1] - start
    second = ends[-1] - ends[half - 1]
    if first <= 0 or second <= 0:
        return False
    return abs(first / half - second / (len(ends) - half)) <= SETTLED * first / half
