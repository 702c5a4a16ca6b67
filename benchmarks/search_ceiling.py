"""Where the default strategy's trials go: its own model against better-informed ones (issue 12, eighth round).

Usage: PYTHONPATH=. python benchmarks/search_ceiling.py --mode perfect-prior [--seed 0]
       [--tune-boards 0-19] [--judge-boards 2000-2039] [--out runs.json]

Runs the default strategy (``ours``) on the development boards through the benchmark's own
run_one, with its model replaced in one of three ways, so that a run seed's trials to within
2% can be set against main's own runs on the same boards and seeds
(search-remeasure-order-dev.json, "best first"):

- ``gp-only``: the roofline off (the GP without a physics prior proposes every trial), the
  GP's hyperparameters set by marginal likelihood as in main. The reference for the next one.
- ``oracle-hyper``: the roofline off, and the GP's hyperparameters (length scale per input,
  signal and noise) fitted once per landscape on 400 random configurations of the noise-free
  truth with 2% noise added, then held: the best hyperparameters a learned model could find.
- ``perfect-prior``: the roofline's prediction replaced by the noise-free truth, and the
  search held on the GP whose prior mean uses it: what the acquisition, the design trials and
  the end of the run achieve when the model is right. A ceiling, not a strategy. With
  ``--prior-error S`` each configuration's prior is off by an independent lognormal error of
  spread S (drawn once per landscape, seeded by its position among the boards run, so a run
  over fewer boards draws other errors): how right a model has to be. With
  ``--prior-error-length L`` the error is smooth instead (a random function of the encoded knobs
  varying over L of each knob's range, spread S): a wrong trend, as a model's errors are.

None of these is a strategy a user could run (each reads the truth); they say whether the
trials are lost to the acquisition or to the model. The strategy's code is unchanged.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse
import json
from collections.abc import Callable
from typing import Any

import numpy as np
import optuna

from tuner.bench import Landscape, add_board_run_arguments, board_runs, true_logs
from tuner.landscapes import board_seeds
from tuner.strategies import LearnedSampler, Table
from tuner.surrogate import GaussianProcess

MODES = ("gp-only", "oracle-hyper", "perfect-prior")
ORACLE_POINTS = 400
ORACLE_NOISE = 0.02
SMOOTH_FEATURES = 200


def oracle_fits(land: Landscape) -> dict[str, GaussianProcess]:
    """GPs of log energy and log latency fitted on noisy random points of the truth (for their hyperparameters)."""
    table, log_e, log_l = true_logs(land)
    valid = np.flatnonzero(log_e < 50.0)
    rng = np.random.default_rng(0)
    rows = rng.choice(valid, size=min(ORACLE_POINTS, len(valid)), replace=False)
    x = table.x[rows]
    basis = np.hstack([np.ones((len(rows), 1)), x[:, -1:]])
    return {
        f"gp:{name}": GaussianProcess.fit(x, y[rows] + rng.normal(0.0, ORACLE_NOISE, len(rows)), basis)
        for name, y in (("e", log_e), ("l", log_l))
    }


def install(mode: str, state: dict[str, Any]) -> None:
    """Replace the parts of LearnedSampler (and the GP's fit) that the mode changes; ``state`` holds the landscape's."""
    bind = LearnedSampler.bind
    fit = GaussianProcess.fit.__func__

    def bind_without_roofline(self: LearnedSampler, *args: Any, **kwargs: Any) -> None:
        bind(self, *args, **kwargs)
        self.profile = None
        self.trust = "gp"
        if mode == "oracle-hyper":
            self.fits = dict(state["fits"])

    def fit_held(
        cls: type[GaussianProcess],
        x: np.ndarray,
        y: np.ndarray,
        basis: np.ndarray,
        warm: GaussianProcess | None = None,
        optimize: bool = True,
    ) -> GaussianProcess:
        return fit(cls, x, y, basis, warm, optimize and warm is None)

    def truth_as_roofline(self: LearnedSampler, table: Table, trials: list) -> Callable:
        return lambda at: (state["log_e"][at], state["log_l"][at])

    def trust_truth(self: LearnedSampler, have_roofline: bool) -> str:
        self.trust = "gp+roofline"
        return "gp+roofline: the truth as its prior mean (search_ceiling.py)"

    if mode in ("gp-only", "oracle-hyper"):
        LearnedSampler.bind = bind_without_roofline
    if mode == "oracle-hyper":
        GaussianProcess.fit = classmethod(fit_held)
    if mode == "perfect-prior":
        LearnedSampler._roofline = truth_as_roofline
        LearnedSampler._choose_trust = trust_truth


def smooth_error(x: np.ndarray, spread: float, length: float, rng: np.random.Generator) -> np.ndarray:
    """A random smooth error over the encoded grid: a GP draw of this spread and length scale (random features).

    A model's errors are not independent per configuration: a wrong trend is
    wrong over a whole region. This error varies over ``length`` of the
    encoded inputs (each knob's range is 1), so a few trials can learn it.
    """
    weights = rng.normal(0.0, 1.0 / length, (x.shape[1], SMOOTH_FEATURES))
    phases = rng.uniform(0.0, 2 * np.pi, SMOOTH_FEATURES)
    return spread * np.sqrt(2.0 / SMOOTH_FEATURES) * np.cos(x @ weights + phases).sum(axis=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mode", choices=MODES, required=True)
    parser.add_argument("--prior-error", type=float, default=0.0)
    parser.add_argument("--prior-error-length", type=float, default=0.0)
    add_board_run_arguments(parser)
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    state: dict[str, Any] = {}
    install(args.mode, state)

    def prepare(i: int, land: Landscape) -> None:
        if args.mode == "oracle-hyper":
            state["fits"] = oracle_fits(land)
        if args.mode == "perfect-prior":
            table, log_e, log_l = true_logs(land)
            rng = np.random.default_rng(i)
            if args.prior_error_length > 0:
                state["log_e"] = log_e + smooth_error(table.x, args.prior_error, args.prior_error_length, rng)
                state["log_l"] = log_l + smooth_error(table.x, args.prior_error, args.prior_error_length, rng)
            else:
                state["log_e"] = log_e + rng.normal(0.0, args.prior_error, len(log_e))
                state["log_l"] = log_l + rng.normal(0.0, args.prior_error, len(log_l))

    runs = board_runs(board_seeds(args.tune_boards), board_seeds(args.judge_boards), args.seed, prepare)
    if args.out:
        record = {
            "mode": args.mode,
            "prior_error": args.prior_error,
            "prior_error_length": args.prior_error_length,
            "seed": args.seed,
            "runs": runs,
        }
        args.out.write_text(json.dumps(record, indent=1))
    reach = np.array([r["reach"] or np.inf for r in runs], dtype=float)
    print(
        f"{args.mode}, run seed {args.seed}: {len(reach)} runs, median to 2% "
        f"{np.percentile(reach, 50, method='higher')}, p90 {np.percentile(reach, 90, method='higher')}, "
        f"within 12 trials {(reach <= 12).mean():.0%}, reached {np.isfinite(reach).mean():.0%}, "
        f"mean (misses as 41) {np.minimum(reach, 41).mean():.1f}"
    )


if __name__ == "__main__":
    main()
