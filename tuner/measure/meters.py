"""Energy meters: what a window's joules come from, and which rails they cover.

Every meter is started just before a LoadGen test and stopped right after it,
and returns an :class:`EnergyReading` naming itself and the rails it summed.
A meter never reports zero energy silently: 0 J over a non-zero window means
the sensor is not working, and that is a :class:`UserError`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any, Protocol, runtime_checkable

from tuner.errors import UserError
from tuner.measure.poller import Poller


@dataclass(frozen=True)
class EnergyReading:
    """Energy over one window. ``samples`` is how many sensor readings it rests on."""

    energy_j: float
    duration_s: float
    avg_w: float
    meter: str
    rails: list[str]
    samples: int
    warning: str = ""
    extra: dict[str, float | str] = field(default_factory=dict)


class MeterLost(Exception):
    """The meter went away mid-window (a network meter's connection dropped): the window has no energy."""


@runtime_checkable
class Meter(Protocol):
    """Start just before a window, stop right after it.

    ``min_window_s`` is the shortest window whose reading can be trusted;
    a measurement over a shorter one is marked invalid.
    """

    name: str
    rails: list[str]
    min_window_s: float

    def start(self) -> None: ...

    def stop(self) -> EnergyReading: ...


class Monitor(Protocol):
    """Something sampled alongside the meter during the window (telemetry)."""

    def start(self) -> None: ...

    def stop(self) -> Any: ...


MAX_RAILS = 64
MAX_MIN_WINDOW_S = 7200.0


def meter_problem(meter: object) -> str | None:
    """Why an object a plugin returned cannot serve as a :class:`Meter` (None: it can), checked before any use."""
    if isinstance(meter, type) or not isinstance(meter, Meter):
        return "it is not a Meter instance (name, rails, min_window_s, start, stop)"
    name, rails, min_window = meter.name, meter.rails, meter.min_window_s
    if not isinstance(name, str) or not name or len(name) > 80 or not name.isprintable():
        return f"its name {str(name)[:40]!r} is not a printable string of 1-80 characters"
    if not isinstance(rails, list | tuple) or len(rails) > MAX_RAILS or not all(isinstance(r, str) for r in rails):
        return f"its rails are not a list of at most {MAX_RAILS} strings"
    if isinstance(min_window, bool) or not isinstance(min_window, int | float):
        return "its min_window_s is not a number"
    if not (math.isfinite(min_window) and 0 <= min_window <= MAX_MIN_WINDOW_S):
        return f"its min_window_s {min_window!r} is outside 0..{MAX_MIN_WINDOW_S:g} s"
    if not callable(getattr(meter, "start", None)) or not callable(getattr(meter, "stop", None)):
        return "its start or stop is not callable"
    return None


def checked_reading(meter_name: str, reading: object) -> EnergyReading:
    """A meter's reading, whole and finite, or :class:`MeterLost`: a NaN never becomes a measured figure."""
    if not isinstance(reading, EnergyReading):
        raise MeterLost(f"meter {meter_name} returned {type(reading).__name__}, not an EnergyReading: fix the meter")
    for field_name in ("energy_j", "duration_s", "avg_w"):
        value = getattr(reading, field_name)
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
            raise MeterLost(f"meter {meter_name} read {field_name} {value!r}, not a finite number >= 0: fix the meter")
    if isinstance(reading.samples, bool) or not isinstance(reading.samples, int) or reading.samples < 0:
        raise MeterLost(f"meter {meter_name} read {reading.samples!r} samples, not a count: fix the meter")
    return reading


def energy_reader(meter: Meter) -> Callable[[], tuple[float, float] | None] | None:
    """The meter's mid-window reading, if it has one.

    ``energy_now()`` returns (monotonic time, joules since ``start()``) at the
    latest instant the meter knows exactly; an adaptive window needs it to
    judge its own confidence interval. Meters without it give fixed windows.
    """
    return getattr(meter, "energy_now", None)


def reading_of(
    meter: Meter,
    energy_j: float,
    duration_s: float,
    samples: int,
    warning: str = "",
    extra: dict[str, float | str] | None = None,
) -> EnergyReading:
    if duration_s > 0 and energy_j <= 0:
        raise UserError(
            f"meter {meter.name} read {energy_j:.3g} J over {duration_s:.3g} s: the sensor is not "
            "updating; pick another --meter"
        )
    avg = energy_j / duration_s if duration_s > 0 else 0.0
    return EnergyReading(energy_j, duration_s, avg, meter.name, list(meter.rails), samples, warning, extra or {})


class SampledPowerMeter:
    """Trapezoid integral of a power reading polled on a background thread.

    The fallback where no energy counter exists. Periods under 50 ms are
    refused: power sensors (NVML power usage, INA3221) average over tens of
    milliseconds, so faster polling only adds load. A window shorter than a
    few periods gets ``warning`` set and is below ``min_window_s``.
    """

    MIN_PERIOD_S = 0.05
    PERIODS_NEEDED = 10

    def __init__(
        self,
        read_watts: Callable[[], float],
        period_s: float = 0.05,
        name: str = "sampled-power",
        rails: list[str] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if period_s < self.MIN_PERIOD_S:
            raise UserError(f"power sampling period {period_s * 1e3:.0f} ms is too short: use 50 ms or more")
        self.read_watts = read_watts
        self.period_s = period_s
        self.name = name
        self.rails = rails if rails is not None else []
        self.clock = clock
        self.min_window_s = self.PERIODS_NEEDED * period_s
        self._samples: list[tuple[float, float]] = []
        self._poller = Poller(self._sample, period_s, name)
        self._latest: tuple[float, float] | None = None

    def _sample(self) -> None:
        point = (self.clock(), float(self.read_watts()))
        if self._samples and self._latest is not None:
            (ta, wa), (tb, wb) = self._samples[-1], point
            self._latest = (tb, self._latest[1] + (tb - ta) * (wa + wb) / 2)
        else:
            self._latest = (point[0], 0.0)
        self._samples.append(point)

    def energy_now(self) -> tuple[float, float] | None:
        """The trapezoid integral up to the latest power sample."""
        return self._latest

    def start(self) -> None:
        self._samples = []
        self._latest = None
        self._sample()
        self._poller.start()

    def stop(self) -> EnergyReading:
        self._poller.stop()
        self._sample()
        samples = self._samples
        energy = sum((tb - ta) * (wa + wb) / 2 for (ta, wa), (tb, wb) in pairwise(samples))
        duration = samples[-1][0] - samples[0][0]
        warning = ""
        if duration < self.min_window_s:
            warning = (
                f"window {duration:.2f} s is shorter than {self.PERIODS_NEEDED} sampling periods "
                f"({self.min_window_s:.2f} s): the energy is coarse"
            )
        return reading_of(self, energy, duration, len(samples), warning)
