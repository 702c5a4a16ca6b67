"""Time to an answer on a real GPU, observe-only: `tune run` as a user types it, timed from the command.

Usage: python benchmarks/time_to_answer_h200.py --cases resnet50-offline,bert-offline,resnet50-server,vit-offline
           --samplers auto,tpe [--repeats 3] [--first-build] [--remeasure] --work /tmp/tta --out results.json

For each case and sampler, one `python3 -m tuner run ... --json` in a fresh
folder, timed from the launch of the process to its exit (process start,
model build and every trial included). From the study's storage:

- when the recommended configuration first came within 1% of the case's
  whole-space optimum and stayed there (``to_optimum_s``: the optimum measured
  again with ``--reference``, else the recorded one, REFERENCE_J; None when a
  run never got there in its trials, e.g. TPE at its 30-trial budget: its time
  to the answer is then only known to exceed its wall time, and the medians
  count it so, marked ``>=``);
- when the recommended configuration first came within 2% of the study's
  final best (Optuna's datetime_complete of the trial that made it so, from
  the launch): what `tune export` would have written at that moment;
- each trial's wall time (datetime_start to datetime_complete), its setup,
  window and search seconds, and how many trials were cut and why.

``--first-build`` first runs `tune measure` once per model in a fresh process
and times it: the first model build on a freshly started machine (CUDA and
cuDNN initialisation, kernel selection), reported apart from the studies.
``--remeasure`` measures each default-sampler study's recommended configuration
again in three fixed 5 s windows (`tune measure --repeat 3`); ``--reference``
measures the whole-space optimum of each Offline case named (``REFERENCE``)
the same way, after the studies. ``--budget``
seconds: no new study starts after that (a device call has a time limit).

``--repeats N`` runs the whole list N times, round after round, so the
samplers alternate within a case (default, TPE, default, ...) and drift of
the card over the call falls on both alike; round k runs with ``--seed k``
in its own folder. The medians over the rounds of each case and sampler
(wall time, time to within 2%, the answer) close the output.

Nothing on the card is changed: `cuda:0` is observe-only, and the card's
settings are read before and after (benchmarks/time_to_answer_h200.sh).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import optuna

from tuner.records import recommended_of

CASES = {
    "resnet50-offline": {"model": "resnet50", "args": ["--max-latency", "50ms"], "trials": "30"},
    "bert-offline": {"model": "bert-base", "args": ["--max-latency", "20ms"], "trials": "30"},
    "resnet50-server": {
        "model": "resnet50",
        "args": ["--max-latency", "10ms", "--scenario", "server", "--target-qps", "3000"],
        "trials": "12",
    },
    # A user's own model (benchmarks/models/vit_b16.py, found on PYTHONPATH as `tune run` finds any py: model).
    "vit-offline": {"model": "py:vit_b16:build", "args": ["--max-latency", "50ms"], "trials": "30"},
}
MODELS = Path(__file__).resolve().parent / "models"
# The default sampler runs as a user types it, with no --trials: it stops by itself (at most 40 trials). Other
# samplers record no bound to stop on, so they keep the case's budget.
STOPS_BY_ITSELF = ("auto", "learned")
WINDOW_ARGS = {"resnet50-server": ["--window", "4"]}
WITHIN = 0.02
# The knobs an observe-only H200 tunes besides batch size (its clocks and power limit stay as found).
RUNNER_KNOBS = ("precision", "channels_last", "graph")
TUNE = [sys.executable, "-m", "tuner"]
# The cheapest feasible configuration of the whole observe-only space, measured point by point on this card's
# kind (benchmarks/results/h200-observe/observe-*.log: resnet50 0.03724 J/query at 4.26 ms, bert-base 0.05454 at
# 2.92 ms). ``--reference`` measures it again in the same call as the studies' answers, so an answer's ratio to the
# optimum does not depend on which H200 a call was lent.
REFERENCE = {
    "resnet50-offline": (64, {"precision": "fp16", "channels_last": True, "graph": "cudagraphs"}),
    "bert-offline": (32, {"precision": "bf16", "channels_last": False, "graph": "cudagraphs"}),
}
# Their J/query as those logs read it: the optimum a run's answer is judged against when --reference does not
# measure it again in the same call.
REFERENCE_J = {"resnet50-offline": 0.03724, "bert-offline": 0.05454}
TO_OPTIMUM = 0.01
DEVICE = ["cuda:0"]  # --device sim:h200 tries the script on a twin


def run_case(name: str, sampler: str, work: Path, repeat: int = 0) -> dict:
    case = CASES[name]
    folder = work / (f"{name}-{sampler}" if repeat == 0 else f"{name}-{sampler}-r{repeat}")
    command = [
        *TUNE,
        "run",
        "--model",
        case["model"],
        "--device",
        DEVICE[0],
        *case["args"],
        *([] if sampler in STOPS_BY_ITSELF else ["--trials", case["trials"]]),
        *WINDOW_ARGS.get(name, []),
        "--sampler",
        sampler,
        "--seed",
        str(repeat),
        "--out",
        str(folder),
        "--json",
    ]
    env = environment()
    launched = dt.datetime.now()
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, check=False, env=env)
    wall = time.monotonic() - started
    record: dict = {
        "case": name,
        "sampler": sampler,
        "repeat": repeat,
        "command": " ".join(["python3", "-m", "tuner", *command[3:]]),
        "wall_s": round(wall, 2),
        "rc": done.returncode,
    }
    if done.returncode != 0:
        record["stderr"] = done.stderr[-3000:]
        return record
    payload = json.loads(done.stdout)
    record.update(summary=payload, **study_figures(folder, payload["study"], launched))
    return record


def environment() -> dict[str, str]:
    """The environment of every `tune` process: benchmarks/models on PYTHONPATH, as a py: model's user puts it."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(MODELS), env.get("PYTHONPATH", "")]))
    return env


def study_figures(folder: Path, name: str, launched: dt.datetime) -> dict:
    """Time to within 2% of the final best, and each trial's wall time, from the study's own timestamps."""
    study = optuna.load_study(study_name=name, storage=f"sqlite:///{folder / 'tune.db'}")
    trials = sorted(
        (t for t in study.get_trials(deepcopy=False) if t.datetime_complete is not None),
        key=lambda t: t.datetime_complete,
    )
    final = recommended_of(trials)
    reached = None
    if final is not None:
        for i in range(len(trials)):
            best = recommended_of(trials[: i + 1])
            if best is not None and best.value <= final.value * (1 + WITHIN):
                reached = (trials[i].datetime_complete - launched).total_seconds()
                break
    per_trial = [
        {
            "trial": t.number,
            "state": t.state.name,
            "wall_s": round((t.datetime_complete - t.datetime_start).total_seconds(), 2),
            "batch_size": t.user_attrs.get("batch_size"),
            "config": t.user_attrs.get("effective"),
            "j_per_query": t.user_attrs.get("j_per_query"),
            "p99_ms": t.user_attrs.get("p99_ms"),
            "feasible": t.state == optuna.trial.TrialState.COMPLETE and all(v <= 0 for v in t.constraints.values()),
            "windows": t.user_attrs.get("measurements"),
            "cut": t.user_attrs.get("cut"),
            "stop_rule": (t.user_attrs.get("extra") or {}).get("stop_rule"),
            "reused_from": t.user_attrs.get("reused_from"),
            **{key: t.user_attrs.get(key) for key in ("setup_s", "windows_s", "search_s")},
        }
        for t in trials
    ]
    first = trials[0].datetime_start if trials else launched
    curve = []
    for i, t in enumerate(trials):
        best = recommended_of(trials[: i + 1])
        curve.append([round((t.datetime_complete - launched).total_seconds(), 2), None if best is None else best.value])
    return {
        "answer_curve": curve,
        "final_best_trial": None if final is None else final.number,
        "final_best_j_per_query": None if final is None else final.value,
        "within_2pct_s": None if reached is None else round(reached, 2),
        "before_first_trial_s": round((first - launched).total_seconds(), 2),
        "max_trial_s": max((p["wall_s"] for p in per_trial), default=None),
        "cuts": {r: sum(p["cut"] == r for p in per_trial) for r in {p["cut"] for p in per_trial if p["cut"]}},
        "trials": per_trial,
    }


def to_optimum(record: dict, optimum: float | None) -> dict:
    """When the recommended J/query came within 1% of the whole-space optimum and stayed there (seconds from the
    launch), or None: not reached in the trials the run had (then the time is only known to exceed its wall)."""
    curve = record.get("answer_curve") or []
    if optimum is None or not curve:
        return {"optimum_j": optimum, "to_optimum_s": None}
    near = [v is not None and v <= optimum * (1 + TO_OPTIMUM) for _, v in curve]
    at = next((i for i in range(len(near)) if all(near[i:])), None)
    return {"optimum_j": optimum, "to_optimum_s": None if at is None else curve[at][0]}


def remeasure(record: dict) -> dict:
    """The recommended configuration in three fixed 5 s windows, as `tune measure` runs it."""
    best = record["summary"]["best"]
    return measure_again(record["case"], best["batch_size"], best["config"])


def measure_again(case: str, batch_size: int, knobs: dict) -> dict:
    """One configuration in three fixed 5 s windows (`tune measure --repeat 3`): its median J/query."""
    model = CASES[case]["model"]
    sets = [arg for k in RUNNER_KNOBS if k in knobs for arg in ("--set", f"{k}={str(knobs[k]).lower()}")]
    if "batch_timeout_ms" in knobs:
        sets += ["--batch-timeout", str(knobs["batch_timeout_ms"])]
    command = [*TUNE, "measure", "--model", model, "--device", DEVICE[0], "--batch-size", str(batch_size), *sets]
    command += ["--repeat", "3", "--window", "5", "--min-window", "5", "--json"]
    if case.endswith("server"):
        command += ["--scenario", "server", "--target-qps", "3000"]
    done = subprocess.run(command, capture_output=True, text=True, check=False, env=environment())
    if done.returncode != 0:
        return {"command": " ".join(command[1:]), "rc": done.returncode, "stderr": done.stderr[-2000:]}
    payload = json.loads(done.stdout)
    values = [m["j_per_query"] for m in payload["measurements"] if m["valid"]]
    return {
        "command": " ".join(["python3", "-m", "tuner", *command[3:]]),
        "j_per_query": values,
        "median": statistics.median(values) if values else None,
        "p99_ms": [m["p99_ms"] for m in payload["measurements"]],
    }


def first_build(model: str) -> dict:
    """One fresh process measuring one configuration: the first model build on this machine."""
    command = [*TUNE, "measure", "--model", model, "--device", DEVICE[0], "--batch-size", "32", "--window", "2"]
    command += ["--min-window", "2", "--json"]
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, check=False, env=environment())
    return {"model": model, "wall_s": round(time.monotonic() - started, 2), "rc": done.returncode}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--samplers", default="auto")
    parser.add_argument("--runs", default="", help="case:sampler pairs in this order (instead of cases x samplers)")
    parser.add_argument("--first-build", action="store_true")
    parser.add_argument("--remeasure", action="store_true")
    parser.add_argument("--reference", default="", help="Offline cases whose whole-space optimum is measured again")
    parser.add_argument("--work", type=Path, default=Path("/tmp/tta"))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", default=DEVICE[0])
    parser.add_argument("--budget", type=float, default=float("inf"))
    parser.add_argument("--repeats", type=int, default=1, help="rounds of the whole list (samplers alternate)")
    args = parser.parse_args()
    DEVICE[0] = args.device
    unknown = set(filter(None, args.reference.split(","))) - set(REFERENCE)
    if unknown:
        names = ", ".join(sorted(unknown))
        parser.error(f"--reference: no whole-space optimum for {names}; use {', '.join(REFERENCE)}")
    results: dict = {"date_utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "runs": []}
    if args.first_build:
        models = sorted({CASES[c]["model"] for c in args.cases.split(",")})  # the cases named, not --runs
        results["first_build"] = [first_build(m) for m in models]
        print("first build:", results["first_build"], flush=True)
    started = time.monotonic()
    pairs = [tuple(pair.split(":")) for pair in args.runs.split(",") if pair] or [
        (name, sampler) for name in args.cases.split(",") for sampler in args.samplers.split(",")
    ]
    unknown_cases = sorted({name for name, _ in pairs} - set(CASES))
    if unknown_cases:
        parser.error(f"unknown case(s) {', '.join(unknown_cases)}: choose from {', '.join(CASES)}")
    runs = [(name, sampler, k) for k in range(args.repeats) for name, sampler in pairs]
    for name, sampler, k in runs:
        if time.monotonic() - started > args.budget:
            print(f"budget spent: {name} {sampler} round {k} not run", flush=True)
            continue
        record = run_case(name, sampler, args.work, k)
        if args.remeasure and sampler == "auto" and record.get("summary", {}).get("best"):
            record["remeasure"] = remeasure(record)
        results["runs"].append(record)
        args.out.write_text(json.dumps(results, indent=1))
        print(line(record), flush=True)
    results["reference"] = {}
    for name in filter(None, args.reference.split(",")):
        batch_size, knobs = REFERENCE[name]
        again = measure_again(name, batch_size, knobs)
        results["reference"][name] = {"batch_size": batch_size, "config": knobs, **again}
        args.out.write_text(json.dumps(results, indent=1))
        print(f"reference {name}: {results['reference'][name].get('median')}", flush=True)
    for record in results["runs"]:
        again = results["reference"].get(record["case"], {}).get("median")
        record.update(to_optimum(record, again if again is not None else REFERENCE_J.get(record["case"])))
    print("case              sampler  wall s  2% s  max trial s  best J/q  cuts  remeasured  why it stopped")
    for record in results["runs"]:
        print(line(record))
    results["medians"] = medians(results["runs"])
    args.out.write_text(json.dumps(results, indent=1))
    print(
        "medians over rounds: case, sampler, runs, wall s, to within 2% s, answer J/query, measured, "
        "to within 1% of the optimum s (runs that reached it; a run that did not counts as its wall, a lower bound)"
    )
    for m in results["medians"]:
        reach = m["to_optimum_s"]
        shown = "not reached" if reach is None else f"{'>=' if m['reached'] < m['runs'] else ''}{reach:.1f}"
        print(
            f"{m['case']:17} {m['sampler']:7} {m['runs']} {m['wall_s']:6.1f} {m['within_2pct_s'] or float('nan'):6.1f} "
            f"{m['answer_j'] or float('nan'):.5f} {m['measured']} {shown} ({m['reached']} of {m['runs']} reached)"
        )


def medians(runs: list[dict]) -> list[dict]:
    """Per case and sampler, the median over its rounds that ran (rc 0) of wall, time to 2%, answer, trials."""
    out = []
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in runs:
        if not r.get("rc"):
            groups.setdefault((r["case"], r["sampler"]), []).append(r)

    def median(values: list) -> float | None:
        values = [v for v in values if v is not None]
        return statistics.median(values) if values else None

    for (case, sampler), members in groups.items():
        out.append(
            {
                "case": case,
                "sampler": sampler,
                "runs": len(members),
                "wall_s": median([m["wall_s"] for m in members]),
                "within_2pct_s": median([m.get("within_2pct_s") for m in members]),
                "answer_j": median([m.get("final_best_j_per_query") for m in members]),
                "measured": median([m.get("summary", {}).get("measured") for m in members]),
                "reached": sum(m.get("to_optimum_s") is not None for m in members),
                # a run that never came within 1% counts as its whole wall time: the median is then a lower bound
                "to_optimum_s": median(
                    [m["to_optimum_s"] if m.get("to_optimum_s") is not None else m["wall_s"] for m in members]
                )
                if any(m.get("to_optimum_s") is not None for m in members)
                else None,
            }
        )
    return out


def line(r: dict) -> str:
    if r.get("rc"):
        return f"{r['case']:17} {r['sampler']:7} rc={r['rc']} {r.get('stderr', '')[-300:]}"
    again = r.get("remeasure", {}).get("median")
    best = r.get("final_best_j_per_query")
    stopped = r.get("summary", {}).get("stopped", "")
    return (
        f"{r['case']:17} {r['sampler']:7} {r['wall_s']:6.1f} {r.get('within_2pct_s') or float('nan'):5.1f} "
        f"{r.get('max_trial_s') or float('nan'):11.1f} {best or float('nan'):.5f} {sum(r['cuts'].values()):4d} "
        f"{again if again is None else round(again, 5)}  {r.get('summary', {}).get('measured')} measured: {stopped}"
    )


if __name__ == "__main__":
    main()
