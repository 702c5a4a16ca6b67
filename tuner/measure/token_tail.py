"""When an LLM window's verdict is known early: its TTFT or TPOT tail proven past the study's bound.

A Server window at a rate its configuration cannot keep up with queues
queries ever longer; LoadGen would wait for every one of them to finish, so
one bad configuration could cost minutes. Its tail is proven past a bound as
soon as more queries are past it than the percentile allows in the most
queries the window can hold (tuner.measure.stopping.over_needed): a query
whose first token came later than the TTFT bound, or that has waited longer
than it with none, is past it; so is a completed query whose time per output
token is above the TPOT bound. Nothing the rest of the window does can bring
the percentile back under, so the window is cut there, as a CNN window is.

A Server window's cut then holds the queries still arriving, uncompleted,
until LoadGen has ``hold_queries`` outstanding: LoadGen then ends the test
(``server_max_async_queries``) instead of issuing the rest of its schedule,
at least 500 queries however early the cut came. A window meeting its
bounds never has that many outstanding. A cut that leaves the queue short
of the hold (on TPOT, at a rate the configuration keeps up with) is
released once LoadGen has issued its schedule (:func:`stopped_issuing`).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from tuner.measure.stopping import over_needed

# LoadGen has stopped issuing once it is this long without a query (and at the hold, or past its schedule).
HOLD_QUIET_S = 0.25
# How often a Server or SingleStream window looks whether its tail is already proven past a bound.
WATCH_S = 0.02
# One query's times on the SUT's clock (nan while unknown) and its tokens: issued, first token, done, tokens.
Times = tuple[float, float, float, int]


@dataclass
class TokenTail:
    """The bounds (seconds) a window may be cut on, the percentile's quantile and the most queries it holds.

    ``hold_queries`` (0: no hold) and ``hold_max_s``, its longest wait, size a Server cut's hold;
    ``schedule_queries`` and ``schedule_s`` are LoadGen's minimum count and duration, past both of which
    it issues no more (a hold that never fills ends there).
    """

    ttft_s: float | None
    tpot_s: float | None
    quantile: float
    total: int
    hold_queries: int = 0
    hold_max_s: float = 0.0
    schedule_queries: int = 0
    schedule_s: float = 0.0

    @property
    def needed(self) -> int:
        return over_needed(self.total, self.quantile)

    def over(self, queries: Iterable[Times], now: float) -> tuple[str, int] | None:
        """The bound proven past (``ttft`` or ``tpot``) and how many queries are past it, or None."""
        late_first = late_token = 0
        for issued, first, done, tokens in queries:
            if self.ttft_s is not None:
                waited = (now if math.isnan(first) else first) - issued
                late_first += waited > self.ttft_s
            if self.tpot_s is not None and not math.isnan(done) and tokens > 1:
                late_token += (done - first) / (tokens - 1) > self.tpot_s
        if late_first >= self.needed:
            return "ttft", late_first
        if late_token >= self.needed:
            return "tpot", late_token
        return None


def release_when_stopped(sut: Any, tail: TokenTail, ended: threading.Event, started: float) -> None:
    """Return once LoadGen issues no more (see tuner.measure.tokens._watch), or the hold ran its longest wait."""
    deadline = time.monotonic() + tail.hold_max_s
    while not ended.wait(WATCH_S) and not sut.aborted:
        now = time.monotonic()
        if stopped_issuing(sut, tail, now, started) or now >= deadline:
            return


def stopped_issuing(sut: Any, tail: TokenTail, now: float, started: float) -> bool:
    """Whether LoadGen has stopped issuing a held window's queries: quiet, and at the hold or past its schedule.

    A release too early costs only time: later arrivals are completed at once.
    """
    if now - sut.last_issue < HOLD_QUIET_S:
        return False
    scheduled = len(sut.queries) >= tail.schedule_queries and now - started >= tail.schedule_s
    return scheduled or sut.outstanding() >= tail.hold_queries
