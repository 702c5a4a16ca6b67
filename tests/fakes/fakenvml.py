"""A fake NVML (the pynvml functions the device uses) that behaves as the real library does.

Each behaviour follows NVML's API reference (https://docs.nvidia.com/deploy/nvml-api/, cited per function
below); where the real library is stricter than this fake, the fake is wrong. Several GPUs, each its own
handle with a UUID and PCI bus id, so CUDA_VISIBLE_DEVICES can name any of them.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

NVML_SUCCESS = 0
INVALID_ARGUMENT = 2
NOT_SUPPORTED = 3
NO_PERMISSION = 4
FI_DEV_POWER_INSTANT = 186
IDLE_BIT, USER_CLOCKS_BIT = 0x1, 0x2


class FakeNVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


class FakeGpu:
    """One card: what it is, what it runs, and what its driver accepts."""

    def __init__(self, index: int, name: str = "NVIDIA H200") -> None:
        self.index = index
        self.name = name
        self.uuid = f"GPU-{index:08x}-aaaa-bbbb-cccc-{index:012x}"
        self.bus_id = f"00000000:{0x19 + 0x10 * index:02X}:00.0"
        self.locked_sm: tuple[int, int] | None = None
        self.locked_mem: tuple[int, int] | None = None
        self.power_limit_mw = 700_000
        self.reasons = 0
        self.graphics = list(range(1980, 344, -15))
        self.mem_clocks = [3201, 2201]
        self.energy_counter = True
        self.instant_field = True
        self.honour_mem_lock = True
        self.not_supported: set[str] = set()
        self.other_limit_mw: int | None = None
        self.mig: int | None = None
        self.busy = False
        self.boost = [1980, 1755, 1410]
        self._boost_reads = 0
        self.origin = time.monotonic()
        # (time, watts) from then on: a step function of board power
        self.power_steps: list[tuple[float, float]] = [(self.origin - 10.0, 300.0)]
        self.writes: list[tuple[str, tuple]] = []

    def set_watts(self, watts: float) -> None:
        self.power_steps.append((time.monotonic(), watts))

    def energy_mj(self, t: float) -> float:
        """Energy since ``origin`` up to ``t``, integrating the power steps."""
        total = 0.0
        for i, (start, watts) in enumerate(self.power_steps):
            end = self.power_steps[i + 1][0] if i + 1 < len(self.power_steps) else t
            lo, hi = max(start, self.origin), min(end, t)
            if hi > lo:
                total += watts * (hi - lo) * 1000.0
        return total

    def instant_w(self, t: float) -> float:
        return [w for start, w in self.power_steps if start <= t][-1]

    def sm_mhz(self) -> int:
        if self.locked_sm is not None:
            return self.locked_sm[1]
        if not self.busy:
            return 345  # an idle H200 with no lock sits at its lowest clock
        self._boost_reads += 1
        return self.boost[self._boost_reads % len(self.boost)]

    def mem_mhz(self) -> int:
        if self.locked_mem is not None and self.honour_mem_lock:
            return self.locked_mem[1]
        return self.mem_clocks[0]


class FakeNVML:
    """The module: nvmlInit, the device getters and set calls, every set attempt recorded.

    ``root`` False: every set and reset call answers NVML_ERROR_NO_PERMISSION ("Device Commands": each
    requires root/admin access; non-admin users see NVML_ERROR_NO_PERMISSION). ``deny``: set calls
    whose name starts so answer it even as root (a privilege withheld from one call).
    """

    NVMLError = FakeNVMLError

    def __init__(
        self,
        name: str = "NVIDIA H200",
        deny: tuple[str, ...] = (),
        energy_counter: bool = True,
        gpus: int = 1,
        root: bool = True,
    ) -> None:
        self.gpus = [FakeGpu(i, name) for i in range(gpus)]
        for gpu in self.gpus:
            gpu.energy_counter = energy_counter
        self.deny = deny
        self.root = root
        self.write_attempts: list[tuple[str, tuple]] = []

    # The first card's state, for tests of one GPU.
    def __getattr__(self, attr: str):
        if attr in ("locked_sm", "locked_mem", "power_limit_mw", "reasons", "graphics", "origin"):
            return getattr(self.__dict__["gpus"][0], attr)
        raise AttributeError(attr)

    def __setattr__(self, attr: str, value) -> None:
        if attr in ("locked_sm", "locked_mem", "power_limit_mw", "reasons", "graphics"):
            setattr(self.gpus[0], attr, value)
        else:
            super().__setattr__(attr, value)

    def _write(self, fn: str, h: FakeGpu, *args) -> None:
        self.write_attempts.append((fn, args))
        h.writes.append((fn, args))
        if not self.root or fn.startswith(self.deny):
            raise FakeNVMLError(NO_PERMISSION)
        if fn in h.not_supported:
            raise FakeNVMLError(NOT_SUPPORTED)

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlSystemGetDriverVersion(self) -> str:
        return "580.159.04"

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        return self.gpus[index]

    def nvmlDeviceGetName(self, h: FakeGpu) -> str:
        return h.name

    def nvmlDeviceGetUUID(self, h: FakeGpu) -> str:
        return h.uuid

    def nvmlDeviceGetPciInfo(self, h: FakeGpu) -> SimpleNamespace:
        # nvmlPciInfo_t.busId is a char array: bytes through ctypes
        return SimpleNamespace(busId=h.bus_id.encode())

    def nvmlDeviceGetCudaComputeCapability(self, h: FakeGpu) -> tuple[int, int]:
        return (9, 0)

    def nvmlDeviceGetMigMode(self, h: FakeGpu) -> list[int]:
        # nvmlDeviceGetMigMode: NVML_ERROR_NOT_SUPPORTED if the device does not support MIG
        if h.mig is None:
            raise FakeNVMLError(NOT_SUPPORTED)
        return [h.mig, h.mig]

    def nvmlDeviceGetSupportedMemoryClocks(self, h: FakeGpu) -> list[int]:
        return list(h.mem_clocks)

    def nvmlDeviceGetSupportedGraphicsClocks(self, h: FakeGpu, mem) -> list[int]:
        return list(h.graphics)

    def nvmlDeviceGetPowerManagementLimitConstraints(self, h: FakeGpu) -> list[int]:
        return [200_000, 700_000]

    def nvmlDeviceGetPowerManagementLimit(self, h: FakeGpu) -> int:
        return h.power_limit_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, h: FakeGpu) -> int:
        # nvmlDeviceGetEnforcedPowerLimit: "the minimum of various power limiters", so another limit can be lower
        return min(h.power_limit_mw, h.other_limit_mw or h.power_limit_mw)

    def nvmlDeviceGetPowerManagementDefaultLimit(self, h: FakeGpu) -> int:
        return 700_000

    def nvmlDeviceGetApplicationsClock(self, h: FakeGpu, clock) -> int:
        return {0: 1980, 2: 3201}[clock]

    def nvmlDeviceGetMaxClockInfo(self, h: FakeGpu, clock) -> int:
        return {0: 1980, 2: 3201}[clock]

    def nvmlDeviceGetClockInfo(self, h: FakeGpu, clock) -> int:
        # NVML_CLOCK_SM = 1, NVML_CLOCK_MEM = 2: the clock running now
        return {1: h.sm_mhz(), 2: h.mem_mhz()}[clock]

    def nvmlDeviceGetPersistenceMode(self, h: FakeGpu) -> int:
        return 1

    def nvmlDeviceGetComputeMode(self, h: FakeGpu) -> int:
        return 0

    def nvmlDeviceGetTemperature(self, h: FakeGpu, sensor) -> int:
        return 41

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: FakeGpu) -> int:
        held = USER_CLOCKS_BIT if h.locked_sm is not None or h.locked_mem is not None else 0
        idle = IDLE_BIT if not h.busy and h.locked_sm is None else 0
        return h.reasons | held | idle

    def nvmlDeviceGetPowerUsage(self, h: FakeGpu) -> int:
        # nvmlDeviceGetPowerUsage: "On Ampere (except GA100) or newer GPUs, the API returns power averaged over
        # 1 sec interval" (NVML reference): the trailing 1 s mean, not the power now.
        now = time.monotonic()
        return round((h.energy_mj(now) - h.energy_mj(now - 1.0)) / 1.0)

    def nvmlDeviceGetFieldValues(self, h: FakeGpu, fields) -> list[SimpleNamespace]:
        # nvmlDeviceGetFieldValues answers per field (nvmlFieldValue_t.nvmlReturn); NVML_FI_DEV_POWER_INSTANT is
        # the power now where the card reports it, NVML_ERROR_NOT_SUPPORTED in that field elsewhere.
        out = []
        for field in fields:
            field_id = field[0] if isinstance(field, tuple) else field
            ok = field_id == FI_DEV_POWER_INSTANT and h.instant_field
            value = round(h.instant_w(time.monotonic()) * 1000) if ok else 0
            out.append(
                SimpleNamespace(nvmlReturn=NVML_SUCCESS if ok else NOT_SUPPORTED, value=SimpleNamespace(uiVal=value))
            )
        return out

    def nvmlDeviceGetTotalEnergyConsumption(self, h: FakeGpu) -> int:
        # nvmlDeviceGetTotalEnergyConsumption: mJ since the driver was last reloaded, Volta and newer; it
        # moves in steps (about 10 Hz on an H200, tuner.devices.nvml.meters), not smoothly.
        if not h.energy_counter:
            raise FakeNVMLError(NOT_SUPPORTED)
        now = time.monotonic()
        stepped = h.origin + int((now - h.origin) / 0.1) * 0.1
        return round(h.energy_mj(stepped))

    def nvmlDeviceSetGpuLockedClocks(self, h: FakeGpu, low, high) -> None:
        # nvmlDeviceSetGpuLockedClocks: root only; clocks the card does not list are NVML_ERROR_INVALID_ARGUMENT
        self._write("nvmlDeviceSetGpuLockedClocks", h, low, high)
        if low > high or low not in h.graphics or high not in h.graphics:
            raise FakeNVMLError(INVALID_ARGUMENT)
        h.locked_sm = (low, high)

    def nvmlDeviceSetMemoryLockedClocks(self, h: FakeGpu, low, high) -> None:
        # nvmlDeviceSetMemoryLockedClocks: root only, Ampere and newer; a driver may accept it and run another
        # clock (honour_mem_lock False), which only the running clock shows
        self._write("nvmlDeviceSetMemoryLockedClocks", h, low, high)
        if low > high or low not in h.mem_clocks or high not in h.mem_clocks:
            raise FakeNVMLError(INVALID_ARGUMENT)
        h.locked_mem = (low, high)

    def nvmlDeviceResetGpuLockedClocks(self, h: FakeGpu) -> None:
        self._write("nvmlDeviceResetGpuLockedClocks", h)
        h.locked_sm = None

    def nvmlDeviceResetMemoryLockedClocks(self, h: FakeGpu) -> None:
        self._write("nvmlDeviceResetMemoryLockedClocks", h)
        h.locked_mem = None

    def nvmlDeviceSetPowerManagementLimit(self, h: FakeGpu, mw) -> None:
        # nvmlDeviceSetPowerManagementLimit: root only; outside nvmlDeviceGetPowerManagementLimitConstraints is
        # NVML_ERROR_INVALID_ARGUMENT
        self._write("nvmlDeviceSetPowerManagementLimit", h, mw)
        low, high = self.nvmlDeviceGetPowerManagementLimitConstraints(h)
        if not low <= mw <= high:
            raise FakeNVMLError(INVALID_ARGUMENT)
        h.power_limit_mw = mw
