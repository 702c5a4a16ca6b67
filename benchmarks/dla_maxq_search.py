"""Does ``tune run`` find MLPerf's MaxQ on its own, with the DLAs as knobs? (twin figures, sim:orin-trt)

Usage: PYTHONPATH=. python benchmarks/dla_maxq_search.py [--seeds 0,1,2] [--trials 40]

1. The twin's value at NVIDIA's MaxQ setting for ResNet-50 Offline (shared reference
   orin-mlperf.md; mlcommons inference_results_v3.0 configs/resnet50/Offline class Orin_MaxQ): GPU
   capped at 624.75 MHz (612 MHz, the nearest step of the twin's 102 MHz grid, as
   tuner.calibration's ORIN_MAXQ), EMC 2133 MHz, 4 cores at 576 MHz, both DLAs at 883.2 MHz with
   DLA batch 8, under MAXN's caps; GPU batch 64, the space's largest (MLPerf used 256). Its p99
   batch latency is the bound of the search.
2. ``tune run --model resnet50 --device sim:orin-trt --runtime tensorrt --trials N`` over the whole
   space (every knob, the DLA ones included), once per seed.
3. Per seed: the best feasible trial's energy per query (module rails, the objective; and at the
   wall) against MaxQ's, and how far its knobs land from MaxQ's.

Writes benchmarks/results/dla_maxq_search.json and .md. Every figure is a twin figure.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import platform
import subprocess
import sys
from pathlib import Path
from tempfile import TemporaryDirectory

from tuner.devices.virtual.twin import TwinDevice
from tuner.measure.settings import WindowSettings
from tuner.space import Config

MAXQ = {
    "nvpmodel": "MAXN",
    "gpu_mhz": 612,
    "emc_mhz": 2133,
    "cpu_cores": 4,
    "cpu_mhz": 576.0,
    "precision": "int8",
    "dla_cores": 2,
    "dla_mhz": 883.2,
    "dla_batch_size": 8,
}
BATCH = 64
KNOBS = ("nvpmodel", "gpu_mhz", "emc_mhz", "cpu_cores", "cpu_mhz", "dla_cores", "dla_mhz", "dla_batch_size")
OUT = Path(__file__).resolve().parent / "results"


def maxq_point() -> dict:
    twin = TwinDevice("sim:orin-trt")
    m = twin.measure("resnet50", Config(knobs=MAXQ, batch_size=BATCH), WindowSettings(window_s=10.0, noise=False))
    return {
        "knobs": MAXQ,
        "batch_size": BATCH,
        "j_per_query": m.j_per_query,
        "wall_j_per_query": m.extra["wall_j_per_query"],
        "p99_ms": m.p99_ms,
        "qps": m.qps,
    }


def search(seed: int, trials: int, bound_ms: float) -> dict:
    with TemporaryDirectory() as tmp:
        cmd = [
            sys.executable, "-m", "tuner", "run", "--model", "resnet50", "--device", "sim:orin-trt",
            "--runtime", "tensorrt", "--max-latency", f"{bound_ms:.3f}ms", "--trials", str(trials),
            "--seed", str(seed), "--out", tmp, "--json",
        ]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True, check=True)
        payload = json.loads(done.stdout)
        rows = list(csv.DictReader((Path(tmp) / "sim-orin-trt" / "resnet50" / "trials.csv").open()))
    best = payload["best"]
    feasible = [r for r in rows if r["feasible"] == "True"]
    exact = TwinDevice("sim:orin-trt").measure(
        "resnet50", Config(knobs=best["config"], batch_size=best["batch_size"]), WindowSettings(noise=False)
    )
    return {
        "seed": seed,
        "command": " ".join(cmd[1:]).replace(tmp, "<tmp>"),
        "best": {k: best[k] for k in ("trial", "config", "batch_size", "j_per_query", "p99_ms", "qps")},
        "best_noise_free": {"j_per_query": exact.j_per_query, "wall_j_per_query": exact.extra["wall_j_per_query"]},
        "trials_with_dlas": sum(1 for r in rows if r["dla_cores"] not in ("", "0")),
        "feasible_trials": len(feasible),
    }


def distance(found: dict) -> dict:
    """How far the found knobs land from MaxQ's, knob by knob."""
    out = {}
    for knob in KNOBS:
        a, b = found["config"].get(knob), MAXQ[knob]
        out[knob] = {"found": a, "maxq": b}
    out["batch_size"] = {"found": found["batch_size"], "maxq": BATCH}
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--trials", type=int, default=40)
    args = parser.parse_args()
    point = maxq_point()
    bound = point["p99_ms"]
    runs = []
    for seed in [int(s) for s in args.seeds.split(",")]:
        run = search(seed, args.trials, bound)
        run["vs_maxq"] = run["best"]["j_per_query"] / point["j_per_query"]
        run["knobs_vs_maxq"] = distance(run["best"])
        runs.append(run)
        print(f"seed {seed}: best {run['best']['j_per_query'] * 1e3:.3f} mJ/query = {run['vs_maxq']:.2f} x MaxQ")
    result = {
        "what": "twin figures: tune run on sim:orin-trt with DLA knobs vs the twin at MLPerf's MaxQ setting",
        "date": datetime.date.today().isoformat(),
        "machine": f"{platform.node()} ({platform.machine()}, CPU only; the twin needs no accelerator)",
        "maxq": point,
        "bound_ms": bound,
        "runs": runs,
        "all_at_least_as_cheap": all(r["vs_maxq"] <= 1.0 for r in runs),
    }
    OUT.mkdir(exist_ok=True)
    (OUT / "dla_maxq_search.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [
        "# tune run finds MaxQ with the DLAs as knobs (twin figures, sim:orin-trt, resnet50 Offline)",
        "",
        f"{result['date']}, {result['machine']}; `PYTHONPATH=. python benchmarks/dla_maxq_search.py "
        f"--seeds {args.seeds} --trials {args.trials}`.",
        "",
        f"Twin at MLPerf's MaxQ setting (GPU batch {BATCH}): {point['j_per_query'] * 1e3:.3f} mJ/query on the "
        f"module's rails, {point['wall_j_per_query'] * 1e3:.3f} at the wall, p99 {bound:.2f} ms (the bound), "
        f"{point['qps']:.0f} queries/s.",
        "",
        "| seed | best mJ/query (rails, as measured) | x MaxQ | wall mJ/query (noise-free) | p99 ms | trials with DLAs "
        "| knobs found |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        b = r["best"]
        wall = r["best_noise_free"]["wall_j_per_query"]
        shown = ", ".join(f"{k}={v}" for k, v in b["config"].items() if k != "precision")
        lines.append(
            f"| {r['seed']} | {b['j_per_query'] * 1e3:.3f} | {r['vs_maxq']:.2f} | "
            f"{wall * 1e3:.3f} | {b['p99_ms']:.1f} | {r['trials_with_dlas']} | "
            f"{shown}, bs={b['batch_size']} |"
        )
    (OUT / "dla_maxq_search.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
