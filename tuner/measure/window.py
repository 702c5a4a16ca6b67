"""One measured window: a short MLPerf LoadGen test driving a runner.

LoadGen decides when queries are issued and checks that the run was long
enough; the SUT here groups issued samples into batches, runs one
``runner.infer()`` per batch on a worker thread and records each batch's
completion latency, because LoadGen itself only reports per-sample latencies
measured from a single Offline issue time, which would say nothing about a
batch size's real latency.

TestSettings are set directly (no official 600 s config) so a trial costs
seconds. A warm-up of ``settings.warmup_s`` runs ``runner.infer()`` outside
LoadGen (caches, clocks, allocator, autotuning settle there) and estimates the
throughput that sizes the LoadGen run so it fills the window.
"""

from __future__ import annotations

import json
import math
import queue
import re
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from tuner import interrupts
from tuner.errors import UserError

if TYPE_CHECKING:
    from tuner.devices.base import WindowSettings
    from tuner.measure.meters import EnergyReading, Meter

SCENARIOS = ("offline", "server", "singlestream")
# LoadGen issues 1.1 x expected_qps x min_duration samples in Offline; the
# extra margin covers a SUT faster than the warm-up loop, which would otherwise
# end the run before min_duration and make it INVALID. Launch-bound runs vary
# by tens of percent between the warm-up and the window (seen on an H200 and
# on a 2-core CPU), hence 20%, and a re-run sized 60% over what LoadGen saw.
QPS_MARGIN = 1.2
RETRY_MARGIN = 1.6
MIN_WARMUP_ITERS = 3
QSL_SIZE = 1024
# LoadGen's early-stopping rule declares a Server run INVALID below about 460
# queries even when every one met the latency target (p99 at 99% confidence).
SERVER_MIN_QUERIES = 500
# The same rule for SingleStream's p90 needs about 64 queries.
SINGLESTREAM_MIN_QUERIES = 64
SINGLESTREAM_MARGIN = 1.5


class Runner(Protocol):
    """What a window needs from a runner (runners/base.py has the full protocol)."""

    def infer(self) -> Any: ...


class Monitor(Protocol):
    """Something sampled alongside the meter during the window (telemetry)."""

    def start(self) -> None: ...

    def stop(self) -> Any: ...


@dataclass
class LoadGenSummary:
    """What LoadGen concluded, from mlperf_log_summary.txt and mlperf_log_detail.txt."""

    scenario: str = ""
    samples_per_second: float | None = None
    valid: bool = False
    invalid_reasons: list[str] = field(default_factory=list)
    query_count: int | None = None
    errors: int = 0
    latencies_ns: dict[str, float] = field(default_factory=dict)
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass
class WindowResult:
    """One window: per-batch latencies, queries done, its exact bracket and LoadGen's verdict."""

    batch_latencies_ms: list[float]
    queries: int
    batches: int
    start_monotonic: float
    end_monotonic: float
    start_wall: float
    end_wall: float
    warmup_qps: float
    summary: LoadGenSummary
    log_dir: Path
    energy: EnergyReading | None = None
    monitors: list[Any] = field(default_factory=list)
    error: str = ""
    attempts: int = 1

    @property
    def duration_s(self) -> float:
        return self.end_monotonic - self.start_monotonic

    @property
    def qps(self) -> float:
        return self.queries / self.duration_s if self.duration_s > 0 else 0.0


def _loadgen() -> Any:
    try:
        import mlperf_loadgen
    except ImportError:
        raise UserError("install the loadgen extra: pip install 'powertune[loadgen]'") from None
    return mlperf_loadgen


def warm_up(runner: Runner, batch_size: int, warmup_s: float) -> float:
    """Run the runner back to back for ``warmup_s``; return its throughput in samples/s.

    The first iteration is left out of the estimate: it carries one-off costs
    (allocation, kernel selection) that would undersize the LoadGen run.
    Every iteration is a safe point for a recorded Ctrl-C or SIGTERM.
    """
    runner.infer()
    start = time.monotonic()
    deadline = start + max(warmup_s, 0.0)
    iters = 0
    while iters < MIN_WARMUP_ITERS - 1 or time.monotonic() < deadline:
        interrupts.check()
        runner.infer()
        iters += 1
    elapsed = time.monotonic() - start
    return batch_size * iters / elapsed if elapsed > 0 else float(batch_size) * 1e3


class _BatchingSUT:
    """Groups LoadGen samples into batches and runs them on one worker thread.

    Per-batch latency: in Offline LoadGen hands over every sample in one call,
    so counting from that call would measure queueing behind earlier batches,
    an artefact of the scenario; a batch's latency there runs from the moment
    the worker issues it to the runner (its samples are all present) to its
    completion. In Server and SingleStream samples arrive over time, so the
    latency runs from the arrival of the batch's earliest sample, including
    any wait for the runner, as a user's query would see it.
    """

    def __init__(self, lg: Any, runner: Runner, batch_size: int, scenario: str, timeout_s: float = 0.0) -> None:
        self.lg = lg
        self.runner = runner
        self.batch_size = batch_size
        self.offline = scenario == "offline"
        self.timeout_s = 0.0 if self.offline else max(timeout_s, 0.0)
        self.inbox: queue.Queue[list[tuple[Any, float]] | None] = queue.Queue()
        self.latencies_ms: list[float] = []
        self.completed = 0
        self.error = ""
        self.aborted = False
        self.outbox: queue.Queue[list[tuple[Any, float]] | None] = queue.Queue()
        self.thread = threading.Thread(target=self._work, name="powertune-sut", daemon=True)
        self.completer = threading.Thread(target=self._complete, name="powertune-complete", daemon=True)

    def abort(self) -> None:
        """Stop running the model: the samples still issued complete at once, so LoadGen can finish."""
        self.aborted = True

    def start(self) -> None:
        self.thread.start()
        self.completer.start()

    def join(self) -> None:
        """Stop the worker, then the completer once every finished batch has been reported."""
        self.inbox.put(None)
        self.thread.join()
        self.outbox.put(None)
        self.completer.join()

    def _complete(self) -> None:
        """Report finished batches to LoadGen off the worker thread.

        Building one response per sample and calling QuerySamplesComplete
        costs Python time per batch; done on the worker it would sit between
        two batches and idle the accelerator (about 4% of throughput at batch
        128 on an H200). Here it overlaps the next batch, whose synchronize
        releases the GIL.
        """
        while True:
            batch = self.outbox.get()
            if batch is None:
                return
            self.lg.QuerySamplesComplete([self.lg.QuerySampleResponse(s.id, 0, 0) for s, _ in batch])
            self.completed += len(batch)

    def issue(self, samples: list[Any]) -> None:
        now = time.monotonic()
        self.inbox.put([(s, now) for s in samples])

    def flush(self) -> None:
        """Nothing is held back between issues, so there is nothing to flush."""

    def _fill(self, pending: deque[tuple[Any, float]]) -> bool:
        """Dynamic batching: wait for more samples until the batch is full or the oldest waited the timeout.

        Returns False if the end-of-test marker arrived while waiting (the
        caller puts it back so the loop ends after this batch).
        """
        deadline = pending[0][1] + self.timeout_s
        while len(pending) < self.batch_size and not self.aborted:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                item = self.inbox.get(timeout=left)
            except queue.Empty:
                break
            if item is None:
                return False
            pending.extend(item)
        return True

    def _work(self) -> None:
        pending: deque[tuple[Any, float]] = deque()
        while True:
            if not pending:
                item = self.inbox.get()
                if item is None:
                    return
                pending.extend(item)
            while True:
                try:
                    item = self.inbox.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    self.inbox.put(None)
                    break
                pending.extend(item)
            if not self._fill(pending):
                self.inbox.put(None)
            batch = [pending.popleft() for _ in range(min(self.batch_size, len(pending)))]
            issued = time.monotonic()
            if not self.error and not self.aborted:
                try:
                    self.runner.infer()
                except Exception as exc:  # the samples must still complete or LoadGen waits forever
                    self.error = f"{type(exc).__name__}: {exc}"
            done = time.monotonic()
            since = issued if self.offline else min(t for _, t in batch)
            self.latencies_ms.append((done - since) * 1e3)
            self.outbox.put(batch)


def _test_settings(
    lg: Any,
    scenario: str,
    window_s: float,
    qps: float,
    batch_latency_s: float,
    options: dict[str, Any],
) -> Any:
    ts = lg.TestSettings()
    ts.mode = lg.TestMode.PerformanceOnly
    ts.min_duration_ms = int(window_s * 1000)
    if scenario == "offline":
        ts.scenario = lg.TestScenario.Offline
        ts.offline_expected_qps = qps * QPS_MARGIN
        ts.min_query_count = max(1, math.ceil(qps * QPS_MARGIN * window_s))
    elif scenario == "server":
        target = float(options.get("server_target_qps", 0.5 * qps))
        ts.scenario = lg.TestScenario.Server
        ts.server_target_qps = target
        ts.server_target_latency_ns = int(float(options.get("server_target_latency_ms", 1000.0)) * 1e6)
        ts.min_query_count = max(SERVER_MIN_QUERIES, math.ceil(target * window_s))
    else:
        ts.scenario = lg.TestScenario.SingleStream
        # LoadGen pre-generates window / expected-latency queries: a latency on the
        # low side keeps a runner faster than its warm-up from running out of them.
        expected_s = batch_latency_s / SINGLESTREAM_MARGIN
        ts.single_stream_expected_latency_ns = max(1, int(expected_s * 1e9))
        ts.min_query_count = max(SINGLESTREAM_MIN_QUERIES, math.ceil(window_s / max(expected_s, 1e-6)))
    return ts


def run_window(
    runner: Runner,
    batch_size: int,
    settings: WindowSettings,
    log_dir: str | Path,
    meter: Meter | None = None,
    monitors: list[Monitor] | tuple[Monitor, ...] = (),
) -> WindowResult:
    """Warm up, then run one LoadGen test with the meter bracketing exactly that test.

    The meter starts just before StartTest and stops right after it returns,
    so energy and queries cover the same interval; monitors (telemetry) start
    before the meter and stop after it. If LoadGen ends the run before
    min_duration because the SUT beat the warm-up estimate, the window is run
    once more sized on the throughput LoadGen measured.
    """
    lg = _loadgen()
    scenario = settings.scenario.lower().replace("-", "").replace("_", "")
    if scenario not in SCENARIOS:
        raise UserError(f"unknown scenario {settings.scenario!r}: choose one of offline, server, singlestream")
    if batch_size <= 0:
        raise UserError("batch size must be a positive integer")
    if settings.window_s <= 0:
        raise UserError(f"window must be positive, got {settings.window_s} s: pass e.g. --window 10s")
    log_path = Path(log_dir)
    log_path.mkdir(parents=True, exist_ok=True)
    qps = warm_up(runner, batch_size, settings.warmup_s)
    interrupts.check()
    result = _run_once(lg, runner, batch_size, scenario, settings, log_path, qps, meter, monitors)
    if scenario != "server" and not result.error and _too_short(result.summary):
        measured = result.summary.samples_per_second or result.qps
        result = _run_once(
            lg,
            runner,
            batch_size,
            scenario,
            settings,
            log_path,
            max(qps, measured) * RETRY_MARGIN,
            meter,
            monitors,
        )
        result.attempts = 2
    return result


def _too_short(summary: LoadGenSummary) -> bool:
    return not summary.valid and any("duration" in r.lower() for r in summary.invalid_reasons)


def _run_interruptibly(call: Callable[[], Any]) -> None:
    """Run a blocking native call on a helper thread while the main thread waits in short joins.

    Python runs signal handlers only on the main thread and only between
    bytecodes: blocked inside LoadGen's C++ StartTest it would not see Ctrl-C
    or SIGTERM until the whole window had run.
    """
    failure: list[BaseException] = []

    def target() -> None:
        try:
            call()
        except BaseException as exc:  # handed to the caller's thread below
            failure.append(exc)

    thread = threading.Thread(target=target, name="powertune-loadgen", daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(0.05)
    if failure:
        raise failure[0]


def _run_once(
    lg: Any,
    runner: Runner,
    batch_size: int,
    scenario: str,
    settings: WindowSettings,
    log_path: Path,
    qps: float,
    meter: Meter | None,
    monitors: Any,
) -> WindowResult:
    """One LoadGen test; a Ctrl-C or SIGTERM during it ends it early and is raised once all is torn down.

    An exception raised at an arbitrary point inside StartTest tears the SUT
    down under LoadGen's own threads and crashes the process, and then
    nothing restores the hardware. Here a signal only tells the SUT to stop
    running the model (the remaining samples complete at once), so LoadGen
    returns within a batch, everything is destroyed in order, and the signal
    is raised after (see tuner.interrupts).
    """
    timeout_s = float(settings.options.get("batch_timeout_ms", 0.0)) / 1000.0
    sut_state = _BatchingSUT(lg, runner, batch_size, scenario, timeout_s)
    ts = _test_settings(lg, scenario, settings.window_s, qps, batch_size / qps, settings.options)
    log_settings = lg.LogSettings()
    log_settings.log_output.outdir = str(log_path)
    log_settings.log_output.copy_summary_to_stdout = False
    log_settings.enable_trace = False
    sut = lg.ConstructSUT(sut_state.issue, sut_state.flush)
    qsl = lg.ConstructQSL(QSL_SIZE, QSL_SIZE, _noop, _noop)
    sut_state.start()
    reading = None
    started: list[Monitor] = []
    with interrupts.listening(sut_state.abort):
        try:
            for monitor in monitors:
                monitor.start()
                started.append(monitor)
            if meter is not None:
                meter.start()
            start_wall, start = time.time(), time.monotonic()
            _run_interruptibly(lambda: lg.StartTestWithLogSettings(sut, qsl, ts, log_settings))
            end, end_wall = time.monotonic(), time.time()
            if meter is not None:
                reading = meter.stop()
        finally:
            telemetry = [m.stop() for m in reversed(started)][::-1]
            sut_state.join()
            lg.DestroyQSL(qsl)
            lg.DestroySUT(sut)
        interrupts.check()
    return WindowResult(
        batch_latencies_ms=sut_state.latencies_ms,
        queries=sut_state.completed,
        batches=len(sut_state.latencies_ms),
        start_monotonic=start,
        end_monotonic=end,
        start_wall=start_wall,
        end_wall=end_wall,
        warmup_qps=qps,
        summary=parse_logs(log_path),
        log_dir=log_path,
        energy=reading,
        monitors=telemetry,
        error=sut_state.error,
    )


def _noop(samples: list[int]) -> None:
    """Inputs are synthetic and live in the runner: nothing to load or unload."""


_SUMMARY_LATENCY = re.compile(r"^([\w. ]*latency) \(ns\)\s*:\s*([\d.]+)", re.MULTILINE)


def parse_logs(log_dir: str | Path) -> LoadGenSummary:
    """Read LoadGen's verdict from the summary (human text) and detail (:::MLLOG JSON) logs.

    The detail log is authoritative where both say the same thing; the summary
    supplies the latency percentiles and the reasons it gives for INVALID.
    """
    log_path = Path(log_dir)
    summary = LoadGenSummary()
    summary_file = log_path / "mlperf_log_summary.txt"
    detail_file = log_path / "mlperf_log_detail.txt"
    if summary_file.is_file():
        text = summary_file.read_text(errors="replace")
        for line in text.splitlines():
            key, _, value = (part.strip() for part in line.partition(":"))
            if key == "Scenario":
                summary.scenario = value
            elif key.startswith("Samples per second") or key.startswith("Completed samples per second"):
                summary.samples_per_second = _number(value)
            elif key == "Result is":
                summary.valid = value.upper() == "VALID"
            elif key.endswith("satisfied") and value.upper().startswith("NO"):
                summary.invalid_reasons.append(f"{key}: NO")
        summary.latencies_ns = {m.group(1).strip(): float(m.group(2)) for m in _SUMMARY_LATENCY.finditer(text)}
    if detail_file.is_file():
        for line in detail_file.read_text(errors="replace").splitlines():
            if not line.startswith(":::MLLOG"):
                continue
            try:
                entry = json.loads(line[len(":::MLLOG") :])
            except ValueError:
                continue
            if str(entry.get("key", "")).startswith("result_") or entry.get("key") == "num_errors":
                summary.detail[entry["key"]] = entry.get("value")
        detail = summary.detail
        if "result_validity" in detail:
            summary.valid = str(detail["result_validity"]).upper() == "VALID"
        if detail.get("result_samples_per_second") is not None:
            summary.samples_per_second = float(detail["result_samples_per_second"])
        if detail.get("result_invalid_reason"):
            reason = str(detail["result_invalid_reason"])
            if reason not in summary.invalid_reasons:
                summary.invalid_reasons.append(reason)
        if detail.get("result_query_count") is not None:
            summary.query_count = int(detail["result_query_count"])
        summary.errors = int(detail.get("num_errors") or 0)
    if not summary_file.is_file() and not detail_file.is_file():
        summary.invalid_reasons.append(f"LoadGen wrote no logs under {log_path}")
    return summary


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None
