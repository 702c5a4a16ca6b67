"""What lazy confirmation costs on twins: the same landscapes and seeds under each confirmation setting.

Usage: python benchmarks/confirm_guard.py [--devices sim:orin,sim:orin-nano,sim:h200] [--models resnet50,bert-base]
           [--bounds tight,medium,loose] [--quick-start] [--boards 1000-1005] [--seeds 3]
           [--variants confirm:confirm_within=none,lazy:confirm_within=0.0] --out results.json

Each landscape (tuner.bench's twins, the quick start with --quick-start, generated boards with --boards) runs at
each seed once per variant (LearnedSampler settings) through benchmarks/early_stop.py's run: the study to its
cap, the stop rule judged on its prefix. Landscapes are built once for all variants (a sim:h200 sweep takes
minutes). Per variant: the regret of the answer at the stop and at the cap (true energy over the optimum), the
cost of the stop (its answer over the cap's), the trials and windows measured at the stop, and the share of
fresh windows of the answer at the stop that exceed the bound (tune bench's violation).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

from early_stop import boards, fixed, judged_bounds, run, setting

from tuner.bench import BenchSettings, _landscapes, build_landscapes
from tuner.devices.virtual.generated import WORKLOADS
from tuner.strategies.stopping import StopRule

RULE = "window3/default"


def variants(spec: str) -> dict[str, dict]:
    out = {}
    for item in filter(None, spec.split(",")):
        name, _, rest = item.partition(":")
        out[name] = {k: setting(v) for k, v in (p.split("=") for p in rest.split(";") if p)}
    return out


def summarize(runs: list[dict]) -> list[dict]:
    rows = []
    keys = sorted({(r["variant"], r["scope"]) for r in runs})
    for name, scope in keys:
        rs = [r for r in runs if r["variant"] == name and r["scope"] == scope]
        stop = [r["rules"][RULE] for r in rs]
        finite = [s["regret"] for s in stop if math.isfinite(s["regret"])]
        rows.append(
            {
                "variant": name,
                "scope": scope,
                "runs": len(rs),
                "regret_stop_median": statistics.median(s["regret"] for s in stop),
                "regret_stop_worst": max(s["regret"] for s in stop),
                "regret_cap_median": statistics.median(r["regret_cap"] for r in rs),
                "regret_cap_worst": max(r["regret_cap"] for r in rs),
                "cost_median": statistics.median(s["cost"] for s in stop),
                "cost_worst": max(s["cost"] for s in stop),
                "within_1pct": sum(x <= 0.01 for x in finite),
                "trials_median": statistics.median(s["measured"] for s in stop),
                "windows_median": statistics.median(s["windows"] for s in stop),
                "violation_mean": statistics.mean(s["violation"] or 0.0 for s in stop),
            }
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--devices", default="sim:orin,sim:orin-nano,sim:h200")
    ap.add_argument("--models", default="resnet50,bert-base")
    ap.add_argument("--bounds", default="tight,medium,loose")
    ap.add_argument("--quick-start", action="store_true", help="also sim:orin resnet50 at 50 ms (the README's)")
    ap.add_argument("--boards", default="", help="generated boards, e.g. 1000-1005 (their own bound)")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--trials", type=int, default=40)
    ap.add_argument("--variants", default="confirm:confirm_within=none,lazy:confirm_within=0.0")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    settings = BenchSettings(
        devices=[d for d in args.devices.split(",") if d],
        models=args.models.split(","),
        bounds=args.bounds.split(","),
        tune_boards=[],
        judge_boards=[],
    )
    started = time.monotonic()
    lands = build_landscapes(settings) if settings.devices else []
    if args.quick_start:
        lands.append(fixed("sim:orin", "resnet50", 50.0))
    for seed in boards(args.boards):
        bound = ("tight", "medium", "loose")[(seed // 3) % 3]
        lands += _landscapes("judge boards", f"gen:{seed}", WORKLOADS[seed % len(WORKLOADS)], [bound], "p99")
    bounds = judged_bounds("window3")
    rules = {"default": StopRule()}
    runs: list[dict] = []
    for land in lands:
        scope = "generated" if land.device.startswith("gen:") else "quick start" if land.bound == "50ms" else "twins"
        for name, strategy in variants(args.variants).items():
            for seed in range(args.seeds):
                r = run(land, seed, args.trials, bounds, rules, strategy)
                r.update(variant=name, scope=scope)
                runs.append(r)
                s = r["rules"][RULE]
                print(
                    f"{name} {land.device} {land.model} {land.bound} seed {seed}: stop after {s['measured']} "
                    f"({s['windows']} windows) regret {s['regret']:.2%}, cap {r['regret_cap']:.2%}, "
                    f"violation {s['violation']}",
                    flush=True,
                )
                args.out.write_text(json.dumps({"command": " ".join(sys.argv), "runs": runs}, indent=1))
    result = {
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": "python " + " ".join(sys.argv),
        "seconds": round(time.monotonic() - started, 1),
        "summary": summarize(runs),
        "runs": runs,
    }
    args.out.write_text(json.dumps(result, indent=1))
    for row in result["summary"]:
        print(json.dumps(row))


if __name__ == "__main__":
    main()
