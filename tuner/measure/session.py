"""A measured window turned into the project's :class:`Measurement`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from tuner.errors import UserError
from tuner.measure.lanes import Runner
from tuner.measure.loadgen_run import run_window
from tuner.measure.meters import Meter, MeterLost, Monitor
from tuner.measure.results import WindowResult
from tuner.measure.settings import WindowSettings
from tuner.measure.stopping import CUT_REASONS
from tuner.measure.token_results import build_token_measurement
from tuner.measure.tokens import run_token_window
from tuner.measurement import Measurement, batch_size_extras
from tuner.plumbing import atomicfile

PERCENTILES = ("p50", "p90", "p99")


def measure_with(
    runner: Runner,
    meter: Meter,
    batch_size: int,
    settings: WindowSettings,
    percentile: str | None = None,
    monitors: list[Monitor] | tuple[Monitor, ...] = (),
    log_dir: str | Path | None = None,
    warm_qps: float | None = None,
) -> Measurement:
    """Run one LoadGen window metered by ``meter`` and build its Measurement.

    Energy per query is the meter's energy over exactly the LoadGen test
    divided by the queries completed in it. The measurement is marked
    invalid, with the reason, when LoadGen calls the run INVALID, when the
    window is shorter than the meter can resolve, when the runner failed, or
    when nothing completed; a device adds throttling on top from the
    ``monitors`` it passed in, which hold what they sampled after the window.
    ``warm_qps`` skips the warm-up (see :func:`run_window`). A runner that
    generates tokens (runners.base.TokenRunner) runs a token window instead
    (tuner.measure.tokens), ``batch_size`` being its most concurrent sequences.
    """
    percentile = percentile or settings.percentile
    if percentile not in PERCENTILES:
        raise UserError(f"unknown latency percentile {percentile!r}: choose one of {', '.join(PERCENTILES)}")
    folder = log_dir or settings.log_dir or atomicfile.kept_private_folder("powertune-loadgen-")
    if getattr(runner, "generates_tokens", False):
        try:
            tokens = run_token_window(runner, batch_size, settings, folder, meter=meter, monitors=monitors)
        except MeterLost as exc:
            return lost_measurement(meter, str(exc))
        return build_token_measurement(tokens, meter)
    try:
        window = run_window(runner, batch_size, settings, folder, meter=meter, monitors=monitors, warm_qps=warm_qps)
    except MeterLost as exc:
        return lost_measurement(meter, str(exc))
    return build_measurement(window, meter, percentile)


LOST = "no energy for this window: "


def meter_lost(measurement: Measurement) -> str | None:
    """Why the window got no energy at all from its meter (see :func:`lost_measurement`); None if it did."""
    reason = measurement.reason or ""
    return reason.removeprefix(LOST) if not measurement.valid and reason.startswith(LOST) else None


def lost_measurement(meter: Meter, why: str) -> Measurement:
    """A window whose meter failed or went away: invalid, with no energy or rate at all (never a partial figure)."""
    nan = float("nan")
    return Measurement(
        j_per_query=nan,
        p50_ms=nan,
        p90_ms=nan,
        p99_ms=nan,
        qps=nan,
        avg_w=nan,
        energy_j=nan,
        queries=0,
        duration_s=nan,
        meter=meter.name,
        rails=list(meter.rails),
        valid=False,
        reason=f"{LOST}{why}",
    )


def build_measurement(window: WindowResult, meter: Meter, percentile: str = "p99") -> Measurement:
    """Combine a window's latencies, queries and energy; say why if it is not to be trusted.

    A window cut because its verdict was already known (``extra['cut']``) is
    INVALID to LoadGen and may be shorter than the meter resolves; its
    figures are kept as they are, since they settle the trial on their own.
    """
    reading = window.energy
    if reading is None:
        raise ValueError("the window was run without a meter")
    cut = str(window.stop.get("stop_rule", ""))
    cut = cut if cut in CUT_REASONS else ""
    reasons: list[str] = []
    if window.error:
        reasons.append(f"runner error: {window.error}")
    if window.queries <= 0:
        reasons.append("no query completed in the window")
    if not window.summary.valid and not cut:
        why = "; ".join(window.summary.invalid_reasons) or "no reason given"
        reasons.append(f"LoadGen result INVALID ({why})")
    if reading.duration_s < meter.min_window_s and not cut:
        reasons.append(
            f"window {reading.duration_s:.2f} s is shorter than meter {meter.name} needs "
            f"({meter.min_window_s:.2f} s): lengthen --window"
        )
    lat = np.asarray([*window.query_latencies_ms, *window.waiting_ms] or [float("nan")], dtype=float)
    p50, p90, p99 = (float(np.percentile(lat, q)) for q in (50, 90, 99))
    own = {"sut_p50_ms": p50, "sut_p90_ms": p90, "sut_p99_ms": p99}
    # A cut Server window's queries held after the cut carry LoadGen's latencies of the hold, not the
    # configuration's: the window's own view at the cut (completed and still queued queries) stands.
    per_query = None if cut else query_percentiles_ms(window)
    if per_query is not None:
        p50, p90, p99 = per_query
    queries = max(window.queries, 0)
    extra: dict[str, float | str] = {
        "batches": float(window.batches),
        "warmup_qps": window.warmup_qps,
        "window_start_unix": window.start_wall,
        "window_end_unix": window.end_wall,
        "loadgen_log_dir": str(window.log_dir),
        "loadgen_scenario": window.summary.scenario,
        "loadgen_attempts": float(window.attempts),
        "meter_samples": float(reading.samples),
        "percentile": percentile,
        **own,
        "latency_clock": "loadgen" if per_query is not None else "sut-monotonic",
        **batch_size_counts(window),
    }
    # Samples skipped after the window ended complete instantly and would inflate LoadGen's rate.
    if window.summary.samples_per_second is not None and not window.stop.get("skipped_queries"):
        extra["loadgen_samples_per_s"] = window.summary.samples_per_second
    extra.update({key: value for key, value in window.stop.items() if value is not None})
    if cut:
        extra["cut"] = cut
    if len(window.lane_queries) > 1 and window.duration_s > 0:
        # Per-engine throughput when the GPU and the DLAs share the window's queue.
        extra.update({f"engine_{name}_qps": count / window.duration_s for name, count in window.lane_queries.items()})
    if reading.warning:
        extra["meter_warning"] = reading.warning
    extra.update({f"meter_{k}": v for k, v in reading.extra.items()})
    return Measurement(
        j_per_query=reading.energy_j / queries if queries else float("inf"),
        p50_ms=p50,
        p90_ms=p90,
        p99_ms=p99,
        qps=window.qps,
        avg_w=reading.avg_w,
        energy_j=reading.energy_j,
        queries=queries,
        duration_s=window.duration_s,
        meter=reading.meter,
        rails=list(reading.rails),
        valid=not reasons,
        reason="; ".join(reasons),
        extra=extra,
    )


def batch_size_counts(window: WindowResult) -> dict[str, str | float]:
    """The arrived and executed batch-size distributions and the padding, beside latency and energy."""
    sizes = window.batch_sizes()
    return batch_size_extras(sizes["arrived"], sizes["executed"])


def query_percentiles_ms(window: WindowResult) -> tuple[float, float, float] | None:
    """Server and SingleStream: LoadGen's own per-query p50, p90, p99 (issue to completion).

    In these scenarios queries arrive over time, so the latency a user sees is
    LoadGen's per-sample one, timed on LoadGen's clock from its scheduled issue
    to the SUT's completion call: each query's interval holds the SUT's own
    (arrival at the SUT to the end of its batch, on ``time.monotonic``), which
    the measurement keeps beside it as ``sut_p*_ms``. Offline keeps the SUT's
    per-query latencies (from each batch's issue).
    """
    if window.summary.scenario.replace(" ", "").lower() not in ("server", "singlestream"):
        return None
    found = window.summary.latencies_ns
    keys = [f"{q:.2f} percentile latency" for q in (50, 90, 99)]
    if not all(k in found for k in keys):
        return None
    p50, p90, p99 = (found[k] / 1e6 for k in keys)
    return p50, p90, p99


def mark_invalid(measurement: Measurement, reason: str, **update: Any) -> Measurement:
    """A copy marked untrustworthy, with ``reason`` appended to any earlier one."""
    joined = "; ".join(r for r in (measurement.reason, reason) if r)
    return measurement.model_copy(update={"valid": False, "reason": joined, **update})
