"""Would the stop rule have ended a recorded hardware study, and where: its trials replayed through the bound.

Usage: python benchmarks/early_stop_replay.py [--from benchmarks/results/time-to-answer-h200/call13/time-to-answer.json]
           [--case bert-offline] [--space as-run|pinned] [--bounds-judged window3,latent3] [--out replay.json]

A time-to-answer run (benchmarks/time_to_answer_h200.py) records every trial's configuration, energy, tail
latency, verdict and wall time, but not the bound the strategy computed at each proposal. This replays the
trials, in their order, into an in-memory study of the same space (the device kind's space with the clocks
the run pinned; ``pinned``: also with the knobs the model cannot use pinned, as the study would now) and asks
the default strategy for its next proposal before each one is added: the proposal is thrown away (the trial
that was measured is what comes next), its bounds (``--bounds-judged``, as in benchmarks/early_stop.py) are
recorded on the trial. Each bound is then judged with the stop rule: the trial at which it first fires, the
wall time of the run to there, the answer there against the answer at the end (the study's figure and the
mean of the recorded board's windows for that configuration, measured:h200, when it has them).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import optuna
from early_stop import Judged, as_bound, judged_bounds

from tuner.devices.virtual.recorded import RecordedBoard
from tuner.errors import UserError
from tuner.records import recommended_of
from tuner.space import Config, load_space
from tuner.storage import CONSTRAINTS_KEY, NAMED_PREFIX
from tuner.strategies.base import COULD_WIN_KEY, HEADROOM_KEY
from tuner.strategies.stopping import StopRule, decide
from tuner.study import model_space

DEFAULT = Path("benchmarks/results/time-to-answer-h200/call13/time-to-answer.json")
DEVICE_KNOBS = ("sm_mhz", "mem_mhz", "power_limit_w")


def recorded_trial(number: int, row: dict, space, study: optuna.Study, bounds: dict) -> optuna.trial.FrozenTrial:
    """One recorded trial as the study held it: value, latency constraint, identity; a repeat is a reuse."""
    knobs = {n: (space.knobs[n].values[0] if len(space.knobs[n].values) == 1 else v) for n, v in row["config"].items()}
    effective = space.effective(Config(knobs=knobs, batch_size=row["batch_size"]))
    key = json.dumps(effective.key())
    attrs = {
        "config": row["config"],
        "effective": effective.knobs,
        "effective_key": key,
        "batch_size": row["batch_size"],
        "j_per_query": row["j_per_query"],
        "p99_ms": row["p99_ms"],
        "qps": 1.0,
        "latency_key": "p99_ms",
        **({"cut": row["cut"]} if row.get("cut") else {}),
        **bounds,
    }
    earlier = [t for t in study.trials if t.user_attrs["effective_key"] == key and "reused_from" not in t.user_attrs]
    if earlier:
        attrs["reused_from"] = earlier[0].number
    constraint = -1.0 if row["feasible"] else 1.0
    trial = optuna.trial.create_trial(
        value=earlier[0].value if earlier else row["j_per_query"],
        user_attrs=attrs,
        system_attrs={CONSTRAINTS_KEY: [constraint], f"{NAMED_PREFIX}latency": constraint},
    )
    return trial


def replay(run: dict, space_mode: str, bound_names: str) -> tuple[list[optuna.trial.FrozenTrial], object]:
    summary = run["summary"]
    space = load_space(summary.get("device_kind", "h200"))
    for knob in DEVICE_KNOBS:
        if knob in space.knobs:
            space = space.pin(knob, run["trials"][0]["config"][knob])
    if space_mode == "pinned":
        space = model_space(space, summary["model"], "auto")
    sampler = Judged(seed=0, bounds=judged_bounds(bound_names))
    sampler.bind(space, summary["model"], float(summary["max_latency_ms"]), "p99")
    study = optuna.create_study()
    for number, row in enumerate(run["trials"]):
        sampler.several.clear()
        sampler.propose(study)
        bounds = {}
        for name, (headroom, could) in sampler.several.last.items():
            bounds[f"{HEADROOM_KEY}:{name}"] = round(headroom, 6)
            bounds[f"{COULD_WIN_KEY}:{name}"] = could
        study.add_trial(recorded_trial(number, row, space, study, bounds))
    return sorted(study.trials, key=lambda t: t.number), space


def truth_of(board: RecordedBoard, model: str, trial: optuna.trial.FrozenTrial | None) -> float | None:
    """The mean of the recorded board's windows for the trial's configuration (None if it has none)."""
    if trial is None:
        return None
    try:
        config = Config(knobs=trial.user_attrs["effective"], batch_size=trial.user_attrs["batch_size"])
        return board.truth(model, config).j_per_query
    except UserError:
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--from", dest="source", type=Path, default=DEFAULT)
    parser.add_argument("--case", default="bert-offline")
    parser.add_argument("--sampler", default="auto")
    parser.add_argument("--space", choices=("as-run", "pinned"), default="as-run")
    parser.add_argument("--bounds-judged", default="window3,latent3,latent2")
    parser.add_argument("--patience", default="3")
    parser.add_argument("--min-measured", default="8")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    recorded = json.loads(args.source.read_text())
    run = next(r for r in recorded["runs"] if r["case"] == args.case and r["sampler"] == args.sampler)
    trials, _ = replay(run, args.space, args.bounds_judged)
    board = RecordedBoard("measured:h200")
    model = run["summary"]["model"]
    walls = [float(t["wall_s"]) for t in run["trials"]]
    before = float(run.get("before_first_trial_s") or 0.0)
    cap = recommended_of([t for t in trials if t.state == optuna.trial.TrialState.COMPLETE])
    rows = []
    for bound in judged_bounds(args.bounds_judged):
        read = as_bound(trials, bound)
        for p in args.patience.split(","):
            for m in args.min_measured.split(","):
                rule = StopRule(patience=int(p), min_measured=int(m))
                stop = next((i for i in range(len(read)) if decide(read[: i + 1], rule) is not None), None)
                end = len(read) - 1 if stop is None else stop
                answer = recommended_of(read[: end + 1])
                rows.append(
                    {
                        "bound": bound,
                        "rule": f"patience={p},min={m}",
                        "stopped_after": stop,
                        "trials": end + 1,
                        "wall_s": round(before + sum(walls[: end + 1]), 1),
                        "answer_trial": None if answer is None else answer.number,
                        "answer_j": None if answer is None else answer.value,
                        "answer_truth_j": truth_of(board, model, answer),
                        "cap_answer_trial": None if cap is None else cap.number,
                        "cap_answer_j": None if cap is None else cap.value,
                        "cap_truth_j": truth_of(board, model, cap),
                        "reason": None if stop is None else decide(read[: stop + 1], rule).reason,
                    }
                )
    per_trial = [
        {
            "trial": t.number,
            **{k: v for k, v in t.user_attrs.items() if k.startswith((HEADROOM_KEY, COULD_WIN_KEY))},
        }
        for t in trials
    ]
    result = {
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": "python " + " ".join(sys.argv),
        "source": str(args.source),
        "case": args.case,
        "space": args.space,
        "stops": rows,
        "trials": per_trial,
    }
    args.out.write_text(json.dumps(result, indent=1))
    for row in rows:
        gap = (
            f"{row['answer_truth_j'] / row['cap_truth_j'] - 1:+.2%}"
            if row["answer_truth_j"] and row["cap_truth_j"] and math.isfinite(row["cap_truth_j"])
            else "n/a"
        )
        print(
            f"{args.case} {args.space} {row['bound']} {row['rule']}: {row['trials']} trials, {row['wall_s']} s, "
            f"answer trial {row['answer_trial']} ({row['answer_j']:.5f} J, truth {row['answer_truth_j']}) "
            f"vs cap trial {row['cap_answer_trial']} ({row['cap_answer_j']:.5f}); truth gap {gap}; {row['reason']}"
        )


if __name__ == "__main__":
    main()
