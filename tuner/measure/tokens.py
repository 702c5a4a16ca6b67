"""One measured LLM window: LoadGen with token latencies driving a runner that generates (runners.base.TokenRunner).

LoadGen issues queries (Offline: all at once; Server: at Poisson arrivals;
SingleStream: one after another); each is one prompt of the workload
(tuner.measure.prompts, sample index mod its length) handed to the runner,
whose library schedules it into its running batch. The runner reports each
query's first token, which becomes LoadGen's ``FirstTokenComplete``, and its
completion with its token count, which becomes ``QuerySamplesComplete`` with
``n_tokens``: with ``use_token_latencies`` LoadGen then times TTFT (issue to
first token) and TPOT (the rest of the query's latency over its tokens after
the first) itself and writes their percentiles to its detail log
(``result_first_token_*``, ``result_time_per_output_token_*``), which is
where a window's figures come from. LoadGen reports no token latencies in
Offline; there the SUT's own clock (``time.monotonic``) times them the same way.

The study's bounds are LoadGen's own ``ttft_latency``/``tpot_latency`` (and
the query bound ``server_target_latency_ns``), so LoadGen's verdict says
whether a window met them; the window is still a measurement when it did
not (the study's constraints judge it), and is invalid only when LoadGen
ran too few queries or too briefly to judge at all.

The window's record and its Measurement are tuner.measure.token_results; its
LoadGen settings and tail cut tuner.measure.token_settings.

A warm-up first runs a round of queries at the full concurrency outside
LoadGen (the library's first steps, allocator, clocks settle there; the
first window of a configuration also builds its cache and graphs), which
sizes the LoadGen run. The meter starts just before LoadGen and stops when
it returns, right after the last query completes; rates (queries and tokens
per second) are over that same interval, so J per token is average power
over tokens per second.
"""

from __future__ import annotations

import array
import itertools
import math
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tuner.errors import UserError
from tuner.measure.loadgen_run import loadgen, run_interruptibly
from tuner.measure.logparse import parse_logs
from tuner.measure.prompts import PromptSet, load_prompts
from tuner.measure.token_results import Query, TokenWindow, parse_token_latencies
from tuner.measure.token_settings import server_warm_up, tail_rule, token_test_settings
from tuner.measure.token_tail import WATCH_S, Times, TokenTail, release_when_stopped
from tuner.plumbing import atomicfile, interrupts

if TYPE_CHECKING:
    from tuner.measure.meters import EnergyReading, Meter
    from tuner.measure.settings import WindowSettings

QSL_SIZE = 1024
RETRY_MARGIN = 2.0
MAX_ATTEMPTS = 2
WARMUP_TIMEOUT_S = 600.0
# Where no bound says how long a query meeting it runs, the paced warm-up round waits this many of a full round's
# query latencies (plus the slack) past its last arrival, then drops what still runs.
PACED_GRACE = 2.0
PACED_SLACK_S = 0.5
_KEYS = itertools.count()


class _TokenSUT:
    """LoadGen's SUT: hands issued samples to the runner and its tokens back to LoadGen."""

    def __init__(self, lg: Any, runner: Any, prompts: PromptSet, encoded: list[Any]) -> None:
        self.lg = lg
        self.runner = runner
        self.prompts = prompts
        self.encoded = encoded
        self.queries: dict[int, Query] = {}
        self.lock = threading.Lock()
        self.aborted = False
        self.holding = False
        # Queries the runner no longer runs (cancelled at a cut, or held back from it): completed at the release.
        self.stopped: set[int] = set()
        self.last_issue = math.nan
        self.cut: tuple[str, int] | None = None
        self.cut_at = math.nan
        self._token = array.array("i", [0])
        # LoadGen must hear a query's first token before its completion, never after (it times TTFT from the
        # one and ends the query at the other). A completion arriving while the first token is reported waits.
        self._announcing: set[int] = set()
        self._deferred: dict[int, int] = {}

    def times(self) -> list[Times]:
        with self.lock:
            return [(q.issued, q.first, q.done, q.tokens) for q in self.queries.values()]

    def issue(self, samples: list[Any]) -> None:
        now = time.monotonic()
        for sample in samples:
            key = next(_KEYS)
            index = sample.index % len(self.prompts.samples)
            with self.lock:
                self.queries[key] = Query(sample.id, index, now)
                self.last_issue = now
                if self.holding:
                    self.stopped.add(key)
            if self.aborted:
                self._complete(key, 1)
                continue
            if key in self.stopped:
                continue
            self.runner.submit(key, self.encoded[index], self.prompts.samples[index].output_tokens)

    def flush(self) -> None:
        """Nothing is held back: the runner's library schedules every query as it arrives."""

    def first(self, key: int) -> None:
        with self.lock:
            query = self.queries.get(key)
            if query is None or not math.isnan(query.first) or not math.isnan(query.done) or key in self.stopped:
                return
            query.first = time.monotonic()
            self._announcing.add(key)
        address, _ = self._token.buffer_info()
        self.lg.FirstTokenComplete([self.lg.QuerySampleResponse(query.sample_id, address, self._token.itemsize)])
        with self.lock:
            self._announcing.discard(key)
            tokens = self._deferred.pop(key, None)
        if tokens is not None:
            self._complete(key, tokens)

    def done(self, key: int, tokens: int) -> None:
        if key not in self.stopped:
            self._complete(key, tokens)

    def outstanding(self) -> int:
        with self.lock:
            return sum(math.isnan(q.done) for q in self.queries.values())

    def hold(self) -> None:
        """A cut's hold: the runner drops the running queries and gets no more; LoadGen sees them all outstanding."""
        with self.lock:
            self.holding = True
            running = [key for key, q in self.queries.items() if math.isnan(q.done) and key not in self.stopped]
            self.stopped.update(running)
        for key in running:
            self.runner.cancel(key)

    def abort(self) -> None:
        """Complete every running query at once, so LoadGen returns; the runner drops them, later tokens are ignored."""
        self.aborted = True
        with self.lock:
            running = [key for key, q in self.queries.items() if math.isnan(q.done)]
            cancel = [key for key in running if key not in self.stopped]
            self.stopped.update(running)
        for key in cancel:
            self.runner.cancel(key)
        for key in running:
            self._complete(key, 1)

    def _complete(self, key: int, tokens: int) -> None:
        with self.lock:
            query = self.queries.get(key)
            if query is None or not math.isnan(query.done):
                return
            if key in self._announcing:
                self._deferred[key] = tokens
                return
            query.done = time.monotonic()
            query.tokens = max(int(tokens), 0)
            if math.isnan(query.first):
                query.first = query.done
                first = True
            else:
                first = False
        address, _ = self._token.buffer_info()
        if first:
            self.lg.FirstTokenComplete([self.lg.QuerySampleResponse(query.sample_id, address, self._token.itemsize)])
        n = max(query.tokens, 1)
        self.lg.QuerySamplesComplete([self.lg.QuerySampleResponse(query.sample_id, address, self._token.itemsize, n)])


def _scenario(name: str) -> str:
    scenario = name.lower().replace("-", "").replace("_", "")
    if scenario not in ("offline", "server", "singlestream"):
        raise UserError(f"unknown scenario {name!r}: choose one of offline, server, singlestream")
    return scenario


def warm_up(
    runner: Any,
    max_seqs: int,
    prompts: PromptSet,
    encoded: list[Any],
    warmup_s: float,
    arrivals_qps: float = 0.0,
    paced: tuple[int, float | None] | None = None,
) -> tuple[float, float]:
    """Run rounds of up to ``max_seqs`` queries back to back for about ``warmup_s``; return (queries/s, s per query).

    At least one round runs, whatever ``warmup_s``; a configuration's
    one-off costs fall in it, so the rate is timed on a later round where
    the time allows. With ``arrivals_qps`` (a Server window) a paced round
    issues queries at that rate for ``warmup_s``: prompts joining a running
    batch make step shapes a full round never does, and a library with CUDA
    graphs captures each shape when it meets it, which must not happen inside
    the window. ``paced`` (tuner.measure.token_settings.server_warm_up) gives
    the full round's size and how long a query meeting the bounds runs; what
    still runs that long after the paced round (or :data:`PACED_GRACE` full
    rounds' query latencies where nothing bounds it) is a backlog the rate
    outruns, dropped rather than waited for. Every round is a safe point for
    a signal.
    """
    done = threading.Event()
    pending: set[int] = set()
    lock = threading.Lock()
    seconds: list[float] = []
    issued: dict[int, float] = {}

    def on_done(key: int, tokens: int) -> None:
        with lock:
            if key in pending:
                pending.discard(key)
                seconds.append(time.monotonic() - issued[key])
                if not pending:
                    done.set()

    def submit(key: int, index: int) -> None:
        with lock:
            pending.add(key)
            issued[key] = time.monotonic()
        runner.submit(
            key, encoded[index % len(prompts.samples)], prompts.samples[index % len(prompts.samples)].output_tokens
        )

    def wait(round_start: float, until: float = math.inf) -> set[int]:
        """Wait for the round's queries; return (and forget) those still running at ``until``."""
        while True:
            with lock:
                if not pending:
                    return set()
                if time.monotonic() > until:
                    late = set(pending)
                    pending.clear()
                    return late
            done.wait(0.05)
            done.clear()
            interrupts.check()
            failed = getattr(runner, "error", "")
            if failed or time.monotonic() - round_start > WARMUP_TIMEOUT_S:
                raise UserError(f"the LLM runner did not finish its warm-up: {failed or 'timed out'}")

    first, within_s = paced or (max_seqs, None)
    runner.start(lambda key: None, on_done)
    try:
        started = time.monotonic()
        rate, rounds = 0.0, 0
        while rounds < 1 or (time.monotonic() - started < warmup_s and rounds < 8):
            interrupts.check()
            seconds.clear()
            round_start = time.monotonic()
            count = min(first, max(len(prompts.samples), 1)) if rounds else first
            for n in range(count):
                submit(next(_KEYS), rounds * count + n)
            wait(round_start)
            elapsed = time.monotonic() - round_start
            rate = count / elapsed if elapsed > 0 else float(count)
            rounds += 1
        per_query = float(np.median(seconds)) if seconds else 1.0 / max(rate, 1e-9)
        if arrivals_qps > 0:
            paced_start = time.monotonic()
            for n in range(max(1, math.ceil(arrivals_qps * warmup_s))):
                interrupts.check()
                time.sleep(max(0.0, paced_start + n / arrivals_qps - time.monotonic()))
                submit(next(_KEYS), n)
            grace = PACED_GRACE * per_query if within_s is None else within_s
            for key in wait(paced_start, time.monotonic() + grace + PACED_SLACK_S):
                runner.cancel(key)
        return rate, per_query
    finally:
        runner.stop()


def run_token_window(
    runner: Any,
    max_seqs: int,
    settings: WindowSettings,
    log_dir: str | Path,
    meter: Meter | None = None,
    monitors: list[Any] | tuple[Any, ...] = (),
) -> TokenWindow:
    """Warm up, then one LoadGen test with token latencies, metered from LoadGen's start to its end."""
    lg = loadgen()
    scenario = _scenario(settings.scenario)
    if max_seqs <= 0:
        raise UserError("maximum concurrent sequences must be a positive integer")
    if settings.window_s <= 0:
        raise UserError(f"window must be positive, got {settings.window_s} s: pass e.g. --window 10s")
    prompts = load_prompts(settings.prompts)
    log_path = atomicfile.ensure_folder(Path(log_dir))
    started = time.monotonic()
    runner.configure(dict(settings.options))
    encoded = [runner.encode(sample) for sample in prompts.samples]
    arrivals = float(settings.options.get("server_target_qps", 0.0)) if scenario == "server" else 0.0
    longest = max(s.output_tokens for s in prompts.samples)
    paced = server_warm_up(settings, max_seqs, longest) if arrivals > 0 else None
    qps, per_query = warm_up(runner, max_seqs, prompts, encoded, settings.warmup_s, arrivals, paced)
    warmup_s = time.monotonic() - started
    interrupts.check()
    with atomicfile.private_folder("powertune-loadgen-") as private:
        window = _run_once(
            lg, runner, scenario, settings, private, prompts, encoded, max_seqs, qps, per_query, meter, monitors
        )
        attempts = 1
        while _too_short(scenario, window) and attempts < MAX_ATTEMPTS:
            done = len(window.completed)
            measured = done / window.duration_s if window.duration_s > 0 else qps
            qps = max(qps, measured) * RETRY_MARGIN
            if done:
                per_query = min(per_query, window.duration_s / done) / RETRY_MARGIN
            window = _run_once(
                lg, runner, scenario, settings, private, prompts, encoded, max_seqs, qps, per_query, meter, monitors
            )
            attempts += 1
        for name in sorted(p.name for p in private.iterdir()):
            atomicfile.move_file(private / name, log_path / name)
    window.log_dir = log_path
    window.attempts = attempts
    window.warmup_qps = qps
    window.warmup_s = warmup_s
    return window


def _too_short(scenario: str, window: TokenWindow) -> bool:
    """A window that ran out of queries before its minimum duration is run again, sized on what it ran.

    LoadGen issues the queries an Offline or SingleStream run needs up front,
    from the rate or latency it is told: a runner faster than its warm-up
    (one sequence alone runs faster than one of a full batch) runs out.
    """
    reasons = " ".join(window.summary.invalid_reasons).lower()
    return scenario in ("offline", "singlestream") and not window.error and "duration" in reasons


def _run_once(
    lg: Any,
    runner: Any,
    scenario: str,
    settings: WindowSettings,
    log_path: Path,
    prompts: PromptSet,
    encoded: list[Any],
    max_seqs: int,
    qps: float,
    per_query: float,
    meter: Meter | None,
    monitors: Any,
) -> TokenWindow:
    """One LoadGen test; a Ctrl-C or SIGTERM completes the running queries at once and is raised after."""
    sut_state = _TokenSUT(lg, runner, prompts, encoded)
    ts = token_test_settings(lg, scenario, settings, qps, per_query, settings.bound_ms)
    log_settings = lg.LogSettings()
    log_settings.log_output.outdir = str(log_path)
    log_settings.log_output.copy_summary_to_stdout = False
    log_settings.enable_trace = False
    sut = lg.ConstructSUT(sut_state.issue, sut_state.flush)
    qsl = lg.ConstructQSL(QSL_SIZE, QSL_SIZE, _noop, _noop)
    bracket = _Bracket(meter, monitors)
    tail = tail_rule(scenario, settings, ts, max_seqs, max(q.output_tokens for q in prompts.samples))
    if tail is not None and tail.hold_queries:
        ts.server_max_async_queries = tail.hold_queries
    ended = threading.Event()
    watch = threading.Thread(
        target=_watch, args=(sut_state, tail, bracket, ended), name="powertune-token-tail", daemon=True
    )
    runner.start(sut_state.first, sut_state.done)
    with interrupts.listening(sut_state.abort):
        try:
            bracket.open()
            if tail is not None:
                watch.start()
            run_interruptibly(lambda: lg.StartTestWithLogSettings(sut, qsl, ts, log_settings))
        finally:
            ended.set()
            try:
                bracket.close()
            finally:
                if watch.is_alive():
                    watch.join()
                runner.stop()
                lg.DestroyQSL(qsl)
                lg.DestroySUT(sut)
        interrupts.check()
    issued = [q for q in sut_state.queries.values() if q.issued <= bracket.end]
    input_tokens = sum(prompts.samples[q.index].input_tokens for q in issued)
    bound, over = sut_state.cut or ("", 0)
    return TokenWindow(
        queries=list(sut_state.queries.values()),
        start=bracket.start,
        end=bracket.end,
        start_wall=bracket.start_wall,
        end_wall=bracket.end_wall,
        summary=parse_logs(log_path),
        token_latencies_ns=parse_token_latencies(log_path),
        log_dir=log_path,
        energy=bracket.reading,
        warmup_qps=qps,
        warmup_s=0.0,
        input_tokens=input_tokens,
        error=str(getattr(runner, "error", "") or ""),
        monitors=bracket.telemetry,
        cut_bound=bound,
        cut_over=over,
        cut_needed=0 if tail is None else tail.needed,
    )


class _Bracket:
    """The meter and monitors around a window: opened before LoadGen, closed once (at its end, or at a cut)."""

    def __init__(self, meter: Meter | None, monitors: Any) -> None:
        self.meter = meter
        self.monitors = list(monitors)
        self.started: list[Any] = []
        self.reading: EnergyReading | None = None
        self.telemetry: list[Any] = []
        self.start = self.end = self.start_wall = self.end_wall = 0.0
        self._lock = threading.Lock()
        self._closed = False

    def open(self) -> None:
        for monitor in self.monitors:
            monitor.start()
            self.started.append(monitor)
        if self.meter is not None:
            self.meter.start()
        self.start_wall, self.start = time.time(), time.monotonic()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self.end, self.end_wall = time.monotonic(), time.time()
            try:
                if self.meter is not None and self.start:
                    self.reading = self.meter.stop()
            finally:
                self.telemetry = [monitor.stop() for monitor in reversed(self.started)]


def _watch(sut: _TokenSUT, tail: TokenTail, bracket: _Bracket, ended: threading.Event) -> None:
    """Cut the window once its tail is proven past a bound: the bracket closes there and the queries end.

    Without a hold they end at once; with one (a Server window) once LoadGen
    has stopped issuing (tuner.measure.token_tail.stopped_issuing), or when
    the hold ran its longest wait. The thread then outlives the test: a
    thread that completed queries must not exit while LoadGen runs, or
    LoadGen's logging thread may crash (mlcommons/inference#236).
    """
    while not ended.wait(WATCH_S):
        found = tail.over(sut.times(), time.monotonic())
        if found is not None:
            sut.cut = found
            bracket.close()
            if tail.hold_queries:
                sut.hold()
                release_when_stopped(sut, tail, ended, bracket.start)
            sut.abort()
            ended.wait()
            return


def _noop(samples: list[int]) -> None:
    """Prompts are encoded before the window and live in the SUT: nothing to load or unload."""
