"""Parsing of the human units users type on the command line."""

from __future__ import annotations

import re

from tuner.errors import UserError

_LATENCY_UNITS_MS = {"s": 1000.0, "ms": 1.0, "us": 1e-3, "µs": 1e-3, "ns": 1e-6}
_LATENCY_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([a-zµ]*)\s*$")


def parse_latency_ms(text: str) -> float:
    """Return a latency in milliseconds from '50ms', '50 ms', '0.05s' or '50000us'.

    A bare number is refused: '50' could mean seconds or milliseconds, and a
    silently wrong bound would tune for the wrong promise.
    """
    match = _LATENCY_RE.match(str(text).lower())
    if not match or match.group(2) not in _LATENCY_UNITS_MS:
        raise UserError(f"cannot read latency {text!r}: give a number with a unit, e.g. 50ms, 50 ms, 0.05s or 50000us")
    value = float(match.group(1)) * _LATENCY_UNITS_MS[match.group(2)]
    if value <= 0:
        raise UserError(f"latency {text!r} must be positive, e.g. 50ms")
    return value


def format_ms(value_ms: float) -> str:
    """Canonical spelling of a bound, used in study names so '50 ms' and '0.05s' share a study."""
    return f"{value_ms:g}ms"


def parse_int_list(text: str, what: str) -> list[int]:
    """Parse '1,8,32' into [1, 8, 32], naming the flag in the error."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise UserError(f"cannot read {what} {text!r}: give integers separated by commas, e.g. 1,8,32") from None
    if not values or any(v <= 0 for v in values):
        raise UserError(f"{what} {text!r} must be positive integers, e.g. 1,8,32")
    return values
