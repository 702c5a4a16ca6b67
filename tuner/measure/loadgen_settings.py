"""LoadGen's TestSettings for one window, and the Server tail cut's hold sized to them."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from tuner.measure.stopping import QUANTILES, TailProof, over_needed

if TYPE_CHECKING:
    from tuner.measure.settings import WindowSettings

# LoadGen issues 1.1 x expected_qps x min_duration samples in Offline; the
# extra margin covers a SUT faster than the warm-up loop, which would otherwise
# end the run before min_duration and make it INVALID. Launch-bound runs vary
# by tens of percent between the warm-up and the window, hence 20%.
QPS_MARGIN = 1.2
# Offline hands every sample over at once, and each one costs the SUT and LoadGen microseconds to issue
# and, if not run, to complete, so an adaptive window issues for 6 s at most; one that runs out first
# ends with the interval it reached (queries-exhausted).
OFFLINE_ISSUE_S = 6.0
# LoadGen's early-stopping rule declares a Server run INVALID below about 460
# queries even when every one met the latency target (p99 at 99% confidence).
SERVER_MIN_QUERIES = 500
# The same rule for SingleStream's p90 needs about 64 queries.
SINGLESTREAM_MIN_QUERIES = 64
SINGLESTREAM_MARGIN = 1.5
# A Server window cut for its tail stops running the model and holds the queries
# that still arrive, uncompleted, until LoadGen has this many seconds' worth
# outstanding beyond the cut's own count: then LoadGen ends the test early
# (server_max_async_queries) instead of issuing its whole schedule, and the held
# queries complete at once. A healthy window never comes near that many.
HOLD_S = 0.5


def loadgen_test_settings(
    lg: Any,
    scenario: str,
    settings: WindowSettings,
    qps: float,
    batch_latency_s: float,
    hold_queries: int = 0,
) -> Any:
    """LoadGen's settings for one window.

    An adaptive Offline window asks LoadGen for ``min_window_s`` and its
    minimum query count, but issues enough samples to keep the runner busy for
    up to :data:`OFFLINE_ISSUE_S` (or ``window_s``, if shorter): the worker
    ends the window once the interval is narrow enough, and the samples left
    over complete without being run.
    """
    ts = lg.TestSettings()
    ts.mode = lg.TestMode.PerformanceOnly
    window_s = settings.window_s
    options = settings.options
    if scenario == "offline":
        ts.scenario = lg.TestScenario.Offline
        if settings.adaptive:
            assert settings.min_window_s is not None
            ts.min_duration_ms = int(settings.min_window_s * 1000)
            horizon_s = min(window_s, max(settings.min_window_s, OFFLINE_ISSUE_S))
            ts.offline_expected_qps = qps * QPS_MARGIN * horizon_s / settings.min_window_s
            ts.min_query_count = max(1, settings.min_queries)
        else:
            ts.min_duration_ms = int(window_s * 1000)
            ts.offline_expected_qps = qps * QPS_MARGIN
            ts.min_query_count = max(1, math.ceil(qps * QPS_MARGIN * window_s))
        return ts
    ts.min_duration_ms = int(window_s * 1000)
    if scenario == "server":
        target = float(options.get("server_target_qps", 0.5 * qps))
        ts.scenario = lg.TestScenario.Server
        ts.server_target_qps = target
        ts.server_target_latency_ns = int(float(options.get("server_target_latency_ms", 1000.0)) * 1e6)
        ts.min_query_count = max(SERVER_MIN_QUERIES, math.ceil(target * window_s))
        if hold_queries > 0:
            ts.server_max_async_queries = hold_queries
    else:
        ts.scenario = lg.TestScenario.SingleStream
        # LoadGen pre-generates window / expected-latency queries: a latency on the
        # low side keeps a runner faster than its warm-up from running out of them.
        expected_s = batch_latency_s / SINGLESTREAM_MARGIN
        ts.single_stream_expected_latency_ns = max(1, int(expected_s * 1e9))
        ts.min_query_count = max(SINGLESTREAM_MIN_QUERIES, math.ceil(window_s / max(expected_s, 1e-6)))
    return ts


def tail_rule(scenario: str, settings: WindowSettings, engines: int = 1) -> tuple[TailProof | None, int, float]:
    """The window's tail cut (none without a bound), the Server hold's query count and its longest wait.

    Offline learns its most queries from the samples LoadGen issues; a Server
    window holds at most its schedule, ``target x window`` plus six standard
    deviations of the Poisson count. Offline batches are alike only on one
    engine: beside the DLAs each engine runs batches of its own size and
    speed, so a share or a run of batches says nothing of the queries'.
    """
    if settings.bound_ms is None or scenario == "singlestream":
        return None, 0, 0.0
    quantile = QUANTILES.get(settings.percentile, 0.99)
    tail = TailProof(settings.bound_ms / 1000.0, quantile, 0, alike=scenario == "offline" and engines == 1)
    if scenario == "offline":
        return tail, 0, 0.0
    target = float(settings.options.get("server_target_qps", 0.0))
    if target <= 0:
        return None, 0, 0.0
    expected = target * settings.window_s
    tail.total = max(SERVER_MIN_QUERIES, math.ceil(expected + 6 * math.sqrt(expected))) + 1
    hold = 2 * over_needed(tail.total, quantile) + math.ceil(target * (HOLD_S + tail.bound_s)) + 64
    return tail, hold, 1.5 * hold / target + HOLD_S
