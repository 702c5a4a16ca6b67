"""The LLM runner's kv_cache=static engine: transformers' generate over its static cache, in static batches."""

from __future__ import annotations

import importlib.util
import json
import threading

import pytest

HAS_LLM = importlib.util.find_spec("transformers") is not None and importlib.util.find_spec("torch") is not None
needs_llm = pytest.mark.skipif(not HAS_LLM, reason="needs transformers and torch (pip install 'powertune[llm]')")
needs_loadgen = pytest.mark.skipif(
    importlib.util.find_spec("mlperf_loadgen") is None, reason="needs LoadGen (pip install mlcommons-loadgen)"
)


def _runner(max_seqs: int):
    from runners import make_runner

    runner = make_runner("tiny-llm", "cpu")
    runner.prepare(max_seqs, "fp32", {"graph": "eager"})
    runner.configure({"kv_cache": "static"})
    return runner


def _sample(n_in: int, n_out: int):
    from tuner.measure.prompts import PromptSample

    return PromptSample(input_tokens=n_in, output_tokens=n_out, text=None)


@needs_llm
@pytest.mark.slow
def test_static_batches_report_each_query_s_first_token_and_its_own_length():
    runner = _runner(2)
    encoded = [runner.encode(_sample(n_in, n_out)) for n_in, n_out in ((8, 5), (12, 7), (5, 3))]
    firsts: list[int] = []
    dones: dict[int, int] = {}
    finished = threading.Event()

    def on_done(key: int, tokens: int) -> None:
        assert key in firsts  # a first token before the end
        dones[key] = tokens
        if len(dones) == 3:
            finished.set()

    try:
        runner.start(firsts.append, on_done)
        for key, (ids, n_out) in enumerate(zip(encoded, (5, 7, 3), strict=True)):
            runner.submit(key, ids, n_out)
        assert finished.wait(120), runner.error
        runner.stop()
        assert dones == {0: 5, 1: 7, 2: 3} and sorted(firsts) == [0, 1, 2] and runner.error == ""
        described = runner.describe()
        assert described["llm_runtime"] == "transformers-generate-static" and described["kv_cache"] == "static"
    finally:
        runner.close()


@needs_llm
@pytest.mark.slow
def test_a_cancelled_query_is_never_reported_and_a_stopped_session_drops_its_queue():
    runner = _runner(1)
    ids = runner.encode(_sample(8, 6))
    seen: list[int] = []
    try:
        runner.start(seen.append, lambda key, tokens: seen.append(-key - 1))
        runner.cancel(0)
        runner.submit(0, ids, 6)
        for key in range(1, 40):
            runner.submit(key, ids, 6)
        runner.stop()  # returns once the running batch has stopped; the queue is dropped
        count = len(seen)
        assert 0 not in seen and -1 not in seen and count < 2 * 40
        runner.start(seen.append, lambda key, tokens: None)
        runner.stop()
        assert len(seen) == count  # nothing of the old session ran on
    finally:
        runner.close()


@needs_llm
def test_an_unknown_kv_cache_is_a_one_line_error():
    from runners.hf_llm_runner import check_kv_cache
    from tuner.errors import UserError

    assert check_kv_cache({}) == "paged" and check_kv_cache({"kv_cache": "static"}) == "static"
    with pytest.raises(UserError, match="unknown kv_cache 'ring': use one of paged, static"):
        check_kv_cache({"kv_cache": "ring"})


@needs_llm
@needs_loadgen
@pytest.mark.slow
def test_tune_measure_runs_the_static_cache_and_shows_only_the_knobs_that_act(tmp_path):
    import os

    from clirun import run_cli
    from locations import FAKES

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"input_tokens": 8, "output_tokens": 4}) + "\n")
    path = os.pathsep.join([str(FAKES), *filter(None, [os.environ.get("PYTHONPATH")])])
    r = run_cli(
        "measure",
        *("--model", "tiny-llm", "--device", "cpu", "--meter", "py:fakemeter:ConstantMeter"),
        *("--scenario", "singlestream", "--batch-size", "1", "--set", "kv_cache=static"),
        *("--prompts", str(prompts), "--window", "0.5", "--json"),
        env={"PYTHONPATH": path, "TUNE_POWERCAP_ROOT": str(tmp_path / "no-rapl")},
    )
    assert r.returncode == 0, r.stderr
    payload = json.loads(r.stdout)
    assert payload["config"] == {"precision": "fp32", "kv_cache": "static"}
    (m,) = payload["measurements"]
    assert m["valid"] and m["tokens"]["output_tokens"] == 4 * m["queries"]


@needs_llm
def test_a_thread_gets_its_own_graph_tree_state_where_torch_would_assert(monkeypatch):
    """pytorch/pytorch#123177: before 2.13 a Python thread other than the importing one had no tree state."""
    import sys
    import types

    import torch

    from runners.hf_static import graph_trees_for_this_thread

    old = types.ModuleType("torch._inductor.cudagraph_trees")
    old.local = threading.local()
    monkeypatch.setitem(sys.modules, "torch._inductor.cudagraph_trees", old)
    monkeypatch.setattr(torch._inductor, "cudagraph_trees", old, raising=False)
    monkeypatch.setattr(torch._C, "_is_key_in_tls", lambda name: False)
    seen: dict[str, bool] = {}

    def worker() -> None:
        graph_trees_for_this_thread()
        seen["worker"] = hasattr(old.local, "tree_manager_containers") and hasattr(old.local, "tree_manager_locks")

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert seen == {"worker": True} and not hasattr(old.local, "tree_manager_containers")  # per thread only
    fixed = types.ModuleType("torch._inductor.cudagraph_trees")
    fixed.local, fixed._initialize_tls = threading.local(), lambda local: None
    monkeypatch.setitem(sys.modules, "torch._inductor.cudagraph_trees", fixed)
    monkeypatch.setattr(torch._inductor, "cudagraph_trees", fixed, raising=False)
    graph_trees_for_this_thread()
    assert not hasattr(fixed.local, "tree_manager_containers")  # a torch with the fix sets its own up


@needs_llm
def test_a_dropped_continuous_batching_manager_fails_its_queue_instead_of_flushing_it():
    """A cut window leaves held arrivals queued; the library's default stop would generate them all first."""
    from runners.hf_llm_runner import HfLlmRunner
    from runners.llm_spec import parse_llm

    calls: list[dict] = []

    class Manager:
        def stop(self, block: bool = True, timeout: float | None = None, hard_stop: bool = False) -> None:
            calls.append({"block": block, "hard_stop": hard_stop})

        def destroy(self) -> None:
            calls.append({"destroy": True})

    runner = HfLlmRunner(parse_llm("tiny-llm"), "cpu")
    runner._manager = Manager()
    runner._drop_manager()
    assert calls == [{"block": True, "hard_stop": True}, {"destroy": True}] and runner._manager is None

    class Older:  # a transformers whose stop has no hard_stop: called as before
        def stop(self, block: bool = True, timeout: float | None = None) -> None:
            calls.append({"older": block})

        def destroy(self) -> None:
            pass

    runner._manager = Older()
    runner._drop_manager()
    assert calls[-1] == {"older": True}
