"""Model names a user may pass to --model, checked before anything touches hardware."""

from __future__ import annotations

from pathlib import Path

from runners import user_model
from runners.factory import check_runtime
from runners.profile import profile_names
from tuner.errors import UserError

FILE_SUFFIXES = (".onnx", ".engine", ".plan")


def check_model(model: str, runtime: str = "auto") -> None:
    """Accept a zoo model, a ``py:module:factory`` model, or an existing .onnx/.engine/.plan file.

    Also checks that ``runtime`` can run it, so a wrong pairing fails before
    the device is opened.
    """
    check_runtime(model, runtime)
    if user_model.is_user_model(model):
        user_model.check(model)
        return
    if Path(model).suffix.lower() in FILE_SUFFIXES:
        if not Path(model).is_file():
            raise UserError(f"model file {model} not found: check the path")
        return
    if model not in profile_names():
        raise UserError(
            f"unknown model {model!r}: known models are {', '.join(profile_names())}, "
            f"a {user_model.EXAMPLE} factory, or a path to a .onnx or TensorRT .engine file"
        )


def model_slug(model: str) -> str:
    """The folder name of a model's results: a file's stem, a factory's module.function, or the zoo name."""
    if user_model.is_user_model(model):
        module, factory = user_model.parse(model)
        return f"{module}.{factory}"
    if Path(model).suffix.lower() in FILE_SUFFIXES:
        return Path(model).stem
    return model
