"""How the governor's saving depends on how close the trace's peak comes to the board's capacity (twin figures).

The shipped diurnal day peaks at 150 q/s, about what the AGX Orin twin serves
resnet50 within a 50 ms p99: at the peak every strategy runs near MAXN. A
deployment sized with headroom sees a lower peak. This replays the committed
sim:orin policy (benchmarks/results/governor-sim-orin-policy.yaml, written by
benchmarks/governor.py) over the same day with every rate scaled, and reports
the governor's saving against the static configuration planned for the scaled
peak and against MAXN as deployed and with locked clocks. The plan is not
re-run: the policy's bands cover 10-180 q/s.

    nice -n 10 python benchmarks/governor_peak.py    # writes benchmarks/results/governor-peak.md
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
from tuner.serve.replay import replay
from tuner.serve.trace import load_trace

RESULTS = Path(__file__).resolve().parent / "results"
SCALES = (0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


def main() -> None:
    policy_file = RESULTS / "governor-sim-orin-policy.yaml"
    policy = load_policy(policy_file)
    device = open_device(policy.device)
    trace_file = resources.files("tuner.serve") / "traces" / "diurnal.csv"
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    started = time.monotonic()
    lines = [
        "# Governor saving against the trace's peak (digital twin figures, not hardware)",
        "",
        f"Date: {dt.datetime.now(dt.timezone.utc).isoformat(timespec='minutes')}; machine: "
        f"{platform.node()} ({platform.machine()}, Python {platform.python_version()}); commit {commit}.",
        "",
        "Command: `nice -n 10 python " + " ".join(["benchmarks/governor_peak.py", *sys.argv[1:]]) + "`",
        "",
        f"Policy `{policy_file.name}` ({policy.device}, {policy.model}, {policy.percentile} <= "
        f"{policy.max_latency_ms:g} ms); the diurnal day with every rate multiplied by the scale; seed 0; the "
        "replay's default rules and switch costs (as in governor.md).",
        "",
        "| scale | peak q/s | static band | governor vs static | vs MAXN as deployed | vs MAXN locked "
        "| % over bound (governor) | switches |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for scale in SCALES:
        trace = load_trace(trace_file, scale)  # type: ignore[arg-type]
        report = replay(policy, device, trace, seed=0)  # type: ignore[arg-type]
        s = report.summary()
        governor = report.results["governor"].row()
        static = policy.bands[policy.band_for(float(trace.rates.max())) or policy.top]
        lines.append(
            f"| {scale:g} | {s['peak_qps']:.0f} | {static.label()} | {s['governor_vs_static_pct']:.1f}% | "
            f"{s['governor_vs_default_pct']:.1f}% | {s['governor_vs_default_locked_pct']:.1f}% | "
            f"{governor['over_bound_pct']:.3g} | {governor['switches']} |"
        )
        print(lines[-1], flush=True)
    lines += ["", f"Wall time: {time.monotonic() - started:.0f} s."]
    (RESULTS / "governor-peak.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
