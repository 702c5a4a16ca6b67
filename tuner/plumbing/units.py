"""Parsing of the human units and counts users type on the command line.

Every value is range-checked here, so a bound of a billion seconds, a NaN or a
trial budget of 1e20 is refused in one line before anything is opened.
"""

from __future__ import annotations

import math
import re

from tuner.errors import ConfigurationError

_LATENCY_UNITS_MS = {"s": 1000.0, "ms": 1.0, "us": 1e-3, "µs": 1e-3, "ns": 1e-6}
_LATENCY_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([a-zµ]*)\s*$")
# A bound beyond an hour per query is a typo (50s for 50ms), not a service promise.
MAX_LATENCY_MS = 3_600_000.0
MIN_LATENCY_MS = 1e-3
# Far more trials than any space has distinct configurations; a bigger number is a typo.
MAX_TRIALS = 1_000_000
MAX_BATCH = 1 << 20
MAX_LIST = 64
# numpy's and Optuna's samplers take a 32-bit seed; anything else fails deep inside them.
MAX_SEED = 2**32 - 1
# Arrival rates, queries/s, wherever one enters (--target-qps, plan's --rates, a trace): below
# the floor a Server window holds no query; no device here serves 100,000 queries a second, and
# above that LoadGen schedules every query of a window up front (work no signal interrupts).
MIN_RATE_QPS = 0.01
MAX_RATE_QPS = 1e5
# A dynamic batching timeout beyond a minute is no longer a latency-bound service.
MAX_BATCH_TIMEOUT_MS = 60_000.0


def parse_latency_ms(text: str) -> float:
    """Return a latency in milliseconds from '50ms', '50 ms', '0.05s' or '50000us'.

    A bare number is refused: '50' could mean seconds or milliseconds, and a
    silently wrong bound would tune for the wrong promise.
    """
    match = _LATENCY_RE.match(str(text).lower())
    if not match or match.group(2) not in _LATENCY_UNITS_MS:
        raise ConfigurationError(
            f"cannot read latency {text!r}: give a number with a unit, e.g. 50ms, 50 ms, 0.05s or 50000us"
        )
    value = float(match.group(1)) * _LATENCY_UNITS_MS[match.group(2)]
    if not math.isfinite(value) or value <= 0:
        raise ConfigurationError(f"latency {text!r} must be positive, e.g. 50ms")
    if value > MAX_LATENCY_MS or value < MIN_LATENCY_MS:
        raise ConfigurationError(f"latency {text!r} is outside 1us..1h: check the unit, e.g. 50ms")
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
        raise ConfigurationError(f"{what} lists {len(parts)} values: give at most {MAX_LIST}, e.g. 1,8,32")
    if not all(re.fullmatch(r"[0-9]+", p) for p in parts):
        raise ConfigurationError(
            f"cannot read {what} {text!r}: give positive integers separated by commas, e.g. 1,8,32"
        )
    values = [int(p) for p in parts]
    if any(v <= 0 or v > MAX_BATCH for v in values):
        raise ConfigurationError(f"{what} {text!r} must be integers from 1 to {MAX_BATCH}, e.g. 1,8,32")
    return values


def check_count(value: int, flag: str, example: int, maximum: int = MAX_TRIALS) -> int:
    """A positive count no larger than ``maximum`` (trials, repeats, seeds, points)."""
    if value <= 0 or value > maximum:
        raise ConfigurationError(f"{flag} must be an integer from 1 to {maximum}, e.g. {example}")
    return value


def check_seconds(value: float | None, flag: str, example: str, maximum: float = 7 * 86400.0) -> float | None:
    """A positive, finite duration in seconds (window, timeout, heartbeat), at most a week by default."""
    if value is None:
        return None
    if not math.isfinite(value) or value <= 0 or value > maximum:
        raise ConfigurationError(f"{flag} must be a positive number of seconds up to {maximum:g}, e.g. {example}")
    return value


def check_seed(value: int | None, flag: str = "--seed") -> int | None:
    """A sampler seed: an integer from 0 to 2**32-1 (numpy's range), or None for none."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_SEED:
        raise ConfigurationError(f"{flag} must be an integer from 0 to {MAX_SEED} (2**32-1), e.g. 1")
    return value


def check_rate(value: float, flag: str = "--target-qps") -> float:
    """A finite arrival rate within [MIN_RATE_QPS, MAX_RATE_QPS] queries/s."""
    if not (math.isfinite(value) and MIN_RATE_QPS <= value <= MAX_RATE_QPS):
        raise ConfigurationError(
            f"{flag} {value:g} q/s is outside {MIN_RATE_QPS:g} to {MAX_RATE_QPS:g} queries/s: give a rate in that range"
        )
    return float(value)


def check_range(value: float, flag: str, low: float, high: float, example: str) -> float:
    """A finite number from ``low`` to ``high`` (both included)."""
    if not math.isfinite(value) or not low <= value <= high:
        raise ConfigurationError(f"{flag} must be a number from {low:g} to {high:g}, e.g. {example}")
    return value
