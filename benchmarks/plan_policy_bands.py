"""Policy bands of ``tune plan`` for resnet50 Server over rates that span a device's range (hardware or twin).

Runs tune plan's own loop (``tuner.serve.plan``: a study per rate, refine,
verify, cross-check, bands) with two settings the CLI does not expose, chosen
so that five rates fit one ten-minute call on the H200: a 0.3 s warm-up
before each window (the ladder of CUDA graphs is captured once per variant by
the runner cache, so the warm-up only has to reach steady clocks), and the
first trials of every rate's study seeded with fp16 at each maximum batch size
with CUDA graphs, and once eager (the plan's own seeds are the space's
defaults, graph=eager, which on this card never serve the top rates). Every
study lives in ``--storage``; a second run with the same storage measures only
the rates and cross-checks the first one did not finish.

    python3 benchmarks/plan_policy_bands.py --device cuda:0 --out OUT        # observe-only on a GPU
    python3 benchmarks/plan_policy_bands.py --device sim:h200 --out OUT      # the twin, same rates
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import optuna

from tuner.devices.registry import open_device
from tuner.measure.settings import WindowSettings
from tuner.scenario import TIMEOUT_KNOB, label, serving_space, window_for
from tuner.serve.figures import plot_policy
from tuner.serve.plan import PlanOptions, build_policy, plan_rates
from tuner.serve.policy import write_policy
from tuner.space import Config
from tuner.study import narrowed_space, open_study, study_name

SEED_TIMEOUT_MS = 1.0
CARD_QUERY = (
    "name,driver_version,clocks.sm,clocks.mem,clocks.applications.graphics,power.limit,persistence_mode,compute_mode"
)


def card_state(device: str) -> str | None:
    """nvidia-smi's reading of what the plan must leave unchanged (clocks, power limit, modes); None on a twin."""
    if not device.startswith("cuda"):
        return None
    query = ["nvidia-smi", f"--query-gpu={CARD_QUERY}", "--format=csv"]
    return subprocess.run(query, capture_output=True, text=True, check=True, timeout=30).stdout.strip()


def seed(device: Any, options: PlanOptions, storage: str) -> None:
    """Queue fp16 CUDA graphs at every maximum batch size, and fp16 eager at the middle one, in each new study."""
    space = serving_space(
        narrowed_space(device, options.knobs, options.batch_sizes), window_for(options.window, "server", 1.0)
    )
    default = space.default_config().knobs
    sizes = space.batch_sizes
    seeds = [("cudagraphs", b) for b in sizes] + [("eager", sizes[len(sizes) // 2])]
    for rate in options.rates:
        name = study_name(
            options.model, device, label(window_for(options.window, "server", rate)), options.max_latency_ms
        )
        study = open_study(name, storage)
        if study.trials:
            continue
        for graph, batch in seeds:
            knobs = {**default, "precision": "fp16", "graph": graph, TIMEOUT_KNOB: SEED_TIMEOUT_MS}
            study.enqueue_trial(space.params_for(Config(knobs=knobs, batch_size=batch)), skip_if_exists=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--out", type=Path, required=True, help="folder: tune.db, policy.yaml/png, plan.json")
    parser.add_argument("--rates", default="500,2000,5000,9000,13000")
    parser.add_argument("--max-latency-ms", type=float, default=20.0)
    parser.add_argument("--batch-sizes", default="8,32,128")
    parser.add_argument("--trials", type=int, default=6)
    parser.add_argument("--window", type=float, default=2.0)
    parser.add_argument("--warmup", type=float, default=0.3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--storage", help="Optuna storage URL (default sqlite:///OUT/tune.db)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    before = card_state(args.device)
    storage = args.storage or f"sqlite:///{(args.out / 'tune.db').resolve()}"
    device = open_device(args.device)
    options = PlanOptions(
        model="resnet50",
        max_latency_ms=args.max_latency_ms,
        rates=[float(r) for r in args.rates.split(",")],
        trials=args.trials,
        refine_trials=0,
        seed=args.seed,
        sampler="random",
        batch_sizes=[int(b) for b in args.batch_sizes.split(",")],
        knobs=["precision", "graph"],
        storage=storage,
        out=args.out,
        window=WindowSettings(window_s=args.window, warmup_s=args.warmup, seed=args.seed),
    )
    seed(device, options, storage)

    def progress(result: Any) -> None:
        best = "infeasible" if result.record is None else f"{result.record['j_per_query']:.4g} J/query"
        print(f"{result.rate:g} q/s: {best} at {time.monotonic() - started:.0f} s", flush=True)

    results = plan_rates(device, options, on_rate=progress)
    policy = build_policy(device, options, results, "p99")
    write_policy(policy, args.out / "policy.yaml")
    plot_policy(policy, args.out / "policy.png")
    windows = sum(
        len(open_study(r.study, storage).get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)))
        for r in results
    )
    summary = {
        "version": 1,
        "what": "tune plan's policy bands for resnet50 Server (benchmarks/plan_policy_bands.py)",
        "date_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": " ".join(["python3", *sys.argv]),
        "device": device.name,
        "simulated": device.simulated,
        "gpu": getattr(device, "gpu_name", None),
        "card_before": before,
        "card_after": card_state(args.device),
        "windows_measured": windows,
        "seconds": round(time.monotonic() - started, 1),
        "policy": policy.model_dump(mode="json"),
    }
    (args.out / "plan.json").write_text(json.dumps(summary, indent=1))
    for band in policy.bands:
        figures = f"{band.j_per_query:.4f} J/query, p99 {band.latency_ms:.2f} ms"
        print(f"{band.min_qps:g}-{band.max_qps:g} q/s: {band.label()}: {figures}")
    print(f"{windows} windows in {summary['seconds']} s")


if __name__ == "__main__":
    main()
