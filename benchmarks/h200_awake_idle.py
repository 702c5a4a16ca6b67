"""Board power between batches on a GPU left to its own clock management (observe-only): the awake idle.

A Server window at a low rate is mostly time between batches. This measures
what the board draws there: NVML's energy counter over windows in which a tiny
CUDA-graph replay (one small kernel, microseconds of work) is issued every
``gap`` milliseconds, for gaps from 1 to 200 ms, and over a window with no work
at all. The SM clock is sampled during each window. Nothing on the card is
written: no clocks, power limit or modes.

    python3 benchmarks/h200_awake_idle.py --out awake-idle.json --seconds 6
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
from pathlib import Path

import pynvml
import torch

GAPS_MS = (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0)


def window(handle, seconds: float, gap_s: float | None, replay) -> dict:
    """Mean board power (energy counter) and sampled SM clocks over one window."""
    clocks = []
    kernels = 0
    start_mj = pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
    start = time.monotonic()
    next_at = start
    while (now := time.monotonic()) - start < seconds:
        if gap_s is not None and now >= next_at:
            replay()
            torch.cuda.synchronize()
            kernels += 1
            next_at += gap_s
            clocks.append(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM))
        elif gap_s is None and len(clocks) < (now - start) * 20:
            clocks.append(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM))
        time.sleep(min(0.0005, max(next_at - time.monotonic(), 0.0)) if gap_s is not None else 0.05)
    elapsed = time.monotonic() - start
    energy_j = (pynvml.nvmlDeviceGetTotalEnergyConsumption(handle) - start_mj) / 1000.0
    return {
        "gap_ms": None if gap_s is None else gap_s * 1000,
        "seconds": elapsed,
        "avg_w": energy_j / elapsed,
        "kernels": kernels,
        "sm_mhz_median": statistics.median(clocks) if clocks else None,
        "sm_mhz_min": min(clocks) if clocks else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seconds", type=float, default=6.0)
    args = parser.parse_args()
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    x = torch.ones(1024, device="cuda")
    graph = torch.cuda.CUDAGraph()
    for _ in range(3):
        torch.add(x, x)
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        y = torch.add(x, x)
    del y
    rows = [window(handle, args.seconds, None, graph.replay)]
    for gap in GAPS_MS:
        rows.append(window(handle, args.seconds, gap / 1000.0, graph.replay))
    rows.append(window(handle, args.seconds, None, graph.replay))
    result = {
        "version": 1,
        "what": "board power with a tiny graph replay every gap ms, and with no work (benchmarks/h200_awake_idle.py)",
        "date_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": " ".join(["python3", *sys.argv]),
        "gpu": pynvml.nvmlDeviceGetName(handle),
        "driver": pynvml.nvmlSystemGetDriverVersion(),
        "torch": torch.__version__,
        "rows": rows,
    }
    args.out.write_text(json.dumps(result, indent=1))
    for r in rows:
        print(r, flush=True)


if __name__ == "__main__":
    main()
