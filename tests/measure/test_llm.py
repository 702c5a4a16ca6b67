"""LLMs under TTFT/TPOT bounds: the workload, the names, LoadGen's token latencies, the study, bad input.

The end-to-end rows run a tiny random Llama (``tiny-llm``) on the CPU through
transformers' continuous batching and real LoadGen windows, metered by the
constant-power plugin (tests/fakes/fakemeter.py), so energies are exact: J per
output token must be the window's energy over its tokens.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import math
import os
from pathlib import Path

import optuna
import pytest
from clirun import folder_state, in_process, run_cli
from locations import FAKES

from runners.llm_spec import LLM_ZOO, is_llm, parse_llm, slug_of
from tuner.errors import ConfigurationError
from tuner.llm import bounds_label, llm_space
from tuner.measure.prompts import SHAPES, load_prompts, shaped
from tuner.measure.settings import WindowSettings
from tuner.measure.token_results import parse_token_latencies
from tuner.measure.token_tail import TokenTail
from tuner.run_options import RunOptions
from tuner.space import load_space
from tuner.storage import named_constraints

HAS_LLM = importlib.util.find_spec("transformers") is not None and importlib.util.find_spec("torch") is not None
needs_llm = pytest.mark.skipif(not HAS_LLM, reason="needs transformers and torch (pip install 'powertune[llm]')")
needs_loadgen = pytest.mark.skipif(
    importlib.util.find_spec("mlperf_loadgen") is None, reason="needs LoadGen (pip install mlcommons-loadgen)"
)


def _prompts(tmp_path: Path) -> Path:
    """Short prompts (a few tokens in, a few out) so a CPU window holds hundreds of queries."""
    path = tmp_path / "prompts.jsonl"
    lines = [
        {"input_tokens": 8, "output_tokens": 4},
        {"input_tokens": 12, "output_tokens": 6},
        {"prompt": "the quick brown fox jumps over the lazy dog", "max_tokens": 5},
    ]
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    return path


# The workload


def test_built_in_shapes_are_seeded_and_within_their_caps():
    for name, shape in SHAPES.items():
        first, again = shaped(name), load_prompts(name)
        assert first == again and len(first.samples) == 1024
        assert all(shape.input_min <= s.input_tokens <= shape.input_max for s in first.samples)
        assert all(shape.output_min <= s.output_tokens <= shape.output_max for s in first.samples)
    assert load_prompts(None).name == "openorca"
    # CNN-DM's articles are long and its summaries short; OpenOrca's answers are as long as its questions.
    cnndm, orca = load_prompts("cnndm"), load_prompts("openorca")
    assert cnndm.mean_input_tokens > 5 * cnndm.mean_output_tokens
    assert 0.5 < orca.mean_input_tokens / orca.mean_output_tokens < 2


def test_a_jsonl_file_of_prompts_and_of_lengths(tmp_path):
    prompts = load_prompts(str(_prompts(tmp_path)))
    assert [s.output_tokens for s in prompts.samples] == [4, 6, 5]
    assert prompts.samples[2].text.startswith("the quick") and prompts.samples[2].input_tokens >= 1
    default = tmp_path / "default.jsonl"
    default.write_text('{"prompt": "hello"}\n\n')
    assert load_prompts(str(default)).samples[0].output_tokens == 128


BAD_PROMPTS = [
    ("not json\n", "line 1 is not JSON"),
    ('{"input_tokens": 8}\n', "output_tokens"),
    ('{"input_tokens": -3, "output_tokens": 4}\n', "input_tokens"),
    ('{"input_tokens": 8, "output_tokens": 1e400}\n', "output_tokens"),
    ('{"input_tokens": 8, "output_tokens": NaN}\n', "not JSON"),
    ('{"input_tokens": 99999999999999999999, "output_tokens": 4}\n', "input_tokens"),
    ('{"input_tokens": true, "output_tokens": 4}\n', "input_tokens"),
    ('{"prompt": "", "max_tokens": 4}\n', "non-empty"),
    ('{"prompt": "x", "max_tokens": 0}\n', "output_tokens"),
    ('{"prompt": "x", "temperature": 0.7}\n', "unknown key"),
    ("[1, 2]\n", "not a JSON object"),
    ("[" * 100000 + "\n", "not JSON"),
    ("\n\n", "holds no prompt"),
    (b"\xff\xfe\x00bad", "not UTF-8"),
]


@pytest.mark.parametrize("content,said", BAD_PROMPTS)
def test_a_bad_prompts_file_is_a_one_line_error(tmp_path, content, said):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(ConfigurationError) as exc:
        load_prompts(str(path))
    assert said in str(exc.value) and "\n" not in str(exc.value)


def test_a_special_file_or_a_folder_is_refused_without_being_read(tmp_path):
    fifo = tmp_path / "pipe.jsonl"
    os.mkfifo(fifo)  # opening it for reading would block until a writer came
    for path in (fifo, tmp_path, Path("/dev/zero")):
        with pytest.raises(ConfigurationError, match="not a regular file"):
            load_prompts(str(path))
    with pytest.raises(ConfigurationError, match="no built-in shape"):
        load_prompts("sharegpt")


# Model names


def test_llm_names_and_their_folders(tmp_path, monkeypatch):
    assert is_llm("tiny-llm") and is_llm("hf:meta-llama/Llama-3.2-1B") and not is_llm("resnet50")
    spec = parse_llm("tiny-llm")
    assert spec.source == "zoo" and not spec.has_weights and spec.config == LLM_ZOO["tiny-llm"]
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ConfigurationError, match="not in the local Hugging Face cache"):
        parse_llm("hf:meta-llama/Llama-3.2-1B")
    assert slug_of("hf:meta-llama/Llama-3.2-1B") == "meta-llama--Llama-3.2-1B"
    folder = tmp_path / "my-model"
    folder.mkdir()
    with pytest.raises(ConfigurationError, match=r"no config\.json"):
        parse_llm(f"hf:{folder}")
    (folder / "config.json").write_text('{"model_type": "llama"}')
    assert is_llm(str(folder)) and not parse_llm(str(folder)).has_weights
    (folder / "model.safetensors").write_bytes(b"")
    assert parse_llm(str(folder)).has_weights and parse_llm(str(folder)).slug == "my-model"


@needs_llm
def test_a_model_folder_runs_its_weights_or_random_ones_from_its_config(tmp_path, monkeypatch):
    """A folder with config.json alone runs random weights; save_pretrained's folder its own; the cache's too."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from runners.hf_llm_runner import build_model

    config_only = tmp_path / "config-only"
    LlamaConfig(**LLM_ZOO["tiny-llm"]).save_pretrained(config_only)
    random_model = build_model(parse_llm(str(config_only)), torch.float32, torch.device("cpu"))
    assert random_model.config.hidden_size == 64 and not parse_llm(str(config_only)).has_weights
    torch.manual_seed(7)
    saved = tmp_path / "with-weights"
    LlamaForCausalLM(LlamaConfig(**LLM_ZOO["tiny-llm"])).save_pretrained(saved)
    spec = parse_llm(f"hf:{saved}")
    assert spec.has_weights
    loaded = build_model(spec, torch.float32, torch.device("cpu"))
    original = LlamaForCausalLM.from_pretrained(saved)
    assert torch.equal(loaded.model.embed_tokens.weight, original.model.embed_tokens.weight)
    snapshot = tmp_path / "hub" / "models--acme--tiny" / "snapshots" / "0123abc"
    snapshot.parent.mkdir(parents=True)
    config_only.rename(snapshot)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    cached = parse_llm("hf:acme/tiny")
    assert cached.source == "hub" and cached.path == snapshot and cached.slug == "acme--tiny"


# The study's space and bounds


def test_an_llm_space_on_a_gpu_tunes_the_step_size_and_runs_no_int8():
    space = llm_space(load_space("h200"))
    assert space.knobs["max_batch_tokens"].group == "runner"
    assert set(space.knobs["precision"].values) <= {"fp32", "fp16", "bf16"}
    assert "max_batch_tokens" not in llm_space(load_space("cpu")).knobs


def test_the_bounds_a_study_constrains():
    window = WindowSettings(max_ttft_ms=500, max_tpot_ms=30)
    tokens_only = RunOptions(model="tiny-llm", max_latency_ms=math.inf, window=window)
    assert tokens_only.bounds() == {"ttft": ("ttft_p99_ms", 500), "tpot": ("tpot_p99_ms", 30)}
    both = RunOptions(model="tiny-llm", max_latency_ms=4000, window=window)
    assert list(both.bounds()) == ["latency", "ttft", "tpot"]
    assert bounds_label(math.inf, window) == "ttft500ms,tpot30ms"
    assert RunOptions(model="resnet50", max_latency_ms=50).bounds() == {"latency": ("p99_ms", 50)}


def test_token_latencies_are_read_from_loadgen_s_detail_log(tmp_path):
    entries = {
        "result_first_token_99.00_percentile_latency_ns": 8_000_000,
        "result_first_token_50.00_percentile_latency_ns": 2_000_000,
        "result_time_per_output_token_99.00_percentile_ns": 1_500_000,
        "result_99.00_percentile_latency_ns": 9,
    }
    lines = [":::MLLOG " + json.dumps({"key": k, "value": v}) for k, v in entries.items()]
    (tmp_path / "mlperf_log_detail.txt").write_text("\n".join([*lines, ":::MLLOG {broken"]) + "\n")
    assert parse_token_latencies(tmp_path) == {"ttft_p99": 8e6, "ttft_p50": 2e6, "tpot_p99": 1.5e6}


def test_a_token_tail_is_proven_once_more_queries_are_past_a_bound_than_the_percentile_allows():
    nan = math.nan
    tail = TokenTail(ttft_s=0.1, tpot_s=0.01, quantile=0.99, total=500)
    assert tail.needed == 6  # 1% of 500 queries, and the interpolated percentile's one more
    late = [(0.0, 0.2, 1.0, 10)] * 5  # first tokens 200 ms after issue
    assert tail.over(late, now=1.0) is None
    waiting = [(0.5, nan, nan, 0)]  # no first token yet, 150 ms after its issue
    assert tail.over(late + waiting, now=0.65) == ("ttft", 6)
    assert tail.over(late + waiting, now=0.55) is None
    slow = [(0.0, 0.01, 0.5, 11)] * 6  # 49 ms per token after the first
    assert tail.over(slow, now=1.0) == ("tpot", 6)


# Bad input on the command line: exit 2, one line, nothing written


def _cli_rows(tmp_path: Path) -> list[tuple[list[str], str]]:
    corrupt = tmp_path / "corrupt.jsonl"
    corrupt.write_text('{"input_tokens": 8, "output_tokens": 4}\n{"input_tokens": \n')
    plugin = ["--meter", "py:fakemeter:ConstantMeter"]
    llm = ["run", "--model", "tiny-llm", "--device", "cpu", "--out", str(tmp_path / "studies"), *plugin]
    return [
        ([*llm, "--max-ttft", "500ms", "--prompts", str(corrupt)], "line 2 is not JSON"),
        ([*llm, "--max-ttft", "500ms", "--prompts", "/dev/zero"], "not a regular file"),
        ([*llm, "--max-ttft=-5ms"], "--max-ttft"),
        ([*llm, "--max-tpot", "0ms"], "--max-tpot"),
        ([*llm, "--max-tpot", "30"], "--max-tpot"),
        (llm, "needs a bound"),
        ([*llm, "--max-ttft", "500ms", "--sampler", "learned"], "not tokens"),
        (["run", "--model", "tiny-cnn", "--device", "cpu", "--max-latency", "50ms", "--max-ttft", "1s"], "for LLMs"),
        (["run", "--model", "tiny-cnn", "--device", "cpu"], "needs a latency bound"),
        (["run", "--model", "hf:no-such-org/no-such-model", "--device", "cpu", "--max-ttft", "1s"], "meter plugin"),
        (["run", "--model", "hf:no-org/no-model", "--device", "cpu", "--max-ttft", "1s", *plugin], "not in the local"),
        (["run", "--model", "openai://127.0.0.1:9/v1#m", "--device", "sim:orin", "--max-ttft", "1s"], "a twin models"),
    ]


def test_bad_llm_input_is_refused_in_one_line_and_nothing_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "no-cache"))
    monkeypatch.setenv("TUNE_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("TUNE_POWERCAP_ROOT", str(tmp_path / "no-rapl"))
    for args, said in _cli_rows(tmp_path):
        before = folder_state(tmp_path)
        code, _out, err = in_process(*args)
        lines = err.strip().splitlines()
        assert code == 2 and len(lines) == 1 and said in lines[0], (args, err)
        assert folder_state(tmp_path) == before, f"{args} wrote something"


# End to end on the CPU (a tiny random LLM, real LoadGen windows)


@needs_llm
@needs_loadgen
@pytest.mark.slow
def test_every_scenario_times_tokens_and_charges_energy_to_them(tmp_path):
    from fakemeter import ConstantMeter

    from runners import make_runner
    from tuner.measure.session import measure_with

    runner = make_runner("tiny-llm", "cpu")
    runner.prepare(4, "fp32", {"graph": "eager"})
    try:
        for scenario, options in (("offline", {}), ("singlestream", {}), ("server", {"server_target_qps": 150})):
            settings = WindowSettings(
                scenario=scenario, window_s=0.5, warmup_s=0.1, prompts=str(_prompts(tmp_path)), options=options
            )
            m = measure_with(runner, ConstantMeter(watts=10.0), 4, settings, log_dir=tmp_path / scenario)
            assert m.valid, (scenario, m.reason)
            t = m.tokens
            assert t is not None and t.output_tokens >= m.queries > 0
            assert t.j_per_token == pytest.approx(m.energy_j / t.output_tokens)
            assert m.j_per_query == pytest.approx(m.energy_j / m.queries)
            assert 0 < t.ttft_p50_ms <= t.ttft_p90_ms <= t.ttft_p99_ms
            assert 0 <= t.tpot_p50_ms <= t.tpot_p99_ms
            # LoadGen times TTFT/TPOT itself where it reports them (not in Offline).
            assert t.latency_clock == ("sut-monotonic" if scenario == "offline" else "loadgen")
            assert m.extra["loadgen_log_dir"] == str(tmp_path / scenario)
    finally:
        runner.close()


@needs_llm
@needs_loadgen
@pytest.mark.slow
def test_a_server_window_that_cannot_keep_up_is_cut_once_its_ttft_tail_is_proven_over(tmp_path):
    """One sequence at a time against a rate far above it: the queue grows, and the window ends at the proof."""
    from fakemeter import ConstantMeter

    from runners import make_runner
    from tuner.measure.session import measure_with

    runner = make_runner("tiny-llm", "cpu")
    runner.prepare(1, "fp32", {})
    settings = WindowSettings(
        scenario="server",
        window_s=2.0,
        warmup_s=0.1,
        prompts=str(_prompts(tmp_path)),
        options={"server_target_qps": 400},
        max_ttft_ms=2.0,
    )
    try:
        m = measure_with(runner, ConstantMeter(watts=10.0), 1, settings, log_dir=tmp_path / "cut")
    finally:
        runner.close()
    assert m.valid and m.extra["cut"] == "tail-over-bound" and m.extra["cut_bound"] == "ttft"
    assert m.extra["tail_over_queries"] >= m.extra["tail_over_needed"] > 0
    # Metered up to the cut, long before the 2 s window: the queued queries' waits count as their TTFT.
    assert m.duration_s < 1.5 and m.tokens.latency_clock == "sut-monotonic" and m.tokens.ttft_p99_ms > 2.0


@needs_llm
@needs_loadgen
@pytest.mark.slow
def test_tune_run_an_llm_under_ttft_and_tpot_bounds_on_the_cpu(tmp_path):
    out = tmp_path / "studies"
    path = os.pathsep.join([str(FAKES), *filter(None, [os.environ.get("PYTHONPATH")])])
    env = {"PYTHONPATH": path, "TUNE_POWERCAP_ROOT": str(tmp_path / "no-rapl")}
    r = run_cli(
        "run",
        *("--model", "tiny-llm", "--device", "cpu", "--meter", "py:fakemeter:ConstantMeter"),
        *("--scenario", "server", "--target-qps", "150", "--prompts", str(_prompts(tmp_path))),
        *("--max-ttft", "20s", "--max-tpot", "5s", "--window", "1", "--batch-sizes", "2,8"),
        *("--trials", "2", "--seed", "0", "--out", str(out), "--json"),
        env=env,
    )
    assert r.returncode == 0, r.stderr
    assert "random weights" in r.stderr
    payload = json.loads(r.stdout)
    best = payload["best"]
    assert best is not None and payload["max_ttft_ms"] == 20000 and payload["max_tpot_ms"] == 5000
    assert best["j_per_token"] == pytest.approx(best["avg_w"] / best["tokens_per_s"], rel=0.02)
    assert best["avg_w"] == pytest.approx(42.0, rel=1e-3)  # the constant-power plugin's draw
    assert best["ttft_p99_ms"] > 0 and best["tpot_p99_ms"] > 0 and best["j_per_query"] > best["j_per_token"]
    study = optuna.load_study(study_name=payload["study"], storage=f"sqlite:///{out / 'tune.db'}")
    assert payload["study"].endswith("|ttft20000ms,tpot5000ms")
    trial = study.trials[best["trial"]]
    assert set(named_constraints(trial.system_attrs)) == {"ttft", "tpot"}  # no query bound was given
    assert trial.value == pytest.approx(best["j_per_token"])
    folder = out / "cpu" / "tiny-llm" / "server-150qps"
    with open(folder / "trials.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert {"j_per_token", "tokens_per_s", "ttft_p50_ms", "ttft_p90_ms", "tpot_p99_ms"} <= set(rows[0])
    pareto = json.loads((folder / "pareto.json").read_text())
    assert pareto["energy_key"] == "j_per_token" and pareto["latency_key"] == "tpot_p99_ms"
    assert pareto["max_latency_ms"] is None and (folder / "pareto.png").stat().st_size > 0
    detail = Path(trial.user_attrs["loadgen_logs"]) / "mlperf_log_detail.txt"
    assert "result_first_token_99.00_percentile_latency_ns" in detail.read_text()
