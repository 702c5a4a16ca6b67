"""A knob, a power mode's caps and one configuration, and how knob values compare and are spelled.

The search space (tuner.space) is built from these; a value is a bool, an
int, a float or a string as a space file writes it.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tuner.errors import ConfigurationError

KnobValue = bool | int | float | str
# At most this many values a knob (a space file's bound: see tuner.space.MAX_SPACE_POINTS).
MAX_KNOB_VALUES = 4096


class Knob(BaseModel):
    """One tunable setting.

    ``group`` says who owns it: ``device`` knobs change hardware state (clocks,
    modes, limits); ``runner`` knobs only change how the model is run
    (precision, CUDA graphs), so they are safe in observe-only mode.
    ``ordered`` knobs have an order that samplers see (tuner.indexed).
    ``runtime`` names the only runtime that can use the knob (a Jetson's DLAs
    and their precision need TensorRT); the device leaves it out otherwise.
    """

    model_config = ConfigDict(extra="forbid")

    values: list[KnobValue] = Field(min_length=1)
    default: KnobValue
    group: Literal["device", "runner"] = "device"
    unit: str = ""
    ordered: bool = True
    runtime: str | None = None
    description: str = ""

    @model_validator(mode="after")
    def _default_is_allowed(self) -> Knob:
        if len(self.values) > MAX_KNOB_VALUES:
            raise ValueError(f"{len(self.values)} values, more than {MAX_KNOB_VALUES}")
        bad = [v for v in self.values if is_numeric(v) and not (math.isfinite(v) and (v > 0 or is_none_of(v)))]
        if bad:
            raise ValueError(f"values must be positive numbers (a clock, a count, a limit), not {bad[0]!r}")
        if len({norm(v) for v in self.values}) != len(self.values):
            raise ValueError("values are listed twice")
        if self.default not in self.values:
            raise ValueError(f"default {self.default!r} is not one of the values {self.values}")
        return self


class Mode(BaseModel):
    """A power mode (nvpmodel): caps on other knobs plus fixed properties such as active TPCs."""

    model_config = ConfigDict(extra="forbid")

    id: int
    caps: dict[str, float] = Field(default_factory=dict)
    properties: dict[str, float] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _caps_positive(self) -> Mode:
        bad = [k for k, v in self.caps.items() if not (math.isfinite(v) and v > 0)]
        if bad:
            raise ValueError(f"cap of {bad[0]} must be a positive number")
        return self


class Config(BaseModel):
    """One point of a space: a value for every knob plus the batch size."""

    model_config = ConfigDict(extra="forbid")

    knobs: dict[str, KnobValue]
    batch_size: int

    def key(self) -> tuple:
        return (self.batch_size, *sorted((k, str(v)) for k, v in self.knobs.items()))

    def label(self) -> str:
        parts = [f"{k}={v}" for k, v in self.knobs.items()]
        return " ".join([*parts, f"bs={self.batch_size}"])


def capped(values: list[KnobValue], value: KnobValue, cap: float) -> KnobValue:
    """A mode's cap applied to one knob value: the highest allowed value at or under it (the lowest if none)."""
    if not isinstance(value, (int, float)) or value <= cap:
        return value
    allowed = [v for v in values if not isinstance(v, str)]
    under = [v for v in allowed if v <= cap]
    return max(under) if under else min(allowed)


def distinct(values: list[KnobValue]) -> list[KnobValue]:
    """Values in first-occurrence order, one per Config.key() spelling."""
    seen: dict[str, KnobValue] = {}
    for v in values:
        seen.setdefault(str(v), v)
    return list(seen.values())


def same_value(a: KnobValue, b: KnobValue) -> bool:
    if not (is_numeric(a) and is_numeric(b)):
        return str(a) == str(b)
    return abs(float(a) - float(b)) < 1e-6


def is_numeric(value: object) -> bool:
    """int or float, but not bool (True is an int to Python, not a clock to us)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def is_none_of(value: object) -> bool:
    """The integer 0: a count of nothing (no DLA beside the GPU), the one non-positive value a knob may take."""
    return isinstance(value, int) and not isinstance(value, bool) and value == 0


def norm(value: KnobValue) -> tuple[str, object]:
    return ("n", round(float(value), 6)) if is_numeric(value) else ("s", str(value))


def index_of(values: list[KnobValue], value: KnobValue) -> int:
    for i, candidate in enumerate(values):
        if same_value(candidate, value):
            return i
    raise ConfigurationError(f"value {value!r} is not one of {values}")


def within_one(allowed: list[KnobValue], raw: str) -> list[KnobValue]:
    """The one numeric value less than one unit from ``raw`` (gpu_mhz=1300 for 1300.5 MHz), if exactly one is."""
    if not is_number(raw):
        return []
    near = [a for a in allowed if is_numeric(a) and abs(float(a) - float(raw)) < 1.0]
    return near if len(near) == 1 else []


YAML_BOOLS = {"true": True, "yes": True, "on": True, "false": False, "no": False, "off": False}


def spells(value: KnobValue, raw: str) -> bool:
    """Whether ``raw`` names ``value`` as a space file could: a boolean as true/yes/on (any case), a number as any
    numeral of it (200, 200.0), anything else by its text."""
    if isinstance(value, bool):
        return YAML_BOOLS.get(raw.lower()) is value
    if is_numeric(value):
        return is_number(raw) and same_value(value, float(raw))
    return str(value) == raw


def spelling(value: KnobValue) -> str:
    """A value as the space files write it (true/false, not Python's True/False)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def is_number(text: str) -> bool:
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False
