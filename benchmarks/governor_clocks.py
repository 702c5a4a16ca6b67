"""Bands as clock locks or as clock caps: what letting the tuned configurations idle at the floor buys (twin figures).

``tune apply`` and the governor write a configuration's clocks as locks (min =
max), so between batches the board idles at the configuration's clocks. The
default mode as deployed (``nvpmodel -m 0``) lets devfreq and cpufreq drop the
clocks to the floor between batches and raise them again 25 ms late. This
replays the committed sim:orin policy (benchmarks/results/governor-sim-orin-policy.yaml,
written by benchmarks/governor.py) over the shipped diurnal day and bursty hour
with the static configuration and the governor's bands held each way:
``lock`` (as today), and ``cap`` (max = the band's clock, min = the table's
floor, governors free) with the governors reacting 25 ms late (the replay's
model for the default mode: GPU devfreq polls every 25 ms), 10 ms late
(schedutil's rate limit on the CPU) and at once (the most favourable reading).
The plan is not re-run: the bands are the ones planned with locked clocks.

    nice -n 10 python benchmarks/governor_clocks.py    # writes benchmarks/results/governor-clocks.md
"""

from __future__ import annotations

import datetime as dt
import platform
import subprocess
import sys
import time
from importlib import resources
from pathlib import Path

from tuner.devices.registry import open_device
from tuner.serve.policy import load_policy
from tuner.serve.replay import DEFAULT_REACTION_S, replay
from tuner.serve.trace import load_trace

RESULTS = Path(__file__).resolve().parent / "results"
# (clocks, how late the tuned configurations' governors react); the default mode always reacts 25 ms late.
VARIANTS = (("lock", DEFAULT_REACTION_S), ("cap", DEFAULT_REACTION_S), ("cap", 0.010), ("cap", 0.0))


def label(clocks: str, reaction_s: float) -> str:
    if clocks == "lock":
        return "lock (min = max, as today)"
    late = "at once" if reaction_s == 0 else f"{1000 * reaction_s:g} ms late"
    return f"cap (min = floor), governors {late}"


def main() -> None:
    policy_file = RESULTS / "governor-sim-orin-policy.yaml"
    policy = load_policy(policy_file)
    device = open_device(policy.device)
    traces = resources.files("tuner.serve") / "traces"
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    started = time.monotonic()
    lines = [
        "# Bands as clock locks or caps (digital twin figures, not hardware)",
        "",
        f"Date: {dt.datetime.now(dt.timezone.utc).isoformat(timespec='minutes')}; machine: "
        f"{platform.node()} ({platform.machine()}, Python {platform.python_version()}); commit {commit}.",
        "",
        "Command: `nice -n 10 python " + " ".join(["benchmarks/governor_clocks.py", *sys.argv[1:]]) + "`",
        "",
        f"Policy `{policy_file.name}` ({policy.device}, {policy.model}, {policy.percentile} <= "
        f"{policy.max_latency_ms:g} ms); seed 0; the replay's default rules and switch costs (as in governor.md). "
        f"MAXN as deployed reacts {1000 * DEFAULT_REACTION_S:g} ms late in every row; savings are against it.",
    ]
    for name in ("diurnal", "bursty"):
        trace = load_trace(traces / f"{name}.csv")  # type: ignore[arg-type]
        lines += [
            "",
            f"Trace {name} (peak {float(trace.rates.max()):g} q/s):",
            "",
            "| static and bands held as | static kJ | static % over | governor kJ | governor % over "
            "| governor vs static | governor vs MAXN as deployed | MAXN as deployed kJ / % over |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for clocks, reaction_s in VARIANTS:
            report = replay(policy, device, trace, seed=0, reaction_s=DEFAULT_REACTION_S, clocks=clocks)  # type: ignore[arg-type]
            if reaction_s != DEFAULT_REACTION_S:
                tuned = replay(policy, device, trace, seed=0, reaction_s=reaction_s, clocks=clocks)  # type: ignore[arg-type]
                report.results.update(static=tuned.results["static"], governor=tuned.results["governor"])
            rows = {n: report.results[n].row() for n in ("default", "static", "governor")}
            s = report.savings()
            lines.append(
                f"| {label(clocks, reaction_s)} | {rows['static']['energy_kj']:.4g} | "
                f"{rows['static']['over_bound_pct']:.3g} | {rows['governor']['energy_kj']:.4g} | "
                f"{rows['governor']['over_bound_pct']:.3g} | {s['governor_vs_static_pct']:.1f}% | "
                f"{s['governor_vs_default_pct']:.1f}% | {rows['default']['energy_kj']:.4g} / "
                f"{rows['default']['over_bound_pct']:.3g} |"
            )
            print(lines[-1], flush=True)
    lines += ["", f"Wall time: {time.monotonic() - started:.0f} s."]
    (RESULTS / "governor-clocks.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
