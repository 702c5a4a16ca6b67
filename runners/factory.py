"""Pick a runner for a model argument: a zoo name, a user's factory, an ONNX file, a TensorRT engine or an LLM.

Runner modules import torch, onnxruntime or tensorrt, all optional extras, so
they are imported here only when asked for; the core package never pays for them.
"""

from __future__ import annotations

from pathlib import Path

from runners import llm_spec, user_model
from runners.base import Runner
from tuner.errors import UserError

RUNTIMES = ("auto", "torch", "onnxruntime", "tensorrt")


def make_runner(
    model: str,
    device: str = "cpu",
    weights: str | Path | None = None,
    runtime: str = "auto",
) -> Runner:
    """A runner for ``model`` on ``device`` (cpu, cuda, cuda:N) through ``runtime``.

    ``auto`` picks by the model: ``.engine``/``.plan`` files run on TensorRT,
    ``.onnx`` files on onnxruntime, zoo names and ``py:`` factories on PyTorch.
    ``tensorrt`` also builds an ``.onnx`` file into an engine. A causal LM
    (runners.llm_spec) runs on transformers' continuous batching; an
    ``openai://`` one is a server the user deploys (runners.openai_engine).
    """
    if model.startswith(llm_spec.ENGINE_PREFIX):
        return _engine_runner(model, device, weights, runtime)
    if llm_spec.is_llm(model):
        return _llm_runner(model, device, weights, runtime)
    runtime = check_runtime(model, runtime)
    if runtime == "tensorrt":
        if weights is not None:
            raise UserError("a TensorRT engine carries its own weights; drop the weights file")
        from runners.tensorrt_runner import TensorRTRunner

        return TensorRTRunner(model, device)
    if runtime == "onnxruntime":
        if weights is not None:
            raise UserError("an ONNX file carries its own weights; drop the weights file")
        from runners.onnx_runner import OnnxRunner

        return OnnxRunner(model, device)
    try:
        from runners.torch_runner import TorchRunner
    except ImportError:
        raise UserError("PyTorch models need PyTorch: pip install 'powertune[torch]'") from None
    if user_model.is_user_model(model):
        return TorchRunner(user_model.load(model), device, weights)
    return TorchRunner(model, device, weights)


def _engine_runner(model: str, device: str, weights: str | Path | None, runtime: str) -> Runner:
    """An OpenAI-compatible server (runners.openai_engine): it holds its own weights and runtime."""
    if weights is not None:
        raise UserError(f"{model} is a server that loads its own weights; drop the weights file")
    if runtime != "auto":
        raise UserError(f"{model} is a server that runs its own runtime; drop --runtime {runtime}")
    from runners.openai_engine import EngineRunner

    return EngineRunner(model, device)


def _llm_runner(model: str, device: str, weights: str | Path | None, runtime: str) -> Runner:
    spec = llm_spec.parse_llm(model)
    if weights is not None:
        raise UserError(f"{model} takes its weights from its folder; drop the weights file")
    if runtime not in ("auto", "torch"):
        raise UserError(f"{model} runs on transformers (PyTorch): drop --runtime {runtime}")
    try:
        from runners.hf_llm_runner import HfLlmRunner
    except ImportError:
        raise UserError("LLM models need transformers and PyTorch: pip install 'powertune[llm]'") from None
    return HfLlmRunner(spec, device)


def check_runtime(model: str, runtime: str) -> str:
    """The runtime that will run ``model``; a mismatch is a one-line error naming the fix."""
    if runtime not in RUNTIMES:
        raise UserError(f"unknown runtime {runtime!r}: use one of {', '.join(RUNTIMES)}")
    suffix = Path(model).suffix.lower() if not user_model.is_user_model(model) else ""
    engine = suffix in (".engine", ".plan")
    if runtime == "auto":
        if engine:
            return "tensorrt"
        return "onnxruntime" if suffix == ".onnx" else "torch"
    if runtime == "tensorrt" and not (engine or suffix == ".onnx"):
        raise UserError(f"--runtime tensorrt runs .engine/.plan files or builds .onnx files, not {model!r}")
    if runtime == "onnxruntime" and suffix != ".onnx":
        raise UserError(f"--runtime onnxruntime runs .onnx files, not {model!r}")
    if runtime == "torch" and (engine or suffix == ".onnx"):
        raise UserError(f"--runtime torch runs zoo models and py: factories; {model!r} needs tensorrt or onnxruntime")
    return runtime
