"""Compare the H200 twin's GPU time per op class with the CUDA kernel time the real H200 spent, per zoo model.

Usage: python scripts/zoo_kernel_diagnostic.py [PROFILE_JSON] [--write]

PROFILE_JSON (default benchmarks/results/h200-call7/zoo_kernel_profile.json) comes
from benchmarks/zoo_kernel_profile.py on the real GPU: every kernel with the
top-level aten operator that launched it. Kernels are grouped by the twin's
op classes (convolutions, depthwise convolutions, GEMM, attention matmuls,
normalisation, elementwise) plus one group the model profiles did not count:
layout copies (the contiguous copies eager attention makes before and after
its batched matmuls). The twin's side is sim:h200 at default clocks, fp16,
channels_last, per class, GPU time only (no launch). With ``--write`` the table
goes to benchmarks/results/zoo-kernel-diagnostic.md.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run from a checkout without installing the package

from runners.profile import load_profile  # noqa: E402
from tuner.devices.virtual.twin import TwinDevice  # noqa: E402
from tuner.space import Config  # noqa: E402

DEFAULT = ROOT / "benchmarks" / "results" / "h200-call7" / "zoo_kernel_profile.json"
OUT = ROOT / "benchmarks" / "results" / "zoo-kernel-diagnostic.md"
GROUPS = ("conv", "conv_depthwise", "gemm", "attention", "normalisation", "elementwise", "layout copy")
DEPTHWISE_KERNELS = ("conv2d_c1_k1", "depthwise", "dwconv")


def real_group(op: str, kernel: str) -> str:
    """The twin op class of one real kernel, from the operator that launched it and the kernel's name."""
    if op in ("aten::conv2d", "aten::convolution", "aten::_convolution"):
        return "conv_depthwise" if any(k in kernel for k in DEPTHWISE_KERNELS) else "conv"
    if op in ("aten::linear", "aten::addmm"):
        return "gemm"
    if op in ("aten::matmul", "aten::bmm"):
        return "layout copy" if "copy" in kernel else "attention"
    if op in ("aten::reshape", "aten::contiguous", "aten::clone"):
        return "layout copy"
    if op in ("aten::batch_norm", "aten::layer_norm", "aten::softmax", "aten::_softmax"):
        return "normalisation"
    return "elementwise"


def twin_groups(model: str, batch: int, device: TwinDevice) -> dict[str, float]:
    """The twin's GPU time per class (microseconds per batch) at default clocks, fp16, channels_last."""
    space = device.space()
    knobs = {**space.default_config(batch).knobs, "precision": "fp16", "channels_last": True}
    op = device.model.operating([Config(knobs=knobs, batch_size=batch)])
    profile = load_profile(model)
    gpu = device.model.layer_times(profile, op, op.gpu_mhz)["gpu"][0]
    out: dict[str, float] = defaultdict(float)
    for layer, t in zip(device.model.layers(profile), gpu, strict=True):
        cls = device.model.class_of(layer)
        group = {"conv_dense": "conv", "conv_pointwise": "conv", "broadcast": "elementwise"}.get(cls, cls)
        if layer.op == "copy":
            group = "layout copy"
        out[group] += t * 1e6
    return out


def table(path: Path) -> str:
    data = json.loads(path.read_text())
    device = TwinDevice("sim:h200")
    lines = [
        f"# Zoo models on the H200: kernel time per op class, real vs twin ({data['gpu']}, torch {data['torch']},"
        f" {data['date']})",
        "",
        "Real: CUDA kernel time per batch under torch.profiler (benchmarks/zoo_kernel_profile.py, device call 7,"
        " TorchRunner fp16, channels_last, eager, default clocks). Twin: sim:h200 GPU time per class at default"
        " clocks (no launch cost). Produced by `python scripts/zoo_kernel_diagnostic.py --write`.",
        "",
        "| model | batch | wall ms | kernels ms | twin GPU ms | " + " | ".join(GROUPS) + " |",
        "|---|---|---|---|---|" + "---|" * len(GROUPS),
    ]
    for case in data["cases"]:
        if case["precision"] != "fp16" or case["bs"] < 8:
            continue
        real: dict[str, float] = defaultdict(float)
        for k in case["kernels"]:
            real[real_group(k["op"], k["kernel"])] += k["us"]
        twin = twin_groups(case["model"], case["bs"], device)
        cells = [f"{real[g] / 1000:.2f} / {twin[g] / 1000:.2f}" for g in GROUPS]
        lines.append(
            f"| {case['model']} | {case['bs']} | {case['ms_per_batch_median']:.2f} | {sum(real.values()) / 1000:.2f}"
            f" | {sum(twin.values()) / 1000:.2f} | " + " | ".join(cells) + " |"
        )
    lines += ["", "Each class cell: real ms / twin ms per batch."]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> None:
    paths = [Path(a) for a in argv if not a.startswith("--")]
    text = table(paths[0] if paths else DEFAULT)
    print(text)
    if "--write" in argv:
        OUT.write_text(text)


if __name__ == "__main__":
    main(sys.argv[1:])
