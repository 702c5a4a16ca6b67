"""A twin's physics for a causal LM: prefill, then one decode step per output token.

Each forward pass (the prefill of ``batch`` prompts, or one decode step of
``batch`` sequences over their KV cache) is written as the kernels a decoder
runs (per layer: RMS norms, the q/k/v/o and MLP projections, rotary
embedding, the KV cache write, attention; then the head and the generation
loop's own ops) with their FLOPs and bytes, and timed and powered by the
twin's own model (tuner.devices.virtual.twin_physics: each kernel is
max(compute, memory) + its floor against the twin's roofline at the GPU clock,
and max(that, its host launch) in eager mode; power from the same rails). So
prefill comes out compute-bound (2 x parameters x prompt tokens FLOPs) and a
decode step memory-bound at small batches (weights read once a step, shared
by the batch, plus each sequence's KV cache), and the clocks, modes and power
limit act on an LLM as on any model.

What the CNN calibration cannot know is an LLM runtime's host cost per step:
eager Hugging Face ``generate`` runs about 700 small kernels a step, so at
batch 1 it is 18x above the memory floor on an H200. :data:`RUNTIMES` holds
that per runtime, each with its source; docs/twin-model.md says which figures
were fitted and which only checked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from runners.profile import LayerProfile, ModelProfile
from tuner.devices.virtual.twin_physics import PRECISION_BYTES, TwinModel
from tuner.devices.virtual.twin_schema import Runtime
from tuner.errors import ConfigurationError
from tuner.space import Config

# Bytes are counted at fp32 as in every twin profile (the twin scales them by the precision's width).
FP32 = 4.0
# Decode steps evaluated exactly; those between are interpolated (the step cost is smooth in the context).
CONTEXT_SAMPLES = 9
# Kernels of one RMS norm in eager PyTorch (Hugging Face LlamaRMSNorm: cast, pow, mean, add, rsqrt, mul,
# weight mul) and of rotary embedding applied to q and k (mul, slice-neg-cat, mul, add, each for q and k).
NORM_KERNELS = 7
ROTARY_KERNELS = 10
# Ops of the model outside the layers (embedding, the rotary table, the mask) and of the generation loop per
# step (last-position logits to fp32, argmax, the finished-sequence bookkeeping, the stop check): assumed
# counts from the structure of transformers' LlamaModel.forward and GenerationMixin._sample.
MODEL_KERNELS = 10
LOOP_KERNELS = 12


class DecoderShape(BaseModel):
    """The shape of a decoder-only transformer (a Hugging Face config's fields): all the physics needs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    layers: int = Field(gt=0)
    hidden: int = Field(gt=0)
    intermediate: int = Field(gt=0)
    heads: int = Field(gt=0)
    kv_heads: int = Field(gt=0)
    vocab: int = Field(gt=0)
    head_dim: int | None = None
    tied_embeddings: bool = False

    @property
    def dim(self) -> int:
        return self.head_dim or self.hidden // self.heads

    @property
    def layer_params(self) -> float:
        attn = self.hidden * self.dim * (2 * self.heads + 2 * self.kv_heads)
        return attn + 3 * self.hidden * self.intermediate + 2 * self.hidden

    @property
    def params(self) -> float:
        """Every parameter: layers, embedding, final norm and (if untied) the head."""
        embed = self.vocab * self.hidden
        return self.layers * self.layer_params + embed * (1 if self.tied_embeddings else 2) + self.hidden

    @property
    def kv_per_token(self) -> float:
        """KV cache elements one token adds over all layers (keys and values)."""
        return 2.0 * self.layers * self.kv_heads * self.dim

    @classmethod
    def from_hf_config(cls, config: dict[str, Any]) -> DecoderShape:
        """From a Hugging Face ``config.json`` (Llama, Qwen2, Mistral, Gemma names)."""
        try:
            return cls(
                layers=int(config["num_hidden_layers"]),
                hidden=int(config["hidden_size"]),
                intermediate=int(config["intermediate_size"]),
                heads=int(config["num_attention_heads"]),
                kv_heads=int(config.get("num_key_value_heads") or config["num_attention_heads"]),
                vocab=int(config["vocab_size"]),
                head_dim=config.get("head_dim"),
                tied_embeddings=bool(config.get("tie_word_embeddings", False)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigurationError(
                f"a decoder config needs num_hidden_layers, hidden_size, intermediate_size, num_attention_heads "
                f"and vocab_size ({exc}): give a causal LM's config.json"
            ) from None


# Llama-3.2-1B's published config.json (meta-llama/Llama-3.2-1B): 16 layers, hidden 2048, MLP 8192, 32 heads,
# 8 KV heads of 64, vocabulary 128256, tied embeddings: 1.236 B parameters, the model of the H200 figures.
LLAMA_3_2_1B = DecoderShape(
    layers=16, hidden=2048, intermediate=8192, heads=32, kv_heads=8, vocab=128256, tied_embeddings=True
)
# TinyLlama-1.1B's config.json (TinyLlama/TinyLlama-1.1B-Chat-v1.0): 22 layers, hidden 2048, MLP 5632, 32 heads,
# 4 KV heads, vocabulary 32000, untied: the model of the Orin Nano Super llama.cpp figures.
TINYLLAMA_1_1B = DecoderShape(layers=22, hidden=2048, intermediate=5632, heads=32, kv_heads=4, vocab=32000)


class LlmRuntime(BaseModel):
    """How a runtime runs the decoder: its launch cost relative to the twin's eager PyTorch, its KV cache.

    ``launch_scale`` multiplies the twin's per-operator launch cost of every
    kernel (eager); ``dynamic_cache``: the cache grows by concatenation, so a
    step copies every layer's whole cache (transformers' DynamicCache) instead
    of writing the new token's slot (a static or paged cache); ``graphs``: the
    step is one replayed CUDA graph (the twin's ``graph_replay_us`` once a
    step, no launch per kernel); ``floor_activity``: the share of a full load
    at which a replayed kernel's floor draws dynamic power in this runtime
    (None: the twin's own, fitted on CNN windows).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    description: str
    launch_scale: float = 1.0
    dynamic_cache: bool = True
    graphs: bool = False
    floor_activity: float | None = Field(default=None, ge=0.0, le=1.0)
    source: str


RUNTIMES = {
    "hf-eager": LlmRuntime(
        description="Hugging Face generate, eager, DynamicCache",
        # Fitted: the one figure it is fitted to is the H200's batch-1 TPOT (10.3 ms, Llama-3.2-1B shape, bf16,
        # 256-token prompts, 128 new tokens, observe-only); batch 16, 64 and 256 are checked, not fitted
        # (benchmarks/twin_llm_check.py, benchmarks/results/twin-llm-check).
        launch_scale=0.679,
        source="fitted to the H200's batch-1 TPOT of Hugging Face generate (eager); checked at batch 16, 64, 256",
    ),
    "graphs": LlmRuntime(
        description="a static KV cache, each decode step one replayed CUDA graph",
        dynamic_cache=False,
        graphs=True,
        # Fitted (bisection on [0, 1], benchmarks/twin_llm_check.py) to the H200's batch-1 J/token of generate over
        # the static cache with the library's compiled forward (0.644 J, 251 W; benchmarks/results/llm-h200.md):
        # with the twin's CNN-fitted 0.3 its decode drew 367 W (J/token +31%). The fit ends at the bound, 0: a
        # decode step's many small kernels (norms, rotary, the cache write) draw nothing above idle, and the 8%
        # left is the card's host time in generate's loop (the GPU idle between replays), not modelled.
        floor_activity=0.0,
        source="assumption: no launch per kernel, the twin's graph_replay_us per step (fitted on CNN windows); "
        "its floor activity fitted to the H200's batch-1 J/token of the static cache with the compiled forward "
        "(0.0, at the bound: J/token +8%; TPOT 2.29 ms vs 2.40 ms; benchmarks/results/twin-llm-check.md)",
    ),
}


def runtime_for(config: Config) -> str:
    """The runtime a configuration runs: graphs where its ``graph`` knob asks for them, else eager."""
    return "graphs" if str(config.knobs.get("graph", "eager")) in ("cudagraphs", "compile", "graphs") else "hf-eager"


def _layer(name: str, op: str, op_class: str, flops: float, weight_elems: float, act_elems: float) -> LayerProfile:
    return LayerProfile(
        name=name,
        op=op,
        flops=flops,
        weight_bytes=weight_elems * FP32,
        act_bytes=act_elems * FP32,
        matmul=op_class in ("gemm", "attention"),
        op_class=op_class,
    )


def forward_profile(shape: DecoderShape, batch: int, tokens: int, context: int, runtime: LlmRuntime) -> ModelProfile:
    """One forward pass as kernels: ``batch`` sequences of ``tokens`` new tokens each over ``context`` cached ones.

    Prefill is ``tokens`` = prompt length, ``context`` = 0; a decode step is
    ``tokens`` = 1. FLOPs and bytes are for the whole batch (the twin runs it
    as batch 1). The head runs on the last position only, as generate asks.
    """
    s, rows, span = shape, batch * tokens, context + tokens
    h, kv, q = s.hidden, s.kv_heads * s.dim, s.heads * s.dim
    layers: list[LayerProfile] = []

    def norm(tag: str, n: int) -> None:
        layers.extend(_layer(f"{tag}.{k}", "mul", "elementwise", n * h, 0.0, 2.0 * n * h) for k in range(NORM_KERNELS))

    def linear(tag: str, n: int, fan_in: int, fan_out: int) -> None:
        layers.append(
            _layer(tag, "linear", "gemm", 2.0 * n * fan_in * fan_out, fan_in * fan_out, n * (fan_in + fan_out))
        )

    for i in range(s.layers):
        norm(f"l{i}.norm1", rows)
        linear(f"l{i}.q", rows, h, q)
        linear(f"l{i}.k", rows, h, kv)
        linear(f"l{i}.v", rows, h, kv)
        layers.extend(
            _layer(f"l{i}.rope.{k}", "mul", "elementwise", rows * (q + kv) / 2, 0.0, rows * (q + kv))
            for k in range(ROTARY_KERNELS)
        )
        # The cache write: a DynamicCache concatenates (reads the cache, writes it one token longer), per k and v.
        cache = batch * (2 * context + span) * s.kv_heads * s.dim if runtime.dynamic_cache else rows * kv
        layers.extend(_layer(f"l{i}.cache.{k}", "cat", "layout_copy", 0.0, 0.0, cache) for k in ("k", "v"))
        attention = 4.0 * batch * tokens * span * q
        layers.append(
            _layer(f"l{i}.attention", "matmul", "attention", attention, 0.0, 2.0 * batch * span * kv + 2.0 * rows * q)
        )
        linear(f"l{i}.o", rows, q, h)
        layers.append(_layer(f"l{i}.add1", "add", "elementwise", rows * h, 0.0, 3.0 * rows * h))
        norm(f"l{i}.norm2", rows)
        linear(f"l{i}.gate", rows, h, s.intermediate)
        linear(f"l{i}.up", rows, h, s.intermediate)
        layers.append(
            _layer(f"l{i}.act", "silu", "elementwise", rows * s.intermediate, 0.0, 2.0 * rows * s.intermediate)
        )
        layers.append(
            _layer(f"l{i}.mul", "mul", "elementwise", rows * s.intermediate, 0.0, 3.0 * rows * s.intermediate)
        )
        linear(f"l{i}.down", rows, s.intermediate, h)
        layers.append(_layer(f"l{i}.add2", "add", "elementwise", rows * h, 0.0, 3.0 * rows * h))
    layers.append(_layer("embed", "embedding", "elementwise", 0.0, 0.0, 2.0 * rows * h))
    layers.extend(_layer(f"model.{k}", "default", "elementwise", rows, 0.0, 2.0 * rows) for k in range(MODEL_KERNELS))
    norm("norm", rows)
    linear("head", batch, h, s.vocab)
    layers.extend(
        _layer(f"loop.{k}", "default", "elementwise", batch * s.vocab / LOOP_KERNELS, 0.0, 2.0 * batch * s.vocab / 4)
        for k in range(LOOP_KERNELS)
    )
    return ModelProfile(
        model="decoder",
        task="causal-lm",
        input_shape=[tokens],
        generated_by="tuner.devices.virtual.decode",
        layers=layers,
    )


@dataclass(frozen=True)
class Phase:
    """One phase of a generation on the twin: its time, average power (rails summed) and GPU clock."""

    seconds: float
    watts: float
    gpu_mhz: float


@dataclass(frozen=True)
class Generation:
    """What a batch of generations costs on a twin: TTFT, TPOT, energy per output token, average power.

    Every sequence of the batch has the same prompt and output length, all
    decoded together (a full static batch): ``ttft_s`` is the prefill,
    ``tpot_s`` the mean decode step.
    """

    batch: int
    prompt_tokens: int
    new_tokens: int
    prefill: Phase
    decode: Phase
    runtime: str

    @property
    def ttft_s(self) -> float:
        return self.prefill.seconds

    @property
    def tpot_s(self) -> float:
        return self.decode.seconds / max(self.new_tokens - 1, 1)

    @property
    def seconds(self) -> float:
        return self.prefill.seconds + self.decode.seconds

    @property
    def energy_j(self) -> float:
        return self.prefill.seconds * self.prefill.watts + self.decode.seconds * self.decode.watts

    @property
    def output_tokens(self) -> int:
        return self.batch * self.new_tokens

    @property
    def j_per_token(self) -> float:
        return self.energy_j / self.output_tokens

    @property
    def avg_w(self) -> float:
        return self.energy_j / self.seconds


def _model_for(twin: TwinModel, runtime: LlmRuntime) -> TwinModel:
    """The twin's physics with the LLM runtime's launch cost (its per-operator costs, no module overhead).

    An LLM runtime's precision and graph mode are its own settings on every
    twin (a Jetson twin fixes fp32 eager for its CNN runner): a configuration
    that names them is run with them, one that does not with the twin's fixed
    values.
    """
    name = f"llm:{runtime.description}"
    own = Runtime(description=runtime.description, launch_scale=runtime.launch_scale, module_overhead=False)
    knob_map = {"precision": "precision", "graph": "graph", **twin.params.knob_map}
    update = {"runtimes": {**twin.params.runtimes, name: own}, "knob_map": knob_map}
    if runtime.floor_activity is not None:
        update["floor_activity"] = runtime.floor_activity
    params = twin.params.model_copy(update=update)
    return TwinModel(params, twin.space, name)


def _pass(model: TwinModel, profile: ModelProfile, config: Config) -> tuple[float, float, float]:
    """Seconds, watts and GPU clock of one forward pass (the power limit settles the clock as for any model)."""
    result = model.evaluate(profile, [config])
    return float(result.time_s[0]), float(result.power_w[0]), float(result.gpu_mhz[0])


def generate(
    twin: TwinModel,
    shape: DecoderShape,
    config: Config,
    prompt_tokens: int,
    new_tokens: int,
    runtime: str | LlmRuntime | None = None,
) -> Generation:
    """A batch of ``config.batch_size`` generations under the configuration's knobs, on the twin's physics.

    The first output token comes from the prefill; each of the other
    ``new_tokens - 1`` from a decode step over a cache one token longer
    (:data:`CONTEXT_SAMPLES` steps evaluated, the rest interpolated).
    ``runtime``: a name in :data:`RUNTIMES` (default: the configuration's
    ``graph`` knob), or a runtime of the caller's (a calibration's candidate).
    """
    if prompt_tokens < 1 or new_tokens < 1:
        raise ConfigurationError(f"a generation needs prompt and output tokens (got {prompt_tokens} and {new_tokens})")
    if isinstance(runtime, LlmRuntime):
        llm, name = runtime, runtime.description
    else:
        name = runtime or runtime_for(config)
        if name not in RUNTIMES:
            raise ConfigurationError(f"unknown LLM runtime {name!r}: choose from {', '.join(RUNTIMES)}")
        llm = RUNTIMES[name]
    model = _model_for(twin, llm)
    batch = max(config.batch_size, 1)
    knobs = {**config.knobs, "graph": "cudagraphs" if llm.graphs else "eager"}
    one = Config(knobs=knobs, batch_size=1)
    prefill = Phase(*_pass(model, forward_profile(shape, batch, prompt_tokens, 0, llm), one))
    steps = new_tokens - 1
    if steps == 0:
        return Generation(batch, prompt_tokens, new_tokens, prefill, Phase(0.0, prefill.watts, prefill.gpu_mhz), name)
    contexts = np.unique(np.linspace(prompt_tokens, prompt_tokens + steps - 1, CONTEXT_SAMPLES).round().astype(int))
    sampled = np.array([_pass(model, forward_profile(shape, batch, 1, int(c), llm), one) for c in contexts])
    every = np.arange(prompt_tokens, prompt_tokens + steps)
    seconds = np.interp(every, contexts, sampled[:, 0])
    joules = np.interp(every, contexts, sampled[:, 0] * sampled[:, 1])
    total = float(seconds.sum())
    decode = Phase(total, float(joules.sum()) / total, float(np.interp(every, contexts, sampled[:, 2]).mean()))
    return Generation(batch, prompt_tokens, new_tokens, prefill, decode, name)


def memory_floor_s(twin: TwinModel, shape: DecoderShape, precision: str, mem_mhz: float) -> float:
    """The least time a batch-1 decode step can take: every weight read once at the memory's peak bandwidth."""
    return shape.params * PRECISION_BYTES[precision] / (twin.params.bytes_per_mem_mhz * mem_mhz)
