"""NVML as the devices call it: its return codes, clock and reason bits (nvml.h), and the bindings' errors."""

from __future__ import annotations

from typing import Any

from tuner.errors import UserError

NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_SUCCESS = 0
CLOCK_GRAPHICS = 0
CLOCK_SM = 1
CLOCK_MEM = 2
TEMPERATURE_GPU = 0
# nvmlDeviceGetPowerUsage is a 1 s average on Ampere (but GA100) and newer (NVML reference, nvmlDeviceGetPowerUsage);
# the field value NVML_FI_DEV_POWER_INSTANT at GPU scope is the power now, where the card reports it.
FI_DEV_POWER_INSTANT = 186
POWER_SCOPE_GPU = 0
# Clock-event reason bits (nvml.h): these mean the clocks were pulled down by
# something other than the configuration under test, so the window is untrusted.
THROTTLE_BITS = {
    0x8: "hardware slowdown",
    0x20: "software thermal slowdown",
    0x40: "hardware thermal slowdown",
    0x80: "hardware power brake",
}
# SW power cap is the configured power limit doing its job: recorded, not disqualifying.
POWER_CAP_BIT = 0x4
GPU_IDLE_BIT = 0x1
# Applications-clocks or locked-clocks setting in force (nvml.h nvmlClocksEventReasonApplicationsClocksSetting).
USER_CLOCKS_BIT = 0x2
# Samples with any of these bits may run below a lock without the lock failing.
BELOW_LOCK_BITS = GPU_IDLE_BIT | POWER_CAP_BIT | sum(THROTTLE_BITS)


def load_nvml(nvml: Any | None) -> Any:
    if nvml is not None:
        return nvml
    try:
        import pynvml
    except ImportError:
        raise UserError("NVML bindings are missing: pip install nvidia-ml-py") from None
    return pynvml


def error_code(exc: BaseException) -> int | None:
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) else None


def is_nvml_error(nvml: Any, exc: BaseException) -> bool:
    cls = getattr(nvml, "NVMLError", None)
    return (isinstance(cls, type) and isinstance(exc, cls)) or error_code(exc) is not None


def as_text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
