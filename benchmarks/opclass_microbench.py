"""Op-class microbenchmarks on a real NVIDIA GPU, observe-only: the twin's per-class efficiencies come from here.

Usage: python benchmarks/opclass_microbench.py --out DIR

Each op class the twin distinguishes (dense, depthwise and pointwise
convolution; fp16/bf16/fp32 GEMM; attention; elementwise/normalisation) runs
over a sweep of sizes shaped like the zoo models' layers. GPU time per call is
the median of CUDA-event timings of many back-to-back calls (no host sync in
between, so launch cost is hidden by the queue). Separately, the host cost of
launching one eager operator is timed with the GPU kept idle enough that the
host is the bottleneck, and the floor of a tiny kernel is read from a captured
CUDA graph (no launch gaps). The SM and memory clocks are read from NVML after
each case, so every figure can be converted to cycles. Nothing on the card is
changed: no NVML set function is called.

The twin fits, per class, an achieved fraction of peak compute, an achieved
fraction of peak bandwidth and a kernel minimum time to these sweeps
(scripts/calibrate_twin.py), never to whole-model totals.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

try:
    import pynvml
except ImportError:  # the GPU machine's image carries nvidia-ml-py; without it, clocks are not recorded
    pynvml = None

DT = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
BYTES = {"fp16": 2, "bf16": 2, "fp32": 4}


class Clocks:
    """Read-only NVML clock and power reads (no set calls)."""

    def __init__(self) -> None:
        self.h = None
        if pynvml is not None:
            pynvml.nvmlInit()
            self.h = pynvml.nvmlDeviceGetHandleByIndex(0)

    def read(self) -> dict:
        if self.h is None:
            return {}
        return {
            "sm_mhz": pynvml.nvmlDeviceGetClockInfo(self.h, pynvml.NVML_CLOCK_SM),
            "mem_mhz": pynvml.nvmlDeviceGetClockInfo(self.h, pynvml.NVML_CLOCK_MEM),
            "power_w": pynvml.nvmlDeviceGetPowerUsage(self.h) / 1000,
        }

    def state(self) -> dict:
        if self.h is None:
            return {}
        return {
            "name": pynvml.nvmlDeviceGetName(self.h),
            "driver": pynvml.nvmlSystemGetDriverVersion(),
            "power_limit_mw": pynvml.nvmlDeviceGetPowerManagementLimit(self.h),
            "max_sm_mhz": pynvml.nvmlDeviceGetMaxClockInfo(self.h, pynvml.NVML_CLOCK_SM),
        }


def gpu_time(fn, min_ms: float = 40.0) -> float:
    """Median seconds per call over batches of back-to-back calls, timed with CUDA events."""
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize()
    once = max(start.elapsed_time(end), 1e-3)
    reps = int(min(max(min_ms / once, 3), 2000))
    samples = []
    for _ in range(5):
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        torch.cuda.synchronize()
        samples.append(start.elapsed_time(end) / reps / 1000)
    return statistics.median(samples)


def graph_time(fn, calls: int = 200) -> float:
    """Seconds per call when ``calls`` copies are replayed from one CUDA graph (no launch gaps)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    return gpu_time(graph.replay, 20.0) / calls


def cases(quick: bool) -> list[dict]:
    """(class, label, builder) for every case. Builders return (fn, flops, bytes)."""
    out = []
    batches = (1, 8, 64, 256) if not quick else (1, 8)

    def case(cls, prec, label, build):
        out.append({"class": cls, "precision": prec, "label": label, "build": build})

    def conv(cls, prec, n, cin, cout, hw, k, stride, groups):
        def build():
            x = torch.randn(n, cin, hw, hw, device="cuda", dtype=DT[prec]).contiguous(memory_format=torch.channels_last)
            w = torch.randn(cout, cin // groups, k, k, device="cuda", dtype=DT[prec]).contiguous(
                memory_format=torch.channels_last
            )
            ho = (hw + 2 * (k // 2) - k) // stride + 1
            flops = 2 * n * cout * ho * ho * (cin // groups) * k * k
            moved = (x.numel() + w.numel() + n * cout * ho * ho) * BYTES[prec]
            return (lambda: F.conv2d(x, w, None, stride, k // 2, 1, groups)), flops, moved

        case(cls, prec, f"{cls} {prec} n{n} c{cin}->{cout} {hw}x{hw} k{k}s{stride}", build)

    for prec in ("fp16", "fp32"):
        for n in batches:
            conv("conv_dense", prec, n, 64, 64, 56, 3, 1, 1)
            conv("conv_dense", prec, n, 256, 256, 14, 3, 1, 1)
            conv("conv_pointwise", prec, n, 256, 64, 56, 1, 1, 1)
            conv("conv_pointwise", prec, n, 1024, 256, 14, 1, 1, 1)
            conv("conv_pointwise", prec, n, 96, 24, 56, 1, 1, 1)
            conv("conv_depthwise", prec, n, 144, 144, 56, 3, 1, 144)
            conv("conv_depthwise", prec, n, 384, 384, 14, 3, 1, 384)
            conv("conv_depthwise", prec, n, 672, 672, 14, 5, 1, 672)
            conv("conv_depthwise", prec, n, 960, 960, 7, 3, 1, 960)

    def gemm(cls, prec, m, k, n):
        def build():
            a = torch.randn(m, k, device="cuda", dtype=DT[prec])
            b = torch.randn(n, k, device="cuda", dtype=DT[prec])
            return (lambda: F.linear(a, b)), 2 * m * k * n, (m * k + k * n + m * n) * BYTES[prec]

        case(cls, prec, f"{cls} {prec} {m}x{k}x{n}", build)

    for prec in ("fp16", "bf16", "fp32"):
        for tokens in (128, 1024, 8192, 32768) if not quick else (128,):
            gemm(f"gemm_{prec}", prec, tokens, 768, 3072)
            gemm(f"gemm_{prec}", prec, tokens, 1024, 1024)
        gemm(f"gemm_{prec}", prec, 8192, 8192, 8192)
        gemm(f"gemm_{prec}", prec, 8, 2048, 1000)

    def attention(prec, b, heads, seq, dim):
        def build():
            q = torch.randn(b * heads, seq, dim, device="cuda", dtype=DT[prec])
            kt = torch.randn(b * heads, dim, seq, device="cuda", dtype=DT[prec])
            flops = 2 * b * heads * seq * seq * dim
            moved = (2 * b * heads * seq * dim + b * heads * seq * seq) * BYTES[prec]
            return (lambda: torch.bmm(q, kt)), flops, moved

        case("attention", prec, f"attention {prec} b{b} h{heads} s{seq} d{dim}", build)

    for b in batches:
        attention("fp16", b, 12, 128, 64)
        attention("fp16", b, 16, 128, 64)

    def elementwise(name, prec, numel, fn_of):
        def build():
            x = torch.randn(numel, device="cuda", dtype=DT[prec])
            fn, reads = fn_of(x)
            return fn, numel, (reads + 1) * numel * BYTES[prec]

        case("elementwise", prec, f"{name} {prec} {numel}", build)

    def add(x):
        y = torch.randn_like(x)
        return (lambda: torch.add(x, y)), 2

    def relu(x):
        return (lambda: torch.relu(x)), 1

    def layernorm(x):
        x2 = x.view(-1, 1024)
        w = torch.ones(1024, device="cuda", dtype=x.dtype)
        return (lambda: F.layer_norm(x2, (1024,), w, w)), 1

    def batchnorm(x):
        x4 = x.view(-1, 256, 16, 16).contiguous(memory_format=torch.channels_last)
        m = torch.zeros(256, device="cuda", dtype=x.dtype)
        v = torch.ones(256, device="cuda", dtype=x.dtype)
        return (lambda: F.batch_norm(x4, m, v, v, m, False)), 1

    def softmax(x):
        x2 = x.view(-1, 128)
        return (lambda: torch.softmax(x2, -1)), 1

    for exp in (12, 16, 20, 24, 27) if not quick else (12, 20):
        numel = 2**exp
        for name, fn_of in (
            ("add", add),
            ("relu", relu),
            ("layernorm", layernorm),
            ("batchnorm", batchnorm),
            ("softmax", softmax),
        ):
            elementwise(name, "fp16", numel, fn_of)

    def layout_copy(prec, b, heads, seq, dim):
        """The copy eager attention makes: a (b, s, h, d) view transposed to (b, h, s, d), made contiguous."""

        def build():
            x = torch.randn(b, seq, heads, dim, device="cuda", dtype=DT[prec]).transpose(1, 2)
            return (lambda: x.contiguous()), 0, 2 * x.numel() * BYTES[prec]

        case("layout_copy", prec, f"layout_copy {prec} b{b} h{heads} s{seq} d{dim}", build)

    def broadcast_mul(prec, n, c, hw):
        """Squeeze-and-excitation scaling: x (n, c, h, w) channels_last times s (n, c, 1, 1)."""

        def build():
            x = torch.randn(n, c, hw, hw, device="cuda", dtype=DT[prec]).contiguous(memory_format=torch.channels_last)
            scale = torch.randn(n, c, 1, 1, device="cuda", dtype=DT[prec])
            return (lambda: x * scale), x.numel(), (2 * x.numel() + scale.numel()) * BYTES[prec]

        case("broadcast", prec, f"broadcast_mul {prec} n{n} c{c} {hw}x{hw}", build)

    for b in batches:
        layout_copy("fp16", b, 12, 128, 64)
        layout_copy("fp16", b, 16, 128, 64)
        broadcast_mul("fp16", b, 96, 112)
        broadcast_mul("fp16", b, 240, 28)
        broadcast_mul("fp16", b, 672, 14)
    return out


def launch_cost(clocks: Clocks) -> dict:
    """Host seconds per eager operator and per nn.Module call, GPU kept nearly idle; and the tiny-kernel floor."""
    x = torch.randn(1024, device="cuda", dtype=torch.float16)
    conv = torch.nn.Conv2d(16, 16, 3, padding=1).cuda().half().eval()
    img = torch.randn(1, 16, 8, 8, device="cuda", dtype=torch.float16)
    relu = torch.nn.ReLU()
    results = {}
    with torch.inference_mode():
        for name, fn in (
            ("aten_add", lambda: torch.add(x, x)),
            ("module_relu", lambda: relu(x)),
            ("module_conv3x3", lambda: conv(img)),
        ):
            for _ in range(200):
                fn()
            torch.cuda.synchronize()
            per = []
            for _ in range(5):
                started = time.perf_counter()
                for _ in range(2000):
                    fn()
                per.append((time.perf_counter() - started) / 2000)
                torch.cuda.synchronize()
            results[f"host_s_per_call_{name}"] = statistics.median(per)
        floors = {}
        for numel in (1, 1024, 16384, 262144):
            y = torch.randn(numel, device="cuda", dtype=torch.float16)
            floors[str(numel)] = graph_time(lambda y=y: torch.add(y, y))
        results["graph_s_per_tiny_kernel"] = floors
    results["clocks"] = clocks.read()
    return results


def copy_bandwidth() -> dict:
    """Peak achievable bandwidth: a 4 GiB device-to-device copy (bytes read plus written)."""
    src = torch.empty(2**30, device="cuda", dtype=torch.float32)
    dst = torch.empty_like(src)
    src.normal_()
    t = gpu_time(lambda: dst.copy_(src), 200.0)
    return {"bytes": 2 * src.numel() * 4, "seconds": t, "gb_per_s": 2 * src.numel() * 4 / t / 1e9}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--quick", action="store_true", help="a few sizes only (CI smoke)")
    parser.add_argument("--classes", default="", help="comma-separated case classes to run (default: all)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    clocks = Clocks()
    result = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "cudnn": torch.backends.cudnn.version(),
        "allow_tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
        "allow_tf32_cudnn": torch.backends.cudnn.allow_tf32,
        "gpu": torch.cuda.get_device_name(0),
        "card_before": clocks.state(),
        "copy": copy_bandwidth(),
        "launch": launch_cost(clocks) if not args.classes else None,
        "cases": [],
    }
    torch.backends.cudnn.benchmark = True
    with torch.inference_mode():
        wanted = set(filter(None, args.classes.split(",")))
        for case in cases(args.quick):
            if wanted and case["class"] not in wanted:
                continue
            row = {k: v for k, v in case.items() if k != "build"}
            try:
                fn, flops, moved = case["build"]()
                t = gpu_time(fn)
            except RuntimeError as exc:  # one failing shape (memory, missing kernel) must not end the sweep
                row["error"] = str(exc).splitlines()[0]
                result["cases"].append(row)
                torch.cuda.empty_cache()
                continue
            row.update(seconds=t, flops=flops, bytes=moved, tflops=flops / t / 1e12, gb_per_s=moved / t / 1e9)
            row.update(clocks.read())
            result["cases"].append(row)
            print(
                f"{row['label']:48s} {t * 1e6:10.1f} us {row['tflops']:8.1f} TF/s {row['gb_per_s']:8.0f} GB/s"
                f" sm {row.get('sm_mhz')}",
                flush=True,
            )
            del fn
    result["card_after"] = clocks.state()
    result["card_untouched"] = result["card_after"] == result["card_before"]
    (args.out / "opclass_microbench.json").write_text(json.dumps(result, indent=1) + "\n")
    print("copy GB/s", round(result["copy"]["gb_per_s"]), "launch", json.dumps(result["launch"]))


if __name__ == "__main__":
    main()
