"""Governor benchmark (digital twin figures): plan a policy, then replay the shipped traces three ways.

For each twin: ``tune plan`` over a range of arrival rates (resnet50, p99 <= 50 ms; a study per rate,
reused when the storage already has it), then ``tune replay`` of the diurnal day and the bursty hour:
energy, queries over the bound and switches for the default mode (MAXN / the card's default clocks),
the static configuration planned for the trace's peak rate, and the governor. The H200 twin serves
the same traces scaled by ``--h200-scale`` (the card is about 30 times faster than an AGX Orin).

    nice -n 10 python benchmarks/governor.py            # writes benchmarks/results/governor.md
"""

from __future__ import annotations

import argparse
import datetime as dt
import platform
import sys
import tempfile
import time
from importlib import resources
from pathlib import Path

from tuner.devices.registry import open_device
from tuner.serve.plan import PlanOptions, build_policy, plan_rates, plot_policy
from tuner.serve.policy import write_policy
from tuner.serve.replay import load_trace, plot_replay, replay

RESULTS = Path(__file__).resolve().parent / "results"
BASE_RATES = [float(r) for r in range(20, 181, 20)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="study storage folder (default: a temporary one)")
    parser.add_argument("--trials", type=int, default=50, help="trials per planned rate")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--h200-scale", type=float, default=30.0)
    parser.add_argument("--twins", default="sim:orin,sim:h200")
    parser.add_argument("--md", default="governor.md", help="results file under benchmarks/results/")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="governor-bench-"))
    RESULTS.mkdir(parents=True, exist_ok=True)
    traces = resources.files("tuner.serve") / "traces"
    started = time.monotonic()
    lines = [
        "# Governor benchmark (digital twin figures, not hardware)",
        "",
        f"Date: {dt.datetime.now(dt.timezone.utc).isoformat(timespec='minutes')}; machine: "
        f"{platform.node()} ({platform.machine()}, Python {platform.python_version()}), busy 2-core CI-class host.",
        "",
        "Command: `nice -n 10 python " + " ".join(["benchmarks/governor.py", *sys.argv[1:]]) + "`",
        "",
        f"resnet50, Server scenario, p99 <= 50 ms; plan over {BASE_RATES[0]:g}-{BASE_RATES[-1]:g} q/s in steps of "
        f"20 (x scale), {args.trials} trials per rate (TPE, seeded with the default mode at every batch size), "
        f"seed {args.seed}. Replay: the governor polls every 1 s, headroom 10%, hysteresis 10%, dwell 30 s.",
        "",
    ]
    for twin in args.twins.split(","):
        scale = args.h200_scale if "h200" in twin else 1.0
        device = open_device(twin)
        options = PlanOptions(
            model="resnet50",
            max_latency_ms=50.0,
            rates=[r * scale for r in BASE_RATES],
            trials=args.trials,
            seed=args.seed,
            out=out,
        )
        results = plan_rates(device, options, on_rate=lambda r, t=twin: print(f"{t} {r.rate:g} q/s done", flush=True))
        policy = build_policy(device, options, results, "p99")
        stem = f"governor-{device.slug}"
        write_policy(policy, RESULTS / f"{stem}-policy.yaml")
        plot_policy(policy, RESULTS / f"{stem}-policy.png")
        lines += [f"## {twin} (trace rates x {scale:g})", "", "Policy bands:", ""]
        lines += ["| rates q/s | configuration | J/query at top | p99 ms at top |", "|---|---|---|---|"]
        lines += [
            f"| {b.min_qps:g}-{b.max_qps:g} | {b.label()} | {b.j_per_query:.4g} | {b.latency_ms:.3g} |"
            for b in policy.bands
        ]
        for name in ("diurnal", "bursty"):
            report = replay(policy, device, load_trace(traces / f"{name}.csv", scale), seed=args.seed)  # type: ignore[arg-type]
            plot_replay(report, RESULTS / f"{stem}-{name}.png")
            summary = report.summary()
            lines += [
                "",
                f"Trace {name} ({summary['hours']:g} h, peak {summary['peak_qps']:g} q/s):",
                "",
                "| strategy | energy kJ | J/query | queries | % over bound | switches |",
                "|---|---|---|---|---|---|",
            ]
            lines += [
                f"| {r['strategy']} | {r['energy_kj']:.4g} | {r['j_per_query']:.4g} | {r['queries']} | "
                f"{r['over_bound_pct']:.3g} | {r['switches']} |"
                for r in summary["strategies"]
            ]
            lines += [
                "",
                f"Governor saves {summary['governor_vs_static_pct']:.1f}% against the static peak-tuned configuration "
                f"and {summary['governor_vs_default_pct']:.1f}% against the default mode. "
                f"Plot: `{stem}-{name}.png`.",
            ]
        lines.append("")
    lines.append(f"Wall time: {time.monotonic() - started:.0f} s.")
    (RESULTS / args.md).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
