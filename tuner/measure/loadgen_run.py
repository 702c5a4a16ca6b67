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
import math
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuner.errors import UserError
from tuner.measure.lanes import Runner, lanes_of
from tuner.measure.loadgen_settings import loadgen_test_settings, tail_rule
from tuner.measure.logparse import parse_logs
from tuner.measure.meters import energy_reader
from tuner.measure.results import LoadGenSummary, WindowResult
from tuner.measure.stopping import CUT_REASONS, STOP_LOADGEN, StopRule
from tuner.measure.sut import BatchingSUT
from tuner.measure.warmup import warm_up
from tuner.plumbing import atomicfile, interrupts

if TYPE_CHECKING:
    from tuner.measure.meters import Meter, Monitor
    from tuner.measure.settings import WindowSettings

SCENARIOS = ("offline", "server", "singlestream")
# A window that still runs out of samples is re-run sized three times over what it saw (up to three
# attempts): the window ends at its own duration, so samples issued beyond it are not run.
RETRY_MARGIN = 3.0
MAX_ATTEMPTS = 3
QSL_SIZE = 1024


def loadgen() -> Any:
    """The mlperf_loadgen module, or a one-line error naming the extra that installs it."""
    try:
        import mlperf_loadgen
    except ImportError:
        raise UserError("install the loadgen extra: pip install 'powertune[loadgen]'") from None
    return mlperf_loadgen


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
    lg = loadgen()
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


def run_interruptibly(call: Callable[[], Any]) -> None:
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
    is raised after (see tuner.plumbing.interrupts).
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
    tail, hold, hold_max_s = tail_rule(scenario, settings, len(lanes_of(runner, batch_size)))
    sut_state = BatchingSUT(
        lg, runner, batch_size, scenario, meter, monitors, rule, timeout_s, pad, tail, hold, hold_max_s
    )
    ts = loadgen_test_settings(lg, scenario, settings, qps, batch_size / qps, hold)
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
        # are collected first (the last trial's garbage); older garbage goes
        # with Python's own full collections between windows.
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
            run_interruptibly(lambda: lg.StartTestWithLogSettings(sut, qsl, ts, log_settings))
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


def _noop(samples: list[int]) -> None:
    """Inputs are synthetic and live in the runner: nothing to load or unload."""
