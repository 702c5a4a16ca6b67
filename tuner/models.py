"""Model names a user may pass to --model, checked before anything touches disk or hardware."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from runners import user_model
from runners.factory import check_runtime
from runners.profile import profile_names
from tuner.errors import UserError, did_you_mean

# An ONNX file is a protobuf ModelProto; its first field is ir_version (field 1, varint), tag byte 0x08.
_ONNX_FIRST_BYTE = 0x08
FILE_SUFFIXES = (".onnx", ".engine", ".plan")


def check_model(model: str, runtime: str = "auto", simulated: bool = False) -> None:
    """Accept a zoo model, a ``py:module:factory`` model, or a readable .onnx/.engine/.plan file.

    Also checks that ``runtime`` can run it, so a wrong pairing fails before
    the device is opened; a text file named .onnx, or an ONNX file where
    onnxruntime is missing, is refused here rather than after the study
    storage was created. Twins model the zoo only.
    """
    resolved = check_runtime(model, runtime)
    is_file = not user_model.is_user_model(model) and Path(model).suffix.lower() in FILE_SUFFIXES
    if simulated and (is_file or user_model.is_user_model(model)):
        raise UserError(
            f"the digital twins model the zoo models only ({', '.join(profile_names())}): measure {model} on hardware"
        )
    if user_model.is_user_model(model):
        user_model.check(model)
        return
    if Path(model).suffix.lower() == ".onnx":
        _check_onnx(Path(model), resolved)
        return
    if is_file:
        if not Path(model).is_file():
            raise UserError(f"model file {model} not found: check the path")
        return
    if model not in profile_names():
        raise UserError(
            f"unknown model {model!r}{did_you_mean(model, profile_names())}: known models are "
            f"{', '.join(profile_names())}, a {user_model.EXAMPLE} factory, or a path to a .onnx or TensorRT "
            ".engine file"
        )


def model_slug(model: str) -> str:
    """The folder name of a model's results: a file's stem, a factory's module.function, or the zoo name."""
    if user_model.is_user_model(model):
        module, factory = user_model.parse(model)
        return f"{module}.{factory}"
    if Path(model).suffix.lower() in FILE_SUFFIXES:
        return Path(model).stem
    return model


def _check_onnx(path: Path, runtime: str) -> None:
    if path.is_dir():
        raise UserError(f"--model {path} is a folder: give the path of a .onnx file")
    try:
        with open(path, "rb") as fh:
            head = fh.read(1)
    except OSError as exc:
        raise UserError(f"ONNX file {path} cannot be read ({exc.strerror}): check the path") from None
    if head != bytes([_ONNX_FIRST_BYTE]):
        raise UserError(f"{path} is not an ONNX model (empty or not a protobuf ModelProto): export it again")
    if runtime == "onnxruntime" and importlib.util.find_spec("onnxruntime") is None:
        raise UserError(f"running {path.name} needs onnxruntime: pip install 'powertune[onnx]'")
