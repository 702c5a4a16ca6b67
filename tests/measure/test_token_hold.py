"""A Server LLM window cut for its tail holds the arriving queries, so LoadGen ends it instead of issuing its schedule.

On the H200 every cut Server window of a study ran LoadGen's whole schedule
(500 queries at 40 q/s: 12.7 s each) after a cut at about 1 s, because the
cut completed each arriving query at once.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from tuner.measure.settings import WindowSettings
from tuner.measure.token_settings import tail_rule

needs_llm = pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None or importlib.util.find_spec("mlperf_loadgen") is None,
    reason="needs transformers, torch and LoadGen (pip install 'powertune[llm,loadgen]')",
)


class _Ts:
    """The TestSettings fields tail_rule reads of a Server window."""

    def __init__(self, qps: float, min_queries: int, min_duration_ms: int = 10_000) -> None:
        self.server_target_qps = qps
        self.min_query_count = min_queries
        self.min_duration_ms = min_duration_ms


def _server(**bounds: float) -> WindowSettings:
    return WindowSettings(scenario="server", window_s=10.0, options={"server_target_qps": 40.0}, **bounds)


def test_the_hold_is_above_what_a_window_meeting_its_bounds_has_outstanding_and_below_its_schedule():
    tail = tail_rule("server", _server(max_ttft_ms=500.0, max_tpot_ms=30.0), _Ts(40.0, 500), 16, 128)
    assert tail is not None
    # 16 running and 20 arriving within the TTFT bound, plus six standard deviations, the overs and the spare.
    assert 16 + 20 < tail.hold_queries < 500
    assert tail.hold_max_s == pytest.approx(3.0 * tail.hold_queries / 40.0 + 0.5)
    # Many sequences: what arrives within TTFT + 127 TPOT bounds it instead.
    wide = tail_rule("server", _server(max_ttft_ms=500.0, max_tpot_ms=30.0), _Ts(40.0, 500), 512, 128)
    assert wide is not None and 40 * (0.5 + 127 * 0.03) < wide.hold_queries < 512


def test_no_hold_where_nothing_bounds_the_queue():
    only_tpot = tail_rule("server", _server(max_tpot_ms=30.0), _Ts(40.0, 500), 16, 128)
    assert only_tpot is not None and only_tpot.hold_queries == 0
    with_query_bound = tail_rule("server", _server(max_tpot_ms=30.0, bound_ms=2000.0), _Ts(40.0, 500), 16, 128)
    assert with_query_bound is not None and with_query_bound.hold_queries > 80
    single = WindowSettings(scenario="singlestream", window_s=10.0, max_ttft_ms=500.0)

    class _Single:
        min_query_count = 64
        single_stream_expected_latency_ns = 10**8

    tail = tail_rule("singlestream", single, _Single(), 1, 128)
    assert tail is not None and tail.hold_queries == 0


@needs_llm
@pytest.mark.slow
def test_a_cut_server_window_ends_long_before_loadgen_s_schedule(tmp_path: Path):
    """One sequence at 400 q/s for a 10 s window (4000 queries scheduled): cut, held, ended by LoadGen early."""
    from fakemeter import ConstantMeter

    from runners import make_runner
    from tuner.measure.tokens import run_token_window

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"input_tokens": 8, "output_tokens": 4}) + "\n" for _ in range(3)))
    settings = WindowSettings(
        scenario="server",
        window_s=10.0,
        warmup_s=0.1,
        prompts=str(prompts),
        options={"server_target_qps": 400},
        max_ttft_ms=2.0,
        max_tpot_ms=50.0,
    )
    runner = make_runner("tiny-llm", "cpu")
    runner.prepare(1, "fp32", {})
    try:
        window = run_token_window(runner, 1, settings, tmp_path / "logs", ConstantMeter(watts=10.0))
    finally:
        runner.close()
    assert window.cut_bound == "ttft"
    tail = tail_rule("server", settings, _Ts(400.0, 4000), 1, 4)
    assert tail is not None and tail.hold_queries > 0
    # LoadGen stopped issuing at the hold's count outstanding: far fewer queries than its 4000 were issued.
    assert len(window.queries) < tail.hold_queries + 2 * 400 < 4000
    assert all(q.done == q.done for q in window.queries)


class _InstantRunner:
    """Completes every query as it is submitted, recording when each was."""

    def __init__(self) -> None:
        self.submitted: list[float] = []
        self._done = None

    def start(self, on_first, on_done) -> None:
        self._done = on_done

    def submit(self, key: int, encoded: list[int], max_new_tokens: int) -> None:
        import time

        self.submitted.append(time.monotonic())
        self._done(key, max_new_tokens)

    def stop(self) -> None:
        self._done = None


def test_a_server_warm_up_ends_with_queries_arriving_at_the_window_s_rate():
    """Prompts joining a running batch make the step shapes a CUDA-graph library captures: before the window."""
    from tuner.measure.prompts import load_prompts
    from tuner.measure.tokens import warm_up

    prompts = load_prompts(None)
    runner = _InstantRunner()
    encoded = [[1, 2, 3]] * len(prompts.samples)
    warm_up(runner, 4, prompts, encoded, 0.1, arrivals_qps=100.0)
    assert len(runner.submitted) >= 4 + 10
    # The paced round's query n is issued no earlier than n / 100 s after it began, after the last full round's.
    assert runner.submitted[-1] - runner.submitted[-11] >= 9 / 100.0
    burst = _InstantRunner()
    warm_up(burst, 4, prompts, encoded, 0.0)
    assert len(burst.submitted) == 4


class _SlowRunner:
    """One sequence at a time, each query taking ``per_query`` s: far slower than a 200 q/s paced round."""

    def __init__(self, per_query: float) -> None:
        import queue
        import threading

        self.per_query = per_query
        self.cancelled: set[int] = set()
        self.completed: list[int] = []
        self._queue: queue.Queue = queue.Queue()
        self._done = None
        self._worker = threading.Thread(target=self._serve, daemon=True)
        self._worker.start()

    def _serve(self) -> None:
        import time

        while True:
            key = self._queue.get()
            if key in self.cancelled:
                continue
            time.sleep(self.per_query)
            if self._done is not None and key not in self.cancelled:
                self.completed.append(key)
                self._done(key, 4)

    def start(self, on_first, on_done) -> None:
        self._done = on_done

    def submit(self, key: int, encoded: list[int], max_new_tokens: int) -> None:
        self._queue.put(key)

    def cancel(self, key: int) -> None:
        self.cancelled.add(key)

    def stop(self) -> None:
        self._done = None


def test_a_paced_warm_up_drops_the_backlog_of_a_configuration_slower_than_the_rate():
    """On the H200 one sequence at 40 q/s spent 25 s of its trial draining a 1 s paced round: now it is dropped."""
    from tuner.measure import tokens
    from tuner.measure.prompts import load_prompts

    prompts = load_prompts(None)
    runner = _SlowRunner(per_query=0.02)
    encoded = [[1, 2, 3]] * len(prompts.samples)
    # 200 paced queries over 1 s against a runner that serves 50 q/s: a backlog of about 150 at the round's end.
    tokens.warm_up(runner, 1, prompts, encoded, 1.0, arrivals_qps=200.0)
    paced = 200
    assert len(runner.cancelled) > paced // 2
    # Nothing cancelled ever completed, and what completed is about what the runner served in the round and its grace.
    assert not set(runner.completed) & runner.cancelled
    assert len(runner.completed) < paced // 2


def test_a_server_warm_up_is_sized_on_what_a_window_meeting_its_bounds_runs():
    """512 sequences at 20 q/s under TTFT 500 ms / TPOT 30 ms: about 86 outstanding, each done within 4.31 s."""
    from tuner.measure.token_settings import server_warm_up

    bounded = WindowSettings(
        scenario="server", window_s=10.0, options={"server_target_qps": 20.0}, max_ttft_ms=500.0, max_tpot_ms=30.0
    )
    first, within = server_warm_up(bounded, 512, 128)
    assert first == 87 and within == pytest.approx(0.5 + 127 * 0.03)
    assert server_warm_up(bounded, 16, 128)[0] == 16
    query_bound = WindowSettings(scenario="server", window_s=10.0, options={"server_target_qps": 20.0}, bound_ms=2000.0)
    assert server_warm_up(query_bound, 512, 128) == (40, pytest.approx(2.0))
    free = WindowSettings(scenario="server", window_s=10.0, options={"server_target_qps": 20.0})
    assert server_warm_up(free, 512, 128) == (512, None)


class _HeldSut:
    """What the hold's release reads of a window's SUT."""

    def __init__(self, issued: int, outstanding: int, last_issue: float) -> None:
        self.queries = dict.fromkeys(range(issued))
        self._outstanding = outstanding
        self.last_issue = last_issue

    def outstanding(self) -> int:
        return self._outstanding


def test_a_hold_that_never_fills_is_released_once_loadgen_s_schedule_is_issued():
    """A TPOT cut at 20 q/s on the H200 left 80 outstanding of a 226-query hold: the window waited 34 s for it."""
    from tuner.measure.token_tail import HOLD_QUIET_S, TokenTail, stopped_issuing

    tail = TokenTail(0.5, 0.03, 0.99, 500, hold_queries=226, hold_max_s=34.4, schedule_queries=500, schedule_s=10.0)
    quiet = 100.0 + HOLD_QUIET_S
    # LoadGen issued its minimum count past its minimum duration and has been quiet: it is done.
    assert stopped_issuing(_HeldSut(500, 80, 100.0), tail, quiet, started=80.0)
    # Short of its count, or of its duration, or not quiet: it may still issue; at the hold it cannot.
    assert not stopped_issuing(_HeldSut(499, 80, 100.0), tail, quiet, started=80.0)
    assert not stopped_issuing(_HeldSut(500, 80, 100.0), tail, quiet, started=quiet - 9.0)
    assert not stopped_issuing(_HeldSut(500, 80, 100.0), tail, 100.0, started=80.0)
    assert stopped_issuing(_HeldSut(300, 226, 100.0), tail, quiet, started=95.0)


def test_a_server_tail_carries_loadgen_s_minimum_schedule():
    tail = tail_rule("server", _server(max_ttft_ms=500.0, max_tpot_ms=30.0), _Ts(20.0, 500, 10_000), 512, 128)
    assert tail is not None and (tail.schedule_queries, tail.schedule_s) == (500, 10.0)


_TPOT_CUT = """
import json, sys
from pathlib import Path
from fakemeter import ConstantMeter
from runners import make_runner
from tuner.measure.settings import WindowSettings
from tuner.measure.tokens import run_token_window
out = Path(sys.argv[1])
prompts = out / "prompts.jsonl"
prompts.write_text("".join(json.dumps({"input_tokens": 16, "output_tokens": 16}) + "\\n" for _ in range(8)))
settings = WindowSettings(scenario="server", window_s=5.0, warmup_s=0.5, prompts=str(prompts),
                          options={"server_target_qps": 100}, max_ttft_ms=5000.0, max_tpot_ms=1.0)
runner = make_runner("tiny-llm", "cpu")
runner.prepare(16, "fp32", {})
for n in range(2):
    window = run_token_window(runner, 16, settings, out / f"logs{n}", ConstantMeter(watts=10.0))
    print(window.cut_bound, len(window.queries))
runner.close()
"""


@needs_llm
@pytest.mark.slow
def test_a_window_cut_on_tpot_past_its_schedule_ends_without_crashing_loadgen(tmp_path: Path):
    """The cut's thread outlives the test: exiting after completing queries crashed LoadGen's logger (SIGSEGV).

    100 q/s under a 5 s TTFT bound holds more than LoadGen's 500-query schedule, so the schedule ends first;
    on the code before, 4 of 5 such windows died in TlsLogger::SwapBuffers.
    """
    import os
    import subprocess
    import sys

    fakes = Path(__file__).resolve().parents[1] / "fakes"
    env = {**os.environ, "PYTHONPATH": str(fakes), "PYTHONFAULTHANDLER": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", _TPOT_CUT, str(tmp_path)], capture_output=True, text=True, env=env, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    cuts = proc.stdout.split()
    assert cuts[0::2] == ["tpot", "tpot"] and all(int(n) >= 500 for n in cuts[1::2])
