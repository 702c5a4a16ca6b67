"""Governor benchmark (digital twin figures): plan a policy, then replay the shipped traces every way.

For each twin: ``tune plan`` over a range of arrival rates (resnet50, p99 <= 50 ms; a study per rate,
reused when the storage already has it), then ``tune replay`` of the diurnal day and the bursty hour:
energy, queries over the bound and switches for the default mode as deployed (MAXN / the card's default
clocks with its frequency governors free), the same mode with clocks locked, the static configuration
planned for the trace's peak rate, and the governor. One more line splits the governor's gap: the same
bands chosen on the true rate (no estimation, no headroom, switches free), which no governor can beat
with this policy. Then the switch model's effect and sensitivity: the governor with switches free and
no switch-cost rule (the replay before switch costs were modelled, but with the queue carried across
each switch), with costs but without the rule, and with every switch time x0.25 and x4; and the default
mode as deployed with its governors reacting at once and 10 or 50 ms late (25 ms in the main table).
The H200 twin serves the same traces scaled by ``--h200-scale`` (the card is about 30 times faster).

    nice -n 10 python benchmarks/governor.py            # writes benchmarks/results/governor.md
"""

from __future__ import annotations

import argparse
import datetime as dt
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from importlib import resources
from pathlib import Path

from tuner.devices.registry import open_device
from tuner.devices.switching import SwitchCosts
from tuner.devices.virtual.twin import TwinDevice
from tuner.serve.figures import plot_policy, plot_replay
from tuner.serve.plan import REFINE_TRIALS, PlanOptions, build_policy, plan_rates
from tuner.serve.policy import Policy, write_policy
from tuner.serve.replay import (
    DEFAULT_REACTION_S,
    GovernorRules,
    Replayer,
    default_band,
    deployed_reaction,
    replay,
    unlocked_idle_w,
)
from tuner.serve.replay_report import StrategyResult
from tuner.serve.trace import Trace, load_trace

RESULTS = Path(__file__).resolve().parent / "results"


def variants(
    policy: Policy, device: TwinDevice, trace: Trace, seed: int, rules: GovernorRules
) -> list[tuple[str, StrategyResult]]:
    """The governor under other switch models, and the default mode with other governor reaction times."""
    out = []
    plain = replace(rules, weigh_switches=False)
    for label, rule, costs in (
        ("governor, switches free, no switch-cost rule (the replay before)", plain, SwitchCosts.free()),
        ("governor, switch costs, no switch-cost rule", plain, SwitchCosts()),
        ("governor, every switch time x0.25", rules, SwitchCosts(scale=0.25)),
        ("governor, every switch time x4", rules, SwitchCosts(scale=4.0)),
    ):
        out.append((label, Replayer(device, policy, seed).governed(trace, 1.0, rule, costs)))
    static = policy.bands[policy.band_for(float(trace.rates.max())) or policy.top]
    maxn, timeout = default_band(device, static)
    replayer = Replayer(device, policy, seed)
    idle = unlocked_idle_w(device, maxn)
    for delay in (0.0, 0.010, 0.050):
        reaction = deployed_reaction(replayer, maxn, delay)
        if delay > 0 and reaction is None:
            continue
        label = f"default as deployed, governors {'at once' if delay == 0 else f'{1000 * delay:g} ms late'}"
        out.append((label, replayer.fixed("default", maxn, timeout, trace, -1, idle, reaction)))
    return out


def known_rate(policy: Policy, device: TwinDevice, trace: Trace, seed: int) -> tuple[float, float]:
    """Energy (J) and % of queries over the bound with each row served by the band for its true rate."""
    replayer = Replayer(device, policy, seed)
    energy = queries = over = 0.0
    for rate, seconds in zip(trace.rates, trace.durations, strict=True):
        index = policy.band_for(float(rate))
        band = policy.bands[policy.top if index is None else index]
        e, q, o = replayer.piece(band.config(), band.batch_timeout_ms, float(rate), float(seconds))
        energy, queries, over = energy + e, queries + q, over + o
    return energy, 100 * over / queries


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="study storage folder (default: a temporary one)")
    parser.add_argument("--trials", type=int, default=50, help="trials per planned rate")
    parser.add_argument("--refine", type=int, default=REFINE_TRIALS, help="neighbour-walk trials per planned rate")
    parser.add_argument("--step", type=float, default=10.0, help="planned rates: step..180 q/s in this step (x scale)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--h200-scale", type=float, default=30.0)
    parser.add_argument("--twins", default="sim:orin,sim:h200")
    parser.add_argument("--headroom", type=float, default=GovernorRules.headroom)
    parser.add_argument("--smoothing", type=float, default=GovernorRules.smoothing_s)
    parser.add_argument("--md", default="governor.md", help="results file under benchmarks/results/")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="governor-bench-"))
    RESULTS.mkdir(parents=True, exist_ok=True)
    traces = resources.files("tuner.serve") / "traces"
    rules = GovernorRules(headroom=args.headroom, smoothing_s=args.smoothing)
    base = [args.step * i for i in range(1, int(180 / args.step) + 1)]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    started = time.monotonic()
    lines = [
        "# Governor benchmark (digital twin figures, not hardware)",
        "",
        f"Date: {dt.datetime.now(dt.timezone.utc).isoformat(timespec='minutes')}; machine: "
        f"{platform.node()} ({platform.machine()}, Python {platform.python_version()}), busy 2-core CI-class host; "
        f"commit {commit}.",
        "",
        "Command: `nice -n 10 python " + " ".join(["benchmarks/governor.py", *sys.argv[1:]]) + "`",
        "",
        f"resnet50, Server scenario, p99 <= 50 ms; plan over {base[0]:g}-{base[-1]:g} q/s in steps of "
        f"{args.step:g} (x scale), {args.trials} trials per rate (TPE, seeded with the default mode at every batch "
        f"size and the rate below's best five) and up to {args.refine} walking from the best to cheaper neighbours, "
        f"every rate's winner cross-checked at every other rate, seed "
        f"{args.seed}. Replay: the governor reads a one-second Poisson count every second, smoothing "
        f"{rules.smoothing_s:g} s, headroom {100 * rules.headroom:g}%, hysteresis {100 * rules.hysteresis:g}%, "
        f"dwell {rules.min_dwell_s:g} s, a switch down only if it saves {100 * rules.min_saving:g}% at the observed "
        "rate and more than twice its energy over the dwell time. Every switch pauses serving for its time "
        "(tuner/devices/switching.py) and the queue carries across it. `default`: the default mode with its "
        "frequency governors free (clocks fall to the lowest between batches, "
        f"{1000 * DEFAULT_REACTION_S:g} ms late on a Jetson); "
        "`default_locked`: the same with clocks locked at maximum (jetson_clocks).",
        "",
    ]
    for twin in args.twins.split(","):
        scale = args.h200_scale if "h200" in twin else 1.0
        device = open_device(twin)
        options = PlanOptions(
            model="resnet50",
            max_latency_ms=50.0,
            rates=[r * scale for r in base],
            trials=args.trials,
            refine_trials=args.refine,
            seed=args.seed,
            out=out,
        )
        t0 = time.monotonic()
        results = plan_rates(device, options, on_rate=lambda r, t=twin: print(f"{t} {r.rate:g} q/s done", flush=True))
        policy = build_policy(device, options, results, "p99")
        plan_s = time.monotonic() - t0
        stem = f"governor-{device.slug}"
        write_policy(policy, RESULTS / f"{stem}-policy.yaml")
        plot_policy(policy, RESULTS / f"{stem}-policy.png")
        lines += [f"## {twin} (trace rates x {scale:g}; plan took {plan_s:.0f} s)", "", "Policy bands:", ""]
        lines += ["| rates q/s | configuration | J/query at top | p99 ms at top |", "|---|---|---|---|"]
        lines += [
            f"| {b.min_qps:g}-{b.max_qps:g} | {b.label()} | {b.j_per_query:.4g} | {b.latency_ms:.3g} |"
            for b in policy.bands
        ]
        for name in ("diurnal", "bursty"):
            trace = load_trace(traces / f"{name}.csv", scale)  # type: ignore[arg-type]
            report = replay(policy, device, trace, seed=args.seed, rules=rules)  # type: ignore[arg-type]
            plot_replay(report, RESULTS / f"{stem}-{name}.png")
            summary = report.summary()
            known_j, known_over = known_rate(policy, device, trace, args.seed)  # type: ignore[arg-type]
            static_j = report.results["static"].energy_j
            lines += [
                "",
                f"Trace {name} ({summary['hours']:g} h, peak {summary['peak_qps']:g} q/s):",
                "",
                "| strategy | energy kJ | J/query | queries | % over bound | switches | switching s |",
                "|---|---|---|---|---|---|---|",
            ]
            lines += [
                f"| {r['strategy']} | {r['energy_kj']:.4g} | {r['j_per_query']:.4g} | {r['queries']} | "
                f"{r['over_bound_pct']:.3g} | {r['switches']} | {r['switching_s']:.3g} |"
                for r in summary["strategies"]
            ]
            lines += ["", "Other switch models and governor reaction times (same trace, same seed):", ""]
            lines += [
                "| variant | energy kJ | J/query | % over bound | switches | switching s |",
                "|---|---|---|---|---|---|",
            ]
            for label, result in variants(policy, device, trace, args.seed, rules):  # type: ignore[arg-type]
                r = result.row()
                lines.append(
                    f"| {label} | {r['energy_kj']:.4g} | {r['j_per_query']:.4g} | {r['over_bound_pct']:.3g} | "
                    f"{r['switches']} | {r['switching_s']:.3g} |"
                )
            lines += [
                "",
                f"Governor saves {summary['governor_vs_static_pct']:.1f}% against the static peak-tuned configuration, "
                f"{summary['governor_vs_default_pct']:.1f}% against the default mode as deployed and "
                f"{summary['governor_vs_default_locked_pct']:.1f}% against it with locked clocks. The same bands "
                f"on the true rate: {known_j / 1000:.4g} kJ ({100 * (1 - known_j / static_j):.1f}% below static), "
                f"{known_over:.3g}% over the bound. Plot: `{stem}-{name}.png`.",
            ]
        lines.append("")
    lines.append(f"Wall time: {time.monotonic() - started:.0f} s.")
    (RESULTS / args.md).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
