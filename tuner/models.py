"""Model names a user may pass to --model, and where each model's per-layer profile comes from."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from runners.profile import ModelProfile, load_profile, profile_names
from tuner.errors import UserError


def device_models(device: Any) -> list[str]:
    """Models a plugin device declares as its own (its optional ``models()``), else none."""
    declared = getattr(device, "models", None)
    return list(declared()) if callable(declared) else []


def check_model(model: str, device: Any = None) -> None:
    """Accept a zoo model, an existing .onnx file, or a model the device declares."""
    if model.endswith(".onnx"):
        if not Path(model).is_file():
            raise UserError(f"ONNX file {model} not found: check the path")
        return
    own = device_models(device)
    if model not in profile_names() and model not in own:
        known = ", ".join([*own, *profile_names()])
        raise UserError(f"unknown model {model!r}: known models are {known}, or a path to a .onnx file")


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
