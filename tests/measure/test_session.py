"""From a window to a Measurement: energy per query, percentiles and every reason to distrust it."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tuner.errors import UserError
from tuner.measure.meters import EnergyReading, SampledPowerMeter
from tuner.measure.results import BatchRecord, LoadGenSummary, WindowResult
from tuner.measure.session import build_measurement, measure_with
from tuner.measure.settings import WindowSettings


class Meter:
    name = "test-meter"
    min_window_s = 1.0

    def __init__(self) -> None:
        self.rails = ["rail-a", "rail-b"]


def _window(duration=2.0, energy=100.0, queries=1000, valid=True, error="") -> WindowResult:
    reading = EnergyReading(energy, duration, energy / duration, "test-meter", ["rail-a", "rail-b"], 20)
    summary = LoadGenSummary(
        scenario="Offline",
        samples_per_second=queries / duration,
        valid=valid,
        invalid_reasons=[] if valid else ["Min duration satisfied: NO"],
    )
    return WindowResult(
        # Batches of different sizes: percentiles over batches would differ from those over queries.
        batch_latencies_ms=[1000.0] * 100,
        query_latencies_ms=[float(i) for i in range(1, 101)],
        queries=queries,
        batches=100,
        start_monotonic=10.0,
        end_monotonic=10.0 + duration,
        start_wall=1e9,
        end_wall=1e9 + duration,
        warmup_qps=500.0,
        summary=summary,
        log_dir=Path("/tmp/x"),
        energy=reading,
        error=error,
    )


def test_server_reports_loadgens_per_query_latency_beside_its_own_and_the_batch_sizes():
    window = _window()
    window.summary.scenario = "Server"
    window.summary.latencies_ns = {f"{q:.2f} percentile latency": q * 1.1e6 for q in (50, 90, 99)}
    window.batch_records = [BatchRecord(0.0, 0.001, 3, 4, 0.0), BatchRecord(0.1, 0.101, 4, 4, 0.1)]
    m = build_measurement(window, Meter())
    assert m.p99_ms == pytest.approx(108.9) and m.extra["sut_p99_ms"] == pytest.approx(99.01)
    assert m.extra["latency_clock"] == "loadgen"
    assert m.extra["batch_sizes_arrived"] == "3:1 4:1" and m.extra["batch_sizes_executed"] == "4:2"
    assert m.extra["padding"] == pytest.approx(1 / 8)


def test_energy_per_query_and_percentiles():
    m = build_measurement(_window(), Meter())
    assert m.valid and m.reason == ""
    assert m.j_per_query == pytest.approx(0.1)
    assert m.qps == pytest.approx(500.0)
    assert m.avg_w == pytest.approx(50.0)
    assert (m.p50_ms, m.p90_ms) == (pytest.approx(50.5), pytest.approx(90.1))
    assert m.p99_ms == pytest.approx(99.01)
    assert m.meter == "test-meter" and m.rails == ["rail-a", "rail-b"]


@pytest.mark.parametrize(
    ("window", "reason"),
    [
        (_window(valid=False), "LoadGen result INVALID"),
        (_window(duration=0.5), "shorter than meter test-meter"),
        (_window(error="RuntimeError: boom"), "runner error"),
        (_window(queries=0), "no query completed"),
    ],
)
def test_untrustworthy_windows_are_invalid_with_a_reason(window, reason):
    m = build_measurement(window, Meter())
    assert not m.valid
    assert reason in m.reason


class Sleepy:
    def infer(self, size: int | None = None) -> int:
        time.sleep(0.002)
        return size or 1


@pytest.mark.slow  # a LoadGen window on this CPU
def test_measure_with_runs_loadgen_and_meters_it(tmp_path):
    meter = SampledPowerMeter(lambda: 20.0, period_s=0.05, name="const", rails=["board"])
    settings = WindowSettings(window_s=1.0, warmup_s=0.05)
    m = measure_with(Sleepy(), meter, 2, settings, "p90", log_dir=tmp_path)
    assert m.valid, m.reason
    assert m.avg_w == pytest.approx(20.0)
    assert m.j_per_query == pytest.approx(m.energy_j / m.queries)
    assert m.extra["percentile"] == "p90"
    assert (tmp_path / "mlperf_log_detail.txt").is_file()


def test_unknown_percentile_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="percentile"):
        measure_with(Sleepy(), Meter(), 1, WindowSettings(), "p95", log_dir=tmp_path)
