"""How wrong the default strategy's model is, trial by trial, where it matters (issue 12, ninth round).

Usage: PYTHONPATH=. python benchmarks/search_model_error.py [--seed 0]
       [--tune-boards 0-19] [--judge-boards 2000-2039] [--out errors.json]
       PYTHONPATH=. python benchmarks/search_model_error.py --device sim:orin
       [--models resnet50,mobilenet_v2,bert-base] [--seed 0]   (a twin's landscapes instead)

Runs the default strategy (``ours``, unchanged) on the development boards through the
benchmark's own run_one and, after each proposal, sets the model that proposed it (the trusted
one: ``gp+roofline`` or ``gp``) against the noise-free truth, as mean absolute error of log
energy per query and log tail latency over three sets of configurations:

- ``proposed``: the configuration it just proposed;
- ``near``: the near-optimal set, every configuration that meets the bound with a true energy
  within 10% of the optimum's (where the search has to end up);
- ``random``: 300 configurations drawn once per landscape (the whole grid).

With each, how often the truth lies within two of the model's standard deviations (its spread
as the acquisition reads it, measurement noise included): whether it knows what it does not know.

The eighth round's ceiling (search_ceiling.py) says the strategy reaches 2% in a median of 12
trials when its model is off by about 5% per configuration; this says when the real model gets
that close, and where. The evaluation reads predictions only, so the runs are main's own
(checked run for run against search-remeasure-order-dev.json, and with ``--device`` against the
twin figures' search-twins-jetson-ordered.json). Prints medians per band of trials and, for the
proposals from trial 4 on that were truly over the latency bound, by kind of step (global, local,
probe of an untried direction), whether the latency model's mean had put them under it (tenth
round: a quarter of the trials go over the bound; was it the model or the acquisition's risk?);
and, per band and kind of step, how often a proposal truly beat the incumbent and by how much
(eleventh round: what a global step buys, early and late).
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse
import json
import math
from typing import Any

import numpy as np
import optuna

from tuner.bench import Landscape, add_board_run_arguments, board_runs, true_logs, twin_runs
from tuner.landscapes import board_seeds
from tuner.space import Config
from tuner.strategies import LearnedSampler, measured_trials

NEAR = 0.10
RANDOM_ROWS = 300
BANDS = ((4, 8), (9, 14), (15, 22), (23, 40))
SETS = ("proposed", "near", "random")


def landscape_sets(land: Landscape) -> dict[str, Any]:
    """One landscape's grid table, its truth by row, its near-optimal rows and a fixed random sample of valid rows."""
    table, log_e, log_l = true_logs(land)
    valid = np.flatnonzero(log_e < 50.0)
    feasible = valid[np.exp(log_l[valid]) <= land.max_latency_ms]
    best = log_e[feasible].min()
    near = feasible[log_e[feasible] <= best + np.log(1.0 + NEAR)]
    sample = np.random.default_rng(0).choice(valid, size=min(RANDOM_ROWS, len(valid)), replace=False)
    return {"table": table, "log_e": log_e, "log_l": log_l, "near": near, "random": sample}


def install(state: dict[str, Any], log: list[dict[str, Any]]) -> None:
    """Wrap LearnedSampler.propose to score the trusted model after each proposal (predictions only)."""
    propose = LearnedSampler.propose
    fit_models = LearnedSampler._fit_models

    def kept_fit_models(self: LearnedSampler, *args: Any) -> dict[str, Any]:
        state["models"] = fit_models(self, *args)
        return state["models"]

    LearnedSampler._fit_models = kept_fit_models

    def scored_propose(self: LearnedSampler, study: optuna.Study) -> Config | None:
        incumbent = _incumbent(self, study, state["table"])
        config = propose(self, study)
        predictor = state.get("models", {}).get(self.trust)
        if config is None or predictor is None:
            return config
        table_row = state["table"].grid.position(json.dumps(self.space.effective(config).key()))
        record: dict[str, Any] = {"device": state["device"], "trial": len(study.trials), "model": self.trust}
        rows = {"proposed": np.array([table_row]), "near": state["near"], "random": state["random"]}
        for name, at in rows.items():
            mean_e, sd_e, mean_l, sd_l = predictor(at)
            miss_e = np.abs(mean_e - state["log_e"][at])
            miss_l = np.abs(mean_l - state["log_l"][at])
            record[name] = [float(np.mean(miss_e)), float(np.mean(miss_l))]
            record[f"{name}_covered"] = [float(np.mean(miss_e <= 2 * sd_e)), float(np.mean(miss_l <= 2 * sd_l))]
            if name == "proposed":
                bound = math.log(self.bound_ms)
                record["bound"] = [float(mean_l[0] - bound), float(state["log_l"][table_row] - bound), float(sd_l[0])]
        local = self.reason[0].startswith("local")
        record["step"] = ("probe" if "untried direction" in self.reason[1] else "local") if local else "global"
        gain = float(state["log_e"][incumbent] - state["log_e"][table_row]) if incumbent is not None else 0.0
        record["gain"] = gain if record["bound"][1] <= 0 else 0.0
        log.append(record)
        return config

    LearnedSampler.propose = scored_propose


def _incumbent(sampler: LearnedSampler, study: optuna.Study, table: Any) -> int | None:
    """Grid row of the strategy's incumbent before a proposal: the lowest measured energy that met the bound."""
    key = f"{sampler.percentile}_ms"
    feasible = [t for t in measured_trials(study) if key in t.user_attrs and t.user_attrs[key] <= sampler.bound_ms]
    if not feasible:
        return None
    best = min(feasible, key=lambda t: t.user_attrs["j_per_query"])
    return table.grid.position(best.user_attrs.get("effective_key", ""))


def gains(log: list[dict[str, Any]]) -> list[str]:
    """What each kind of step bought, per band of trials: how often a proposal truly beat the incumbent.

    A proposal counts as an improvement when it truly meets the bound and its true energy is
    more than 0.5% below the incumbent's true energy (the incumbent as the strategy saw it:
    the lowest measured energy that met the bound). The gain is in log energy (true).
    """
    lines = []
    for low, high in BANDS:
        parts = []
        for step in ("global", "local", "probe"):
            mine = [r["gain"] for r in log if r["step"] == step and low <= r["trial"] <= high]
            if not mine:
                continue
            won = [g for g in mine if g > 0.005]
            median = float(np.median(won)) if won else 0.0
            parts.append(
                f"{step} {len(mine)}: improved {len(won) / len(mine):.0%} (median gain {median:.3f}, "
                f"mean over all {float(np.mean(np.maximum(mine, 0.0))):.3f})"
            )
        lines.append(f"  trials {low}-{high}: " + "; ".join(parts))
    return lines


def over_bound(log: list[dict[str, Any]]) -> list[str]:
    """Proposals from trial 4 on that were truly over the bound: did the latency model see it coming?

    Per kind of step (global, local, probe): how many proposals went over, how many of those the
    model predicted under the bound (its mean), and the medians of predicted and true latency
    over the bound and of the model's spread (log units).
    """
    lines = []
    for step in sorted({r["step"] for r in log}):
        mine = [r for r in log if r["step"] == step and r["trial"] >= 4]
        over = [r["bound"] for r in mine if r["bound"][1] > 0]
        if not over:
            continue
        predicted, true, spread = np.median(np.array(over), axis=0)
        unseen = sum(1 for b in over if b[0] <= 0)
        lines.append(
            f"  {step}: {len(over)} of {len(mine)} proposals over the bound, {unseen} of them predicted under it; "
            f"median predicted {predicted:+.3f}, true {true:+.3f}, spread {spread:.3f}"
        )
    return lines


def bands(log: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Median error per band of trial numbers and set: the table the round quotes."""
    out = []
    for low, high in BANDS:
        inside = [r for r in log if low <= r["trial"] <= high]
        row: dict[str, Any] = {"trials": f"{low}-{high}", "proposals": len(inside)}
        for name in SETS:
            values = np.array([r[name] for r in inside])
            row[name] = np.round(np.median(values, axis=0), 3).tolist() if len(values) else None
            covered = np.array([r[f"{name}_covered"] for r in inside])
            row[f"{name}_covered"] = np.round(np.mean(covered, axis=0), 3).tolist() if len(covered) else None
        out.append(row)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", help="a twin (sim:orin ...): its landscapes, one per model and bound")
    parser.add_argument("--models", default="resnet50,mobilenet_v2,bert-base")
    add_board_run_arguments(parser)
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    state: dict[str, Any] = {}
    log: list[dict[str, Any]] = []
    install(state, log)

    def prepare(_: int, land: Landscape) -> None:
        state.clear()
        state.update(landscape_sets(land), device=land.device)

    if args.device:
        runs = twin_runs(args.device, args.models.split(","), [args.seed], prepare)
    else:
        runs = board_runs(board_seeds(args.tune_boards), board_seeds(args.judge_boards), args.seed, prepare)
    table = bands(log)
    if args.out:
        columns = list(log[0]) if log else []
        rows = [[np.round(r[c], 3).tolist() if isinstance(r[c], list) else r[c] for c in columns] for r in log]
        record = {"seed": args.seed, "bands": table, "runs": runs, "log": {"columns": columns, "rows": rows}}
        args.out.write_text(json.dumps(record, separators=(",", ":")))
    reach = np.array([r["reach"] or np.inf for r in runs], dtype=float)
    print(f"run seed {args.seed}: {len(runs)} runs, median to 2% {np.percentile(reach, 50, method='higher')}")
    print("mean |error| of log energy, log latency (median over proposals):")
    for row in table:
        print(
            f"  trials {row['trials']} ({row['proposals']} proposals): "
            + "; ".join(f"{name} {row[name]} (covered {row[f'{name}_covered']})" for name in SETS)
        )
    print("proposals truly over the bound, by kind of step (log latency over the bound):")
    print("\n".join(over_bound(log)))
    print("what each kind of step bought (true log energy below the incumbent's, proposals that truly met the bound):")
    print("\n".join(gains(log)))


if __name__ == "__main__":
    main()
