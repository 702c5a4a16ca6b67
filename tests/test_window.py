"""The LoadGen window, run for real against a runner that sleeps like a small model."""

from __future__ import annotations

import sys
import time

import pytest

from tuner.devices.base import WindowSettings
from tuner.errors import UserError
from tuner.measure.meters import EnergyReading
from tuner.measure.window import parse_logs, run_window


class SleepyRunner:
    """Takes ``delay_s`` per batch and remembers when each call happened."""

    def __init__(self, delay_s: float = 0.002, fail_after: int | None = None) -> None:
        self.delay_s = delay_s
        self.calls: list[float] = []
        self.fail_after = fail_after

    def infer(self) -> None:
        self.calls.append(time.monotonic())
        if self.fail_after is not None and len(self.calls) > self.fail_after:
            raise RuntimeError("out of memory")
        time.sleep(self.delay_s)


class RecordingMeter:
    name = "recording"
    min_window_s = 0.0

    def __init__(self) -> None:
        self.rails = ["test-rail"]
        self.started = self.stopped = 0.0

    def start(self) -> None:
        self.started = time.monotonic()

    def stop(self) -> EnergyReading:
        self.stopped = time.monotonic()
        duration = self.stopped - self.started
        return EnergyReading(10.0 * duration, duration, 10.0, self.name, self.rails, 2)


def test_offline_window_batches_samples_and_keeps_logs(tmp_path):
    runner = SleepyRunner()
    meter = RecordingMeter()
    settings = WindowSettings(window_s=1.0, warmup_s=0.1)
    result = run_window(runner, 4, settings, tmp_path / "logs", meter=meter)

    assert result.error == ""
    assert result.queries > 0
    assert result.batches == len(result.batch_latencies_ms) == -(-result.queries // 4)
    assert all(lat >= runner.delay_s * 1e3 for lat in result.batch_latencies_ms)
    assert result.summary.scenario == "Offline"
    assert result.summary.valid, result.summary.invalid_reasons
    assert result.summary.samples_per_second and result.summary.samples_per_second > 0
    assert result.duration_s >= 1.0
    assert (tmp_path / "logs" / "mlperf_log_summary.txt").is_file()
    assert (tmp_path / "logs" / "mlperf_log_detail.txt").is_file()
    assert (
        not (tmp_path / "logs" / "mlperf_log_trace.json").exists()
        or (tmp_path / "logs" / "mlperf_log_trace.json").stat().st_size < 1000
    )
    # the meter brackets exactly the LoadGen test; warm-up runs before it
    assert meter.started <= result.start_monotonic < result.end_monotonic <= meter.stopped
    warmup_calls = [t for t in runner.calls if t < meter.started]
    assert len(warmup_calls) >= 3
    assert len(runner.calls) - len(warmup_calls) == result.batches
    assert result.energy is not None and result.energy.meter == "recording"


class SpeedsUpRunner(SleepyRunner):
    """Slow while warming up, five times faster afterwards (as after autotuning)."""

    def infer(self) -> None:
        self.calls.append(time.monotonic())
        time.sleep(0.01 if len(self.calls) <= 4 else 0.002)


def test_offline_window_is_rerun_when_the_warmup_undersized_it(tmp_path):
    settings = WindowSettings(window_s=0.5, warmup_s=0.0)
    result = run_window(SpeedsUpRunner(), 2, settings, tmp_path)
    assert result.attempts == 2
    assert result.summary.valid, result.summary.invalid_reasons
    assert result.duration_s >= 0.5


def test_singlestream_window_runs(tmp_path):
    settings = WindowSettings(window_s=0.5, warmup_s=0.05, scenario="singlestream")
    result = run_window(SleepyRunner(), 1, settings, tmp_path)
    assert result.summary.scenario == "SingleStream"
    assert result.queries == result.batches > 0


def test_runner_error_ends_the_window_and_is_reported(tmp_path):
    settings = WindowSettings(window_s=0.3, warmup_s=0.0)
    result = run_window(SleepyRunner(fail_after=5), 2, settings, tmp_path)
    assert "out of memory" in result.error
    assert result.queries > 0


def test_missing_loadgen_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "mlperf_loadgen", None)
    with pytest.raises(UserError, match=r"powertune\[loadgen\]"):
        run_window(SleepyRunner(), 1, WindowSettings(window_s=0.1), tmp_path)


def test_unknown_scenario_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="scenario"):
        run_window(SleepyRunner(), 1, WindowSettings(scenario="multistream-ish"), tmp_path)


def test_parse_logs_reads_an_invalid_summary(tmp_path):
    (tmp_path / "mlperf_log_summary.txt").write_text(
        "Scenario : Offline\nMode     : PerformanceOnly\nSamples per second: 1234.5\n"
        "Result is : INVALID\n  Min duration satisfied : NO\n  Min queries satisfied : Yes\n"
        "99.00 percentile latency (ns)   : 861005304\n"
    )
    summary = parse_logs(tmp_path)
    assert summary.samples_per_second == 1234.5
    assert not summary.valid
    assert summary.invalid_reasons == ["Min duration satisfied: NO"]
    assert summary.latencies_ns["99.00 percentile latency"] == 861005304
