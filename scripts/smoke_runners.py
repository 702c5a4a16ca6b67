"""Exercise every runner path on one device and print time per batch.

CI has no GPU, so the CUDA-only paths (fp16, CUDA graphs, torch.compile on a
GPU) are checked by running this on a GPU machine:

    python scripts/smoke_runners.py --device cuda:0

It stops at the first failure other than a UserError, which it prints and
counts as a refusal.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

from runners import make_runner
from tuner.errors import UserError

GPU_CASES = [
    ("tiny-cnn", 8, "fp16", {}),
    ("resnet50", 1, "fp32", {}),
    ("resnet50", 1, "fp16", {"channels_last": True}),
    ("resnet50", 1, "fp16", {"channels_last": True, "graph": "cudagraphs"}),
    ("resnet50", 128, "fp16", {"channels_last": True}),
    ("resnet50", 128, "bf16", {"channels_last": True, "graph": "cudagraphs"}),
    ("resnet50", 32, "fp32", {"graph": "compile"}),
    ("resnet50", 32, "fp16", {"graph": "compile", "channels_last": True}),
    ("mobilenet_v2", 64, "fp16", {"channels_last": True, "graph": "cudagraphs"}),
    ("efficientnet_b0", 64, "bf16", {"channels_last": True, "graph": "cudagraphs"}),
    ("bert-base", 8, "fp16", {"graph": "cudagraphs"}),
    ("bert-large", 32, "bf16", {}),
    ("bert-large", 32, "bf16", {"graph": "cudagraphs"}),
]
CPU_CASES = [
    ("tiny-cnn", 8, "fp32", {}),
    ("tiny-cnn", 8, "bf16", {"channels_last": True}),
    ("resnet50", 1, "fp32", {"channels_last": True}),
    ("resnet50", 4, "bf16", {}),
    ("bert-base", 1, "fp32", {}),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batches", type=int, default=20)
    args = parser.parse_args()
    cases = CPU_CASES if args.device == "cpu" else GPU_CASES
    for model, batch_size, precision, options in cases:
        runner = make_runner(model, args.device)
        label = f"{model:16s} bs={batch_size:4d} {precision} {options}"
        start = time.perf_counter()
        try:
            runner.prepare(batch_size, precision, options)
        except UserError as exc:
            print(f"{label}: refused: {exc}")
            continue
        prepared = time.perf_counter() - start
        start = time.perf_counter()
        for _ in range(args.batches):
            runner.infer()
        ms = (time.perf_counter() - start) / args.batches * 1e3
        qps = batch_size / ms * 1e3
        print(f"{label}: prepare {prepared:.1f} s, {ms:.2f} ms/batch, {qps:.0f} qps")
        runner.close()


if __name__ == "__main__":
    main()
