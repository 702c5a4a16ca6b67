"""Host launch cost of one eager layer, per operator type, on a real GPU machine (observe-only).

Usage: python benchmarks/launch_microbench.py --out DIR [--batch 1] [--precision fp16|fp32]

Every leaf module of every zoo model (fp16 by default, or fp32 as the Orin
twins run it; channels_last for CNNs, as the runner builds them) is called alone, on the input it sees inside the model,
many times back to back without a host sync: the GPU work of one call is far
shorter than its launch at batch 1, so the host time per call is the launch
cost of that layer (Python module call, dispatcher, library heuristics, kernel
launches). The twin takes the median per operator type as its launch cost per
layer. A chain of empty modules measures the Python cost of a module call on
its own. Nothing on the card is changed.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from opclass_microbench import graph_time

from runners import zoo

MODELS = ("resnet50", "mobilenet_v2", "efficientnet_b0", "bert-base", "bert-large")


def op_name(module: nn.Module) -> str:
    """The operator type, named as runners/profiling.py names it (that module needs pydantic, absent there)."""
    names = {
        "Conv2d": "conv2d",
        "Linear": "linear",
        "MatMul": "matmul",
        "Embedding": "embedding",
        "MaxPool2d": "maxpool",
        "AdaptiveAvgPool2d": "avgpool",
        "BatchNorm2d": "batchnorm",
        "LayerNorm": "layernorm",
        "ReLU6": "relu6",
        "SiLU": "silu",
        "GELU": "gelu",
    }
    kind = type(module).__name__
    return names.get(kind, kind.lower())


def host_seconds(fn, calls: int = 200) -> float:
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    runs = []
    for _ in range(3):
        started = time.perf_counter()
        for _ in range(calls):
            fn()
        runs.append((time.perf_counter() - started) / calls)
        torch.cuda.synchronize()
    return statistics.median(runs)


class Empty(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


def kernel_floors() -> dict[str, float]:
    """GPU seconds per call of small fp16 kernels of each op class, replayed from a CUDA graph (no launch gaps)."""
    h = torch.float16
    cl = torch.channels_last

    def t(*shape):
        return torch.randn(*shape, device="cuda", dtype=h)

    x56, x14 = t(1, 64, 56, 56).contiguous(memory_format=cl), t(1, 256, 14, 14).contiguous(memory_format=cl)
    w3, w1 = t(64, 64, 3, 3).contiguous(memory_format=cl), t(64, 256, 1, 1).contiguous(memory_format=cl)
    xd, wd = t(1, 144, 28, 28).contiguous(memory_format=cl), t(144, 1, 3, 3).contiguous(memory_format=cl)
    a, w = t(8, 768), t(768, 768)
    q, k = t(12, 128, 64), t(12, 64, 128)
    s, ln = t(12 * 128, 128), t(128, 768)
    cases = {
        "conv_dense": lambda: F.conv2d(x56, w3, None, 1, 1),
        "conv_pointwise": lambda: F.conv2d(x14, w1),
        "conv_depthwise": lambda: F.conv2d(xd, wd, None, 1, 1, 1, 144),
        "gemm_fp16": lambda: F.linear(a, w),
        "attention": lambda: torch.bmm(q, k),
        "elementwise": lambda: torch.add(ln, ln),
        "layernorm": lambda: F.layer_norm(ln, (768,)),
        "softmax": lambda: torch.softmax(s, -1),
    }
    return {name: graph_time(fn, 100) for name, fn in cases.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--precision", choices=("fp16", "fp32"), default="fp16")
    args = parser.parse_args()
    dtype = torch.float16 if args.precision == "fp16" else torch.float32
    args.out.mkdir(parents=True, exist_ok=True)
    result = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(0),
        "batch": args.batch,
        "precision": args.precision,
        "models": {},
    }
    chain = nn.Sequential(*[Empty() for _ in range(100)])
    x = torch.zeros(1, device="cuda")
    with torch.inference_mode():
        result["graph_kernel_s"] = kernel_floors()
        print("graph-replayed small kernels, us:", {k: round(1e6 * v, 2) for k, v in result["graph_kernel_s"].items()})
        result["empty_module_call_s"] = host_seconds(lambda: chain(x), 50) / 100
        for name in MODELS:
            spec = zoo.spec(name)
            model = zoo.build_model(name).to("cuda", dtype)
            batch = zoo.input_for(name, args.batch, "cuda", dtype)
            if spec.cnn:
                model = model.to(memory_format=torch.channels_last)
                batch = batch.contiguous(memory_format=torch.channels_last)
            captured: list[tuple[str, nn.Module, tuple]] = []
            hooks = [
                m.register_forward_hook(lambda m, i, o, n=n, c=captured: c.append((n, m, i)))
                for n, m in model.named_modules()
                if not any(True for _ in m.children())
            ]
            model(batch)
            for h in hooks:
                h.remove()
            layers = []
            for layer_name, module, inputs in captured:
                layers.append(
                    {
                        "name": layer_name,
                        "op": op_name(module),
                        "host_s": host_seconds(lambda m=module, i=inputs: m(*i)),
                    }
                )
            forward = host_seconds(lambda m=model, b=batch: m(b), 20)
            result["models"][name] = {"layers": layers, "forward_host_s": forward}
            by_op: dict[str, list[float]] = {}
            for layer in layers:
                by_op.setdefault(layer["op"], []).append(layer["host_s"])
            summary = {op: round(1e6 * statistics.median(v), 1) for op, v in sorted(by_op.items())}
            print(
                name,
                f"forward {1e3 * forward:.2f} ms, sum of layers {1e3 * sum(x['host_s'] for x in layers):.2f} ms,"
                f" median us per op {summary}",
                flush=True,
            )
            del model
            torch.cuda.empty_cache()
    (args.out / f"launch_microbench_{args.precision}.json").write_text(json.dumps(result, indent=1) + "\n")
    print("empty module call us", round(1e6 * result["empty_module_call_s"], 2))


if __name__ == "__main__":
    main()
