"""Windows that end once their verdict is known: a tail proven over the bound, an overloaded queue, a costlier figure.

Real LoadGen windows against sleeping runners; every assertion is on counts
and verdicts, never on how long something took.
"""

from __future__ import annotations

import pytest
from test_window import RecordingMeter, SleepyRunner, SteadyMeter

from tuner.measure.loadgen_run import run_window
from tuner.measure.session import build_measurement
from tuner.measure.settings import WindowSettings
from tuner.measure.stopping import STOP_COSTLIER, STOP_TAIL, TailProof, costs_more, over_needed

pytestmark = pytest.mark.slow


def test_offline_tail_cut(tmp_path):
    # every batch takes 20 ms against a 5 ms bound: the p99 is over whatever the rest of the window does
    settings = WindowSettings(window_s=5.0, min_window_s=1.0, warmup_s=0.05, bound_ms=5.0)
    result = run_window(SleepyRunner(0.02), 4, settings, tmp_path, meter=RecordingMeter())
    assert result.stop["stop_rule"] == STOP_TAIL
    assert result.attempts == 1  # LoadGen calls a cut window too short; it is not run again
    # at most five batches, every one past the bound: the share of batches proves it by the fifth, the count
    # against the samples LoadGen issued may do so sooner (every query measured is over)
    assert result.batches <= 5 and result.queries == result.stop["tail_over_queries"] == 4 * result.batches
    assert result.stop["skipped_queries"] > 0
    m = build_measurement(result, RecordingMeter())
    assert m.valid and m.extra["cut"] == STOP_TAIL and m.p99_ms > 5.0


def test_offline_window_within_the_bound_is_not_cut(tmp_path):
    settings = WindowSettings(window_s=0.6, warmup_s=0.05, bound_ms=500.0)
    result = run_window(SleepyRunner(0.002), 4, settings, tmp_path, meter=RecordingMeter())
    assert result.stop["stop_rule"] in ("max-duration", "queries-exhausted")
    assert result.stop["tail_over_queries"] == 0


def test_an_overloaded_server_window_is_cut_and_loadgen_ends_early(tmp_path):
    # capacity 1 query per 10 ms (100 q/s) against 1000 q/s arrivals for a 20 s schedule
    settings = WindowSettings(
        window_s=20.0, warmup_s=0.0, scenario="server", bound_ms=20.0, options={"server_target_qps": 1000.0}
    )
    result = run_window(SleepyRunner(0.01), 1, settings, tmp_path, meter=RecordingMeter())
    assert result.stop["stop_rule"] == STOP_TAIL
    # LoadGen stopped issuing once the held queries reached its outstanding limit: far fewer than its schedule
    assert result.summary.query_count is None or result.summary.query_count < 20_000
    assert result.stop["skipped_queries"] > 0
    m = build_measurement(result, RecordingMeter())
    assert m.valid and m.extra["cut"] == STOP_TAIL and m.p99_ms > 20.0


def test_the_costlier_cut_needs_the_whole_interval_above_the_best(tmp_path):
    settings = WindowSettings(window_s=3.0, min_window_s=2.9, ci=0.01, warmup_s=0.05, cut_j_per_query=1e-6)
    result = run_window(SleepyRunner(0.002), 4, settings, tmp_path, meter=SteadyMeter())
    assert result.stop["stop_rule"] == STOP_COSTLIER and result.attempts == 1
    assert result.duration_s < 2.9


def test_tail_proof_counts():
    assert over_needed(100, 0.99) == 2 and over_needed(150, 0.99) == 3 and over_needed(0, 0.99) == 1
    proof = TailProof(0.01, 0.99, 1000)
    proof.add([0.02] * 5 + [0.001] * 100)
    assert proof.over == 5 and not proof.proven()
    assert proof.proven(waiting_over=proof.needed - 5)
    assert costs_more(1.2, 0.1, 1.0) and not costs_more(1.05, 0.1, 1.0) and not costs_more(2.0, float("inf"), 1.0)
    assert not costs_more(2.0, 0.01, None)


def test_a_window_above_the_best_ends_once_it_cannot_be_cheaper_by_more_than_the_resolution():
    # 0.5% above the best with a 1.2% interval: it might still be 0.7% cheaper, more than a 1% study could not tell
    assert not costs_more(1.005, 0.012, 1.0) and costs_more(1.005, 0.012, 1.0, resolution=0.01)
    assert not costs_more(1.005, 0.02, 1.0, resolution=0.01)  # it might be 1.5% cheaper: measure on
    # a window at or below the best never ends as costlier, whatever its interval: it would hold a value below the best
    assert not costs_more(1.0, 0.0, 1.0, resolution=0.01) and not costs_more(0.999, 0.001, 1.0, resolution=0.5)
