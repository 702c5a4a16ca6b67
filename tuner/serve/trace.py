"""Arrival-rate traces for ``tune replay``: the shipped ones (tuner/serve/traces/) and CSV files, read safely."""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tuner.errors import ConfigurationError
from tuner.plumbing.readfile import read_capped
from tuner.plumbing.units import MAX_RATE_QPS
from tuner.serve.validate import MAX_TRACE_BYTES, MAX_TRACE_ROWS


@dataclass
class Trace:
    """Rate steps: ``rates[i]`` queries/s from ``times[i]`` until ``times[i+1]`` (the last for one more step)."""

    times: np.ndarray
    rates: np.ndarray
    name: str = ""

    @property
    def durations(self) -> np.ndarray:
        step = float(np.median(np.diff(self.times))) if len(self.times) > 1 else 60.0
        return np.diff(np.append(self.times, self.times[-1] + step))


TRACES = Path(__file__).parent / "traces"


def shipped_traces() -> list[str]:
    """The names of the traces that ship with the tool (tuner/serve/traces/), for ``--trace NAME``."""
    return sorted(p.stem for p in TRACES.glob("*.csv"))


def trace_path(spec: str) -> Path:
    """``--trace``: a CSV file, or the bare name of a shipped trace (``diurnal``); a miss lists the shipped ones."""
    path = Path(spec)
    if path.exists():
        return path
    name = path.name.removesuffix(".csv")
    if path.parent == Path(".") and name in shipped_traces():
        return TRACES / f"{name}.csv"
    raise ConfigurationError(
        f"no trace {spec}: give a CSV file of t_s,rate_qps, or a shipped trace by name: "
        f"{', '.join(shipped_traces())} (in {TRACES})"
    )


def load_trace(path: Path, scale: float = 1.0) -> Trace:
    """Read ``t_s,rate_qps`` rows; a bad file, or one asking for more work than the limits allow, is one line.

    Times must be finite and increasing and rates (after ``scale``) within
    the serving rate limits (tuner/serve/validate.py); the file's size and
    rows are capped before they are parsed.
    """
    fix = "give a CSV file of t_s,rate_qps rows"
    raw = read_capped(path, "trace", MAX_TRACE_BYTES, fix)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigurationError(f"trace {path} is not UTF-8 text: {fix}") from None
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    if len(lines) > MAX_TRACE_ROWS + 1:
        raise ConfigurationError(f"trace {path} has more than {MAX_TRACE_ROWS} rows: use coarser steps")
    try:
        rows = list(csv.DictReader(lines))
        times = np.array([float(r["t_s"]) for r in rows])
        raw = [float(r["rate_qps"]) for r in rows]
    except (KeyError, TypeError, ValueError, csv.Error):
        raise ConfigurationError(
            f"trace {path} must be CSV with columns t_s,rate_qps and numbers in every row"
        ) from None
    if not (math.isfinite(scale) and scale > 0):
        raise ConfigurationError("--rate-scale must be a positive number, e.g. 10")
    highest = max(raw, default=0.0)
    if any(not math.isfinite(r) or r < 0 for r in raw) or highest > MAX_RATE_QPS / scale:
        raise ConfigurationError(
            f"trace {path}: rates (times --rate-scale) must be from 0 to {MAX_RATE_QPS:g} queries/s; "
            f"the highest is {highest:g}" + ("" if scale == 1 else f" times {scale:g}")
        )
    rates = np.array(raw) * scale
    with np.errstate(over="ignore", invalid="ignore"):
        steps = np.diff(times)
    if len(times) < 2 or not np.all(np.isfinite(times)) or not np.all(np.isfinite(steps)) or np.any(steps <= 0):
        raise ConfigurationError(f"trace {path} needs two or more rows with finite, increasing t_s")
    if np.any(rates < 0) or not np.all(np.isfinite(rates)) or float(rates.max()) > MAX_RATE_QPS:
        raise ConfigurationError(
            f"trace {path}: rates (times --rate-scale) must be from 0 to {MAX_RATE_QPS:g} queries/s; "
            f"the highest is {float(rates.max()):g}"
        )
    return Trace(times=times, rates=rates, name=path.stem)
