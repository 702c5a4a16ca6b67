"""NVML's total-energy counter as a window meter (Volta and newer)."""

from __future__ import annotations

import bisect
import itertools
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from tuner.errors import UserError
from tuner.measure.meters import EnergyReading, reading_of

# Edges that give the counter's update period, and how early (a share of it) reads turn fine before the next is due.
EDGES_FOR_PERIOD = 5
LEAD = 0.15


class NvmlEnergyMeter:
    """Delta of the NVML total-energy counter (mJ since driver load; Volta and newer).

    The counter only moves at about 10 Hz, so reading it at the window's
    bounds would be off by up to one update (100 ms, 10% of a 1 s window). A
    polling thread records every update edge: the pair (midway between the
    read that first saw the new value and the read before, new value). Its
    timing error is uniform over the gap between those reads, and it enters
    the energy of the blocks on both sides of the edge with opposite signs,
    so it widens a window's interval (tuner.measure.stopping) without moving
    its total. The thread therefore reads every ``poll_s`` (5 ms), and every
    ``fine_s`` (0.5 ms) around the time the next update is due once it knows
    the counter's period (:func:`next_read_delay`). The counter between two
    edges is interpolated linearly, which is exact when power is constant
    over that ~100 ms interval. ``start()``
    returns only once an edge has been seen, so the window begins right after
    a known point of the counter; ``stop()`` keeps polling until the first
    edge after the window's end and interpolates the end between the last edge
    inside the window and that one. Edge detection lag is the same at both
    ends and cancels. The residual error is about half a poll period of power
    at each end; windows under ``min_window_s`` (1 s) are still marked
    invalid because one update interval is then a large share of the energy.
    """

    min_window_s = 1.0

    def __init__(
        self,
        nvml: Any,
        handle: Any,
        poll_s: float = 0.005,
        name: str = "nvml-energy",
        fine_s: float = 0.0005,
        rails: list[str] | None = None,
        clock: Callable[[], float] = time.monotonic,
        edge_timeout_s: float = 1.0,
        rhythm: deque[float] | None = None,
    ) -> None:
        self.nvml = nvml
        self.handle = handle
        self.poll_s = poll_s
        self.fine_s = min(fine_s, poll_s)
        self.name = name
        self.rails = rails if rails is not None else ["gpu-total-energy"]
        self.clock = clock
        self.edge_timeout_s = edge_timeout_s
        self._edges: list[tuple[float, float]] = []
        self._gaps: list[float] = []
        # The latest update times; a device passes one deque to each window's meter, as the rhythm outlives a window.
        self._rhythm: deque[float] = rhythm if rhythm is not None else deque(maxlen=EDGES_FOR_PERIOD)
        self._polls = 0
        self._lock = threading.Lock()
        self._first_edge = threading.Event()
        self._stop_after: float | None = None
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = 0.0
        self._started = 0.0
        self._e0_mj: float | None = None

    def _read_mj(self) -> float:
        return float(self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle))

    def _read(self) -> tuple[float, float]:
        """(the read's midpoint on ``clock``, counter value in mJ)."""
        before = self.clock()
        value = self._read_mj()
        return (before + self.clock()) / 2, value

    def _poll(self) -> None:
        last_t, last_v = self._read()
        while not self._done.is_set():
            time.sleep(next_read_delay(self.clock(), list(self._rhythm), self.poll_s, self.fine_s))
            now, value = self._read()
            with self._lock:
                self._polls += 1
                if value != last_v:
                    self._edges.append(((last_t + now) / 2, value))
                    self._gaps.append(now - last_t)
                    self._rhythm.append((last_t + now) / 2)
                    self._first_edge.set()
                    if self._stop_after is not None and last_t >= self._stop_after:
                        self._done.set()
            last_t, last_v = now, value
            if self._stop_after is None and not self._first_edge.is_set() and now - self._started > self.edge_timeout_s:
                self._done.set()

    def start(self) -> None:
        self._edges = []
        self._gaps = []
        self._polls = 0
        self._stop_after = None
        self._first_edge.clear()
        self._done.clear()
        self._started = self.clock()
        self._e0_mj = None
        self._thread = threading.Thread(target=self._poll, name="powertune-nvml-energy", daemon=True)
        self._thread.start()
        if not self._first_edge.wait(self.edge_timeout_s + 1.0):
            self._done.set()
            self._thread.join()
            raise UserError(
                f"the NVML energy counter did not change in {self.edge_timeout_s:.1f} s: "
                "this GPU does not update it; use --meter nvml-power"
            )
        self._t0 = self.clock()

    def energy_now(self) -> tuple[float, float] | None:
        """Energy up to the latest counter update, once one has been seen after the start."""
        with self._lock:
            edges = list(self._edges)
        if not edges or edges[-1][0] <= self._t0:
            return None
        if self._e0_mj is None:
            self._e0_mj = interpolate_counter(edges, self._t0)
        t, value = edges[-1]
        return t, (value - self._e0_mj) / 1e3

    def stop(self) -> EnergyReading:
        t1 = self.clock()
        with self._lock:
            self._stop_after = t1
        assert self._thread is not None, "stop() without start()"
        self._thread.join(self.edge_timeout_s + 1.0)
        self._done.set()
        self._thread.join()
        edges = list(self._edges)
        if not edges or edges[-1][0] < t1:
            raise UserError("the NVML energy counter stopped updating during the window; use --meter nvml-power")
        energy_mj = interpolate_counter(edges, t1) - interpolate_counter(edges, self._t0)
        inside = sum(1 for t, _ in edges if self._t0 <= t <= t1)
        gaps = sorted(self._gaps)
        extra = {"counter_edges": float(len(edges)), "counter_polls": float(self._polls)}
        if gaps:
            # How precisely the edges were timed: the gap between the reads around each (the error is uniform over it).
            extra["counter_edge_gap_ms_p50"] = round(gaps[len(gaps) // 2] * 1e3, 3)
            extra["counter_edge_gap_ms_max"] = round(gaps[-1] * 1e3, 3)
        return reading_of(self, energy_mj / 1e3, t1 - self._t0, inside + 2, extra=extra)


def next_read_delay(now: float, edges: list[float], poll_s: float, fine_s: float) -> float:
    """Seconds until the counter's next read: ``fine_s`` around the next update's due time, else ``poll_s``.

    ``edges`` are the latest update times seen. Once :data:`EDGES_FOR_PERIOD`
    of them give a period (their median spacing), reads come every ``fine_s``
    from :data:`LEAD` of a period before the next update is due to as long
    after it; elsewhere, before the period is known, or when updates are
    late (their rhythm changed), every ``poll_s`` as before.
    """
    if len(edges) < EDGES_FOR_PERIOD:
        return poll_s
    spacings = sorted(b - a for a, b in itertools.pairwise(edges))
    period = spacings[len(spacings) // 2]
    if period <= 4 * poll_s:
        return poll_s
    opens = edges[-1] + (1.0 - LEAD) * period
    if now < opens:
        return max(fine_s, min(poll_s, opens - now))
    return fine_s if now <= edges[-1] + (1.0 + LEAD) * period else poll_s


def interpolate_counter(edges: list[tuple[float, float]], t: float) -> float:
    """Counter value at time ``t``, linear between the update edges that bracket it.

    Outside the edges the nearest edge's value is used (and the slope of the
    nearest interval beyond the last edge), so a caller sees a continuous
    function of time.
    """
    times = [e[0] for e in edges]
    i = bisect.bisect_right(times, t)
    if i == 0:
        return edges[0][1]
    if i == len(edges):
        if len(edges) < 2:
            return edges[-1][1]
        (ta, va), (tb, vb) = edges[-2], edges[-1]
    else:
        (ta, va), (tb, vb) = edges[i - 1], edges[i]
    if tb == ta:
        return vb
    return va + (vb - va) * (t - ta) / (tb - ta)
