"""Derive per-mode, per-rail power of an AGX Orin under inference from public tegrastats logs.

Usage: python scripts/orin_mode_rails.py GIT_DIR [--write]

GIT_DIR is a clone (or bare mirror) of github.com/BroncoSpace-Lab/scales-hardware.
The logs are read at the pinned commit below, never copied here: this script
parses each 1 Hz tegrastats line (four INA3221 rails, GR3D load, per-core CPU
load and clock) and writes the figures the Orin twin's rails rest on to
scripts/calibration_data/orin-mode-rails.json, with the blob of every log.

Per run (workload x nvpmodel mode): samples with GR3D above 0 are "busy" (the
model running), samples after the last busy one are "idle" (the process
finished, the board left alone); the mean and median of each rail and of the
GR3D load over each,
the CPU cores online and the highest CPU clock seen, the busy cores (sum
of per-core load / 100, median) and the mean busy cores at each CPU clock. A log can hold a second run at another mode:
depth_maxn.txt's MAXN run (CPU clocks up to 2201 MHz, 186 busy samples) is
followed after 7 idle minutes by 260 busy samples with the CPU capped at 1497
MHz (the 50W mode's cap, drawing what depth_50W.txt's run draws), and
resnet_test.txt's MAXN run by a 650-sample run at 1497 MHz. The log is cut
where a busy stretch of at least RUN_GAP_S samples starts, after an idle gap of
more than RUN_GAP_S, with a highest CPU clock other than the first stretch's
(short GR3D blips and repeated runs at the same mode stay as they were). Throughput per mode is the repository's own
table (docs/ML_Jetson_Performance.md), which is read and kept beside the rails;
where its power column disagrees with the log's busy mean it says so.

The logs carry the GR3D load but not the GPU clock it ran at: tegrastats
prints GR3D_FREQ as "N%" without "@[MHz]" here (the CSV's "GR3D Frequency"
column is empty), nor EMC_FREQ; the twin derives the clock from the load
through the devfreq governor (scripts/twin_rails.py).
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import statistics
import subprocess
from pathlib import Path

REPO = "https://github.com/BroncoSpace-Lab/scales-hardware"
COMMIT = "510a7bc4b8305d315fea78f6fa6d7f6272a2d3c3"
DOC = "docs/ML_Jetson_Performance.md"
OUT = Path(__file__).resolve().parent / "calibration_data" / "orin-mode-rails.json"
RAILS = ("VDD_GPU_SOC", "VDD_CPU_CV", "VIN_SYS_5V0", "VDDQ_VDD2_1V8AO")
# (workload, mode) -> log file. The table's MaxN ResNet row links resnet_test.csv, but its figures (14.78 W) are
# those of resnet_maxn.txt; resnet_test.txt is an earlier MAXN run kept as a second MAXN row.
LOGS = {
    ("resnet152", "MAXN"): "docs/data/resnet_maxn.txt",
    ("resnet152", "50W"): "docs/data/resnet_50W.txt",
    ("resnet152", "30W"): "docs/data/resnet_30W.txt--graph",
    ("resnet152", "15W"): "docs/data/resnet_15W.txt",
    ("resnet152-rerun", "MAXN"): "docs/data/resnet_test.txt",
    ("depth-anything-v2-base", "MAXN"): "docs/data/depth_maxn.txt",
    ("depth-anything-v2-base", "50W"): "docs/data/depth_50W.txt",
    ("depth-anything-v2-base", "30W"): "docs/data/depth_30W.txt",
    ("depth-anything-v2-base", "15W"): "docs/data/depth_15W.txt",
    ("phi-3.5-mini", "30W"): "docs/data/phi_30W.txt",
    ("phi-3.5-mini", "15W"): "docs/data/phi_15W.txt",
}
TABLES = {"Resnet Test Results": "resnet152", "Depth Anything Test Results": "depth-anything-v2-base"}
RAIL_RE = re.compile(r"(VDD_GPU_SOC|VDD_CPU_CV|VIN_SYS_5V0|VDDQ_VDD2_1V8AO) (\d+)mW/(\d+)mW")
GR3D_RE = re.compile(r"GR3D_FREQ (\d+)%")
CPU_RE = re.compile(r"CPU \[([^\]]*)\]")
RAM_RE = re.compile(r"RAM \d+/(\d+)MB")
# Seconds (1 Hz samples): an idle gap that long separates runs, a busy stretch that long is a run (the longest
# pause inside one run of these logs is 21 s).
RUN_GAP_S = 60


def git_show(git_dir: str, path: str) -> str:
    return subprocess.run(
        ["git", f"--git-dir={git_dir}", "show", f"{COMMIT}:{path}"], capture_output=True, text=True, check=True
    ).stdout


def blob(git_dir: str, path: str) -> str:
    out = subprocess.run(
        ["git", f"--git-dir={git_dir}", "rev-parse", f"{COMMIT}:{path}"], capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


def parse(text: str) -> list[dict]:
    """One dict per tegrastats line: rails (W, instantaneous), GR3D %, cores online, highest clock, busy cores."""
    samples = []
    for line in text.splitlines():
        gr3d = GR3D_RE.search(line)
        cpu = CPU_RE.search(line)
        rails = {name: int(now) / 1000.0 for name, now, _ in RAIL_RE.findall(line)}
        if gr3d is None or cpu is None or len(rails) != len(RAILS):
            continue
        cores = [c for c in cpu.group(1).split(",") if c != "off"]
        ram = RAM_RE.search(line)
        samples.append(
            {
                "gr3d": int(gr3d.group(1)),
                "rails": rails,
                "cores_online": len(cores),
                "cpu_mhz_max": max(float(c.split("@")[1]) for c in cores),
                "busy_cores": sum(int(c.split("%")[0]) for c in cores) / 100.0,
                "core_loads": [(int(c.split("%")[0]) / 100.0, float(c.split("@")[1])) for c in cores],
                "ram_total_mb": int(ram.group(1)) if ram else None,
            }
        )
    return samples


def summary(samples: list[dict]) -> dict:
    out: dict = {"samples": len(samples)}
    for rail in RAILS:
        values = [s["rails"][rail] for s in samples]
        out[rail] = {"mean": round(statistics.fmean(values), 3), "median": round(statistics.median(values), 3)}
    out["sum_mean"] = round(statistics.fmean(sum(s["rails"].values()) for s in samples), 3)
    loads = [s["gr3d"] for s in samples]
    out["gr3d_pct"] = {"mean": round(statistics.fmean(loads), 1), "median": statistics.median(loads)}
    out["busy_cores_by_mhz"] = busy_cores_by_mhz(samples)
    return out


def busy_cores_by_mhz(samples: list[dict]) -> dict[str, float]:
    """Mean busy cores (per-core load / 100) at each CPU clock the samples show, so the CPU rail can be held to
    the cores' own activity at their own clocks (a cluster idles at its floor while another runs at the cap)."""
    by_mhz: dict[str, float] = {}
    for s in samples:
        for load, mhz in s["core_loads"]:
            key = f"{mhz:g}"
            by_mhz[key] = by_mhz.get(key, 0.0) + load
    return {k: round(v / len(samples), 4) for k, v in sorted(by_mhz.items(), key=lambda kv: float(kv[0])) if v > 0}


def own_run(samples: list[dict]) -> list[dict]:
    """The log up to where a later run at another mode starts (see the module docstring)."""
    busy_at = [i for i, s in enumerate(samples) if s["gr3d"] > 0]
    stretches = [[busy_at[0]]]
    for prev, i in itertools.pairwise(busy_at):
        if i - prev > RUN_GAP_S:
            stretches.append([])
        stretches[-1].append(i)
    first_mhz = max(samples[i]["cpu_mhz_max"] for i in stretches[0])
    for stretch in stretches[1:]:
        if len(stretch) >= RUN_GAP_S and max(samples[i]["cpu_mhz_max"] for i in stretch) != first_mhz:
            return samples[: stretch[0]]
    return samples


def table_rows(doc: str) -> dict[tuple[str, str], dict]:
    """The repository's summary tables: FPS and power per mode (the runs' throughput comes from here)."""
    rows: dict[tuple[str, str], dict] = {}
    for title, workload in TABLES.items():
        block = doc.split(title, 1)[1]
        for line in block.splitlines()[3:9]:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) < 6 or cells[0] not in ("MaxN", "50W", "30W", "15W"):
                continue
            mode = "MAXN" if cells[0] == "MaxN" else cells[0]
            rows[(workload, mode)] = {"fps": float(cells[1]), "power_w": float(cells[5])}
    return rows


def derive(git_dir: str) -> dict:
    doc = git_show(git_dir, DOC)
    table = table_rows(doc)
    runs = []
    for (workload, mode), path in LOGS.items():
        samples = own_run(parse(git_show(git_dir, path)))
        busy_at = [i for i, s in enumerate(samples) if s["gr3d"] > 0]
        busy = [samples[i] for i in busy_at]
        idle = samples[busy_at[-1] + 1 :]
        run = {
            "workload": workload,
            "mode": mode,
            "log": path,
            "blob": blob(git_dir, path),
            "cores_online": busy[0]["cores_online"],
            "cpu_mhz_max": max(s["cpu_mhz_max"] for s in busy),
            "busy_cores_median": round(statistics.median(s["busy_cores"] for s in busy), 2),
            "ram_total_mb": busy[0]["ram_total_mb"],
            "busy": summary(busy),
            "idle": summary(idle) if idle else None,
        }
        published = table.get((workload, mode))
        if published is not None:
            run["table"] = published
            run["table_power_vs_log"] = round(published["power_w"] / run["busy"]["sum_mean"] - 1.0, 3)
        runs.append(run)
    return {
        "version": 1,
        "source": {
            "repository": REPO,
            "commit": COMMIT,
            "document": f"{REPO}/blob/{COMMIT}/{DOC}",
            "board": "Jetson AGX Orin devkit, 32 GB (RAM total 30698 MB in every log; the authors say 32GB), "
            "12 CPU cores online at MAXN and 50W, 8 at 30W, 4 at 15W: nvpmodel_p3701_0000.conf's modes",
            "runtime": "HuggingFace pipelines (PyTorch, eager fp32), batch 1, nvpmodel defaults (no jetson_clocks)",
            "sampling": "tegrastats at 1 Hz; instantaneous mW per rail; GR3D load in % without its clock (no "
            "GR3D or EMC frequency in any log)",
        },
        "derived_by": "python scripts/orin_mode_rails.py GIT_DIR --write",
        "runs": runs,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("git_dir", help="clone or mirror of BroncoSpace-Lab/scales-hardware")
    parser.add_argument("--write", action="store_true", help=f"write {OUT.name}")
    args = parser.parse_args()
    data = derive(args.git_dir)
    for run in data["runs"]:
        b = run["busy"]
        rails = " ".join(f"{r.split('_')[1]}={b[r]['mean']:.2f}" for r in RAILS)
        print(
            f"{run['workload']:24s} {run['mode']:4s} busy={b['samples']:5d} {rails} sum={b['sum_mean']:.2f} "
            f"cores={run['cores_online']} cpu<={run['cpu_mhz_max']:.0f} busy_cores={run['busy_cores_median']}"
        )
    if args.write:
        OUT.write_text(json.dumps(data, indent=1) + "\n")


if __name__ == "__main__":
    main()
