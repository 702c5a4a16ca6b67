"""Model names a user may pass to --model, and where each model's per-layer profile comes from."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from runners import llm_spec, user_model
from runners.factory import check_runtime
from runners.profile import ModelProfile, load_profile, profile_names
from tuner.errors import ConfigurationError, UserError, did_you_mean

# An ONNX file is a protobuf ModelProto; its first field is ir_version (field 1, varint), tag byte 0x08.
_ONNX_FIRST_BYTE = 0x08
FILE_SUFFIXES = (".onnx", ".engine", ".plan")


def device_models(device: Any) -> list[str]:
    """Models a plugin device declares as its own (its optional ``models()``), else none."""
    declared = getattr(device, "models", None)
    return list(declared()) if callable(declared) else []


def check_model(model: str, runtime: str = "auto", simulated: bool = False, device: Any = None) -> None:
    """Accept a zoo model, a ``py:module:factory`` model, a .onnx/.engine/.plan file, or a device's own model.

    Also checks that ``runtime`` can run it, so a wrong pairing fails before
    the device is opened; a text file named .onnx, or an ONNX file where
    onnxruntime is missing, is refused here rather than after the study
    storage was created. A twin runs any model it can profile (a zoo model, an
    ONNX graph, a ``py:`` factory: see :func:`profiled`), and profiles it here, so a
    model it cannot run is refused before anything is created. A device whose knobs depend
    on the runtime (a Jetson's DLAs need TensorRT) is told which one runs.
    A causal LM (runners.llm_spec) must name a model that exists and runs on
    transformers, which must be installed.
    """
    if llm_spec.is_llm(model):
        _check_llm(model, runtime, simulated, device)
        return
    if simulated and runtime == "tensorrt" and model in profile_names():
        resolved = runtime  # a TensorRT twin runs zoo models; the twin itself refuses a runtime it does not model
    else:
        resolved = check_runtime(model, runtime)
    use_runtime = getattr(device, "use_runtime", None)
    if use_runtime is not None:
        use_runtime(resolved)
    is_file = not user_model.is_user_model(model) and Path(model).suffix.lower() in FILE_SUFFIXES
    if simulated and is_file and Path(model).suffix.lower() != ".onnx":
        raise ConfigurationError(
            f"a digital twin runs a model from its graph: give the .onnx file {Path(model).stem} was built from, "
            f"a {user_model.EXAMPLE} factory or a zoo model ({', '.join(profile_names())}), not a TensorRT engine"
        )
    if user_model.is_user_model(model):
        user_model.check(model)
        if simulated:
            profiled(model)
        return
    if Path(model).suffix.lower() == ".onnx":
        _check_onnx(Path(model), needs_onnxruntime=resolved == "onnxruntime" and not simulated)
        if simulated:
            profiled(model)
        return
    if is_file:
        if not Path(model).is_file():
            raise ConfigurationError(f"model file {model} not found: check the path")
        return
    own = device_models(device)
    if model not in profile_names() and model not in own:
        known = [*own, *profile_names()]
        raise ConfigurationError(
            f"unknown model {model!r}{did_you_mean(model, known)}: known models are "
            f"{', '.join(known)}, a {user_model.EXAMPLE} factory, or a path to a .onnx or TensorRT .engine file"
        )


def _check_llm(model: str, runtime: str, simulated: bool, device: Any) -> None:
    if model.startswith(llm_spec.ENGINE_PREFIX):
        _check_engine(model, runtime, simulated)
        return
    llm_spec.parse_llm(model)
    if runtime not in ("auto", "torch"):
        raise ConfigurationError(f"{model} runs on transformers (PyTorch): drop --runtime {runtime}")
    use_runtime = getattr(device, "use_runtime", None)
    if use_runtime is not None:
        use_runtime("torch")
    if simulated:
        return  # the twins decode from the model's shape (tuner.devices.virtual.decode)
    if importlib.util.find_spec("transformers") is None:
        raise ConfigurationError(f"running {model} needs transformers: pip install 'powertune[llm]'")


def _check_engine(model: str, runtime: str, simulated: bool) -> None:
    """A server the user deploys: a well-formed URL (and engine file), on a device that is not a twin.

    A server the tool does not start must answer and serve the model now, before any study file is made.
    """
    from runners.engine_server import load_engine
    from runners.openai_engine import EngineClient, parse_target

    target = parse_target(model)
    if target.engine is not None:
        load_engine(target.engine)
    if runtime != "auto":
        raise ConfigurationError(f"{model} is a server that runs its own runtime: drop --runtime {runtime}")
    if simulated:
        raise ConfigurationError(
            f"a twin models a decoder from its configuration, not a server: run {model} on the device it serves "
            "from, or give the twin the model's folder or a built-in LLM name (llama3.2-1b-random)"
        )
    if target.engine is None:
        EngineClient(target).check()


def model_slug(model: str) -> str:
    """The folder name of a model's results: a file's stem, a factory's module.function, or the zoo name."""
    if model.startswith(llm_spec.ENGINE_PREFIX):
        from runners.openai_engine import engine_slug

        return engine_slug(model)
    if llm_spec.is_llm(model):
        return llm_spec.slug_of(model)
    if user_model.is_user_model(model):
        module, factory = user_model.parse(model)
        return f"{module}.{factory}"
    if Path(model).suffix.lower() in FILE_SUFFIXES:
        return Path(model).stem
    return model


def _check_onnx(path: Path, needs_onnxruntime: bool) -> None:
    if path.is_dir():
        raise ConfigurationError(f"--model {path} is a folder: give the path of a .onnx file")
    try:
        with open(path, "rb") as fh:
            head = fh.read(1)
    except OSError as exc:
        raise ConfigurationError(f"ONNX file {path} cannot be read ({exc.strerror}): check the path") from None
    if head != bytes([_ONNX_FIRST_BYTE]):
        raise ConfigurationError(f"{path} is not an ONNX model (empty or not a protobuf ModelProto): export it again")
    if needs_onnxruntime and importlib.util.find_spec("onnxruntime") is None:
        raise ConfigurationError(f"running {path.name} needs onnxruntime: pip install 'powertune[onnx]'")


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
    if model.endswith(".onnx") or (user_model.is_user_model(model) and getattr(device, "simulated", False)):
        try:
            profile = profiled(model)
        except UserError as exc:
            return None, str(exc)
        how = "the ONNX graph of" if model.endswith(".onnx") else "one CPU forward of"
        return profile, f"profiled from {how} {model}"
    return None, f"no per-layer profile for {model}"


_ONNX_PROFILES: dict[tuple[str, int, int], ModelProfile] = {}


def profiled(model: str) -> ModelProfile:
    """A model's per-layer FLOP/byte profile, whatever the model: what a digital twin runs it from.

    A zoo model has its committed profile; a .onnx file is profiled from its
    graph and a ``py:`` factory from one fp32 forward on the CPU (torch), as
    the committed ones were made, once per process for each version of the
    file. A model that cannot be profiled is a one-line error.
    """
    if model in profile_names():
        return load_profile(model)
    if user_model.is_user_model(model):
        return user_model.profile(model)
    path = Path(model)
    if path.suffix.lower() != ".onnx":
        raise UserError(f"no per-layer profile for {model}: a twin runs zoo models, .onnx files and py: factories")
    try:
        stat = path.stat()
    except OSError as exc:
        raise UserError(f"ONNX file {model} cannot be read ({exc.strerror}): check the path") from None
    key = (str(path.resolve()), stat.st_mtime_ns, stat.st_size)
    if key not in _ONNX_PROFILES:
        from runners.profile_onnx import profile_onnx

        _ONNX_PROFILES[key] = profile_onnx(path)
    return _ONNX_PROFILES[key]


ZOO_INPUT_NAMES = {"bert-base": "ids", "bert-large": "ids"}
"""A zoo model's input name: its forward argument (``x``; BERT's token ids ``ids``), the name
torch.onnx.export gives a graph input unless told otherwise (``input_names=``)."""


def model_inputs(model: str) -> tuple[list[tuple[str, list[int]]], str]:
    """The model's inputs, name and shape per sample (no batch axis), and where they were read.

    A zoo model's from its committed profile and its forward argument; an
    ONNX file's from its graph (a symbolic axis beyond the batch is refused:
    an engine needs a fixed one); a ``py:`` factory's from its own input
    description (this imports it, and needs torch).
    """
    if model in profile_names():
        name = ZOO_INPUT_NAMES.get(model, "x")
        return [(name, list(load_profile(model).input_shape))], (
            f"{model}'s forward argument as torch.onnx.export names it; export with input_names=['{name}'] to match"
        )
    if user_model.is_user_model(model):
        try:
            return user_model.described_inputs(model), f"the input description of {model}"
        except ImportError:
            raise UserError(f"reading the inputs of {model} needs PyTorch: pip install 'powertune[torch]'") from None
    path = Path(model)
    if path.suffix.lower() != ".onnx":
        raise UserError(f"the inputs of {model} are unknown: export a zoo model, an .onnx file or a py: factory")
    from runners.profile_onnx import graph_inputs

    found = []
    for name, dims, _ in graph_inputs(path):
        sample = (dims or [])[1:]
        if dims is None or not all(isinstance(d, int) and d > 0 for d in sample):
            raise UserError(f"input {name!r} of {path.name} has no fixed shape beyond its batch axis: fix the file")
        found.append((name, [int(d) for d in sample]))
    return found, f"the graph inputs of {path.name}"


# ONNX TensorProto element types of floating inputs, by the precision knob's names.
_ONNX_FLOATS = {1: "fp32", 10: "fp16", 16: "bf16"}


def fixed_knobs(model: str, runtime: str, knobs: Any) -> dict[str, tuple[Any, str]]:
    """Runner knobs among ``knobs`` that cannot change what ``model`` computes or how fast: value and reason.

    An ONNX file fixes its precision (its floating inputs' type) and, under
    onnxruntime or TensorRT, its layout and graph; channels_last changes only
    2-D convolutions, so a model without one (token models such as BERT) runs
    the same either way. A study pins these before its first trial, whatever
    the sampler, so none proposes a value the runner refuses or spends a trial
    on a knob that changes nothing.
    """
    if llm_spec.is_llm(model):
        why = "an LLM has no 2-D convolution, the only work channels_last changes"
        return {"channels_last": (False, why)} if "channels_last" in knobs else {}
    resolved = check_runtime(model, runtime)
    name = Path(model).name if Path(model).suffix.lower() in FILE_SUFFIXES else model
    fixed: dict[str, tuple[Any, str]] = {}
    if resolved in ("onnxruntime", "tensorrt"):
        fixed["channels_last"] = (False, f"{resolved} runs the layout the file was exported with")
        fixed["graph"] = ("eager", f"{resolved} runs its own graph, not PyTorch's CUDA graphs or torch.compile")
    if resolved == "onnxruntime":
        from runners.profile_onnx import graph_inputs

        types = [elem for _, _, elem in graph_inputs(Path(model))]
        precision = next((_ONNX_FLOATS[t] for t in types if t in _ONNX_FLOATS), "fp32")
        takes = f"takes {precision} inputs" if any(t in _ONNX_FLOATS for t in types) else "takes no float input"
        fixed["precision"] = (precision, f"{name} {takes}, so the file fixes the precision")
    elif resolved == "torch" and "channels_last" in knobs:
        try:
            profile = profiled(model)
        except UserError:  # a forward that runs only where the study runs it (a CUDA-only op): nothing pinned
            profile = None
        if profile is not None and not any(layer.op == "conv2d" for layer in profile.layers):
            fixed["channels_last"] = (False, f"{name} has no 2-D convolution, the only work channels_last changes")
    return {k: v for k, v in fixed.items() if k in knobs}
