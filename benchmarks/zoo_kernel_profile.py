"""Where each zoo model's GPU time goes on a real NVIDIA GPU: CUDA kernels per batch, by launching operator.

Usage: python benchmarks/zoo_kernel_profile.py --out DIR [--cases resnet50:fp16:8,...]

A diagnostic for the digital twin: the twin predicts a batch's time
as the sum over layers of op-class times; this records what the GPU really ran
for the same TorchRunner setup as benchmarks/zoo_energy_sweep.py (eager,
inference_mode, channels_last for CNNs, one host sync per batch), so
scripts/zoo_kernel_diagnostic.py can group the kernel time by the twin's op
classes and compare class by class. Per case: the unprofiled time per batch,
then torch.profiler over a few batches: every CUDA kernel with the top-level
aten operator that launched it, its count and device time per batch, and the
number of kernel launches per batch; per top-level aten operator, its host time
per batch (inclusive, under the profiler, so inflated by its overhead). Observe-only: nothing on the card changes.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import time
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from runners.torch_runner import TorchRunner

CASES = [
    f"{m}:fp16:{b}"
    for m in ("resnet50", "mobilenet_v2", "efficientnet_b0", "bert-base", "bert-large")
    for b in (8, 64, 256)
] + ["resnet50:fp16:1", "resnet50:fp32:1", "resnet50:fp32:8", "efficientnet_b0:fp16:1"]
PROFILED_BATCHES = 5


def _top_op(event) -> str:
    """The outermost aten operator above the event that launched a kernel (what a model layer calls)."""
    top = event.name
    parent = event.cpu_parent
    while parent is not None:
        if parent.name.startswith("aten::"):
            top = parent.name
        parent = parent.cpu_parent
    return top


def profile_case(runner: TorchRunner, batch: int) -> dict:
    for _ in range(10):
        runner.infer()
    times = []
    for _ in range(30):
        t0 = time.perf_counter()
        runner.infer()
        times.append(time.perf_counter() - t0)
    times.sort()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(PROFILED_BATCHES):
            runner.infer()
    kernels: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0.0])
    launches = 0
    cpu_ops: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for event in prof.events():
        if event.cpu_parent is None and event.name.startswith("aten::"):
            cpu_ops[event.name][0] += 1 / PROFILED_BATCHES
            cpu_ops[event.name][1] += event.cpu_time_total / PROFILED_BATCHES
        if event.name.startswith(("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC")):
            launches += 1
        for kernel in getattr(event, "kernels", []):
            key = (_top_op(event), kernel.name)
            kernels[key][0] += 1 / PROFILED_BATCHES
            kernels[key][1] += kernel.duration / PROFILED_BATCHES
    rows = [
        {"op": op, "kernel": name[:160], "count": round(c, 2), "us": round(us, 2)}
        for (op, name), (c, us) in sorted(kernels.items(), key=lambda kv: -kv[1][1])
    ]
    return {
        "ms_per_batch_median": 1000 * times[len(times) // 2],
        "ms_per_batch_min": 1000 * times[0],
        "kernel_us_per_batch": round(sum(r["us"] for r in rows), 1),
        "kernels_per_batch": round(sum(r["count"] for r in rows), 1),
        "launches_per_batch": launches / PROFILED_BATCHES,
        "cpu_ops": {op: {"count": round(c, 2), "cpu_us": round(us, 1)} for op, (c, us) in cpu_ops.items()},
        "kernels": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--cases", default=",".join(CASES))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    result = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "cudnn": torch.backends.cudnn.version(),
        "setup": "TorchRunner eager, inference_mode, channels_last for CNNs, sync per batch; default clocks",
        "cases": [],
    }
    runners: dict[str, TorchRunner] = {}
    for case in args.cases.split(","):
        model, precision, batch = case.split(":")
        runner = runners.setdefault(model, TorchRunner(model, "cuda"))
        runner.prepare(int(batch), precision, {"channels_last": True})
        row = {"model": model, "precision": precision, "bs": int(batch)}
        row.update(profile_case(runner, int(batch)))
        result["cases"].append(row)
        print(
            f"{case:24s} {row['ms_per_batch_median']:8.2f} ms/batch, kernels {row['kernel_us_per_batch'] / 1000:8.2f}"
            f" ms in {row['kernels_per_batch']:.0f} kernels, {row['launches_per_batch']:.0f} launches",
            flush=True,
        )
        (args.out / "zoo_kernel_profile.json").write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
