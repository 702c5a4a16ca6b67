"""What a monotone-latency rule could have told the default strategy: proposals that earlier trials rule out or in.

Usage: PYTHONPATH=. python benchmarks/search_dominance.py [--seed 0] [--margin 0.05]
       [--tune-boards 0-19] [--judge-boards 2000-2039] [--out dominance.json]

A power knob with more of it (a higher clock, more cores, a higher fabric level) does not make
a window slower, and a larger batch does not make it faster. So a configuration with every
ordered knob at or below a measured one's, the same unordered knobs (a power mode) and at least
its batch size cannot meet the bound if that one missed it; with every ordered knob at or above
and at most its batch size it meets it if that one did. Read with a margin (a window measured
more than ``--margin`` over or under the bound), that rule needs no model. Half the global steps
go over the bound (search.md, tenth round); this counts how many of main's proposals from trial
4 on such a rule would have ruled out (and whether they truly went over) or ruled in, on the
development boards (board_runs: the runs of search_variants.py, main unchanged). It assumes
that every ordered knob's values ascend in resources, as they do on the generated boards and
twins; a board with a knob that slows as it rises would break it, which is one reason it is
measured here before it is built.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse
import json
from typing import Any

import numpy as np
import optuna

import tuner.bench as bench
from tuner.landscapes import board_seeds
from tuner.records import tail_latency_ms

COUNTS = (
    "proposals",
    "over",
    "over_global",
    "ruled_out",
    "ruled_out_over",
    "ruled_out_global",
    "ruled_in",
    "ruled_in_meet",
)


def dominance_counts(land: bench.Landscape, study: optuna.Study, margin: float) -> dict[str, int]:
    """Per run: main's proposals from trial 4 on, those truly over the bound, and what the rule says of them."""
    space = bench.device(land.device).space()
    table = bench.truth(land.device, land.model, "p99")
    bound = land.max_latency_ms
    out = dict.fromkeys(COUNTS, 0)
    earlier: list[tuple[np.ndarray, tuple, int, float]] = []
    trials = [
        t
        for t in sorted(study.trials, key=lambda t: t.number)
        if t.state == optuna.trial.TrialState.COMPLETE and bench.counts_as_trial(t) and "repeat_of" not in t.user_attrs
    ]
    for n, t in enumerate(trials, start=1):
        ordered, unordered = [], []
        for name in space.tuned_knobs:
            knob = space.knobs[name]
            index = [str(v) for v in knob.values].index(str(t.user_attrs["effective"][name]))
            (ordered if knob.ordered else unordered).append(index)
        here = (np.array(ordered), tuple(unordered), int(t.user_attrs["batch_size"]))
        if n >= 4:
            over = table[t.user_attrs["effective_key"]][1] > bound
            is_global = str(t.user_attrs.get("proposed_by", "")).startswith("gp")
            out_rule = any(
                u == here[1] and b <= here[2] and np.all(o >= here[0]) and lat > bound * (1 + margin)
                for o, u, b, lat in earlier
            )
            in_rule = any(
                u == here[1] and b >= here[2] and np.all(o <= here[0]) and lat < bound * (1 - margin)
                for o, u, b, lat in earlier
            )
            for key, hit in (
                ("proposals", True),
                ("over", over),
                ("over_global", over and is_global),
                ("ruled_out", out_rule),
                ("ruled_out_over", out_rule and over),
                ("ruled_out_global", out_rule and is_global),
                ("ruled_in", in_rule),
                ("ruled_in_meet", in_rule and not over),
            ):
                out[key] += bool(hit)
        earlier.append((*here, float(tail_latency_ms(t))))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--margin", type=float, default=0.05)
    bench.add_board_run_arguments(parser)
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    state: dict[str, Any] = {}
    run_study, run_record = bench.run_study, bench.run_record

    def kept_study(*a: Any) -> Any:
        state["study"], summary = run_study(*a)
        return state["study"], summary

    def counted_record(land: bench.Landscape, result: bench.RunResult) -> dict[str, Any]:
        return {**run_record(land, result), "dominance": dominance_counts(land, state["study"], args.margin)}

    bench.run_study, bench.run_record = kept_study, counted_record
    runs = bench.board_runs(board_seeds(args.tune_boards), board_seeds(args.judge_boards), args.seed)
    total = {k: sum(r["dominance"][k] for r in runs) for k in COUNTS}
    if args.out:
        args.out.write_text(
            json.dumps({"seed": args.seed, "margin": args.margin, "total": total, "runs": runs}, indent=1)
        )
    print(
        f"run seed {args.seed}, {len(runs)} runs, margin {args.margin:.0%}: {total['proposals']} proposals from "
        f"trial 4, {total['over']} truly over the bound ({total['over_global']} of them global steps); "
        f"ruled out {total['ruled_out']} ({total['ruled_out_over']} truly over, {total['ruled_out_global']} "
        f"global steps); ruled in {total['ruled_in']} ({total['ruled_in_meet']} truly met it)"
    )


if __name__ == "__main__":
    main()
