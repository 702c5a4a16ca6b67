"""Does every command name the same configuration at every rate of a plan? The issue's own plan, on a twin.

Runs ``tune plan`` as a user does (default trials, refine and verification),
then for each planned rate asks ``tune export --scenario server@RATEqps``,
``tune pareto`` (its starred rows), ``tune status --scenario`` and Optuna's
``best_trial``, and compares the trial each names with the policy's point
and band for that rate. Writes a Markdown table and the raw JSON.

    python3 benchmarks/plan_one_answer.py --out OUT [--device sim:orin] [--rates 20:180:20]
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

import optuna

from tuner.serve.policy import load_policy


def tune(*args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "tuner", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"tune {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", default="sim:orin")
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--bound", default="50ms")
    parser.add_argument("--rates", default="20:180:20")
    parser.add_argument("--seed", default="1")
    args = parser.parse_args()
    studies = args.out / "studies"
    flags = ["-m", args.model, "-d", args.device, "-l", args.bound, "--out", str(studies)]
    started = time.monotonic()
    tune("plan", *flags, "--rates", args.rates, "--seed", args.seed, "-o", str(args.out / "policy.yaml"))
    plan_s = time.monotonic() - started
    policy = load_policy(args.out / "policy.yaml")
    storage = f"sqlite:///{studies}/tune.db"
    rows = []
    for point in policy.points:
        scenario = f"server@{point.rate_qps:g}qps"
        row: dict = {"rate": point.rate_qps, "policy point": point.trial}
        if point.feasible:
            best = optuna.load_study(study_name=point.study, storage=storage).best_trial
            exported = tune("export", *flags, "--scenario", scenario, "-o", str(args.out / "e.yaml"), "--json")
            export = json.loads(exported)
            pareto = json.loads(tune("pareto", *flags, "--scenario", scenario, "--json"))
            status = json.loads(tune("status", *flags, "--scenario", scenario, "--json"))["studies"][0]
            band = next(b for b in policy.bands if b.min_qps < point.rate_qps <= b.max_qps)
            row.update(
                {
                    "best_trial": best.number,
                    "export": export["provenance"]["trial"],
                    "pareto *": sorted({p["trial"] for f in pareto["fronts"].values() for p in f if p["recommended"]}),
                    "status": status["best"]["trial"],
                    "band": band.provenance.trial if band.provenance.study == point.study else None,
                    "J/query": best.value,
                }
            )
            named = {row["policy point"], row["export"], row["status"], *row["pareto *"]}
            named |= {row["band"]} if row["band"] is not None else set()
            row["one answer"] = named == {best.number}
        rows.append(row)
    (args.out / "plan_one_answer.json").write_text(json.dumps({"plan_s": plan_s, "rows": rows}, indent=1))
    lines = [
        f"# One answer across `tune plan`'s rates ({args.device}, digital twin, not hardware)",
        "",
        f"Date: {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC; host {platform.node()} "
        f"({platform.processor() or platform.machine()}); command: python3 benchmarks/plan_one_answer.py "
        f"--out OUT --device {args.device} --rates {args.rates} (tune plan -m {args.model} -l {args.bound} "
        f"--seed {args.seed}, default trials, refine and verification); plan took {plan_s:.0f} s.",
        "",
        "| rate q/s | best_trial | policy point | band (its upper rate) | export | pareto * | status | J/query "
        "| one answer |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "best_trial" not in r:
            lines.append(f"| {r['rate']:g} | no feasible trial | - | - | - | - | - | - | - |")
            continue
        band = "-" if r["band"] is None else r["band"]
        lines.append(
            f"| {r['rate']:g} | {r['best_trial']} | {r['policy point']} | {band} | {r['export']} | "
            f"{', '.join(map(str, r['pareto *']))} | {r['status']} | {r['J/query']:.4g} | {r['one answer']} |"
        )
    (args.out / "plan_one_answer.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
