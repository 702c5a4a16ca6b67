"""Model names a user may pass to --model, checked before anything touches disk or hardware."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from runners.profile import profile_names
from tuner.errors import UserError, did_you_mean

# An ONNX file is a protobuf ModelProto; its first field is ir_version (field 1, varint), tag byte 0x08.
_ONNX_FIRST_BYTE = 0x08


def check_model(model: str, simulated: bool = False) -> None:
    """Accept a zoo model (every zoo model has a committed profile) or a readable ONNX file.

    A text file named .onnx, or an ONNX file where onnxruntime is missing,
    is refused here rather than after the study storage was created.
    """
    if model.endswith(".onnx"):
        _check_onnx(Path(model), simulated)
        return
    if model not in profile_names():
        raise UserError(
            f"unknown model {model!r}{did_you_mean(model, profile_names())}: known models are "
            f"{', '.join(profile_names())}, or a path to a .onnx file"
        )


def _check_onnx(path: Path, simulated: bool) -> None:
    if simulated:
        raise UserError(
            f"the digital twins model the zoo models only ({', '.join(profile_names())}): "
            f"measure {path.name} on hardware"
        )
    if path.is_dir():
        raise UserError(f"--model {path} is a folder: give the path of a .onnx file")
    try:
        with open(path, "rb") as fh:
            head = fh.read(1)
    except OSError as exc:
        raise UserError(f"ONNX file {path} cannot be read ({exc.strerror}): check the path") from None
    if head != bytes([_ONNX_FIRST_BYTE]):
        raise UserError(f"{path} is not an ONNX model (empty or not a protobuf ModelProto): export it again")
    if importlib.util.find_spec("onnxruntime") is None:
        raise UserError(f"running {path.name} needs onnxruntime: pip install 'powertune[onnx]'")
