"""An LLM window's record and its Measurement: per-query times, LoadGen's token latencies, J per output token.

LoadGen writes TTFT and TPOT percentiles to its detail log in Server and
SingleStream (``result_first_token_*_percentile_latency_ns``,
``result_time_per_output_token_*_percentile_ns``); the SUT's own clock times
them the same way where LoadGen does not (Offline) or where its log no
longer holds the window's (a window cut at its verdict: the queries ended at
the cut read as instant there).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tuner.measure.logparse import mllog_entries
from tuner.measure.results import LoadGenSummary
from tuner.measure.stopping import STOP_TAIL
from tuner.measurement import Measurement, TokenMetrics

if TYPE_CHECKING:
    from tuner.measure.meters import EnergyReading, Meter

# LoadGen's verdict lines that say a window was too short to judge; its others are about the latency bounds
# (performance constraints, early stopping, "TTFT constrain not met"), which the study's constraints judge.
TOO_SHORT = ("min duration", "min queries")
PERCENTILES = {"p50": "50.00", "p90": "90.00", "p99": "99.00"}


@dataclass
class Query:
    """One query on the SUT's clock (nan while unknown): its sample, when issued, first token, done; its tokens."""

    sample_id: int
    index: int
    issued: float
    first: float = math.nan
    done: float = math.nan
    tokens: int = 0


@dataclass
class TokenWindow:
    """One LLM window: every query's times on the SUT's clock, tokens generated, LoadGen's verdict and logs."""

    queries: list[Query]
    start: float
    end: float
    start_wall: float
    end_wall: float
    summary: LoadGenSummary
    token_latencies_ns: dict[str, float]
    log_dir: Path
    energy: EnergyReading | None
    warmup_qps: float
    warmup_s: float
    input_tokens: int
    error: str = ""
    attempts: int = 1
    monitors: list[Any] = field(default_factory=list)
    cut_bound: str = ""
    cut_over: int = 0
    cut_needed: int = 0

    @property
    def completed(self) -> list[Query]:
        """The queries that completed in the window (a cut window: before its cut)."""
        return [q for q in self.queries if q.done <= self.end]

    @property
    def output_tokens(self) -> int:
        return sum(q.tokens for q in self.completed)

    @property
    def duration_s(self) -> float:
        return self.end - self.start


def parse_token_latencies(log_dir: str | Path) -> dict[str, float]:
    """LoadGen's TTFT and TPOT percentiles (ns) from its detail log: ``ttft_p99``, ``tpot_p50``, ...

    Keys ``result_first_token_99.00_percentile_latency_ns`` and
    ``result_time_per_output_token_99.00_percentile_ns``; absent in Offline,
    where LoadGen reports only token throughput.
    """
    detail = Path(log_dir) / "mlperf_log_detail.txt"
    if not detail.is_file():
        return {}
    wanted: dict[str, str] = {}
    for name, pct in PERCENTILES.items():
        wanted[f"result_first_token_{pct}_percentile_latency_ns"] = f"ttft_{name}"
        wanted[f"result_time_per_output_token_{pct}_percentile_ns"] = f"tpot_{name}"
    found: dict[str, float] = {}
    for entry in mllog_entries(detail):
        key = wanted.get(str(entry.get("key", "")))
        if key is not None and isinstance(entry.get("value"), int | float):
            found[key] = float(entry["value"])
    return found


def sut_token_latencies_ms(window: TokenWindow) -> dict[str, float]:
    """TTFT and TPOT percentiles (ms) on the SUT's clock, defined as LoadGen defines them.

    A cut window counts every query issued before its cut, a query with no
    first token yet at the time it had waited by then.
    """
    done = window.completed
    issued = [q for q in window.queries if q.issued <= window.end]
    ttft = np.asarray(
        [((q.first if q.first <= window.end else window.end) - q.issued) * 1e3 for q in issued] or [math.nan]
    )
    tpot = np.asarray([(q.done - q.first) * 1e3 / (q.tokens - 1) for q in done if q.tokens > 1] or [0.0])
    latency = np.asarray([(q.done - q.issued) * 1e3 for q in done] or [math.nan])
    out: dict[str, float] = {}
    for name, pct in (("p50", 50), ("p90", 90), ("p99", 99)):
        out[f"ttft_{name}"] = float(np.percentile(ttft, pct))
        out[f"tpot_{name}"] = float(np.percentile(tpot, pct))
        out[f"latency_{name}"] = float(np.percentile(latency, pct))
    return out


def build_token_measurement(window: TokenWindow, meter: Meter) -> Measurement:
    """A token window as a Measurement: J per query and per output token, TTFT/TPOT and why it is not trusted."""
    reading = window.energy
    if reading is None:
        raise ValueError("the window was run without a meter")
    done = window.completed
    tokens = window.output_tokens
    reasons: list[str] = []
    if window.error:
        reasons.append(f"runner error: {window.error}")
    if (not done or tokens <= 0) and not window.cut_bound:
        reasons.append("no query completed in the window")
    cut = bool(window.cut_bound)
    judged = [r for r in window.summary.invalid_reasons if any(short in r.lower() for short in TOO_SHORT)]
    if not cut and not window.summary.valid and (judged or not window.summary.invalid_reasons):
        reasons.append(f"LoadGen result INVALID ({'; '.join(judged) or 'no reason given'})")
    if not cut and reading.duration_s < meter.min_window_s:
        reasons.append(
            f"window {reading.duration_s:.2f} s is shorter than meter {meter.name} needs "
            f"({meter.min_window_s:.2f} s): lengthen --window"
        )
    own = sut_token_latencies_ms(window)
    loadgen = window.token_latencies_ns
    # A cut window's LoadGen log holds the queries ended at the cut as instant: its own figures at the cut stand.
    complete = all(f"{k}_{p}" in loadgen for k in ("ttft", "tpot") for p in PERCENTILES)
    clock = "loadgen" if complete and not cut else "sut-monotonic"
    figure = {key: loadgen[key] / 1e6 for key in loadgen} if clock == "loadgen" else own
    per_query = (None if cut else _query_percentiles(window.summary)) or tuple(own[f"latency_{p}"] for p in PERCENTILES)
    duration = window.duration_s
    queries = len(done)
    metrics = TokenMetrics(
        output_tokens=tokens,
        input_tokens=window.input_tokens,
        j_per_token=reading.energy_j / tokens if tokens else math.inf,
        tokens_per_s=tokens / duration if duration > 0 else 0.0,
        ttft_p50_ms=figure["ttft_p50"],
        ttft_p90_ms=figure["ttft_p90"],
        ttft_p99_ms=figure["ttft_p99"],
        tpot_p50_ms=figure["tpot_p50"],
        tpot_p90_ms=figure["tpot_p90"],
        tpot_p99_ms=figure["tpot_p99"],
        latency_clock=clock,
    )
    extra: dict[str, float | str] = {
        "warmup_qps": window.warmup_qps,
        "warmup_s": window.warmup_s,
        "window_start_unix": window.start_wall,
        "window_end_unix": window.end_wall,
        "loadgen_log_dir": str(window.log_dir),
        "loadgen_scenario": window.summary.scenario,
        "loadgen_attempts": float(window.attempts),
        "loadgen_result": "VALID" if window.summary.valid else "INVALID: " + "; ".join(window.summary.invalid_reasons),
        "meter_samples": float(reading.samples),
        "latency_clock": clock,
        **{f"sut_{key}_ms": value for key, value in own.items()},
    }
    if cut:
        extra.update(
            cut=STOP_TAIL,
            cut_bound=window.cut_bound,
            tail_over_queries=float(window.cut_over),
            tail_over_needed=float(window.cut_needed),
        )
    if reading.warning:
        extra["meter_warning"] = reading.warning
    extra.update({f"meter_{k}": v for k, v in reading.extra.items()})
    return Measurement(
        j_per_query=reading.energy_j / queries if queries else math.inf,
        p50_ms=per_query[0],
        p90_ms=per_query[1],
        p99_ms=per_query[2],
        qps=queries / duration if duration > 0 else 0.0,
        avg_w=reading.avg_w,
        energy_j=reading.energy_j,
        queries=queries,
        duration_s=duration,
        meter=reading.meter,
        rails=list(reading.rails),
        valid=not reasons,
        reason="; ".join(reasons),
        extra=extra,
        tokens=metrics,
    )


def _query_percentiles(summary: LoadGenSummary) -> tuple[float, float, float] | None:
    """LoadGen's per-query p50/p90/p99 (ms) in Server and SingleStream, where it times queries from their issue."""
    if summary.scenario.replace(" ", "").lower() not in ("server", "singlestream"):
        return None
    keys = [f"{pct} percentile latency" for pct in PERCENTILES.values()]
    if not all(k in summary.latencies_ns for k in keys):
        return None
    p50, p90, p99 = (summary.latencies_ns[k] / 1e6 for k in keys)
    return p50, p90, p99
