"""The run-time governor: follows the observed arrival rate through a policy's bands.

It switches up at once (a band too slow breaks the latency promise) and down
only with hysteresis, after a minimum dwell, and when the saving pays for the
switch and the likely switch back; the rate it reads is a smoothed estimate
(tuner/serve/estimate.py) raised by a headroom. An unreadable rate, or one
above every band, selects the fastest band. Every switch is logged. It holds
no hardware: it calls ``apply`` with the new band (or only logs, observe-only);
``run_governor`` is the loop ``tune govern`` runs under a hardware session.
The rules, and why each, are in docs/serving.md.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tuner.errors import ConfigurationError
from tuner.plumbing import atomicfile, interrupts
from tuner.plumbing.readfile import read_json
from tuner.serve.estimate import DEFAULT_BURST_SIGMAS, DEFAULT_SMOOTHING_S, RateEstimate
from tuner.serve.policy import Band, Policy
from tuner.serve.rates import RateSource, RateUnavailable

DEFAULT_HEADROOM = 0.10
DEFAULT_HYSTERESIS = 0.10
DEFAULT_DWELL_S = 30.0
DEFAULT_MIN_SAVING = 0.03
# A state file not rewritten within this many intervals (plus the grace) is stale.
STALE_INTERVALS = 3
STALE_GRACE_S = 5.0
MAX_STATE_BYTES = 1 << 20
MAX_PID = 2**22  # the kernel's PID_MAX_LIMIT


@dataclass
class Switch:
    """One band change (or, observe-only, one that would have been made)."""

    time: float
    rate_qps: float | None
    from_band: int | None
    to_band: int
    to: str
    reason: str
    applied: bool

    def line(self) -> str:
        rate = "unknown" if self.rate_qps is None else f"{self.rate_qps:.4g} q/s"
        verb = "switch" if self.applied else "would switch"
        source = "start" if self.from_band is None else f"band {self.from_band}"
        return f"{verb} at rate {rate}: {source} -> band {self.to_band} ({self.to}); {self.reason}"


class Governor:
    """Chooses a band per observation; ``observe`` is the API for servers that embed it."""

    def __init__(
        self,
        policy: Policy,
        apply: Callable[[Band], None] | None = None,
        headroom: float = DEFAULT_HEADROOM,
        hysteresis: float = DEFAULT_HYSTERESIS,
        min_dwell_s: float = DEFAULT_DWELL_S,
        smoothing_s: float = DEFAULT_SMOOTHING_S,
        burst_sigmas: float = DEFAULT_BURST_SIGMAS,
        min_saving: float = DEFAULT_MIN_SAVING,
        switch_s: Callable[[int, int], float] | None = None,
        clock: Callable[[], float] = time.time,
        log: Callable[[Switch], None] | None = None,
        warn: Callable[[str], None] | None = None,
    ) -> None:
        self.policy = policy
        self.apply = apply
        self.headroom = headroom
        self.hysteresis = hysteresis
        self.min_dwell_s = min_dwell_s
        self.estimate = RateEstimate(smoothing_s, burst_sigmas)
        self.min_saving = min_saving
        self.switch_s = switch_s
        self.clock = clock
        self.log = log
        self.warn = warn
        self.current: int | None = None
        self.since = 0.0
        self.switches: list[Switch] = []

    @property
    def observe_only(self) -> bool:
        return self.apply is None

    @property
    def band(self) -> Band | None:
        return None if self.current is None else self.policy.bands[self.current]

    def observe(self, rate_qps: float | None, now: float | None = None) -> Switch | None:
        """Take one rate observation (queries/s); switch bands if the rules say so. None: unreadable."""
        now = self.clock() if now is None else now
        if rate_qps is None or not math.isfinite(rate_qps) or rate_qps < 0:
            return self.fallback(f"unreadable rate {rate_qps!r}", now)
        rate_qps = self.estimate.update(rate_qps, now)
        wanted = rate_qps * (1 + self.headroom)
        target = self.policy.band_for(wanted)
        if target is None:
            top = self.policy.bands[-1].max_qps
            self._warn(f"rate {rate_qps:.4g} q/s is above every band (top {top:g} q/s): highest-throughput band")
            return self._switch(self.policy.top, rate_qps, now, "rate above every band: highest-throughput band")
        if self.current is None:
            return self._switch(target, rate_qps, now, "first observation")
        if target > self.current:
            return self._switch(target, rate_qps, now, "rate rose above the band")
        if target < self.current:
            edge = self.policy.bands[self.current].min_qps
            if wanted > edge * (1 - self.hysteresis):
                return None
            if now - self.since < self.min_dwell_s:
                return None
            if not self.pays(self.current, target, rate_qps):
                return None
            return self._switch(target, rate_qps, now, "rate fell below the band")
        return None

    def pays(self, current: int, target: int, rate_qps: float) -> bool:
        """Whether a switch down saves more than it costs at this rate (see the module docstring)."""
        if self.switch_s is None:
            return True
        here = self.policy.bands[current].j_per_query_at(rate_qps)
        there = self.policy.bands[target].j_per_query_at(rate_qps)
        if here is None or there is None:
            return True
        if here - there < self.min_saving * here:
            return False
        cost_j = 2.0 * self.switch_s(current, target) * self.policy.bands[current].avg_w
        return rate_qps * (here - there) * self.min_dwell_s > cost_j

    def fallback(self, reason: str, now: float | None = None) -> Switch | None:
        """The safe choice when the rate is unknown: the highest-throughput band."""
        now = self.clock() if now is None else now
        self._warn(f"{reason}: running the highest-throughput band")
        return self._switch(self.policy.top, None, now, f"{reason}: highest-throughput band")

    def _warn(self, message: str) -> None:
        if self.warn is not None:
            self.warn(message)

    def _switch(self, target: int, rate: float | None, now: float, reason: str) -> Switch | None:
        if target == self.current:
            return None
        band = self.policy.bands[target]
        if self.apply is not None:
            self.apply(band)
        switch = Switch(
            time=now,
            rate_qps=rate,
            from_band=self.current,
            to_band=target,
            to=band.label(),
            reason=reason,
            applied=self.apply is not None,
        )
        self.current, self.since = target, now
        self.switches.append(switch)
        if self.log is not None:
            self.log(switch)
        return switch


def write_state(path: Path, governor: Governor, interval_s: float, running: bool = True) -> None:
    """The current band for the serving process (batch size, timeout), replaced atomically.

    The file names the governor's PID and when it was last written; it is
    rewritten every interval, so a reader can tell a governor that died
    (kill -9: nothing could mark it) by a PID that is gone or a file older
    than ``stale_after`` (:func:`read_state`). A governor that stops writes
    ``running: false`` (its board is restored, so the band no longer holds).
    """
    band = governor.band
    if band is None:
        return
    now = time.time()
    state: dict[str, Any] = {
        "band": governor.current,
        "batch_size": band.batch_size,
        "batch_timeout_ms": band.batch_timeout_ms,
        "knobs": band.knobs,
        "since": governor.since,
        "observe_only": governor.observe_only,
        "running": running,
        "pid": os.getpid(),
        "updated_at": now,
        "stale_after": now + STALE_INTERVALS * interval_s + STALE_GRACE_S,
    }
    atomicfile.write_text(path, json.dumps(state))


def read_state(path: Path, now: float | None = None) -> dict[str, Any]:
    """A state file as the serving process should read it, with ``stale``: true unless a live governor holds it.

    Stale: the governor stopped (``running`` false), or its PID is gone, or
    it has not rewritten the file by ``stale_after`` (killed, hung, or on
    another machine's clock).
    """
    state = read_json(path, "governor state file", MAX_STATE_BYTES, f"remove {path}", trusted=True)
    if not isinstance(state, dict):
        raise ConfigurationError(f"governor state file {path} is not a JSON object: remove {path}")
    pid, stale_after = state.get("pid", 0), state.get("stale_after", 0)
    if isinstance(pid, bool) or not isinstance(pid, int) or not 0 <= pid <= MAX_PID:
        raise ConfigurationError(f"governor state file {path} names no valid PID ({str(pid)[:24]}): remove {path}")
    if isinstance(stale_after, bool) or not isinstance(stale_after, int | float):
        raise ConfigurationError(f"governor state file {path} has no valid stale_after: remove {path}")
    now = time.time() if now is None else now
    state["stale"] = not state.get("running", False) or not _alive(pid) or now > float(stale_after)
    return state


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def journal_line(switch: Switch) -> str:
    """One JSON line per switch for ``--log``."""
    return json.dumps(asdict(switch))


def run_governor(
    governor: Governor,
    source: RateSource,
    interval_s: float,
    duration_s: float | None = None,
    sleep: Callable[[float], None] | None = None,
    on_tick: Callable[[], None] | None = None,
) -> None:
    """Read the rate every ``interval_s`` and hand it to the governor, until ``duration_s`` (or forever).

    Under a hardware session Ctrl-C and SIGTERM are only recorded; each tick
    is a safe point (before reading the rate and after the sleep), where the
    recorded signal is raised and the caller's hardware session restores the
    device. The sleep between ticks ends at the first signal, so however long
    the interval, the first signal ends the loop at once.
    """
    woken = threading.Event()
    wait = sleep or woken.wait
    end = None if duration_s is None else time.monotonic() + duration_s
    with interrupts.listening(woken.set):
        while end is None or time.monotonic() < end:
            interrupts.check()
            try:
                rate = source.read()
            except RateUnavailable as exc:
                governor.fallback(str(exc))
            else:
                governor.observe(rate)
            if on_tick is not None:
                on_tick()
            interrupts.check()
            wait(interval_s if end is None else max(0.0, min(interval_s, end - time.monotonic())))
            interrupts.check()
