"""One recommended configuration, written for the tool a deployment uses.

Every format comes from the same :class:`~tuner.deploy.ExportedConfig` (the
study's one answer) and says in its first comment line what it cannot
express (:data:`LIMITS`), so nothing the study chose is dropped silently:

- ``yaml``: the export ``tune apply`` and ``tune verify`` read (with its digest).
- ``json``: the same content as JSON, for scripts.
- ``env``: ``POWERTUNE_*`` shell assignments, for scripts (``. file``).
- ``nvpmodel``: a POWER_MODEL block for the board's own /etc/nvpmodel.conf
  (built and checked against the board: tuner.devices.jetson.persist).
- ``triton``: a config.pbtxt fragment: max_batch_size, dynamic batching with
  only the batch sizes the study measured as preferred sizes and the queue
  delay, the instance group, and the precision the engine must be built with.
- ``trtexec``: the engine build: precision flags, DLA core and GPU fallback
  for a DLA lane, and the model's own input names and shapes.
- ``vllm``, ``llamacpp``: an LLM study's engine command line
  (tuner.deploy.engines), beside the device's mode.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from tuner.deploy import ExportedConfig, export_yaml
from tuner.deploy.engines import ENGINE_FORMATS, ENGINE_LIMITS, ENGINE_SUFFIX, RENDER
from tuner.errors import UserError
from tuner.plumbing import atomicfile

FORMATS = ("yaml", "nvpmodel", "triton", "trtexec", "env", "json")
SUFFIX = {"yaml": ".yaml", "nvpmodel": ".conf", "triton": ".pbtxt", "trtexec": ".sh", "env": ".env", "json": ".json"}

LIMITS = {
    "yaml": "holds everything the study chose; only tune apply/verify act on it",
    "json": "data only: nothing applies it (tune apply reads the YAML export)",
    "env": "values only: nothing applies them, and the measured figures are left out",
    "nvpmodel": "caps the EMC clock but cannot lock its rate; holds no batch size, precision or DLA engine",
    "triton": "sets no clock, power limit or nvpmodel mode; the engine's precision and DLA lanes are fixed at build",
    "trtexec": "builds the engine only: no clock, power mode or batching timeout",
}

# What a Server study's batching timeout is called in the export; an Offline study has none.
TIMEOUT_KNOB = "batch_timeout_ms"
RUNTIME_PRECISIONS = {"int8": "--int8", "fp16": "--fp16", "bf16": "--bf16", "fp32": ""}
TWIN_CONF_NOTE = (
    "# built on a digital twin's model of NVIDIA's nvpmodel.conf, not a board's own: on the board, "
    "tune apply best.yaml --device <board> --persist builds it against the board's own conf and tables"
)


# Every format tune export writes: the model formats above and the LLM engines' command lines.
ALL_FORMATS = FORMATS + ENGINE_FORMATS
ALL_SUFFIX = {**SUFFIX, **ENGINE_SUFFIX}
ALL_LIMITS = {**LIMITS, **ENGINE_LIMITS}


def limits_line(fmt: str, comment: str = "#") -> str:
    return f"{comment} cannot express: {ALL_LIMITS[fmt]}"


def _origin(exported: ExportedConfig) -> str:
    twin = " (a digital twin, not hardware)" if exported.twin else ""
    source = exported.provenance
    return f"{exported.model} on {exported.device_kind}{twin}, study {source.study} trial {source.trial}"


def precision(exported: ExportedConfig) -> str:
    """The precision the engine must be built with: the study's own knob, else fp32 (what it measured)."""
    return str(exported.knobs.get("precision", "fp32"))


def queue_delay_us(exported: ExportedConfig) -> tuple[int, str]:
    """Triton's max_queue_delay_microseconds and where it comes from.

    A Server study tuned the batching timeout: that is the delay. An Offline
    study tuned none; the delay is then the latency the bound leaves beside
    the measured tail (bound - p-tail), the longest a request can wait for
    its batch to fill without the batch's own time breaking the bound.
    """
    if TIMEOUT_KNOB in exported.knobs:
        return round(float(exported.knobs[TIMEOUT_KNOB]) * 1000), "the study's tuned batching timeout"
    tail = exported.metrics.get(f"{exported.percentile}_ms")
    if not isinstance(tail, (int, float)):
        return 0, "no tail latency recorded: no waiting"
    slack = max(0.0, exported.max_latency_ms - float(tail))
    return round(slack * 1000), (
        f"an Offline study tunes no timeout: the {exported.max_latency_ms:g} ms bound less the measured "
        f"{exported.percentile} {float(tail):.4g} ms"
    )


def preferred_sizes(exported: ExportedConfig) -> tuple[list[int], str]:
    """The batch sizes Triton may prefer: those the study measured running, and where that comes from.

    A Server study's windows record the sizes their batches executed at
    (``batch_sizes_executed``, the CUDA-graph ladder's where one ran); an
    Offline study ran only full batches of its batch size. No other size
    was measured, so none is preferred: a smaller preferred size would let
    the batcher dispatch batches the study never timed.
    """
    executed = str(exported.metrics.get("batch_sizes_executed") or "")
    sizes = sorted({int(item.split(":")[0]) for item in executed.split() if item.split(":")[0].isdigit()})
    sizes = [size for size in sizes if 0 < size <= exported.batch_size]
    if sizes:
        return sizes, "the batch sizes the measured windows executed"
    return [exported.batch_size], "the measured batch size only (the study ran full batches of it)"


def triton(exported: ExportedConfig) -> str:
    """A config.pbtxt fragment (protobuf text format) for the model's Triton config: what the study measured."""
    sizes, where = preferred_sizes(exported)
    delay, why = queue_delay_us(exported)
    dla = int(exported.knobs.get("dla_cores", 0) or 0)
    lines = [
        f"# powertune: {_origin(exported)}",
        limits_line("triton"),
        f"# engine precision: {precision(exported)} (build it with the trtexec export)",
        f"# max_batch_size: the measured batch size; preferred_batch_size: {where}",
        f"# max_queue_delay_microseconds: {why}",
    ]
    if dla:
        lines.append(f"# the study also ran {dla} DLA lane(s): each is its own engine and Triton model (see trtexec)")
    lines += [
        f"max_batch_size: {exported.batch_size}",
        "dynamic_batching {",
        f"  preferred_batch_size: [ {', '.join(map(str, sizes))} ]",
        f"  max_queue_delay_microseconds: {delay}",
        "}",
        "instance_group [",
        "  {",
        "    count: 1",
        "    kind: KIND_GPU",
        "  }",
        "]",
        "parameters {",
        '  key: "powertune_precision"',
        f'  value: {{ string_value: "{precision(exported)}" }}',
        "}",
    ]
    return "\n".join(lines) + "\n"


def _shapes(batch: int, inputs: list[tuple[str, list[int]]]) -> str:
    """trtexec's shape list: ``name:BxDxD`` per input, comma-separated."""
    return ",".join(f"{name}:" + "x".join(str(d) for d in [batch, *sample]) for name, sample in inputs)


def _onnx_file(model: str) -> tuple[str, str]:
    """The ONNX file trtexec builds from, and what the user must do first (nothing for a study of that file)."""
    from tuner.models import model_slug

    if model.lower().endswith(".onnx"):
        return model, ""
    return f"{model_slug(model)}.onnx", f"# export {model} to {model_slug(model)}.onnx first (docs/models.md)"


def trtexec(exported: ExportedConfig) -> str:
    """The trtexec command(s) that build the engine(s) the study measured, as a shell script.

    The inputs' names and shapes come from the model (tuner.models.model_inputs): the zoo's, the ONNX
    graph's or a ``py:`` factory's own description. The GPU engine is optimised for the batch size
    the study measured (TensorRT's optimisation point), and takes any batch down to 1.
    """
    from tuner.models import model_inputs

    inputs, where = model_inputs(exported.model)
    flag = RUNTIME_PRECISIONS.get(precision(exported))
    if flag is None:
        known = ", ".join(RUNTIME_PRECISIONS)
        raise UserError(f"precision {precision(exported)!r} has no trtexec flag: use one of {known}")
    sizes, _ = preferred_sizes(exported)
    onnx, first = _onnx_file(exported.model)
    stem = Path(onnx).stem
    gpu = [
        "trtexec",
        f"--onnx={onnx}",
        f"--saveEngine={stem}-b{exported.batch_size}-{precision(exported)}.plan",
        *([flag] if flag else []),
        f"--minShapes={_shapes(1, inputs)}",
        f"--optShapes={_shapes(exported.batch_size, inputs)}",
        f"--maxShapes={_shapes(exported.batch_size, inputs)}",
    ]
    lines = [
        "#!/bin/sh",
        f"# powertune: {_origin(exported)}",
        limits_line("trtexec"),
        f"# inputs: {where}; optimised for the measured batch size (measured: {', '.join(map(str, sizes))}), "
        "down to 1 for a batch the server sends short when its queue delay runs out",
        *([first] if first else []),
        "set -e",
        " ".join(shlex.quote(a) for a in gpu),
    ]
    dla = int(exported.knobs.get("dla_cores", 0) or 0)
    dla_batch = int(exported.knobs.get("dla_batch_size", exported.batch_size) or exported.batch_size)
    for core in range(dla):
        # A DLA runs int8 or fp16 only, with static shapes: one shape, the DLA batch size.
        dla_flag = flag if flag in ("--int8", "--fp16") else "--fp16"
        cmd = [
            "trtexec",
            f"--onnx={onnx}",
            f"--saveEngine={stem}-dla{core}-b{dla_batch}.plan",
            dla_flag,
            f"--useDLACore={core}",
            "--allowGPUFallback",
            f"--shapes={_shapes(dla_batch, inputs)}",
        ]
        lines.append(" ".join(shlex.quote(a) for a in cmd))
    return "\n".join(lines) + "\n"


def env(exported: ExportedConfig) -> str:
    """``POWERTUNE_*`` shell assignments (sourced by a service's start script)."""
    values: dict[str, Any] = {
        "MODEL": exported.model,
        "DEVICE_KIND": exported.device_kind,
        "BATCH_SIZE": exported.batch_size,
        "MAX_LATENCY_MS": exported.max_latency_ms,
        "PERCENTILE": exported.percentile,
        "STUDY": exported.provenance.study,
        "TRIAL": exported.provenance.trial,
        "TWIN": str(exported.twin).lower(),
    }
    values.update({k.upper(): v for k, v in exported.knobs.items()})
    lines = [f"# powertune: {_origin(exported)}", limits_line("env")]
    lines += [f"POWERTUNE_{key}={shlex.quote(str(value))}" for key, value in values.items()]
    return "\n".join(lines) + "\n"


def as_json(exported: ExportedConfig) -> str:
    return json.dumps({"cannot_express": LIMITS["json"], **exported.document()}, indent=2) + "\n"


def render(exported: ExportedConfig, fmt: str, nvpmodel_block: str | None = None) -> str:
    """The export in ``fmt``; ``nvpmodel`` needs the block built against the board (``nvpmodel_block``)."""
    if fmt == "yaml":
        return export_yaml(exported).replace("\n", f"\n{limits_line('yaml')}\n", 1)
    if fmt == "json":
        return as_json(exported)
    if fmt == "env":
        return env(exported)
    if fmt == "triton":
        return triton(exported)
    if fmt == "trtexec":
        return trtexec(exported)
    if fmt in RENDER:
        return RENDER[fmt](exported)
    if fmt == "nvpmodel":
        if nvpmodel_block is None:
            raise UserError("the nvpmodel format is built against the board's own conf: give the board")
        head = [f"# powertune: {_origin(exported)}", limits_line("nvpmodel")]
        head.append("# add this block to /etc/nvpmodel.conf, then: sudo nvpmodel -m <ID> (or: tune apply --persist)")
        return "\n".join(head) + "\n" + nvpmodel_block
    raise UserError(f"unknown export format {fmt!r}: choose from {', '.join(ALL_FORMATS)}")


def nvpmodel_block(exported: ExportedConfig, device: Any) -> str:
    """The tuned POWER_MODEL for this board's conf, with a fresh ID and name, checked by reading it back.

    A Jetson twin has no conf of its own: the mode is built on the twin's
    model of NVIDIA's conf (tuner.devices.virtual.twin_conf), and says so.
    """
    from tuner.deploy import deploy_config
    from tuner.devices.jetson.device import JetsonDevice
    from tuner.devices.jetson.nvpconf import render_mode
    from tuner.devices.jetson.persist import custom_mode, mode_name

    name = mode_name(exported.model, exported.sealed().digest or "")
    if getattr(device, "simulated", False) and getattr(device, "space", None) is not None:
        from tuner.devices.virtual.twin_conf import custom_mode_block

        space = device.space()
        if space.mode_knob is None:
            raise UserError(f"the nvpmodel format is a Jetson board's power mode; {device.name} models no nvpmodel")
        return TWIN_CONF_NOTE + "\n" + custom_mode_block(space, deploy_config(exported, device), name)
    if not isinstance(device, JetsonDevice):
        raise UserError(
            f"the nvpmodel format is a mode of a Jetson board's own conf; {getattr(device, 'name', device)} is not "
            "a Jetson board: run on the board, or point --sysfs-root at its tree"
        )
    config = deploy_config(exported, device)
    _path, _text, mode = custom_mode(device, config, name)
    return render_mode(mode)


def export_paths(output: Path, formats: list[str]) -> dict[str, Path]:
    """Where each format goes: ``output`` itself for one format named there, else with each format's suffix.

    ``-o best.yaml -f triton,trtexec`` writes best.pbtxt and best.sh; ``-o
    model.pbtxt -f triton`` writes model.pbtxt; the default best.yaml with
    ``-f triton`` alone writes best.pbtxt.
    """
    unknown = [f for f in formats if f not in ALL_FORMATS]
    if unknown or not formats:
        shown = ", ".join(unknown) or "(none)"
        raise UserError(f"unknown export format {shown}: choose from {', '.join(ALL_FORMATS)}")
    wanted = list(dict.fromkeys(formats))
    if len(wanted) == 1 and (wanted[0] == "yaml" or output.suffix != ".yaml"):
        return {wanted[0]: output}
    return {fmt: output.with_suffix(ALL_SUFFIX[fmt]) for fmt in wanted}


def write_exports(exported: ExportedConfig, output: Path, formats: list[str], device: Any = None) -> dict[str, Path]:
    """Render every format, then write them (nothing is written if one cannot be rendered)."""
    paths = export_paths(output, formats)
    block = nvpmodel_block(exported, device) if "nvpmodel" in paths else None
    texts = {fmt: render(exported, fmt, block) for fmt in paths}
    for fmt, path in paths.items():
        atomicfile.write_text(path, texts[fmt])
    return paths
