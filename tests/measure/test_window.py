"""The LoadGen window, run for real against a runner that sleeps like a small model."""

from __future__ import annotations

import sys
import time

import numpy as np
import pytest

from tuner.errors import UserError
from tuner.measure.loadgen_run import run_window
from tuner.measure.logparse import parse_logs
from tuner.measure.meters import EnergyReading
from tuner.measure.settings import WindowSettings
from tuner.measure.stopping import StopRule, TailProof, relative_half_width, within_needed


class SleepyRunner:
    """Takes ``delay_s`` per batch and remembers when each call happened."""

    def __init__(self, delay_s: float = 0.002, fail_after: int | None = None) -> None:
        self.delay_s = delay_s
        self.calls: list[float] = []
        self.fail_after = fail_after

    def infer(self, size: int | None = None) -> int:
        self.calls.append(time.monotonic())
        if self.fail_after is not None and len(self.calls) > self.fail_after:
            raise RuntimeError("out of memory")
        time.sleep(self.delay_s)
        return size or 1


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


@pytest.mark.loadgen
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


class TwoEngineRunner(SleepyRunner):
    """A GPU lane at the study's batch size and a slower DLA lane at its own, as the TensorRT runner lists them."""

    def __init__(self) -> None:
        super().__init__()
        self.taken: dict[str, int] = {"gpu": 0, "dla0": 0}

    def lanes(self):
        def run(name: str, delay_s: float, batch: int):
            def infer(size: int | None = None) -> int:
                self.taken[name] += 1
                time.sleep(delay_s)
                return batch if size is None else size

            return infer

        return [("gpu", 4, run("gpu", 0.002, 4)), ("dla0", 2, run("dla0", 0.004, 2))]


@pytest.mark.loadgen
def test_offline_window_feeds_every_engine_from_one_queue(tmp_path):
    runner = TwoEngineRunner()
    settings = WindowSettings(window_s=0.5, warmup_s=0.05)
    result = run_window(runner, 4, settings, tmp_path / "logs", meter=RecordingMeter())

    assert result.error == ""
    # both engines ran batches of their own size from the shared queue, and every sample counts once
    assert result.lane_queries["gpu"] > 0 and result.lane_queries["dla0"] > 0
    assert result.lane_queries["gpu"] % 4 == 0 or result.lane_queries["dla0"] % 2 == 0
    assert sum(result.lane_queries.values()) == result.queries
    assert result.batches == len(result.batch_latencies_ms)


class SpeedsUpRunner(SleepyRunner):
    """Slow while warming up, five times faster afterwards (as after autotuning)."""

    def infer(self, size: int | None = None) -> int:
        self.calls.append(time.monotonic())
        time.sleep(0.01 if len(self.calls) <= 4 else 0.002)
        return size or 1


@pytest.mark.loadgen
def test_offline_window_is_rerun_when_the_warmup_undersized_it(tmp_path):
    settings = WindowSettings(window_s=0.5, warmup_s=0.0)
    result = run_window(SpeedsUpRunner(), 2, settings, tmp_path)
    assert result.attempts == 2
    assert result.summary.valid, result.summary.invalid_reasons
    assert result.duration_s >= 0.5


class SizeRecordingRunner(SleepyRunner):
    """Records the batch size each call was asked for and runs it as a runtime with a graph ladder would."""

    def __init__(self, ladder: tuple[int, ...] = ()) -> None:
        super().__init__(delay_s=0.001)
        self.ladder = ladder
        self.asked: list[int | None] = []

    def infer(self, size: int | None = None) -> int:
        self.asked.append(size)
        super().infer(size)
        if size is None:
            return 8
        return min((b for b in self.ladder if b >= size), default=size)


@pytest.mark.loadgen
@pytest.mark.parametrize("ladder", [(), (1, 2, 4, 8)])
def test_server_batches_run_the_samples_that_arrived_and_latency_is_per_query(tmp_path, ladder):
    runner = SizeRecordingRunner(ladder)
    settings = WindowSettings(window_s=0.5, warmup_s=0.0, scenario="server", options={"server_target_qps": 400.0})
    result = run_window(runner, 8, settings, tmp_path)
    records = result.batch_records
    assert result.summary.valid, result.summary.invalid_reasons
    measured = runner.asked[-len(records) :]
    # every batch asked the runner for exactly the samples it held (no padding to the maximum)
    assert measured == [r.size for r in records] and all(1 <= r.size <= 8 for r in records)
    assert [r.executed for r in records] == [min((b for b in ladder if b >= r.size), default=r.size) for r in records]
    assert sum(r.size for r in records) == result.queries
    sizes = result.batch_sizes()
    assert sum(k * v for k, v in sizes["arrived"].items()) == result.queries
    assert (result.padding == 0.0) == all(r.executed == r.size for r in records)
    # one latency per query, from its own arrival, never shorter than its batch's run
    assert len(result.query_latencies_ms) == len(result.arrivals) == result.queries
    ends = [r.done for r in records for _ in range(r.size)]
    assert result.query_latencies_ms == pytest.approx(
        [(d - a) * 1e3 for d, a in zip(ends, result.arrivals, strict=True)]
    )
    assert all(r.first_arrival <= r.start < r.done for r in records)
    # LoadGen times each query from before it reaches the SUT to after the SUT completes it
    own = np.percentile(result.query_latencies_ms, [50, 90, 99])
    loadgen = [result.summary.latencies_ns[f"{q:.2f} percentile latency"] / 1e6 for q in (50, 90, 99)]
    assert all(o <= lg for o, lg in zip(own, loadgen, strict=True))


class SlowStartMeter(RecordingMeter):
    """Starts only once its counter has moved, as the NVML energy meter waits for an update edge."""

    def start(self) -> None:
        time.sleep(0.15)
        super().start()


@pytest.mark.loadgen
def test_server_starts_the_meter_before_the_first_query_arrives(tmp_path):
    meter = SlowStartMeter()
    settings = WindowSettings(window_s=0.5, warmup_s=0.0, scenario="server", options={"server_target_qps": 400.0})
    result = run_window(SleepyRunner(0.001), 8, settings, tmp_path, meter=meter)
    # no query waits for the meter: it was running before LoadGen issued the first one
    assert meter.started <= result.start_monotonic < min(result.arrivals)
    assert result.energy is not None and result.energy.duration_s >= result.duration_s


@pytest.mark.loadgen
def test_padded_server_batches_run_the_maximum(tmp_path):
    runner = SizeRecordingRunner()
    settings = WindowSettings(
        window_s=0.5, warmup_s=0.0, scenario="server",
        options={"server_target_qps": 400.0, "pad_batches": True},
    )  # fmt: skip
    result = run_window(runner, 8, settings, tmp_path)
    assert {r.executed for r in result.batch_records} == {8}
    assert result.padding == pytest.approx(1 - result.queries / (8 * len(result.batch_records)))


@pytest.mark.loadgen
def test_singlestream_window_runs(tmp_path):
    settings = WindowSettings(window_s=0.5, warmup_s=0.05, scenario="singlestream")
    result = run_window(SleepyRunner(), 1, settings, tmp_path)
    assert result.summary.scenario == "SingleStream"
    assert result.queries == result.batches > 0


@pytest.mark.loadgen
def test_runner_error_ends_the_window_and_is_reported(tmp_path):
    settings = WindowSettings(window_s=0.3, warmup_s=0.0)
    result = run_window(SleepyRunner(fail_after=5), 2, settings, tmp_path)
    assert "out of memory" in result.error
    assert result.queries > 0


def test_missing_loadgen_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "mlperf_loadgen", None)
    with pytest.raises(UserError, match=r"powertune\[loadgen\]"):
        run_window(SleepyRunner(), 1, WindowSettings(window_s=0.1), tmp_path)


@pytest.mark.loadgen
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


class SteadyMeter(RecordingMeter):
    """A 10 W meter that can be read mid-window, as the NVML counter and RAPL can."""

    def energy_now(self):
        now = time.monotonic()
        return now, 10.0 * (now - self.started)


@pytest.mark.loadgen
def test_adaptive_window_stops_once_the_interval_is_narrow(tmp_path):
    settings = WindowSettings(window_s=8.0, min_window_s=0.5, ci=0.5, min_queries=50, warmup_s=0.05)
    meter = SteadyMeter()
    result = run_window(SleepyRunner(), 4, settings, tmp_path, meter=meter)
    assert result.stop["stop_rule"] == "ci"
    assert result.stop["ci_achieved"] <= 0.5 and result.stop["ci_blocks"] >= 8
    assert result.queries >= 50 and result.summary.valid, result.summary.invalid_reasons
    assert 0.5 <= result.duration_s < 8.0
    # The meter brackets exactly the measured batches; the samples LoadGen still held were not run.
    assert meter.started <= result.start_monotonic < result.end_monotonic <= meter.stopped
    assert result.stop["skipped_queries"] > 0
    assert result.batches == -(-result.queries // 4)


@pytest.mark.loadgen
def test_an_adaptive_window_whose_tail_is_known_within_the_bound_needs_fewer_queries(tmp_path):
    # One query a batch: the tail is known within 30 s once 299 batches met it, long before 100,000 queries.
    # The bound is far above a 2 ms batch, so no stall of a loaded machine puts a batch past it.
    settings = WindowSettings(
        window_s=60.0, min_window_s=0.2, ci=0.5, min_queries=100_000, warmup_s=0.05, bound_ms=30_000.0
    )
    result = run_window(SleepyRunner(), 1, settings, tmp_path, meter=SteadyMeter())
    assert result.stop["stop_rule"] == "ci"
    assert within_needed(0.99) <= result.queries < 100_000 and result.stop["tail_over_queries"] == 0


@pytest.mark.loadgen
def test_a_window_of_two_engines_does_not_count_their_batches_as_alike(tmp_path):
    # Beside a DLA the engines run batches of their own size and speed: no run of batches puts the queries'
    # percentile within the bound, so the window waits for its query count (or its end), as without a bound.
    settings = WindowSettings(
        window_s=5.0, min_window_s=0.2, ci=0.5, min_queries=100_000, warmup_s=0.05, bound_ms=500.0
    )
    result = run_window(TwoEngineRunner(), 4, settings, tmp_path, meter=SteadyMeter())
    assert result.lane_queries["gpu"] > 0 and result.lane_queries["dla0"] > 0
    assert result.stop["tail_over_queries"] == 0
    assert result.stop["stop_rule"] in ("max-duration", "queries-exhausted")


@pytest.mark.loadgen
def test_fixed_window_ends_at_its_duration_and_records_the_interval(tmp_path):
    settings = WindowSettings(window_s=0.6, warmup_s=0.05)
    result = run_window(SleepyRunner(), 2, settings, tmp_path, meter=SteadyMeter())
    assert result.stop["stop_rule"] in ("max-duration", "queries-exhausted")
    assert result.stop["ci_target"] is None and result.stop["min_window_s"] == 0.6
    assert result.duration_s >= 0.6


@pytest.mark.loadgen
def test_a_meter_that_cannot_be_read_mid_window_runs_to_the_maximum(tmp_path):
    settings = WindowSettings(window_s=0.8, min_window_s=0.2, ci=0.5, warmup_s=0.05, min_queries=1)
    result = run_window(SleepyRunner(), 2, settings, tmp_path, meter=RecordingMeter())
    assert result.stop["stop_rule"] in ("max-duration", "queries-exhausted")
    assert result.stop["ci_achieved"] is None and result.duration_s >= 0.8


def test_window_settings_refuse_bounds_that_cannot_hold():
    with pytest.raises(ValueError, match="min_window_s"):
        WindowSettings(window_s=2.0, min_window_s=3.0)
    with pytest.raises(ValueError, match="ci"):
        WindowSettings(ci=1.5)
    assert WindowSettings(window_s=2.0, min_window_s=2.0).adaptive is False


def _rule(**kw):
    clock = {"energy": None}
    rule = StopRule(
        min_s=kw.get("min_s", 2.0),
        max_s=kw.get("max_s", 10.0),
        ci=kw.get("ci", 0.01),
        min_queries=kw.get("min_queries", 100),
        adaptive=kw.get("adaptive", True),
        energy_now=lambda: clock["energy"],
    )
    return rule, clock


def test_stop_rule_waits_for_min_duration_and_min_queries_then_stops_on_the_interval():
    """Synthetic time: one batch of 10 queries every 10 ms at exactly 1 J per query."""
    rule, clock = _rule(min_queries=3000)
    rule.begin(0.0)
    reasons = []
    for i in range(1, 1001):
        now = i * 0.01
        clock["energy"] = (now - 0.005, 10.0 * (i - 0.5))
        reasons.append((now, rule.observe(now, 10 * i)))
    first = next((t, r) for t, r in reasons if r is not None)
    # 3000 queries take 3 s: the interval is exact long before, the query count decides.
    assert first[1] == "ci" and 3.0 <= first[0] <= 3.0 + rule.check_period_s + 0.02
    assert rule.achieved < 0.01


def test_stop_rule_waits_for_fewer_queries_once_the_tail_is_known_within_the_bound():
    rule, clock = _rule(min_queries=3000)
    rule.begin(0.0)
    first = None
    for i in range(1, 1001):
        now = i * 0.01
        clock["energy"] = (now - 0.005, 10.0 * (i - 0.5))
        if rule.observe(now, 10 * i, tail_within=True) is not None:
            first = now
            break
    # The interval is exact: the window ends at its 2 s minimum, not at 3000 queries (3 s).
    assert first is not None and 2.0 <= first <= 2.0 + rule.check_period_s + 0.02


def test_the_tail_is_known_within_the_bound_after_enough_batches_none_past_it():
    assert within_needed(0.99) == 299 and within_needed(0.9) == 29 and within_needed(0.5) == 5
    proof = TailProof(0.01, 0.99, 0, alike=True)
    for _ in range(298):
        proof.add([0.005])
    assert not proof.within()
    proof.add([0.005])
    assert proof.within() and not proof.proven()
    proof.add([0.02])  # one batch past the bound: the count rule (min_queries) decides again
    assert not proof.within()
    # Server queries are not alike batches: never known within this way.
    server = TailProof(0.01, 0.99, 0, alike=False)
    for _ in range(1000):
        server.add([0.005])
    assert not server.within()


def _noisy(rule, clock, spread: float) -> tuple[str, float]:
    """Synthetic time: 10 queries every 10 ms whose energy varies uniformly by +-``spread`` around 10 J."""
    import random

    rng = random.Random(0)
    rule.begin(0.0)
    energy, reason, now, i = 0.0, None, 0.0, 0
    while reason is None:
        i += 1
        now = i * 0.01
        energy += 10.0 * rng.uniform(1.0 - spread, 1.0 + spread)
        clock["energy"] = (now, energy)
        reason = rule.observe(now, 10 * i)
    return reason, now


def test_stop_rule_runs_to_the_maximum_when_energy_is_noisy():
    rule, clock = _rule(max_s=3.0, min_queries=1, ci=0.05)
    reason, now = _noisy(rule, clock, 0.8)
    assert reason == "max-duration" and now == pytest.approx(3.0, abs=0.011)
    assert rule.achieved > 0.05


def test_stop_rule_ends_at_its_minimum_when_the_longest_window_could_not_reach_the_interval():
    # About 6% after 2 s, so about 3% after 10 s: three times the 1% asked. Running on would not get there.
    rule, clock = _rule(max_s=10.0, min_queries=1)
    reason, now = _noisy(rule, clock, 0.8)
    assert reason == "ci-out-of-reach" and 2.0 <= now <= 2.0 + rule.check_period_s + 0.011
    assert rule.achieved * (now / 10.0) ** 0.5 > 2 * 0.01
    # Within reach (about 1.5% after 2 s): the window runs past its minimum until it gets to 1%.
    rule, clock = _rule(max_s=10.0, min_queries=1)
    reason, now = _noisy(rule, clock, 0.15)
    assert reason == "ci" and now > 2.0 + rule.check_period_s


def test_relative_half_width_of_a_ratio():
    assert relative_half_width([1.0, 1.0, 1.0], [1.0, 1.0, 1.0]) == 0.0
    assert relative_half_width([1.0], [1.0]) == float("inf")
    wide = relative_half_width([1.0, 3.0, 1.0, 3.0], [1.0, 1.0, 1.0, 1.0])
    assert 0.5 < wide < 2.0
