"""An LLM window's LoadGen TestSettings and its tail cut: scenario, length, rate and the study's token bounds."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from tuner.errors import UserError
from tuner.measure.loadgen_settings import HOLD_S
from tuner.measure.stopping import QUANTILES
from tuner.measure.token_tail import TokenTail

if TYPE_CHECKING:
    from tuner.measure.settings import WindowSettings

# LoadGen's early stopping declares a Server run INVALID below about 460 queries at p99 (as for CNNs), and
# a SingleStream run below 64 at p90.
SERVER_MIN_QUERIES = 500
SINGLESTREAM_MIN_QUERIES = 64
SINGLESTREAM_MARGIN = 2.0
OFFLINE_MIN_QUERIES = 64
QPS_MARGIN = 1.2
# Queries a Server cut's hold counts beyond the most a window meeting its bounds has outstanding.
HOLD_SPARE = 64
# A hold waits at most this many times the time its count takes to arrive (a busy host issues late), then ends.
HOLD_WAIT = 3.0
# Bounds LoadGen is given where the study sets none: far beyond any window, so they never decide its verdict.
UNBOUNDED_NS = 3600 * 10**9


def token_test_settings(
    lg: Any, scenario: str, settings: WindowSettings, qps: float, per_query_s: float, bound_ms: float | None
) -> Any:
    """LoadGen's TestSettings for one token window: its scenario, length, rate and the study's bounds."""
    ts = lg.TestSettings()
    ts.mode = lg.TestMode.PerformanceOnly
    ts.use_token_latencies = True
    ts.ttft_latency = _ns(settings.max_ttft_ms)
    ts.tpot_latency = _ns(settings.max_tpot_ms)
    window_s = settings.window_s
    ts.min_duration_ms = int(window_s * 1000)
    if settings.seed is not None:
        ts.schedule_rng_seed = ts.sample_index_rng_seed = ts.qsl_rng_seed = settings.seed & 0xFFFFFFFF
    if scenario == "offline":
        ts.scenario = lg.TestScenario.Offline
        ts.offline_expected_qps = max(qps * QPS_MARGIN, OFFLINE_MIN_QUERIES / window_s)
        ts.min_query_count = OFFLINE_MIN_QUERIES
    elif scenario == "server":
        ts.scenario = lg.TestScenario.Server
        target = float(settings.options.get("server_target_qps", 0.0))
        if target <= 0:
            raise UserError("the server scenario needs an arrival rate: pass --target-qps, e.g. --target-qps 4")
        ts.server_target_qps = target
        ts.server_target_latency_ns = _ns(bound_ms)
        ts.min_query_count = max(SERVER_MIN_QUERIES, math.ceil(target * window_s))
    else:
        ts.scenario = lg.TestScenario.SingleStream
        # LoadGen issues window / expected latency queries: a latency on the low side keeps a query faster alone
        # than in the warm-up's full batch from running out of them.
        expected_s = max(per_query_s / SINGLESTREAM_MARGIN, 1e-6)
        ts.single_stream_expected_latency_ns = max(1, int(expected_s * 1e9))
        ts.min_query_count = max(SINGLESTREAM_MIN_QUERIES, math.ceil(window_s / expected_s))
    return ts


def _ns(ms: float | None) -> int:
    return UNBOUNDED_NS if ms is None or not math.isfinite(ms) else max(1, int(ms * 1e6))


def tail_rule(scenario: str, settings: WindowSettings, ts: Any, max_seqs: int, output_tokens: int) -> TokenTail | None:
    """The tail cut of a Server or SingleStream window with a token bound, sized on the most queries it can hold.

    Server: its schedule, ``target x window`` plus six standard deviations of
    the Poisson count, or LoadGen's minimum count; SingleStream: its minimum
    count or one and a half times what its window holds at the warm-up's pace.
    Offline hands every query over at once, so TTFT there is queueing by
    design and no cut applies. A Server cut holds arriving queries
    (tuner.measure.token_tail) where the bounds limit what a window meeting
    them has outstanding (:func:`_healthy_outstanding`).
    """
    if scenario == "offline" or (settings.max_ttft_ms is None and settings.max_tpot_ms is None):
        return None
    ttft_s, tpot_s = _token_bounds_s(settings)
    tail = TokenTail(ttft_s=ttft_s, tpot_s=tpot_s, quantile=QUANTILES.get(settings.percentile, 0.99), total=0)
    if scenario == "server":
        target = ts.server_target_qps
        expected = target * settings.window_s
        tail.total = max(ts.min_query_count, math.ceil(expected + 6 * math.sqrt(expected))) + 1
        healthy = _healthy_outstanding(tail.ttft_s, tail.tpot_s, target, settings.bound_ms, max_seqs, output_tokens)
        if healthy is not None:
            tail.hold_queries = math.ceil(healthy + 6 * math.sqrt(healthy)) + 2 * tail.needed + HOLD_SPARE
            tail.hold_max_s = HOLD_WAIT * tail.hold_queries / target + HOLD_S
            tail.schedule_queries, tail.schedule_s = int(ts.min_query_count), ts.min_duration_ms / 1000.0
    else:
        per_query = max(ts.single_stream_expected_latency_ns / 1e9, 1e-6)
        tail.total = max(ts.min_query_count, math.ceil(1.5 * settings.window_s / per_query))
    return tail


def server_warm_up(settings: WindowSettings, max_seqs: int, output_tokens: int) -> tuple[int, float | None]:
    """A Server warm-up's full round (queries at once) and the seconds a query meeting the bounds runs (None: no bound).

    A window meeting its bounds never runs more than it has outstanding
    (:func:`_healthy_outstanding`), so a larger round only costs time; a
    query meeting the token bounds, or the query bound, is done within them.
    """
    ttft_s, tpot_s = _token_bounds_s(settings)
    target = float(settings.options.get("server_target_qps", 0.0))
    healthy = _healthy_outstanding(ttft_s, tpot_s, target, settings.bound_ms, max_seqs, output_tokens)
    first_round = max_seqs if healthy is None else max(1, min(max_seqs, math.ceil(healthy)))
    return first_round, within_bounds_s(settings, output_tokens)


def within_bounds_s(settings: WindowSettings, output_tokens: float) -> float | None:
    """The seconds a query of ``output_tokens`` meeting the bounds runs at most (None: no bound says).

    TTFT plus a TPOT per later token where both are bounded, or the query
    bound, whichever is shorter.
    """
    ttft_s, tpot_s = _token_bounds_s(settings)
    within: list[float] = []
    if ttft_s is not None and tpot_s is not None:
        within.append(ttft_s + max(output_tokens - 1, 0) * tpot_s)
    if settings.bound_ms is not None and math.isfinite(settings.bound_ms):
        within.append(settings.bound_ms / 1000.0)
    return min(within) if within else None


def _token_bounds_s(settings: WindowSettings) -> tuple[float | None, float | None]:
    """The TTFT and TPOT bounds in seconds (None: not bounded)."""
    ttft, tpot = settings.max_ttft_ms, settings.max_tpot_ms
    return (None if ttft is None else ttft / 1000.0), (None if tpot is None else tpot / 1000.0)


def _healthy_outstanding(
    ttft_s: float | None, tpot_s: float | None, target: float, bound_ms: float | None, max_seqs: int, output_tokens: int
) -> float | None:
    """The most queries a Server window meeting its bounds has outstanding, on average (None: unbounded).

    At most ``max_seqs`` run; a query waiting to be admitted has no first
    token, so beyond the few the percentile allows, the queue holds what
    arrived within the TTFT bound. A query meeting both token bounds, or the
    query bound, is done within them, so what is outstanding arrived within
    that time.
    """
    most: list[float] = []
    if ttft_s is not None:
        most.append(max_seqs + target * ttft_s)
        if tpot_s is not None:
            most.append(target * (ttft_s + max(output_tokens - 1, 0) * tpot_s))
    if bound_ms is not None and math.isfinite(bound_ms):
        most.append(target * bound_ms / 1000.0)
    return min(most) if most else None
