"""The clocks a Jetson ran during a window, and whether they held what the trial asked.

The tool sets limits (devfreq ``min_freq``/``max_freq``, cpufreq
``scaling_min_freq``/``scaling_max_freq``, the EMC rate, the DLA caps) and reads
them back, but the silicon can run slower without any limit reading back
differently: soctherm's thermal and over-current (OC) throttling slow the
clocks in hardware. So each window samples what ran:

- GPU: devfreq ``cur_freq`` (Hz, readable by anyone) and, where readable, BPMP
  debugfs ``clk/gpusysclk/rate``; a sample takes the lower of the two.
- CPU: ``scaling_cur_freq`` (kHz) of every online core (``cpuN/cpufreq``).
- EMC and DLA: BPMP debugfs ``/sys/kernel/debug/bpmp/debug/clk/<clock>/rate``
  (``emc``; ``nafll_dla0_core``/``nafll_dla1_core`` on Orin, ``nafll_dla`` on
  Xavier), which NVIDIA's MLPerf Orin harness reads with ``sudo cat`` to check
  its clocks (mlcommons inference_results, closed/NVIDIA). debugfs is root-only
  (mode 0700): for another user these are not sampled, and the device says so once.
  Every DLA is sampled on its own: ``dla_mhz`` is DLA0 (Xavier's one ``nafll_dla``
  clock drives both cores), ``dla1_mhz`` DLA1. Not their minimum: each core has
  its own cap (Orin NX 10W: 153.6 and 115 MHz) and idles on its own between its
  batches, so a minimum would mix an idle core into the one that worked.
- OC events: ``oc<N>_event_cnt`` of the hwmon named ``soctherm_oc`` (NVIDIA's
  tegra23x-oc-event driver: OC1 under-voltage, OC2 average and OC3
  instantaneous over-current; read-only attributes, mode 0444).

A window is throttled when an OC counter rose, or when a clock the trial set
(GPU, CPU, a locked EMC) ran in any sample more than :data:`TOLERANCE` below
what was asked. 2% is below every table step of these boards (GPU 102 MHz on
JetPack 6, CPU 76.8 MHz, EMC several hundred MHz), so a clock that fell one
OPP below the request is caught, and the read-out jitter of ``scaling_cur_freq``
(activity-counter estimates within 1%) is not. The DLA clock is a cap, idle
between DLA batches, so its rate is recorded, not judged.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuner.devices.jetson import sysfs
from tuner.measure.poller import Poller

TOLERANCE = 0.02
PERIOD_S = 0.1
BPMP_CLK = "sys/kernel/debug/bpmp/debug/clk"
# The trials.csv name of each DLA's clock and the BPMP clocks that may carry it, Orin's first.
DLA_RATES = {"dla_mhz": ("nafll_dla0_core", "nafll_dla"), "dla1_mhz": ("nafll_dla1_core",)}
HWMON = "sys/class/hwmon"
OC_NAME = "soctherm_oc"
_OC_FILE = re.compile(r"oc(\d+)_event_cnt")


@dataclass
class ClockFiles:
    """Where a board's running clocks and OC counters are read (found once, at discovery)."""

    gpu_cur: Path
    cpu_cur: dict[int, Path]
    online: dict[int, Path]
    gpu_bpmp: Path | None = None
    emc: Path | None = None
    dla: dict[str, Path] = field(default_factory=dict)
    oc: dict[str, Path] = field(default_factory=dict)
    unreadable: list[str] = field(default_factory=list)
    bpmp: Path = Path("/") / BPMP_CLK

    def note(self) -> str | None:
        """The one line saying which rates cannot be sampled here (debugfs needs root)."""
        if not self.unreadable:
            return None
        return (
            f"the {', '.join(self.unreadable)} rate(s) that ran are not sampled: BPMP debugfs ({self.bpmp}) is "
            "readable by root only (run with sudo to record them)"
        )


def find_clock_files(root: Path, gpu: Path, cpu_dirs: dict[int, Path], online: dict[int, Path]) -> ClockFiles:
    """The running-clock files of the board under ``root`` (see the module docstring)."""
    bpmp = root / BPMP_CLK
    unreadable: list[str] = []

    def rate(name: str, label: str) -> Path | None:
        path = bpmp / name / "rate"
        if sysfs.can_read(path):
            return path
        if sysfs.denied(path):
            unreadable.append(label)
        return None

    gpu_bpmp = rate("gpusysclk", "GPU (gpusysclk)")
    emc = rate("emc", "EMC")
    dla: dict[str, Path] = {}
    for column, names in DLA_RATES.items():
        found = next((bpmp / name / "rate" for name in names if sysfs.can_read(bpmp / name / "rate")), None)
        if found is not None:
            dla[column] = found
    every = [name for names in DLA_RATES.values() for name in names]
    if not dla and any(sysfs.denied(bpmp / name / "rate") for name in every):
        unreadable.append("DLA")
    cpu_cur = {cpu: folder / "scaling_cur_freq" for cpu, folder in cpu_dirs.items()}
    return ClockFiles(
        gpu_cur=gpu / "cur_freq",
        cpu_cur={cpu: path for cpu, path in cpu_cur.items() if sysfs.is_file(path)},
        online=online,
        gpu_bpmp=gpu_bpmp,
        emc=emc,
        dla=dla,
        oc=_oc_counters(root),
        unreadable=unreadable,
        bpmp=bpmp,
    )


def _oc_counters(root: Path) -> dict[str, Path]:
    """``oc<N>_event_cnt`` of the soctherm_oc hwmon, by ``oc<N>`` (none on boards without the driver)."""
    found: dict[str, Path] = {}
    for hwmon in sorted((root / HWMON).glob("hwmon*")):
        name = hwmon / "name"
        if not sysfs.is_file(name) or sysfs.read(name) != OC_NAME:
            continue
        for counter in sorted(hwmon.glob("oc*_event_cnt")):
            match = _OC_FILE.fullmatch(counter.name)
            if match and sysfs.can_read(counter):
                found[f"oc{match.group(1)}"] = counter
    return found


def _int(path: Path | None) -> int | None:
    if path is None:
        return None
    try:
        return int(sysfs.read(path).split()[0])
    except (OSError, ValueError, IndexError):
        return None


class ClockMonitor:
    """Samples the running clocks and OC counters through one window (a :class:`tuner.measure.meters.Monitor`)."""

    def __init__(self, files: ClockFiles, period_s: float = PERIOD_S) -> None:
        self.files = files
        self._poller = Poller(self.sample, period_s, "jetson-clocks")
        self._lock = threading.Lock()
        self.mhz: dict[str, list[float]] = {}
        self._oc_start: dict[str, int] = {}
        self.oc_rise: dict[str, int] = {}

    def _oc_now(self) -> dict[str, int]:
        return {name: value for name, path in self.files.oc.items() if (value := _int(path)) is not None}

    def sample(self) -> None:
        f = self.files
        gpu = [v for v in (_int(f.gpu_cur), _int(f.gpu_bpmp)) if v is not None]
        online = {0} | {cpu for cpu, path in f.online.items() if _int(path) == 1}
        cpu = [v for c, path in f.cpu_cur.items() if c in online and (v := _int(path)) is not None]
        readings = {
            "gpu_mhz": min(gpu) / 1e6 if gpu else None,
            "cpu_mhz": min(cpu) / 1e3 if cpu else None,
            "emc_mhz": None if (emc := _int(f.emc)) is None else emc / 1e6,
        }
        for column, path in f.dla.items():
            readings[column] = None if (hz := _int(path)) is None else hz / 1e6
        with self._lock:
            for name, value in readings.items():
                if value is not None:
                    self.mhz.setdefault(name, []).append(value)

    def start(self) -> None:
        self.mhz, self.oc_rise = {}, {}
        self._oc_start = self._oc_now()
        self.sample()
        self._poller.start()

    def stop(self) -> ClockMonitor:
        self._poller.stop()
        self.sample()
        end = self._oc_now()
        self.oc_rise = {n: end[n] - v for n, v in self._oc_start.items() if n in end and end[n] > v}
        return self

    def extras(self) -> dict[str, float]:
        """Mean, minimum and maximum of each clock sampled (MHz), and the OC events in the window."""
        out: dict[str, float] = {}
        for name, values in self.mhz.items():
            out[f"{name}_mean"] = round(sum(values) / len(values), 3)
            out[f"{name}_min"] = round(min(values), 3)
            out[f"{name}_max"] = round(max(values), 3)
        if self.files.oc:
            out["oc_events"] = float(sum(self.oc_rise.values()))
        return out

    def throttles(self, asked: dict[str, Any]) -> list[str]:
        """Why the window does not count: clocks below what ``asked`` (apply's targets) set, OC events."""
        found: list[str] = []
        wanted = {
            "gpu_mhz": asked["gpu_hz"] / 1e6 if "gpu_hz" in asked else None,
            "cpu_mhz": asked["cpu_khz"] / 1e3 if "cpu_khz" in asked else None,
            "emc_mhz": asked["emc_hz"] / 1e6 if "emc_hz" in asked else None,
        }
        for name, want in wanted.items():
            ran = self.mhz.get(name)
            if want is None or not ran or min(ran) >= want * (1 - TOLERANCE):
                continue
            found.append(
                f"{name} asked {want:g} MHz ran {min(ran):g}-{max(ran):g} MHz (more than {TOLERANCE:.0%} below)"
            )
        if self.oc_rise:
            events = ", ".join(f"{name} +{count}" for name, count in sorted(self.oc_rise.items()))
            found.append(f"over-current events ({events})")
        return found
