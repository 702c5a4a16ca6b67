"""What an NVIDIA GPU ran during a window: its clocks, temperature and clock-event reasons, sampled on a thread."""

from __future__ import annotations

from typing import Any

from tuner.devices.nvml.calls import (
    BELOW_LOCK_BITS,
    CLOCK_MEM,
    CLOCK_SM,
    POWER_CAP_BIT,
    TEMPERATURE_GPU,
    THROTTLE_BITS,
    is_nvml_error,
)
from tuner.measure.poller import Poller

TELEMETRY_PERIOD_S = 0.1
# How far a locked clock may read from its lock (relative) before the setting counts as not held.
CLOCK_TOLERANCE = 0.02


class NvmlTelemetry:
    """Samples temperature, clock-event reasons and the SM and memory clocks on a thread during a window.

    The clocks are what the card ran (nvmlDeviceGetClockInfo), not what was
    asked: an observe-only window records the driver's boost, a locked one
    shows whether the lock held.
    """

    def __init__(self, nvml: Any, handle: Any, period_s: float = TELEMETRY_PERIOD_S) -> None:
        self.nvml = nvml
        self.handle = handle
        self.period_s = period_s
        self.temps_c: list[float] = []
        self.reasons = 0
        self.power_capped_samples = 0
        self.samples = 0
        self.clocks: list[tuple[float | None, float | None, int | None]] = []
        self._poller = Poller(self.sample, period_s, "nvml-telemetry")

    def _reasons_now(self) -> int:
        getter = getattr(self.nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
        if getter is None:
            getter = self.nvml.nvmlDeviceGetCurrentClocksThrottleReasons
        return int(getter(self.handle))

    def _read(self, fn: str, *args: Any) -> Any | None:
        try:
            return getattr(self.nvml, fn)(self.handle, *args)
        except Exception as exc:
            if not is_nvml_error(self.nvml, exc):
                raise
            return None

    def sample(self) -> None:
        temp = self._read("nvmlDeviceGetTemperature", TEMPERATURE_GPU)
        if temp is not None:
            self.temps_c.append(float(temp))
        sm = self._read("nvmlDeviceGetClockInfo", CLOCK_SM)
        mem = self._read("nvmlDeviceGetClockInfo", CLOCK_MEM)
        try:
            reasons: int | None = self._reasons_now()
        except Exception as exc:
            if not is_nvml_error(self.nvml, exc):
                raise
            reasons = None
        self.clocks.append((None if sm is None else float(sm), None if mem is None else float(mem), reasons))
        if reasons is None:
            return
        self.reasons |= reasons
        self.power_capped_samples += bool(reasons & POWER_CAP_BIT)
        self.samples += 1

    def start(self) -> None:
        self.temps_c, self.reasons, self.power_capped_samples, self.samples = [], 0, 0, 0
        self.clocks = []
        self.sample()
        self._poller.start()

    def stop(self) -> NvmlTelemetry:
        self._poller.stop()
        self.sample()
        return self

    def throttle_reasons(self) -> list[str]:
        return [text for bit, text in THROTTLE_BITS.items() if self.reasons & bit]

    def clock_extras(self) -> dict[str, float]:
        """Mean, minimum and maximum of the SM and memory clocks sampled over the window (MHz)."""
        out: dict[str, float] = {}
        for position, name in ((0, "sm_mhz"), (1, "mem_mhz")):
            values = [c[position] for c in self.clocks if c[position] is not None]
            if values:
                out[f"{name}_mean"] = round(sum(values) / len(values), 1)
                out[f"{name}_min"] = min(values)
                out[f"{name}_max"] = max(values)
        return out

    def lock_misses(self, sm_lock: float | None, mem_lock: float | None) -> list[str]:
        """Locks the sampled clocks did not follow, as ``knob locked X MHz, ran A-B MHz``.

        The SM clock may run below its lock while the power cap, a slowdown or
        idling pulls it down (those samples are not judged); above it, or below
        it without such a reason, the lock did not hold. The memory clock is
        judged on every sample without a slowdown: drivers can accept a memory
        lock and not honour it.
        """
        misses = []
        slow = sum(THROTTLE_BITS)
        for position, lock, name, excused in ((0, sm_lock, "sm_mhz", BELOW_LOCK_BITS), (1, mem_lock, "mem_mhz", slow)):
            if lock is None:
                continue
            off = [
                c[position]
                for c in self.clocks
                if c[position] is not None
                and abs(c[position] - lock) > CLOCK_TOLERANCE * lock
                and not (c[position] < lock and (c[2] or 0) & excused)
            ]
            if off:
                misses.append(f"{name} locked at {lock:g} MHz ran {min(off):g}-{max(off):g} MHz")
        return misses
