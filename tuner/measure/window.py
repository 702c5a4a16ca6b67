"""One measured window: a short MLPerf LoadGen test driving a runner.

LoadGen decides when queries are issued and checks that the run was long
enough; the SUT here groups issued samples into batches, runs one
``runner.infer(n)`` per batch on a worker thread and records every query's
latency, from its arrival at the SUT to the completion of its batch (on
``time.monotonic``). The batch size is the maximum: a dynamic batch runs the
n samples that arrived (the runner may round n up to a prepared size, which
is recorded as padding), as a serving runtime's dynamic batcher does.
In Offline LoadGen hands over every sample at once, so a query's latency
there runs from the moment its batch is issued to the runner.

TestSettings are set directly (no official 600 s config) so a trial costs
seconds. A warm-up of ``settings.warmup_s`` runs ``runner.infer()`` outside
LoadGen (caches, clocks, allocator, autotuning settle there) and estimates the
throughput that sizes the LoadGen run so it outlasts the window. The window
itself is bracketed by the SUT's worker (first measured batch to last) and, in
Offline, ends at ``window_s`` or, when adaptive, as soon as the stopping rule
in tuner.measure.stopping is met.
"""

from __future__ import annotations

import gc
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

from tuner import atomicfile, interrupts
from tuner.errors import UserError
from tuner.measure.meters import checked_reading, energy_reader
from tuner.measure.stopping import (
    CUT_REASONS,
    QUANTILES,
    STOP_EXHAUSTED,
    STOP_LOADGEN,
    STOP_TAIL,
    StopRule,
    TailProof,
    over_needed,
)

if TYPE_CHECKING:
    from tuner.measure.meters import EnergyReading, Meter
    from tuner.measure.settings import WindowSettings

SCENARIOS = ("offline", "server", "singlestream")
# LoadGen issues 1.1 x expected_qps x min_duration samples in Offline; the
# extra margin covers a SUT faster than the warm-up loop, which would otherwise
# end the run before min_duration and make it INVALID. Launch-bound runs vary
# by tens of percent between the warm-up and the window (seen on an H200 and
# on a 2-core CPU), hence 20%; a window that still runs out of samples is
# re-run sized three times over what it saw (up to three attempts): the
# window ends at its own duration, so samples issued beyond it are not run.
QPS_MARGIN = 1.2
RETRY_MARGIN = 3.0
MAX_ATTEMPTS = 3
MIN_WARMUP_ITERS = 3
# Offline hands every sample over at once, and each one costs the SUT and LoadGen microseconds to issue
# and, if not run, to complete (0.2-0.3 s for the 132,000 samples of a 10 s window at 12,000 queries/s,
# on a 2-core CPU). Windows on an H200 ended within 2-9 s, so an adaptive window issues for 6 s at most;
# one that runs out first ends with the interval it reached (queries-exhausted).
OFFLINE_ISSUE_S = 6.0
# A warm-up whose two halves ran within 2% of each other has settled; it runs at
# least MIN_SETTLE_S (or all of a shorter one). A prepared runner on a GPU that
# just ran the previous trial settles at once: 0.25 s (a quarter of the default)
# was 8 s of a 30-trial study on an H200.
SETTLED = 0.02
MIN_SETTLE_S = 0.1
QSL_SIZE = 1024
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
HOLD_POLL_S = 0.02


class Runner(Protocol):
    """What a window needs from a runner (runners/base.py has the full protocol)."""

    def infer(self, size: int | None = None) -> int: ...


Lane = tuple[str, int, Callable[[int | None], int]]


def lanes_of(runner: Runner, batch_size: int) -> list[Lane]:
    """The engines that pull batches from the window's one queue: ``(name, batch size, infer)`` each.

    A runner with several engines (the GPU and the DLAs beside it) lists them
    in ``lanes()``; any other runner is one lane, ``main``, at the study's
    batch size.
    """
    lanes = getattr(runner, "lanes", None)
    listed = list(lanes()) if callable(lanes) else []
    return listed or [("main", batch_size, runner.infer)]


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
class BatchRecord:
    """One measured batch on the monotonic clock: when it started and ended, samples run and size executed."""

    start: float
    done: float
    size: int
    executed: int
    first_arrival: float


@dataclass
class WindowResult:
    """One window: per-query and per-batch latencies, queries done, its exact bracket and LoadGen's verdict.

    ``query_latencies_ms`` has one entry per measured query and ``arrivals``
    the monotonic time each arrived, in the same order; ``batch_records`` one
    entry per batch. ``batch_latencies_ms`` is each batch's latency from its
    earliest query (Offline: from its issue). ``waiting_ms``: the queries a
    Server window's tail cut found queued, and how long each had waited then.
    """

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
    stop: dict[str, Any] = field(default_factory=dict)
    lane_queries: dict[str, int] = field(default_factory=dict)
    query_latencies_ms: list[float] = field(default_factory=list)
    arrivals: list[float] = field(default_factory=list)
    batch_records: list[BatchRecord] = field(default_factory=list)
    waiting_ms: list[float] = field(default_factory=list)

    def batch_sizes(self) -> dict[str, dict[int, int]]:
        """How many batches ran each number of samples (``arrived``) and each executed size (``executed``)."""
        arrived: dict[int, int] = {}
        executed: dict[int, int] = {}
        for record in self.batch_records:
            arrived[record.size] = arrived.get(record.size, 0) + 1
            executed[record.executed] = executed.get(record.executed, 0) + 1
        return {"arrived": dict(sorted(arrived.items())), "executed": dict(sorted(executed.items()))}

    @property
    def padding(self) -> float:
        """The fraction of executed batch slots that held no sample."""
        slots = sum(r.executed for r in self.batch_records)
        return 1.0 - sum(r.size for r in self.batch_records) / slots if slots else 0.0

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
    """Run the runner back to back for up to ``warmup_s``; return its throughput in samples/s.

    The first iteration is left out of the estimate: it carries one-off costs
    (allocation, kernel selection) that would undersize the LoadGen run. The
    warm-up ends early once the two halves of what it ran agree within
    :data:`SETTLED` (never before :data:`MIN_SETTLE_S`): a prepared runner on
    a busy GPU is settled at once, and the rest would only repeat it.
    Every iteration is a safe point for a recorded Ctrl-C or SIGTERM.
    """
    lanes = lanes_of(runner, batch_size)
    total = 0.0
    for _name, size, infer in lanes:
        infer()
        start = time.monotonic()
        span = max(warmup_s, 0.0) / len(lanes)
        deadline, earliest = start + span, start + min(span, MIN_SETTLE_S)
        ends: list[float] = []
        while len(ends) < MIN_WARMUP_ITERS - 1 or time.monotonic() < deadline:
            interrupts.check()
            infer()
            ends.append(time.monotonic())
            if ends[-1] >= earliest and len(ends) >= 2 * MIN_WARMUP_ITERS and _settled(start, ends):
                break
        elapsed = time.monotonic() - start
        total += size * len(ends) / elapsed if elapsed > 0 else float(size) * 1e3
    return total


def _settled(start: float, ends: list[float]) -> bool:
    """True when the first and second half of the iterations ran at rates within SETTLED of each other."""
    half = len(ends) // 2
    first = ends[half - 1] - start
    second = ends[-1] - ends[half - 1]
    if first <= 0 or second <= 0:
        return False
    return abs(first / half - second / (len(ends) - half)) <= SETTLED * first / half


class _BatchingSUT:
    """Groups LoadGen samples into batches, runs them on worker threads, and brackets the window.

    A batch holds the samples waiting when the runner is free (after the
    batching timeout, if any), up to the maximum batch size, and the runner runs
    exactly those (``pad`` runs every batch at the maximum, to measure against).
    A query's latency runs from its arrival (Server, SingleStream) or from its
    batch's issue (Offline, where LoadGen hands over every sample at once) to
    its batch's completion. Meter and monitors start just before the first batch
    (Offline) or before LoadGen starts (Server, SingleStream) and stop right
    after the batch that ends the window; samples still queued then are
    completed without running and counted as skipped. A runner with several
    engines (:func:`lanes_of`) gets one worker per engine, all taking from one
    queue, as MLPerf's Offline harness feeds the GPU and the DLAs.
    """

    def __init__(
        self,
        lg: Any,
        runner: Runner,
        batch_size: int,
        scenario: str,
        meter: Meter | None = None,
        monitors: list[Monitor] | tuple[Monitor, ...] = (),
        rule: StopRule | None = None,
        timeout_s: float = 0.0,
        pad: bool = False,
        tail: TailProof | None = None,
        hold_queries: int = 0,
        hold_max_s: float = 0.0,
    ) -> None:
        self.lg = lg
        self.runner = runner
        self.batch_size = batch_size
        self.offline = scenario == "offline"
        self.timeout_s = 0.0 if self.offline else max(timeout_s, 0.0)
        self.pad = pad
        self.meter = meter
        self.monitors = list(monitors)
        self.rule = rule
        self.tail = tail
        self.hold_queries = 0 if self.offline else hold_queries
        self.hold_max_s = hold_max_s
        self.hold_deadline = math.inf
        self.held: list[tuple[Any, float]] = []
        self.waiting_ms: list[float] = []
        self.released = False
        self.issued = 0
        self.handed = 0
        self.last_issue = 0.0
        self.inbox: queue.Queue[list[tuple[Any, float]] | None] = queue.Queue()
        self.latencies_ms: list[float] = []
        self.query_latencies_ms: list[float] = []
        self.arrivals: list[float] = []
        self.records: list[BatchRecord] = []
        self.completed = 0
        self.queries = 0
        self.skipped = 0
        self.error = ""
        self.aborted = False
        self.failure: BaseException | None = None
        self.open = False
        self.closed = False
        self.stop_reason = ""
        self.start = self.end = self.start_wall = self.end_wall = 0.0
        self.reading: EnergyReading | None = None
        self.telemetry: list[Any] = []
        self._started: list[Monitor] = []
        self.outbox: queue.Queue[list[tuple[Any, float]] | None] = queue.Queue()
        self.lanes = lanes_of(runner, batch_size)
        self.lane_queries = {name: 0 for name, _, _ in self.lanes}
        self.pending: deque[tuple[Any, float]] = deque()
        self.running = 0
        self.drained = False
        self._take = threading.Lock()
        self._count = threading.Lock()
        self._handing = threading.Lock()
        self.threads = [
            threading.Thread(target=self._work, args=(lane,), name=f"powertune-sut-{lane[0]}", daemon=True)
            for lane in self.lanes
        ]
        self.completer = threading.Thread(target=self._complete, name="powertune-complete", daemon=True)

    def abort(self) -> None:
        """Stop running the model: the samples still issued complete at once, so LoadGen can finish."""
        self.aborted = True

    def run(self) -> None:
        for thread in self.threads:
            thread.start()
        self.completer.start()

    def join(self) -> None:
        """Stop the worker, then the completer once every finished batch has been reported."""
        self.inbox.put(None)
        for thread in self.threads:
            thread.join()
        self.outbox.put(None)
        self.completer.join()

    def open_window(self) -> None:
        """Start monitors, then the meter; the window begins once the meter is running."""
        for monitor in self.monitors:
            monitor.start()
            self._started.append(monitor)
        if self.meter is not None:
            self.meter.start()
        self.start_wall, self.start = time.time(), time.monotonic()
        if self.tail is not None and self.offline:
            # Offline hands every sample over before the first batch: the window can hold no more.
            self.tail.total = self.issued
        if self.rule is not None:
            self.rule.begin(self.start)
        self.open = True

    def close_window(self, reason: str) -> None:
        """Stop the meter, then the monitors; idempotent, so every exit path may call it."""
        if self.closed:
            return
        self.closed = True
        self.stop_reason = reason
        self.end, self.end_wall = time.monotonic(), time.time()
        if reason in CUT_REASONS:
            self.hold_deadline = self.end + self.hold_max_s
        try:
            if self.meter is not None and self.open:
                self.reading = checked_reading(self.meter.name, self.meter.stop())
        finally:
            self.telemetry = [m.stop() for m in reversed(self._started)][::-1]

    def _complete(self) -> None:
        """Report finished batches to LoadGen off the worker thread.

        The responses were built when the samples were issued, outside the
        window; here they are only handed over, overlapping the next batch,
        whose synchronize releases the GIL. Building them per batch on the
        worker cost about 4% of throughput at batch 128 on an H200.
        """
        while True:
            batch = self.outbox.get()
            if batch is None:
                return
            self.lg.QuerySamplesComplete([response for response, _ in batch])
            self.completed += len(batch)

    def issue(self, samples: list[Any]) -> None:
        now = time.monotonic()
        response = self.lg.QuerySampleResponse
        self.issued += len(samples)
        self.last_issue = now
        self.inbox.put([(response(s.id, 0, 0), now) for s in samples])

    def _hand(self, batch: list[tuple[Any, float]]) -> None:
        """Queue finished (or skipped) samples for completion, counting them against LoadGen's outstanding ones."""
        with self._handing:
            self.handed += len(batch)
        self.outbox.put(batch)

    def _holding(self) -> bool:
        """A Server window cut for its tail keeps arriving queries uncompleted until LoadGen stops issuing."""
        return (
            self.hold_queries > 0
            and self.stop_reason in CUT_REASONS
            and not self.released
            and not self.aborted
            and self.failure is None
        )

    def _release_held(self) -> None:
        """Complete the held queries once LoadGen has ended the test (or the hold ran its time)."""
        now = time.monotonic()
        stopped = self.issued - self.handed > self.hold_queries and now - self.last_issue >= HOLD_POLL_S * 5
        if stopped or now >= self.hold_deadline:
            self.released = True
            self.skipped += len(self.held)
            self._hand(self.held)
            self.held = []

    def _waiting_over(self) -> int:
        """Queued queries that arrived more than the bound ago (called under the take lock), counted up to need."""
        if self.tail is None:
            return 0
        limit = time.monotonic() - self.tail.bound_s
        need = self.tail.needed - self.tail.over
        count = 0
        for _, arrived in self.pending:
            if arrived >= limit or count >= need:
                break
            count += 1
        return count

    def flush(self) -> None:
        """Nothing is held back between issues, so there is nothing to flush."""

    def _fill(self, size: int) -> bool:
        """Dynamic batching: wait for more samples until the batch is full or the oldest waited the timeout.

        Returns False if the end-of-test marker arrived while waiting (the
        caller puts it back so the loop ends after this batch).
        """
        pending = self.pending
        deadline = pending[0][1] + self.timeout_s
        while len(pending) < size and not self.aborted:
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

    def _next(self, size: int) -> list[tuple[Any, float]] | None:
        """A lane's next batch from the shared queue (called under the take lock); None at the end of the test."""
        pending = self.pending
        while True:
            if self.held and not self._holding():
                # A cut's hold that a signal or a failure interrupted: what it held completes now.
                self.skipped += len(self.held)
                self._hand(self.held)
                self.held = []
            if not pending:
                if self._holding():
                    try:
                        item = self.inbox.get(timeout=HOLD_POLL_S)
                    except queue.Empty:
                        self._release_held()
                        continue
                else:
                    item = self.inbox.get()
                if item is None:
                    self.inbox.put(None)  # every lane must see the end
                    return None
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
            if not self.offline and self.tail is not None and self.open and not self.closed:
                if self.tail.proven(self._waiting_over()):
                    with self._count:
                        now = time.monotonic()
                        self.waiting_ms = [(now - arrived) * 1e3 for _, arrived in pending]
                        self.close_window(STOP_TAIL)
            if self.closed or self.aborted or self.failure is not None:
                if self._holding():
                    self.held.extend(pending)
                    pending.clear()
                    self._release_held()
                    continue
                self.skipped += len(pending)
                self._hand(list(pending))
                pending.clear()
                continue
            if not self._fill(size):
                self.inbox.put(None)
            batch = [pending.popleft() for _ in range(min(size, len(pending)))]
            self.running += 1
            self.drained = not pending and self.inbox.empty()
            return batch

    def _work(self, lane: Lane) -> None:
        name, size, infer = lane
        while True:
            with self._take:
                batch = self._next(size)
            if batch is None:
                return
            try:
                self._run_batch(batch, name, infer)
            except BaseException as exc:  # re-raised on the caller's thread once LoadGen returns
                self.failure = exc
            self._hand(batch)

    def _run_batch(self, batch: list[tuple[Any, float]], lane: str, infer: Callable[[int | None], int]) -> None:
        """Run the samples that arrived on one lane (all of its maximum with ``pad``); record each query's latency."""
        with self._count:
            if not self.open:
                self.open_window()
        issued = time.monotonic()
        executed = self.batch_size if self.pad else len(batch)
        try:
            executed = infer(None if self.pad else len(batch))
        except Exception as exc:  # the samples must still complete or LoadGen waits forever
            self.error = f"{type(exc).__name__}: {exc}"
        done = time.monotonic()
        arrivals = [t for _, t in batch]
        since = issued if self.offline else min(arrivals)
        with self._count:
            self.running -= 1
            if self.closed:
                return  # another lane ended the window while this batch ran: it is not part of it
            self.latencies_ms.append((done - since) * 1e3)
            self.query_latencies_ms.extend((done - (issued if self.offline else t)) * 1e3 for t in arrivals)
            self.arrivals.extend(arrivals)
            self.records.append(BatchRecord(issued, done, len(batch), int(executed), since))
            self.queries += len(batch)
            self.lane_queries[lane] += len(batch)
            if self.error:
                self.close_window("runner-error")
                return
            reason = None
            if self.tail is not None:
                self.tail.add([done - (issued if self.offline else t) for t in arrivals])
                reason = STOP_TAIL if self.tail.proven() else None
            if reason is None and self.rule is not None:
                within = self.tail is not None and self.tail.within()
                reason = self.rule.observe(done, self.queries, within)
            if reason is None and self.drained and self.running == 0 and self.offline:
                reason = STOP_EXHAUSTED
            if reason is not None:
                self.close_window(reason)


def _test_settings(
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


def run_window(
    runner: Runner,
    batch_size: int,
    settings: WindowSettings,
    log_dir: str | Path,
    meter: Meter | None = None,
    monitors: list[Monitor] | tuple[Monitor, ...] = (),
    warm_qps: float | None = None,
) -> WindowResult:
    """Warm up, then run one LoadGen test with the meter bracketing exactly the measured batches.

    The meter starts just before the first batch (Server and SingleStream:
    just before LoadGen starts issuing) and stops right after the last
    measured one, so energy and queries cover the same interval;
    monitors (telemetry) start before the meter and stop after it. In Offline
    the window ends after ``settings.window_s``, or earlier when adaptive
    (see :class:`WindowSettings`); why it ended and the interval it reached
    are in the result. If the runner ran out of samples before LoadGen's
    minimum duration because it beat the warm-up estimate, the window is run
    once more sized on the throughput LoadGen measured. ``warm_qps`` (the
    throughput a window of the same prepared configuration just ran at) skips
    the warm-up: nothing changed since, so there is nothing to settle.
    """
    lg = _loadgen()
    scenario = settings.scenario.lower().replace("-", "").replace("_", "")
    if scenario not in SCENARIOS:
        raise UserError(f"unknown scenario {settings.scenario!r}: choose one of offline, server, singlestream")
    if batch_size <= 0:
        raise UserError("batch size must be a positive integer")
    if settings.window_s <= 0:
        raise UserError(f"window must be positive, got {settings.window_s} s: pass e.g. --window 10s")
    log_path = atomicfile.ensure_folder(Path(log_dir))
    started = time.monotonic()
    qps = warm_qps if warm_qps is not None and warm_qps > 0 else warm_up(runner, batch_size, settings.warmup_s)
    warmup_s = time.monotonic() - started
    interrupts.check()
    # LoadGen writes its logs itself, by path: into a private folder, from which they are moved.
    with atomicfile.private_folder("powertune-loadgen-") as private:
        result = _run_once(lg, runner, batch_size, scenario, settings, private, qps, meter, monitors)
        attempts = 1
        while _rerun(scenario, result) and attempts < MAX_ATTEMPTS:
            # Samples issued beyond the window are never run, so oversizing the retry costs little.
            measured = max(result.summary.samples_per_second or 0.0, result.qps)
            qps = max(qps, measured) * RETRY_MARGIN
            result = _run_once(lg, runner, batch_size, scenario, settings, private, qps, meter, monitors)
            attempts += 1
        for name in sorted(p.name for p in private.iterdir()):
            atomicfile.move_file(private / name, log_path / name)
    result.log_dir = log_path
    result.attempts = attempts
    result.stop["warmup_s"] = warmup_s
    result.stop["loadgen_s"] = time.monotonic() - started - warmup_s
    return result


def _rerun(scenario: str, result: WindowResult) -> bool:
    """A window that ran out of samples before LoadGen's minimum duration is run again; a cut one never is."""
    cut = result.stop.get("stop_rule") in CUT_REASONS
    return scenario != "server" and not result.error and not cut and _too_short(result.summary)


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
    rule = None
    if scenario == "offline":
        rule = StopRule(
            min_s=settings.min_window_s or settings.window_s,
            max_s=settings.window_s,
            ci=settings.ci,
            min_queries=settings.min_queries,
            adaptive=settings.adaptive,
            energy_now=None if meter is None else energy_reader(meter),
            cut_j_per_query=settings.cut_j_per_query,
        )
    timeout_s = float(settings.options.get("batch_timeout_ms", 0.0)) / 1000.0
    pad = bool(settings.options.get("pad_batches", False))
    tail, hold, hold_max_s = _tail_rule(scenario, settings, len(lanes_of(runner, batch_size)))
    sut_state = _BatchingSUT(
        lg, runner, batch_size, scenario, meter, monitors, rule, timeout_s, pad, tail, hold, hold_max_s
    )
    ts = _test_settings(lg, scenario, settings, qps, batch_size / qps, hold)
    log_settings = lg.LogSettings()
    log_settings.log_output.outdir = str(log_path)
    log_settings.log_output.copy_summary_to_stdout = False
    log_settings.enable_trace = False
    sut = lg.ConstructSUT(sut_state.issue, sut_state.flush)
    qsl = lg.ConstructQSL(QSL_SIZE, QSL_SIZE, _noop, _noop)
    freeze = bool(settings.options.get("gc_freeze", True))
    if freeze:
        # A full collection walks every object the process holds (torch and the
        # tuner: about a million) and stops every Python thread while it does.
        # Frozen here, they are out of the collector's reach for the window, so
        # the window's own garbage is all it meets. Only the young generations
        # are collected first (the last trial's garbage): a full collection
        # took 0.17 s with torch imported on a 2-core CPU, every window; older
        # garbage goes with Python's own full collections between windows.
        gc.collect(1)
        gc.freeze()
    sut_state.run()
    with interrupts.listening(sut_state.abort):
        try:
            if scenario != "offline":
                # Queries arrive on LoadGen's schedule: a meter that waits for its
                # counter's next update (NVML's, up to 100 ms) must do so before the
                # first one arrives, or that query and those behind it wait too.
                sut_state.open_window()
            _run_interruptibly(lambda: lg.StartTestWithLogSettings(sut, qsl, ts, log_settings))
        finally:
            if freeze:
                gc.unfreeze()
            sut_state.join()
            sut_state.close_window(STOP_LOADGEN)
            lg.DestroyQSL(qsl)
            lg.DestroySUT(sut)
        interrupts.check()
    if sut_state.failure is not None:
        raise sut_state.failure
    stop = {
        "stop_rule": sut_state.stop_reason,
        "ci_target": settings.ci if settings.adaptive else None,
        "ci_achieved": None if rule is None or math.isinf(rule.achieved) else rule.achieved,
        "ci_blocks": 0 if rule is None else rule.blocks,
        "min_window_s": settings.min_window_s if settings.adaptive else settings.window_s,
        "max_window_s": settings.window_s,
        "min_queries": ts.min_query_count,
        "skipped_queries": sut_state.skipped,
    }
    if tail is not None:
        stop["tail_over_queries"] = tail.over
        stop["tail_over_needed"] = tail.needed
    return WindowResult(
        batch_latencies_ms=sut_state.latencies_ms,
        queries=sut_state.queries,
        batches=len(sut_state.latencies_ms),
        start_monotonic=sut_state.start,
        end_monotonic=sut_state.end,
        start_wall=sut_state.start_wall,
        end_wall=sut_state.end_wall,
        warmup_qps=qps,
        summary=parse_logs(log_path),
        log_dir=log_path,
        energy=sut_state.reading,
        monitors=sut_state.telemetry,
        error=sut_state.error,
        stop=stop,
        query_latencies_ms=sut_state.query_latencies_ms,
        arrivals=sut_state.arrivals,
        batch_records=sut_state.records,
        lane_queries=sut_state.lane_queries,
        waiting_ms=sut_state.waiting_ms,
    )


def sizes_to_warm(settings: WindowSettings, batch_size: int) -> int:
    """The batch sizes below the maximum a window runs often enough to prepare beforehand: 1 up to this.

    Offline runs full batches (none). A Server window that keeps its bound
    gathers about ``target x (bound + timeout)`` queries a batch; a batch
    twice that is one whose queries already waited past the bound, so sizes
    beyond are left to the runner's ladder (a resnet50 shape costs 40-90 ms
    of cuDNN plans on an H200: all 511 below 512 took 47 s).
    """
    scenario = settings.scenario.lower().replace("-", "").replace("_", "")
    if scenario == "offline":
        return 0
    target = float(settings.options.get("server_target_qps", 0.0))
    if scenario != "server" or settings.bound_ms is None or target <= 0:
        return batch_size - 1
    wait_s = (settings.bound_ms + float(settings.options.get("batch_timeout_ms", 0.0))) / 1000.0
    return min(batch_size - 1, math.ceil(2 * target * wait_s) + 1)


def _tail_rule(scenario: str, settings: WindowSettings, engines: int = 1) -> tuple[TailProof | None, int, float]:
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
