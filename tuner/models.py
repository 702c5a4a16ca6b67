"""Model names a user may pass to --model, and where each model's per-layer profile comes from."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from runners.profile import ModelProfile, load_profile, profile_names
from tuner.errors import UserError, did_you_mean

# An ONNX file is a protobuf ModelProto; its first field is ir_version (field 1, varint), tag byte 0x08.
_ONNX_FIRST_BYTE = 0x08


def device_models(device: Any) -> list[str]:
    """Models a plugin device declares as its own (its optional ``models()``), else none."""
    declared = getattr(device, "models", None)
    return list(declared()) if callable(declared) else []


def check_model(model: str, simulated: bool = False, device: Any = None) -> None:
    """Accept a zoo model, a readable ONNX file, or a model the device declares as its own.

    A text file named .onnx, or an ONNX file where onnxruntime is missing,
    is refused here rather than after the study storage was created.
    """
    if model.endswith(".onnx"):
        _check_onnx(Path(model), simulated)
        return
    own = device_models(device)
    if model not in profile_names() and model not in own:
        known = [*own, *profile_names()]
        raise UserError(
            f"unknown model {model!r}{did_you_mean(model, known)}: known models are "
            f"{', '.join(known)}, or a path to a .onnx file"
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


def model_profile(model: str, device: Any = None) -> tuple[ModelProfile | None, str]:
    """The model's per-layer FLOPs and bytes and where they came from, or None and why there is none.

    Order: the device's own ``profile(model)`` (a plugin knows its models
    best), the committed zoo profile, then the ONNX graph of a .onnx file.
    """
    declared = getattr(device, "profile", None)
    if callable(declared) and model in device_models(device):
        profile = declared(model)
        if profile is not None:
            return profile, f"profile of {model} declared by the device"
        return None, f"the device declares {model} without a per-layer profile"
    if model in profile_names():
        return load_profile(model), f"committed profile runners/profiles/{model}.json"
    if model.endswith(".onnx"):
        from runners.profile_onnx import profile_onnx

        try:
            return profile_onnx(Path(model)), f"profiled from the ONNX graph of {model}"
        except UserError as exc:
            return None, str(exc)
    return None, f"no per-layer profile for {model}"
