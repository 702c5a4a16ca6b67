"""An LLM study's answer as the command line of the engine that serves it: vLLM or llama.cpp's server.

Both start from the export's engine settings (tuner.deploy.EngineSettings),
with the device's tuned mode beside them as comments (``tune apply`` sets
it; no engine flag can). The flags, from each project's own reference:

- vLLM (``vllm serve``, docs.vllm.ai "Engine Arguments"): ``--max-num-seqs``
  (sequences per iteration), ``--max-num-batched-tokens`` (tokens per
  iteration), ``--dtype {auto,half,float16,bfloat16,float,float32}``,
  ``--enforce-eager`` ("always use eager-mode PyTorch": no CUDA graphs); a
  study that ran graphs or compiled decode leaves vLLM its default, which
  compiles and captures CUDA graphs.
- llama.cpp (``llama-server``, tools/server/README.md): ``-np, --parallel N``
  (server slots), ``-ngl, --n-gpu-layers all``, ``-b, --batch-size N``
  (logical batch), ``-cb, --cont-batching`` (its default), ``-fa, --flash-attn
  [on|off|auto]``, ``-c, --ctx-size N`` (the whole context, shared by the
  slots). The weights' precision is the GGUF file's own (llama-quantize
  makes it), so precision becomes the KV cache type (``-ctk``/``-ctv``
  f16 or bf16, f32) and a comment; llama.cpp captures CUDA graphs on its own.
"""

from __future__ import annotations

import shlex
from typing import Any

from runners.llm_spec import ENGINE_PREFIX, HF_PREFIX, LLM_ZOO
from runners.openai_engine import ENGINE_KNOB_PREFIX
from tuner.deploy import EngineSettings, ExportedConfig
from tuner.errors import UserError

ENGINE_FORMATS = ("vllm", "llamacpp")
ENGINE_SUFFIX = {"vllm": ".vllm.sh", "llamacpp": ".llamacpp.sh"}
ENGINE_LIMITS = {
    "vllm": "sets no clock, power limit or mode (tune apply does); engine settings the study did not tune keep "
    "vLLM's defaults",
    "llamacpp": "sets no clock, power limit or mode (tune apply does); the weights' precision is the GGUF file's; "
    "--ctx-size is left to you (the slots share it)",
}
VLLM_DTYPES = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}
LLAMACPP_CACHE = {"fp16": "f16", "bf16": "bf16", "fp32": "f32"}
# Runner knobs an engine flag carries (or, channels_last, none needs); the others are the device's or the engine
# file's own.
ENGINE_KNOBS = ("precision", "graph", "max_batch_tokens", "channels_last")


def _settings(exported: ExportedConfig, fmt: str) -> EngineSettings:
    if exported.engine is None:
        raise UserError(
            f"the {fmt} format is an LLM engine's command line; {exported.model} is not an LLM study: "
            "export yaml, triton, trtexec, env or json instead"
        )
    return exported.engine


def model_argument(model: str) -> tuple[str, str | None]:
    """What the engine loads for the study's model, and a note when it is the user's to fill in."""
    if model.startswith(ENGINE_PREFIX):
        from runners.openai_engine import parse_target

        return parse_target(model).name, None
    if model in LLM_ZOO:
        return "MODEL", f"{model} ran with random weights of its shape: put the real model in place of MODEL"
    if model.startswith(HF_PREFIX):
        return model[len(HF_PREFIX) :], None
    return model, None


def device_lines(exported: ExportedConfig) -> list[str]:
    """The device's side of the answer, as comment lines: the mode ``tune apply`` sets before the engine starts."""
    device = {k: v for k, v in exported.knobs.items() if k not in ENGINE_KNOBS and not k.startswith(ENGINE_KNOB_PREFIX)}
    twin = " (tuned on a digital twin, not measured on hardware)" if exported.twin else ""
    lines = [f"# device {exported.device_kind}{twin}: apply its mode first with tune apply on the YAML export"]
    if device:
        lines.append("#   " + " ".join(f"{k}={v}" for k, v in device.items()))
    said = "simulated" if exported.twin else "measured"
    for key in ("j_per_token", "ttft_p99_ms", "tpot_p99_ms"):
        if key in exported.metrics:
            lines.append(f"#   {said} {key} = {float(exported.metrics[key]):.4g}")
    return lines


def _script(exported: ExportedConfig, fmt: str, argv: list[str], notes: list[str]) -> str:
    source = exported.provenance
    origin = f"{exported.model}, study {source.study} trial {source.trial}"
    lines = ["#!/bin/sh", f"# powertune: {origin}", f"# cannot express: {ENGINE_LIMITS[fmt]}"]
    lines += device_lines(exported) + [f"# {note}" for note in notes] + ["set -e", "exec " + shlex.join(argv)]
    return "\n".join(lines) + "\n"


def _port(exported: ExportedConfig) -> list[str]:
    if exported.model.startswith(ENGINE_PREFIX):
        from runners.openai_engine import parse_target

        return ["--port", str(parse_target(exported.model).port)]
    return []


def _own(settings: EngineSettings, notes: list[str]) -> None:
    if settings.settings:
        notes.append("the engine file's own settings: " + " ".join(f"{k}={v}" for k, v in settings.settings.items()))
    if settings.command:
        notes.append(f"the study's command line: {settings.command}")


def vllm(exported: ExportedConfig) -> str:
    """``vllm serve`` with the study's sequences, tokens per step, dtype and graph mode."""
    s = _settings(exported, "vllm")
    model, note = model_argument(exported.model)
    notes = [note] if note else []
    argv: list[str] = ["vllm", "serve", model, *_port(exported), "--max-num-seqs", str(s.max_seqs)]
    if s.max_batch_tokens is not None:
        argv += ["--max-num-batched-tokens", str(s.max_batch_tokens)]
    if s.precision is not None:
        dtype = VLLM_DTYPES.get(s.precision)
        if dtype is None:
            notes.append(f"precision {s.precision}: vLLM takes it as --quantization, not --dtype; choose it there")
        else:
            argv += ["--dtype", dtype]
    if s.graph == "eager":
        argv.append("--enforce-eager")
    elif s.graph is not None:
        notes.append(f"graph {s.graph}: vLLM's default (compiled, CUDA graphs) is kept")
    _own(s, notes)
    return _script(exported, "vllm", argv, notes)


def llamacpp(exported: ExportedConfig) -> str:
    """``llama-server`` with the study's sequences as slots, its step size, every layer on the GPU."""
    s = _settings(exported, "llamacpp")
    model, note = model_argument(exported.model)
    notes = [note] if note else []
    gguf = model if model.endswith(".gguf") else f"{model}.gguf"
    if not model.endswith(".gguf"):
        notes.append(f"llama-server loads GGUF: convert {model} (convert_hf_to_gguf.py) to {gguf}")
    argv: list[str] = ["llama-server", "-m", gguf, *_port(exported), "--parallel", str(s.max_seqs), "-ngl", "all"]
    argv.append("--cont-batching")
    if s.max_batch_tokens is not None:
        argv += ["--batch-size", str(s.max_batch_tokens)]
    if s.precision is not None:
        cache = LLAMACPP_CACHE.get(s.precision)
        if cache is not None:
            argv += ["--cache-type-k", cache, "--cache-type-v", cache]
        notes.append(
            f"precision {s.precision}: quantize the GGUF to match (llama-quantize); the flags set the KV cache"
        )
    if s.graph == "eager":
        notes.append("graph eager: llama.cpp captures CUDA graphs itself; the study ran without them")
    notes.append(f"--ctx-size: {s.max_seqs} slots share it; give each the longest prompt plus answer")
    _own(s, notes)
    return _script(exported, "llamacpp", argv, notes)


RENDER: dict[str, Any] = {"vllm": vllm, "llamacpp": llamacpp}
