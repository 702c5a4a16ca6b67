"""Energy meters: what a window's joules come from, and which rails they cover.

Every meter is started just before a LoadGen test and stopped right after it,
and returns an :class:`EnergyReading` naming itself and the rails it summed.
A meter never reports zero energy silently: 0 J over a non-zero window means
the sensor is not working, and that is a :class:`UserError`.
"""

from __future__ import annotations

import bisect
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
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


def energy_reader(meter: Meter) -> Callable[[], tuple[float, float] | None] | None:
    """The meter's mid-window reading, if it has one.

    ``energy_now()`` returns (monotonic time, joules since ``start()``) at the
    latest instant the meter knows exactly; an adaptive window needs it to
    judge its own confidence interval. Meters without it give fixed windows.
    """
    return getattr(meter, "energy_now", None)


def _reading(
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


class NvmlEnergyMeter:
    """Delta of the NVML total-energy counter (mJ since driver load; Volta and newer).

    The counter only moves at about 10 Hz, so reading it at the window's
    bounds would be off by up to one update (100 ms, 10% of a 1 s window). A
    polling thread (``poll_s``, 5 ms by default) records every update edge:
    the pair (time the new value was first seen less half a poll period, new
    value). The counter between two edges is interpolated linearly, which is
    exact when power is constant over that ~100 ms interval. ``start()``
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
        rails: list[str] | None = None,
        clock: Callable[[], float] = time.monotonic,
        edge_timeout_s: float = 1.0,
    ) -> None:
        self.nvml = nvml
        self.handle = handle
        self.poll_s = poll_s
        self.name = name
        self.rails = rails if rails is not None else ["gpu-total-energy"]
        self.clock = clock
        self.edge_timeout_s = edge_timeout_s
        self._edges: list[tuple[float, float]] = []
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

    def _poll(self) -> None:
        last_t, last_v = self.clock(), self._read_mj()
        while not self._done.is_set():
            time.sleep(self.poll_s)
            now, value = self.clock(), self._read_mj()
            with self._lock:
                self._polls += 1
                if value != last_v:
                    self._edges.append(((last_t + now) / 2, value))
                    self._first_edge.set()
                    if self._stop_after is not None and last_t >= self._stop_after:
                        self._done.set()
            last_t, last_v = now, value
            if self._stop_after is None and not self._first_edge.is_set() and now - self._started > self.edge_timeout_s:
                self._done.set()

    def start(self) -> None:
        self._edges = []
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
        return _reading(
            self,
            energy_mj / 1e3,
            t1 - self._t0,
            inside + 2,
            extra={"counter_edges": float(len(edges)), "counter_polls": float(self._polls)},
        )


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
        return _reading(self, energy, duration, len(samples), warning)


DEFAULT_POWERCAP_ROOT = "/sys/class/powercap"


@dataclass
class _Zone:
    name: str
    energy: Path
    max_range_uj: int
    last_uj: int = 0
    total_uj: int = 0


class RaplMeter:
    """CPU package (and DRAM where exposed) energy from Linux powercap RAPL counters.

    Sums the top-level ``intel-rapl:N`` package zones and any ``dram``
    subzone (DRAM is outside the package domain); core/uncore subzones are
    inside the package and psys contains everything, so they are skipped to
    avoid counting twice. The counters wrap at ``max_energy_range_uj``; a
    thread reads them every ``poll_s`` so more than one wrap per window cannot
    go unseen. The root is ``$TUNE_POWERCAP_ROOT`` when set (tests,
    containers), else /sys/class/powercap.
    """

    name = "rapl"
    min_window_s = 0.1

    def __init__(self, root: str | Path | None = None, poll_s: float = 1.0) -> None:
        self.root = Path(root or os.environ.get("TUNE_POWERCAP_ROOT") or DEFAULT_POWERCAP_ROOT)
        self.poll_s = poll_s
        self.zones = self._discover()
        self.rails = [z.name for z in self.zones]
        self._lock = threading.Lock()
        self._poller = Poller(self._accumulate, poll_s, "rapl")
        self._t0 = 0.0
        self._reads = 0

    def _discover(self) -> list[_Zone]:
        packages = sorted(p for p in self.root.glob("intel-rapl:*") if p.name.count(":") == 1)
        zones: list[_Zone] = []
        for package in packages:
            name = _read_text(package / "name")
            if name.startswith("psys"):
                continue
            zones.append(_zone(package, name))
            for sub in sorted(package.glob(f"{package.name}:*")):
                sub_name = _read_text(sub / "name")
                if sub_name == "dram":
                    zones.append(_zone(sub, f"{name}/dram"))
        if not zones:
            raise UserError(
                f"no RAPL energy counters under {self.root}: this CPU or kernel exposes "
                "no powercap "
                "intel-rapl zones; pick another --meter"
            )
        return zones

    def _accumulate(self) -> None:
        with self._lock:
            for zone in self.zones:
                now = _read_uj(zone.energy)
                delta = now - zone.last_uj
                if delta < 0:
                    delta += zone.max_range_uj
                zone.total_uj += delta
                zone.last_uj = now
            self._reads += 1

    def start(self) -> None:
        for zone in self.zones:
            zone.last_uj = _read_uj(zone.energy)
            zone.total_uj = 0
        self._reads = 1
        self._t0 = time.monotonic()
        self._poller.start()

    def energy_now(self) -> tuple[float, float] | None:
        """Read the counters now: they are exact at any instant."""
        self._accumulate()
        return time.monotonic(), sum(z.total_uj for z in self.zones) / 1e6

    def stop(self) -> EnergyReading:
        self._poller.stop()
        self._accumulate()
        duration = time.monotonic() - self._t0
        per_zone = {f"{z.name}_j": z.total_uj / 1e6 for z in self.zones}
        energy = sum(z.total_uj for z in self.zones) / 1e6
        return _reading(self, energy, duration, self._reads, extra=per_zone)


def _zone(folder: Path, name: str) -> _Zone:
    energy = folder / "energy_uj"
    _read_uj(energy)
    try:
        max_range = int(_read_text(folder / "max_energy_range_uj"))
    except ValueError:
        raise UserError(f"cannot parse {folder / 'max_energy_range_uj'}: not a RAPL zone") from None
    return _Zone(name=name, energy=energy, max_range_uj=max_range)


def _read_text(path: Path) -> str:
    try:
        return path.read_text().strip()
    except PermissionError:
        raise UserError(
            f"cannot read {path}: RAPL counters are root-only since Linux 5.10; run as root or "
            f"`sudo chmod o+r {path.parent.parent}/intel-rapl:*/energy_uj`"
        ) from None
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror}; this machine exposes no usable RAPL zone") from None


def _read_uj(path: Path) -> int:
    text = _read_text(path)
    try:
        return int(text)
    except ValueError:
        raise UserError(f"{path} holds {text!r}, not an energy in microjoules: RAPL is unusable here") from None
