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
  the batch ladder as preferred sizes and the queue delay, the instance
  group, and the precision the engine must be built with.
- ``trtexec``: the engine build: precision flags, DLA core and GPU fallback
  for a DLA lane, and the shapes of the batch ladder.
- ``vllm``, ``llamacpp``: an LLM study's engine command line
  (tuner.deploy.engines), beside the device's mode.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from runners.base import ladder
from runners.profile import load_profile
from tuner import atomicfile
from tuner.deploy import ExportedConfig, export_yaml
from tuner.deploy.engines import ENGINE_FORMATS, ENGINE_LIMITS, ENGINE_SUFFIX, RENDER
from tuner.errors import UserError

FORMATS = ("yaml", "nvpmodel", "triton", "trtexec", "env", "json")
SUFFIX = {"yaml": ".yaml", "nvpmodel": ".conf", "triton": ".pbtxt", "trtexec": ".sh", "env": ".env", "json": ".json"}

LIMITS = {
    "yaml": "holds everything the study chose; only tune apply/verify act on it",
    "json": "data only: nothing applies it (tune apply reads the YAML export)",
    "env": "values only: nothing applies them, and the measured figures are left out",
    "nvpmodel": "caps the EMC clock but cannot lock its rate; holds no batch size, precision or DLA engine",
    "triton": "sets no clock, power limit or nvpmodel mode; the engine's precision and DLA lanes are fixed at build",
    "trtexec": "builds the engine only: no clock, power mode or batching timeout; input names are placeholders",
}

# What a Server study's batching timeout is called in the export; an Offline study has none.
TIMEOUT_KNOB = "batch_timeout_ms"
RUNTIME_PRECISIONS = {"int8": "--int8", "fp16": "--fp16", "bf16": "--bf16", "fp32": ""}
INPUT_NAME = "input"


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


def triton(exported: ExportedConfig) -> str:
    """A config.pbtxt fragment (protobuf text format) for the model's Triton config."""
    sizes = ladder(exported.batch_size)
    delay, why = queue_delay_us(exported)
    dla = int(exported.knobs.get("dla_cores", 0) or 0)
    lines = [
        f"# powertune: {_origin(exported)}",
        limits_line("triton"),
        f"# engine precision: {precision(exported)} (build it with the trtexec export)",
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


def _shape(batch: int, sample: list[int]) -> str:
    return f"{INPUT_NAME}:" + "x".join(str(d) for d in [batch, *sample])


def trtexec(exported: ExportedConfig) -> str:
    """The trtexec command(s) that build the engine(s) the study measured, as a shell script."""
    try:
        sample = load_profile(exported.model).input_shape
    except UserError:
        raise UserError(
            f"model {exported.model!r} has no committed profile, so its input shape is unknown: "
            "write the trtexec command by hand from the triton export"
        ) from None
    flag = RUNTIME_PRECISIONS.get(precision(exported))
    if flag is None:
        known = ", ".join(RUNTIME_PRECISIONS)
        raise UserError(f"precision {precision(exported)!r} has no trtexec flag: use one of {known}")
    sizes = ladder(exported.batch_size)
    model = exported.model
    gpu = [
        "trtexec",
        f"--onnx={model}.onnx",
        f"--saveEngine={model}-b{exported.batch_size}-{precision(exported)}.plan",
        *([flag] if flag else []),
        f"--minShapes={_shape(sizes[0], sample)}",
        f"--optShapes={_shape(exported.batch_size, sample)}",
        f"--maxShapes={_shape(exported.batch_size, sample)}",
    ]
    lines = [
        "#!/bin/sh",
        f"# powertune: {_origin(exported)}",
        limits_line("trtexec"),
        f"# rename '{INPUT_NAME}' to the ONNX model's input; the batch ladder is {', '.join(map(str, sizes))}",
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
            f"--onnx={model}.onnx",
            f"--saveEngine={model}-dla{core}-b{dla_batch}.plan",
            dla_flag,
            f"--useDLACore={core}",
            "--allowGPUFallback",
            f"--shapes={_shape(dla_batch, sample)}",
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
    sealed = exported.sealed().model_dump(mode="json")
    return json.dumps({"cannot_express": LIMITS["json"], **sealed}, indent=2) + "\n"


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
    """The tuned POWER_MODEL for this board's conf, with a fresh ID and name, checked by reading it back."""
    from tuner.deploy import deploy_config
    from tuner.devices.jetson.device import JetsonDevice
    from tuner.devices.jetson.nvpconf import render_mode
    from tuner.devices.jetson.persist import custom_mode, mode_name

    if not isinstance(device, JetsonDevice):
        raise UserError(
            f"the nvpmodel format is a mode of a Jetson board's own conf; {getattr(device, 'name', device)} is not "
            "a Jetson board: run on the board, or point --sysfs-root at its tree"
        )
    config = deploy_config(exported, device)
    _path, _text, mode = custom_mode(device, config, mode_name(exported.model, exported.sealed().digest or ""))
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
