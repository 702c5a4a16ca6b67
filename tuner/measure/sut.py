"""The system under test LoadGen drives: it batches issued samples, runs them and brackets the window.

A batch holds the samples that arrived, up to the maximum batch size, and a
query's latency runs from its arrival at the SUT (Offline: its batch's issue)
to its batch's completion, on ``time.monotonic``.
"""

from __future__ import annotations

import math
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tuner.measure.lanes import Lane, Runner, lanes_of
from tuner.measure.meters import Monitor, checked_reading
from tuner.measure.results import BatchRecord
from tuner.measure.stopping import CUT_REASONS, STOP_EXHAUSTED, STOP_TAIL, StopRule, TailProof

if TYPE_CHECKING:
    from tuner.measure.meters import EnergyReading, Meter

# How often a Server window's tail cut, holding the queries that still arrive, looks whether LoadGen stopped.
HOLD_POLL_S = 0.02


class BatchingSUT:
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
        whose synchronize releases the GIL, so the worker does not pay for them.
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
