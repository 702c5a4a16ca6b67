"""The twins' LLM physics: prefill bound by compute, decode by memory, the H200 figures it was checked on."""

import pytest

from tuner.devices.virtual import decode
from tuner.devices.virtual.twin import TwinDevice
from tuner.errors import UserError
from tuner.space import Config

H200 = {"precision": "bf16", "graph": "eager", "sm_mhz": 1980, "mem_mhz": 3201, "power_limit_w": 700}


@pytest.fixture(scope="module")
def h200():
    return TwinDevice("sim:h200").model


def run(twin, batch, runtime=None, prompt=256, new=128, **knobs):
    return decode.generate(
        twin, decode.LLAMA_3_2_1B, Config(knobs={**H200, **knobs}, batch_size=batch), prompt, new, runtime
    )


def test_llama_shape_counts_the_published_parameters():
    config = {
        "num_hidden_layers": 16,
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
        "tie_word_embeddings": True,
    }
    shape = decode.DecoderShape.from_hf_config(config)
    assert shape == decode.LLAMA_3_2_1B
    assert shape.params == pytest.approx(1.236e9, rel=1e-3)
    with pytest.raises(UserError, match=r"config\.json"):
        decode.DecoderShape.from_hf_config({"hidden_size": 8})


def test_prefill_is_compute_bound_and_follows_the_sm_clock(h200):
    fast = run(h200, 64, "graphs", new=2)
    slow = run(h200, 64, "graphs", new=2, sm_mhz=990)
    # 2 x parameters x tokens against the tensor-core roofline: half the clock, nearly twice the TTFT (the
    # elementwise passes over the prompt's activations are memory-bound and do not follow the clock).
    assert 1.6 < slow.ttft_s / fast.ttft_s < 2.05
    assert slow.decode.seconds / fast.decode.seconds < slow.ttft_s / fast.ttft_s
    longer = run(h200, 64, "graphs", new=2, prompt=512)
    assert 1.8 < longer.ttft_s / fast.ttft_s < 2.2


def test_graphed_decode_is_memory_bound_and_batch_amortises_the_weights(h200):
    one = run(h200, 1, "graphs")
    fast_mem = run(h200, 16, "graphs")
    slow_mem = run(h200, 16, "graphs", mem_mhz=2201)
    assert slow_mem.tpot_s > fast_mem.tpot_s * 1.2
    # The floor: every weight read once a step at peak bandwidth; a graphed step is above it, eager far above.
    floor = decode.memory_floor_s(h200, decode.LLAMA_3_2_1B, "bf16", 3201)
    assert floor < one.tpot_s < 10 * floor
    assert run(h200, 1).tpot_s > 15 * floor
    # Sixteen sequences share each step's weight reads: far less energy per token than one.
    assert fast_mem.j_per_token < one.j_per_token / 8


def test_h200_eager_is_within_15_percent_at_the_batch_sizes_not_fitted(h200):
    """The committed launch scale was fitted to batch 1's TPOT only (benchmarks/twin_llm_check.py)."""
    assert run(h200, 1).tpot_s == pytest.approx(10.3e-3, rel=0.01)
    for batch, card in ((16, 0.149), (64, 0.048), (256, 0.0244)):
        assert run(h200, batch).j_per_token == pytest.approx(card, rel=0.15), batch


def test_h200_graphed_decode_draws_the_card_s_power_and_a_cnn_s_graphs_keep_theirs(h200):
    """The graphs runtime's floor activity was fitted to the card's batch-1 static-cache compiled run (0.644 J/token,
    251 W, TPOT 2.40 ms; benchmarks/results/llm-h200.md): with the twin's CNN-fitted value it drew 367 W (+31%)."""
    graphed = run(h200, 1, "graphs")
    assert graphed.j_per_token == pytest.approx(0.6438, rel=0.10) and graphed.decode.watts < 0.85 * 367
    assert graphed.tpot_s == pytest.approx(2.40e-3, rel=0.10)
    assert h200.params.floor_activity == pytest.approx(0.3)  # the twin's own (CNN cudagraphs windows) unchanged


def test_a_power_limit_lowers_the_clock_of_the_prefill(h200):
    free = run(h200, 256)
    capped = run(h200, 256, power_limit_w=300)
    assert capped.prefill.watts <= 300.5
    assert capped.prefill.gpu_mhz < free.prefill.gpu_mhz
    assert capped.ttft_s > free.ttft_s


def test_jetson_twins_decode_with_the_llm_precision_and_graphs():
    orin = TwinDevice("sim:orin").model
    knobs = {"nvpmodel": "MAXN", "gpu_mhz": 1300.5, "emc_mhz": 3199, "cpu_mhz": 2201.6, "cpu_cores": 12}

    def gen(runtime, **extra):
        config = Config(knobs={**knobs, **extra}, batch_size=1)
        return decode.generate(orin, decode.LLAMA_3_2_1B, config, 128, 64, runtime)

    fp32, fp16 = gen("hf-eager"), gen("hf-eager", precision="fp16")
    assert fp16.j_per_token < fp32.j_per_token
    assert gen("graphs", precision="fp16").tpot_s < fp16.tpot_s
    assert decode.runtime_for(Config(knobs={"graph": "cudagraphs"}, batch_size=1)) == "graphs"


def test_bad_generation_lengths_and_runtimes_are_user_errors(h200):
    with pytest.raises(UserError, match="prompt and output tokens"):
        run(h200, 1, new=0)
    with pytest.raises(UserError, match="unknown LLM runtime"):
        run(h200, 1, "vllm")


def test_a_twin_measures_an_llm_window_in_tokens(tmp_path):
    from tuner.devices.registry import open_device
    from tuner.measure.settings import WindowSettings

    device = open_device("sim:h200")
    settings = WindowSettings(noise=False, prompts=None)
    m = device.measure("llama3.2-1b-random", Config(knobs={"precision": "bf16"}, batch_size=16), settings)
    assert m.twin and m.meter == "twin" and m.tokens is not None and m.tokens.latency_clock == "twin"
    assert m.objective == m.tokens.j_per_token == pytest.approx(m.energy_j / m.tokens.output_tokens)
    assert m.tokens.ttft_p50_ms <= m.tokens.ttft_p99_ms and m.tokens.tpot_p99_ms < m.tokens.ttft_p99_ms
    noisy = WindowSettings(seed=3)
    again = [device.measure("llama3.2-1b-random", Config(knobs={}, batch_size=4), noisy).tokens for _ in range(2)]
    assert again[0] == again[1]
    # A folder's config.json is the shape; a CNN on the same twin runs as before.
    folder = tmp_path / "my-llm"
    folder.mkdir()
    (folder / "config.json").write_text(
        '{"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,'
        ' "vocab_size": 512}'
    )
    small = device.measure(str(folder), Config(knobs={}, batch_size=4), settings)
    assert small.tokens is not None and small.tokens.j_per_token < m.tokens.j_per_token
    assert device.measure("resnet50", device.space().default_config(8), settings).tokens is None
    with pytest.raises(UserError, match="a twin models a decoder"):
        device.measure("openai://127.0.0.1:8000/v1#m", Config(knobs={}, batch_size=1), settings)


def test_a_twin_server_window_is_continuous_batching_at_its_rate():
    from tuner.devices.registry import open_device
    from tuner.measure.settings import WindowSettings

    device = open_device("sim:h200")
    config = Config(knobs={"precision": "bf16"}, batch_size=64)

    def at(rate):
        settings = WindowSettings(scenario="server", noise=False, options={"server_target_qps": rate})
        return device.measure("llama3.2-1b-random", config, settings)

    slow, busy, over = at(0.5), at(5.0), at(200.0)
    # Little's law: more queries in flight share each step's weights, and the GPU idles less between them.
    assert slow.extra["twin_llm_running_batch"] < busy.extra["twin_llm_running_batch"] <= 64
    assert busy.tokens.j_per_token < slow.tokens.j_per_token / 4
    assert slow.extra["twin_llm_busy_share"] < busy.extra["twin_llm_busy_share"] <= 1
    # Above its capacity the queue grows through the window: the TTFT with it, the rate served is the capacity.
    assert over.qps < 200 and over.tokens.ttft_p99_ms > 1000 * busy.tokens.ttft_p99_ms / 100
    assert "over capacity" in over.extra["twin_llm_server"]
    # A step of fewer tokens prefills a prompt over more steps: a longer TTFT, the same TPOT.
    chunked = device.measure(
        "llama3.2-1b-random",
        config,
        WindowSettings(scenario="server", noise=False, options={"server_target_qps": 5.0, "max_batch_tokens": 64}),
    )
    assert chunked.tokens.ttft_p50_ms > 2 * busy.tokens.ttft_p50_ms
    assert chunked.tokens.tpot_p50_ms == pytest.approx(busy.tokens.tpot_p50_ms)
    assert busy.tokens.tpot_p99_ms > busy.tokens.tpot_p50_ms
