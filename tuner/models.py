"""Model names a user may pass to --model, checked before anything touches hardware."""

from __future__ import annotations

from pathlib import Path

from runners.profile import profile_names
from tuner.errors import UserError


def check_model(model: str) -> None:
    """Accept a zoo model (every zoo model has a committed profile) or an existing .onnx file."""
    if model.endswith(".onnx"):
        if not Path(model).is_file():
            raise UserError(f"ONNX file {model} not found: check the path")
        return
    if model not in profile_names():
        raise UserError(
            f"unknown model {model!r}: known models are {', '.join(profile_names())}, or a path to a .onnx file"
        )
