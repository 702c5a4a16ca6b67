"""An NVIDIA GPU's search space: its kind from the name NVML reports, cut to the values the card accepts."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tuner.errors import UserError
from tuner.space import SearchSpace

KIND_BY_NAME = (("H200", "h200"), ("H100", "h100"), ("A30", "a30"))
# The knobs that lock a clock; an observe-only device has none, and a configuration without one leaves it to the driver.
LOCK_KNOBS = ("sm_mhz", "mem_mhz")


def kind_of(gpu_name: str) -> str:
    """Search-space kind from the marketing name NVML reports."""
    upper = gpu_name.upper()
    for marker, kind in KIND_BY_NAME:
        if marker in upper:
            return kind
    raise UserError(
        f"no search space for GPU {gpu_name!r}: write one (copy search_spaces/h200.yaml, "
        "set its clocks and power limits) and pass its path as the space file"
    )


def supported_values(try_call: Callable[..., Any], name: str, allow_clock_changes: bool) -> dict[str, Any]:
    """Predicates for values the card accepts; None where NVML cannot say.

    ``try_call`` makes one NVML call on the card and returns None where it fails.
    """
    mem = try_call("nvmlDeviceGetSupportedMemoryClocks")
    graphics: set[float] = set()
    for clock in mem or []:
        graphics.update(float(g) for g in try_call("nvmlDeviceGetSupportedGraphicsClocks", clock) or [])
    limits = try_call("nvmlDeviceGetPowerManagementLimitConstraints")
    if allow_clock_changes and (not mem or not graphics or not limits):
        raise UserError(
            f"NVML on {name} does not report supported clocks and power limits, "
            "so they cannot be "
            "changed safely: run without --allow-clock-changes"
        )
    mem_set = {float(m) for m in mem or []}
    result: dict[str, Any] = {
        "mem_mhz": (lambda v: v in mem_set) if mem_set else None,
        "sm_mhz": (lambda v: v in graphics) if graphics else None,
        "power_limit_w": None,
    }
    if limits:
        low, high = (x / 1000.0 for x in limits)
        result["power_limit_w"] = lambda v: low - 1e-6 <= v <= high + 1e-6
    return result


def card_space(
    base: SearchSpace,
    supported: dict[str, Any],
    current: dict[str, float] | None,
    gpu_name: str,
    kind: str,
    device_name: str,
) -> SearchSpace:
    """The kind's space cut to what the card supports; with ``current`` (observe-only) no clock locks and the
    device knobs pinned to those values."""
    space = base
    for knob, allowed in supported.items():
        if knob not in space.knobs or allowed is None:
            continue
        kept = [v for v in space.knobs[knob].values if allowed(float(v))]
        if not kept:
            raise UserError(
                f"{gpu_name} supports none of the {knob} values in the {kind} space: "
                "edit that file to match `nvidia-smi -q -d SUPPORTED_CLOCKS`"
            )
        default = space.knobs[knob].default
        space.knobs[knob] = space.knobs[knob].model_copy(
            update={"values": kept, "default": default if default in kept else kept[-1]}
        )
    if current is not None:
        space = without_knobs(space, LOCK_KNOBS)
        for name, knob in list(space.knobs.items()):
            if knob.group != "device":
                continue
            if name not in current:
                raise UserError(f"cannot read the current {name} of {device_name} through NVML")
            value = current[name]
            space = space.pin(name, int(value) if float(value).is_integer() else value)
    return space


def without_knobs(space: SearchSpace, names: tuple[str, ...]) -> SearchSpace:
    """The space less the named knobs (the clock locks an observe-only GPU does not make)."""
    gone = set(names) & set(space.knobs)
    if not gone:
        return space
    knobs = {n: k for n, k in space.knobs.items() if n not in gone}
    tuned = [n for n in space.tuned if n not in gone] if space.tuned is not None else None
    return space.model_copy(update={"knobs": knobs, "tuned": tuned})
