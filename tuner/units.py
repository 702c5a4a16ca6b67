"""Parsing of the human units and counts users type on the command line.

Every value is range-checked here, so a bound of a billion seconds, a NaN or a
trial budget of 1e20 is refused in one line before anything is opened.
"""

from __future__ import annotations

import math
import re

from tuner.errors import UserError

_LATENCY_UNITS_MS = {"s": 1000.0, "ms": 1.0, "us": 1e-3, "µs": 1e-3, "ns": 1e-6}
_LATENCY_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([a-zµ]*)\s*$")
# A bound beyond an hour per query is a typo (50s for 50ms), not a service promise.
MAX_LATENCY_MS = 3_600_000.0
MIN_LATENCY_MS = 1e-3
# Far more trials than any space has distinct configurations; a bigger number is a typo.
MAX_TRIALS = 1_000_000
MAX_BATCH = 1 << 20
MAX_LIST = 64


def parse_latency_ms(text: str) -> float:
    """Return a latency in milliseconds from '50ms', '50 ms', '0.05s' or '50000us'.

    A bare number is refused: '50' could mean seconds or milliseconds, and a
    silently wrong bound would tune for the wrong promise.
    """
    match = _LATENCY_RE.match(str(text).lower())
    if not match or match.group(2) not in _LATENCY_UNITS_MS:
        raise UserError(f"cannot read latency {text!r}: give a number with a unit, e.g. 50ms, 50 ms, 0.05s or 50000us")
    value = float(match.group(1)) * _LATENCY_UNITS_MS[match.group(2)]
    if not math.isfinite(value) or value <= 0:
        raise UserError(f"latency {text!r} must be positive, e.g. 50ms")
    if value > MAX_LATENCY_MS or value < MIN_LATENCY_MS:
        raise UserError(f"latency {text!r} is outside 1us..1h: check the unit, e.g. 50ms")
    return value


def format_ms(value_ms: float) -> str:
    """Canonical spelling of a bound, used in study names so '50 ms' and '0.05s' share a study."""
    return f"{value_ms:g}ms"


def figure(value: float) -> str:
    """A figure to 4 significant digits, never in exponent form where a reader expects a plain number.

    13761.2 reads 13761 (not 1.376e+04); 0.07468 and 45.9 as ``:.4g`` writes them.
    """
    if not math.isfinite(value):
        return str(value)
    if abs(value) >= 1e4:
        return f"{value:.0f}"
    return f"{value:.4g}"


def parse_int_list(text: str, what: str) -> list[int]:
    """Parse '1,8,32' into [1, 8, 32], naming the flag in the error.

    An empty item ('1,,8') is refused rather than skipped: it usually marks a
    value lost while editing the command.
    """
    parts = [part.strip() for part in str(text).split(",")]
    if len(parts) > MAX_LIST:
        raise UserError(f"{what} lists {len(parts)} values: give at most {MAX_LIST}, e.g. 1,8,32")
    if not all(re.fullmatch(r"[0-9]+", p) for p in parts):
        raise UserError(f"cannot read {what} {text!r}: give positive integers separated by commas, e.g. 1,8,32")
    values = [int(p) for p in parts]
    if any(v <= 0 or v > MAX_BATCH for v in values):
        raise UserError(f"{what} {text!r} must be integers from 1 to {MAX_BATCH}, e.g. 1,8,32")
    return values


def check_count(value: int, flag: str, example: int, maximum: int = MAX_TRIALS) -> int:
    """A positive count no larger than ``maximum`` (trials, repeats, seeds, points)."""
    if value <= 0 or value > maximum:
        raise UserError(f"{flag} must be an integer from 1 to {maximum}, e.g. {example}")
    return value


def check_seconds(value: float | None, flag: str, example: str, maximum: float = 7 * 86400.0) -> float | None:
    """A positive, finite duration in seconds (window, timeout, heartbeat), at most a week by default."""
    if value is None:
        return None
    if not math.isfinite(value) or value <= 0 or value > maximum:
        raise UserError(f"{flag} must be a positive number of seconds up to {maximum:g}, e.g. {example}")
    return value
