"""Pick a runner for a model argument: a zoo name or a path to an ONNX file.

Runner modules import torch or onnxruntime, both optional extras, so they are
imported here only when asked for; the core package never pays for them.
"""

from __future__ import annotations

from pathlib import Path

from runners.base import Runner
from tuner.errors import UserError


def make_runner(model: str, device: str = "cpu", weights: str | Path | None = None) -> Runner:
    """A runner for ``model`` on ``device`` (cpu, cuda, cuda:N)."""
    if model.endswith(".onnx"):
        if weights is not None:
            raise UserError("an ONNX file carries its own weights; drop the weights file")
        from runners.onnx_runner import OnnxRunner

        return OnnxRunner(model, device)
    try:
        from runners.torch_runner import TorchRunner
    except ImportError:
        from runners.profile import profile_names

        if model not in profile_names():
            raise UserError(
                f"unknown model {model!r}: known models are {', '.join(profile_names())}"
                " (or pass a path to an .onnx file)"
            ) from None
        raise UserError("zoo models need PyTorch: pip install 'powertune[torch]'") from None
    return TorchRunner(model, device, weights)
