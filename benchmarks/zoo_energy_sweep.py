"""Energy per query of every zoo model on a real NVIDIA GPU at a few batch sizes, observe-only.

Usage: python benchmarks/zoo_energy_sweep.py --out DIR [--batches 8,64,256] [--window 4]

The project's own TorchRunner (fp16, channels_last for CNNs, eager,
inference_mode, one host sync per batch: what ``tune run`` measures) runs
back to back for the window. Energy comes from NVML's total-energy counter
(about 10 Hz updates), read by the project's NvmlEnergyMeter from a polling
thread (every update edge, interpolated at the window's bounds), so the batch
loop itself never waits on NVML.
Nothing on the card is changed (no NVML set call); clocks and power limit are
read before and after.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import time
from pathlib import Path

import numpy as np
import pynvml
import torch

from runners.torch_runner import TorchRunner
from tuner.devices.nvml.meters import NvmlEnergyMeter

MODELS = ("resnet50", "mobilenet_v2", "efficientnet_b0", "bert-base", "bert-large")


def window(runner: TorchRunner, meter: NvmlEnergyMeter, batch: int, seconds: float) -> dict:
    """Run ``seconds`` of back-to-back batches under the project's NVML energy meter.

    The meter polls the energy counter from its own thread (what ``tune run`` measures). The first H200 sweep
    (results/h200-call5/) read the counter in the batch loop instead; one read takes about 4-5 ms with the GPU
    idle, so its time per batch and energy per query carried that gap (results/h200-opclass.md, against h200-call8/).
    """
    warm_until = time.monotonic() + 1.0
    while time.monotonic() < warm_until:
        runner.infer()
    latencies = []
    meter.start()
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        t0 = time.monotonic()
        runner.infer()
        latencies.append(time.monotonic() - t0)
    reading = meter.stop()
    batches = len(latencies)
    queries = batches * batch
    return {
        "batches": batches,
        "queries": queries,
        "duration_s": reading.duration_s,
        "qps": queries / reading.duration_s,
        "time_ms_per_batch": 1000 * reading.duration_s / batches,
        "avg_w": reading.avg_w,
        "j_per_query": reading.energy_j / queries,
        "energy_ticks": reading.samples,
        "p50_ms": 1000 * float(np.median(latencies)),
        "p99_ms": 1000 * float(np.percentile(latencies, 99)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--batches", default="8,64,256")
    parser.add_argument("--window", type=float, default=4.0)
    parser.add_argument("--models", default=",".join(MODELS))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)

    def state() -> dict:
        return {
            "power_limit_mw": pynvml.nvmlDeviceGetPowerManagementLimit(handle),
            "max_sm_mhz": pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM),
        }

    meter = NvmlEnergyMeter(pynvml, handle)
    before = state()
    idle = []
    for _ in range(3):
        e0, t0 = pynvml.nvmlDeviceGetTotalEnergyConsumption(handle), time.monotonic()
        time.sleep(1.0)
        idle.append((pynvml.nvmlDeviceGetTotalEnergyConsumption(handle) - e0) / 1000 / (time.monotonic() - t0))
    result = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "gpu": pynvml.nvmlDeviceGetName(handle),
        "driver": pynvml.nvmlSystemGetDriverVersion(),
        "torch": torch.__version__,
        "setup": "TorchRunner fp16, channels_last for CNNs, eager, inference_mode, sync per batch; default clocks",
        "idle_w": float(np.median(idle)),
        "card_before": before,
        "rows": [],
    }
    for model in args.models.split(","):
        runner = TorchRunner(model, "cuda")
        for batch in (int(b) for b in args.batches.split(",")):
            runner.prepare(batch, "fp16", {"channels_last": True})
            row = {"model": model, "bs": batch, "dtype": "float16", "channels_last": True}
            row.update(window(runner, meter, batch, args.window))
            row["sm_mhz_after"] = pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)
            result["rows"].append(row)
            print(
                f"{model:16s} bs{batch:4d} {row['time_ms_per_batch']:8.2f} ms/batch {row['avg_w']:6.1f} W "
                f"{row['j_per_query']:.5f} J/q ticks {row['energy_ticks']} sm {row['sm_mhz_after']}",
                flush=True,
            )
        runner.close()
    result["card_after"] = state()
    result["card_untouched"] = result["card_after"] == before
    (args.out / "zoo_energy_sweep.json").write_text(json.dumps(result, indent=1) + "\n")
    print("card untouched:", result["card_untouched"], "idle W", round(result["idle_w"], 1))


if __name__ == "__main__":
    main()
