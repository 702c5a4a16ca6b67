"""RAPL (``/sys/class/powercap``) as a window meter for the host CPU."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from tuner.errors import UserError
from tuner.measure.meters import EnergyReading, reading_of
from tuner.measure.poller import Poller

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
        return reading_of(self, energy, duration, self._reads, extra=per_zone)


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
