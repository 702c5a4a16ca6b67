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
import json
import math
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tuner import atomicfile, interrupts
from tuner.errors import UserError
from tuner.measure.loadgen_run import loadgen, run_interruptibly
from tuner.measure.logparse import parse_logs
from tuner.measure.prompts import PromptSet, load_prompts
from tuner.measure.results import LoadGenSummary
from tuner.measure.stopping import QUANTILES, STOP_TAIL
from tuner.measure.token_tail import Times, TokenTail
from tuner.measurement import Measurement, TokenMetrics

if TYPE_CHECKING:
    from tuner.measure.meters import EnergyReading, Meter
    from tuner.measure.settings import WindowSettings

QSL_SIZE = 1024
# LoadGen's early stopping declares a Server run INVALID below about 460 queries at p99 (as for CNNs), and
# a SingleStream run below 64 at p90.
SERVER_MIN_QUERIES = 500
SINGLESTREAM_MIN_QUERIES = 64
OFFLINE_MIN_QUERIES = 64
QPS_MARGIN = 1.2
RETRY_MARGIN = 2.0
MAX_ATTEMPTS = 2
# Bounds LoadGen is given where the study sets none: far beyond any window, so they never decide its verdict.
UNBOUNDED_NS = 3600 * 10**9
WARMUP_TIMEOUT_S = 600.0
# LoadGen's verdict lines that say a window was too short to judge; its others are about the latency bounds
# (performance constraints, early stopping, "TTFT constrain not met"), which the study's constraints judge.
TOO_SHORT = ("min duration", "min queries")
# How often a Server or SingleStream window looks whether its tail is already proven past a bound.
WATCH_S = 0.02
_KEYS = itertools.count()
_PERCENTILES = {"p50": "50.00", "p90": "90.00", "p99": "99.00"}


@dataclass
class _Query:
    sample_id: int
    index: int
    issued: float
    first: float = math.nan
    done: float = math.nan
    tokens: int = 0


@dataclass
class TokenWindow:
    """One LLM window: every query's times on the SUT's clock, tokens generated, LoadGen's verdict and logs."""

    queries: list[_Query]
    start: float
    end: float
    start_wall: float
    end_wall: float
    summary: LoadGenSummary
    token_latencies_ns: dict[str, float]
    log_dir: Path
    energy: EnergyReading | None
    warmup_qps: float
    warmup_s: float
    input_tokens: int
    error: str = ""
    attempts: int = 1
    monitors: list[Any] = field(default_factory=list)
    cut_bound: str = ""
    cut_over: int = 0
    cut_needed: int = 0

    @property
    def completed(self) -> list[_Query]:
        """The queries that completed in the window (a cut window: before its cut)."""
        return [q for q in self.queries if q.done <= self.end]

    @property
    def output_tokens(self) -> int:
        return sum(q.tokens for q in self.completed)

    @property
    def duration_s(self) -> float:
        return self.end - self.start


class _TokenSUT:
    """LoadGen's SUT: hands issued samples to the runner and its tokens back to LoadGen."""

    def __init__(self, lg: Any, runner: Any, prompts: PromptSet, encoded: list[Any]) -> None:
        self.lg = lg
        self.runner = runner
        self.prompts = prompts
        self.encoded = encoded
        self.queries: dict[int, _Query] = {}
        self.lock = threading.Lock()
        self.aborted = False
        self.cut: tuple[str, int] | None = None
        self.cut_at = math.nan
        self._token = array.array("i", [0])

    def times(self) -> list[Times]:
        with self.lock:
            return [(q.issued, q.first, q.done, q.tokens) for q in self.queries.values()]

    def issue(self, samples: list[Any]) -> None:
        now = time.monotonic()
        for sample in samples:
            key = next(_KEYS)
            index = sample.index % len(self.prompts.samples)
            with self.lock:
                self.queries[key] = _Query(sample.id, index, now)
            if self.aborted:
                self._complete(key, 1)
                continue
            self.runner.submit(key, self.encoded[index], self.prompts.samples[index].output_tokens)

    def flush(self) -> None:
        """Nothing is held back: the runner's library schedules every query as it arrives."""

    def first(self, key: int) -> None:
        query = self.queries.get(key)
        if query is None or not math.isnan(query.first):
            return
        query.first = time.monotonic()
        address, _ = self._token.buffer_info()
        self.lg.FirstTokenComplete([self.lg.QuerySampleResponse(query.sample_id, address, self._token.itemsize)])

    def done(self, key: int, tokens: int) -> None:
        self._complete(key, tokens)

    def abort(self) -> None:
        """Complete every running query at once, so LoadGen returns; the runner drops them, later tokens are ignored."""
        self.aborted = True
        with self.lock:
            running = [key for key, q in self.queries.items() if math.isnan(q.done)]
        for key in running:
            self.runner.cancel(key)
            self._complete(key, 1)

    def _complete(self, key: int, tokens: int) -> None:
        with self.lock:
            query = self.queries.get(key)
            if query is None or not math.isnan(query.done):
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


def warm_up(runner: Any, max_seqs: int, prompts: PromptSet, encoded: list[Any], warmup_s: float) -> tuple[float, float]:
    """Run rounds of ``max_seqs`` queries back to back for about ``warmup_s``; return (queries/s, s per query).

    At least one round runs, whatever ``warmup_s``: the first of a
    configuration carries one-off costs and says little, so a second round
    is timed where the time allows. Every round is a safe point for a signal.
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

    runner.start(lambda key: None, on_done)
    try:
        started = time.monotonic()
        rate, rounds = 0.0, 0
        while rounds < 1 or (time.monotonic() - started < warmup_s and rounds < 8):
            interrupts.check()
            seconds.clear()
            done.clear()
            round_start = time.monotonic()
            count = min(max_seqs, max(len(prompts.samples), 1)) if rounds else max_seqs
            keys = [next(_KEYS) for _ in range(count)]
            with lock:
                pending.update(keys)
            for n, key in enumerate(keys):
                index = (rounds * count + n) % len(prompts.samples)
                issued[key] = time.monotonic()
                runner.submit(key, encoded[index], prompts.samples[index].output_tokens)
            while not done.wait(0.05):
                interrupts.check()
                failed = getattr(runner, "error", "")
                if failed or time.monotonic() - round_start > WARMUP_TIMEOUT_S:
                    raise UserError(f"the LLM runner did not finish its warm-up: {failed or 'timed out'}")
            elapsed = time.monotonic() - round_start
            rate = count / elapsed if elapsed > 0 else float(count)
            rounds += 1
        per_query = float(np.median(seconds)) if seconds else 1.0 / max(rate, 1e-9)
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
    qps, per_query = warm_up(runner, max_seqs, prompts, encoded, settings.warmup_s)
    warmup_s = time.monotonic() - started
    interrupts.check()
    with atomicfile.private_folder("powertune-loadgen-") as private:
        window = _run_once(lg, runner, scenario, settings, private, prompts, encoded, qps, per_query, meter, monitors)
        attempts = 1
        while _too_short(scenario, window) and attempts < MAX_ATTEMPTS:
            measured = len(window.completed) / window.duration_s if window.duration_s > 0 else qps
            qps = max(qps, measured) * RETRY_MARGIN
            window = _run_once(
                lg, runner, scenario, settings, private, prompts, encoded, qps, per_query, meter, monitors
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
    """An Offline window that ran out of queries before its minimum duration is run again, sized on what it ran."""
    reasons = " ".join(window.summary.invalid_reasons).lower()
    return scenario == "offline" and not window.error and "duration" in reasons


def test_settings(
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
        ts.single_stream_expected_latency_ns = max(1, int(per_query_s * 1e9))
        ts.min_query_count = max(SINGLESTREAM_MIN_QUERIES, math.ceil(window_s / max(per_query_s, 1e-6)))
    return ts


def _ns(ms: float | None) -> int:
    return UNBOUNDED_NS if ms is None or not math.isfinite(ms) else max(1, int(ms * 1e6))


def _run_once(
    lg: Any,
    runner: Any,
    scenario: str,
    settings: WindowSettings,
    log_path: Path,
    prompts: PromptSet,
    encoded: list[Any],
    qps: float,
    per_query: float,
    meter: Meter | None,
    monitors: Any,
) -> TokenWindow:
    """One LoadGen test; a Ctrl-C or SIGTERM completes the running queries at once and is raised after."""
    sut_state = _TokenSUT(lg, runner, prompts, encoded)
    ts = test_settings(lg, scenario, settings, qps, per_query, settings.bound_ms)
    log_settings = lg.LogSettings()
    log_settings.log_output.outdir = str(log_path)
    log_settings.log_output.copy_summary_to_stdout = False
    log_settings.enable_trace = False
    sut = lg.ConstructSUT(sut_state.issue, sut_state.flush)
    qsl = lg.ConstructQSL(QSL_SIZE, QSL_SIZE, _noop, _noop)
    bracket = _Bracket(meter, monitors)
    tail = tail_rule(scenario, settings, ts)
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
    """Cut the window once its tail is proven past a bound: the bracket closes there and the queries end at once."""
    while not ended.wait(WATCH_S):
        found = tail.over(sut.times(), time.monotonic())
        if found is not None:
            sut.cut = found
            bracket.close()
            sut.abort()
            return


def tail_rule(scenario: str, settings: WindowSettings, ts: Any) -> TokenTail | None:
    """The tail cut of a Server or SingleStream window with a token bound, sized on the most queries it can hold.

    Server: its schedule, ``target x window`` plus six standard deviations of
    the Poisson count, or LoadGen's minimum count; SingleStream: its minimum
    count or one and a half times what its window holds at the warm-up's pace.
    Offline hands every query over at once, so TTFT there is queueing by
    design and no cut applies.
    """
    if scenario == "offline" or (settings.max_ttft_ms is None and settings.max_tpot_ms is None):
        return None
    if scenario == "server":
        expected = ts.server_target_qps * settings.window_s
        total = max(ts.min_query_count, math.ceil(expected + 6 * math.sqrt(expected))) + 1
    else:
        per_query = max(ts.single_stream_expected_latency_ns / 1e9, 1e-6)
        total = max(ts.min_query_count, math.ceil(1.5 * settings.window_s / per_query))
    return TokenTail(
        ttft_s=None if settings.max_ttft_ms is None else settings.max_ttft_ms / 1000.0,
        tpot_s=None if settings.max_tpot_ms is None else settings.max_tpot_ms / 1000.0,
        quantile=QUANTILES.get(settings.percentile, 0.99),
        total=total,
    )


def _noop(samples: list[int]) -> None:
    """Prompts are encoded before the window and live in the SUT: nothing to load or unload."""


def parse_token_latencies(log_dir: str | Path) -> dict[str, float]:
    """LoadGen's TTFT and TPOT percentiles (ns) from its detail log: ``ttft_p99``, ``tpot_p50``, ...

    Keys ``result_first_token_99.00_percentile_latency_ns`` and
    ``result_time_per_output_token_99.00_percentile_ns``; absent in Offline,
    where LoadGen reports only token throughput.
    """
    detail = Path(log_dir) / "mlperf_log_detail.txt"
    if not detail.is_file():
        return {}
    wanted: dict[str, str] = {}
    for name, pct in _PERCENTILES.items():
        wanted[f"result_first_token_{pct}_percentile_latency_ns"] = f"ttft_{name}"
        wanted[f"result_time_per_output_token_{pct}_percentile_ns"] = f"tpot_{name}"
    found: dict[str, float] = {}
    for line in detail.read_text(errors="replace").splitlines():
        if not line.startswith(":::MLLOG"):
            continue
        try:
            entry = json.loads(line[len(":::MLLOG") :])
        except ValueError:
            continue
        key = wanted.get(str(entry.get("key", "")))
        if key is not None and isinstance(entry.get("value"), int | float):
            found[key] = float(entry["value"])
    return found


def sut_token_latencies_ms(window: TokenWindow) -> dict[str, float]:
    """TTFT and TPOT percentiles (ms) on the SUT's clock, defined as LoadGen defines them.

    A cut window counts every query issued before its cut, a query with no
    first token yet at the time it had waited by then.
    """
    done = window.completed
    issued = [q for q in window.queries if q.issued <= window.end]
    ttft = np.asarray(
        [((q.first if q.first <= window.end else window.end) - q.issued) * 1e3 for q in issued] or [math.nan]
    )
    tpot = np.asarray([(q.done - q.first) * 1e3 / (q.tokens - 1) for q in done if q.tokens > 1] or [0.0])
    latency = np.asarray([(q.done - q.issued) * 1e3 for q in done] or [math.nan])
    out: dict[str, float] = {}
    for name, pct in (("p50", 50), ("p90", 90), ("p99", 99)):
        out[f"ttft_{name}"] = float(np.percentile(ttft, pct))
        out[f"tpot_{name}"] = float(np.percentile(tpot, pct))
        out[f"latency_{name}"] = float(np.percentile(latency, pct))
    return out


def build_token_measurement(window: TokenWindow, meter: Meter) -> Measurement:
    """A token window as a Measurement: J per query and per output token, TTFT/TPOT and why it is not trusted."""
    reading = window.energy
    if reading is None:
        raise ValueError("the window was run without a meter")
    done = window.completed
    tokens = window.output_tokens
    reasons: list[str] = []
    if window.error:
        reasons.append(f"runner error: {window.error}")
    if (not done or tokens <= 0) and not window.cut_bound:
        reasons.append("no query completed in the window")
    cut = bool(window.cut_bound)
    judged = [r for r in window.summary.invalid_reasons if any(short in r.lower() for short in TOO_SHORT)]
    if not cut and not window.summary.valid and (judged or not window.summary.invalid_reasons):
        reasons.append(f"LoadGen result INVALID ({'; '.join(judged) or 'no reason given'})")
    if not cut and reading.duration_s < meter.min_window_s:
        reasons.append(
            f"window {reading.duration_s:.2f} s is shorter than meter {meter.name} needs "
            f"({meter.min_window_s:.2f} s): lengthen --window"
        )
    own = sut_token_latencies_ms(window)
    loadgen = window.token_latencies_ns
    # A cut window's LoadGen log holds the queries ended at the cut as instant: its own figures at the cut stand.
    complete = all(f"{k}_{p}" in loadgen for k in ("ttft", "tpot") for p in _PERCENTILES)
    clock = "loadgen" if complete and not cut else "sut-monotonic"
    figure = {key: loadgen[key] / 1e6 for key in loadgen} if clock == "loadgen" else own
    per_query = (None if cut else _query_percentiles(window.summary)) or tuple(
        own[f"latency_{p}"] for p in _PERCENTILES
    )
    duration = window.duration_s
    queries = len(done)
    metrics = TokenMetrics(
        output_tokens=tokens,
        input_tokens=window.input_tokens,
        j_per_token=reading.energy_j / tokens if tokens else math.inf,
        tokens_per_s=tokens / duration if duration > 0 else 0.0,
        ttft_p50_ms=figure["ttft_p50"],
        ttft_p90_ms=figure["ttft_p90"],
        ttft_p99_ms=figure["ttft_p99"],
        tpot_p50_ms=figure["tpot_p50"],
        tpot_p90_ms=figure["tpot_p90"],
        tpot_p99_ms=figure["tpot_p99"],
        latency_clock=clock,
    )
    extra: dict[str, float | str] = {
        "warmup_qps": window.warmup_qps,
        "warmup_s": window.warmup_s,
        "window_start_unix": window.start_wall,
        "window_end_unix": window.end_wall,
        "loadgen_log_dir": str(window.log_dir),
        "loadgen_scenario": window.summary.scenario,
        "loadgen_attempts": float(window.attempts),
        "loadgen_result": "VALID" if window.summary.valid else "INVALID: " + "; ".join(window.summary.invalid_reasons),
        "meter_samples": float(reading.samples),
        "latency_clock": clock,
        **{f"sut_{key}_ms": value for key, value in own.items()},
    }
    if cut:
        extra.update(
            cut=STOP_TAIL,
            cut_bound=window.cut_bound,
            tail_over_queries=float(window.cut_over),
            tail_over_needed=float(window.cut_needed),
        )
    if reading.warning:
        extra["meter_warning"] = reading.warning
    extra.update({f"meter_{k}": v for k, v in reading.extra.items()})
    return Measurement(
        j_per_query=reading.energy_j / queries if queries else math.inf,
        p50_ms=per_query[0],
        p90_ms=per_query[1],
        p99_ms=per_query[2],
        qps=queries / duration if duration > 0 else 0.0,
        avg_w=reading.avg_w,
        energy_j=reading.energy_j,
        queries=queries,
        duration_s=duration,
        meter=reading.meter,
        rails=list(reading.rails),
        valid=not reasons,
        reason="; ".join(reasons),
        extra=extra,
        tokens=metrics,
    )


def _query_percentiles(summary: LoadGenSummary) -> tuple[float, float, float] | None:
    """LoadGen's per-query p50/p90/p99 (ms) in Server and SingleStream, where it times queries from their issue."""
    if summary.scenario.replace(" ", "").lower() not in ("server", "singlestream"):
        return None
    keys = [f"{pct} percentile latency" for pct in _PERCENTILES.values()]
    if not all(k in summary.latencies_ns for k in keys):
        return None
    p50, p90, p99 = (summary.latencies_ns[k] / 1e6 for k in keys)
    return p50, p90, p99
