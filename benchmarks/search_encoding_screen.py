"""How well a model predicts a generated board from a few trials: the GP with two encodings, and posynomials.

Usage: PYTHONPATH=. python benchmarks/search_encoding_screen.py [--boards 0-9] [--posynomial]

The seventh round's screen for the log-value encoding (benchmarks/results/search.md): per
board, 15 random configurations with 2% lognormal noise (three draws), the GP of the default
strategy (tuner/surrogate.py, prior mean linear in the batch size) fitted on them, and its mean
absolute error over the whole grid in log energy and log latency. ``index``: every ordered knob
at its index scaled to [0, 1] (the code's encoding); ``log``: ordered knobs whose values are all
positive numbers at their log value scaled to [0, 1]. A screen of model accuracy, not of the
search: the search with the log encoding was level (search.md).

``--posynomial`` (the ninth round) adds, on the same draws, a sum of power-law stages fitted
to the trials, ``log y = log sum_s exp(a_s + w_s . z)`` with ``z`` the log-encoded knobs (an
unordered knob one-hot) and the log batch size scaled to [0, 1], for 1, 2 and 3 stages (ridge
least squares in log space, best of six starts; the variant on branch ``variant-posynomial``
fits the same form). The GP columns are unchanged by it.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
from scipy.optimize import least_squares

from tuner.bench import device, truth
from tuner.landscapes import WORKLOADS, board_seeds
from tuner.space import SearchSpace
from tuner.strategies import Table, space_table
from tuner.study import narrowed_space
from tuner.surrogate import GaussianProcess

POSY_STAGES = (1, 2, 3)
POSY_RIDGE = 0.03
POSY_STARTS = 6


def log_encoding(space: SearchSpace, table: Table) -> np.ndarray:
    """The table's encoding with each all-positive numeric ordered knob moved to its log position."""
    x = table.x.copy()
    col = 0
    for name in space.tuned_knobs:
        knob = space.knobs[name]
        if not knob.ordered:
            col += len(knob.values)
            continue
        try:
            values = np.array([float(v) for v in knob.values])
        except (TypeError, ValueError):
            col += 1
            continue
        if len(values) > 1 and np.all(values > 0):
            logs = (np.log(values) - np.log(values[0])) / (np.log(values[-1]) - np.log(values[0]))
            x[:, col] = logs[np.rint(x[:, col] * (len(values) - 1)).astype(int)]
        col += 1
    return x


def posynomial_features(space: SearchSpace, table: Table, x: np.ndarray) -> np.ndarray:
    """The log encoding ``x`` with unordered knobs one-hot minus their first value and the batch size at its log."""
    keep = []
    col = 0
    for name in space.tuned_knobs:
        knob = space.knobs[name]
        width = 1 if knob.ordered else len(knob.values)
        keep += list(range(col + (0 if knob.ordered else 1), col + width))
        col += width
    z = x[:, keep]
    if len(space.batch_sizes) > 1:
        batch = np.log(table.grid.batch_column())
        z = np.hstack([z, ((batch - batch.min()) / (batch.max() - batch.min()))[:, None]])
    return z


def fit_posynomial(z: np.ndarray, y: np.ndarray, stages: int, rng: np.random.Generator) -> np.ndarray:
    """Offsets and weights of ``log sum_s exp(a_s + w_s . z)`` fitted to ``y`` (ridge 0.03 on the weights)."""
    d = z.shape[1]
    ridge = np.sqrt(POSY_RIDGE)

    def residuals(theta: np.ndarray) -> np.ndarray:
        return np.concatenate([posynomial(theta, stages, z) - y, ridge * theta[stages:]])

    best = None
    for _ in range(POSY_STARTS):
        start = np.concatenate(
            [np.full(stages, y.mean() - np.log(stages)) + rng.normal(0, 0.3, stages), rng.normal(0, 1.0, stages * d)]
        )
        result = least_squares(residuals, start, method="trf", max_nfev=200)
        if best is None or result.cost < best.cost:
            best = result
    return best.x


def posynomial(theta: np.ndarray, stages: int, z: np.ndarray) -> np.ndarray:
    """The fitted model's log prediction at each row of ``z`` (a log-sum-exp, stable at large exponents)."""
    u = theta[:stages][None, :] + z @ theta[stages:].reshape(stages, z.shape[1]).T
    top = u.max(axis=1, keepdims=True)
    return (top + np.log(np.exp(u - top).sum(axis=1, keepdims=True)))[:, 0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--boards", default="0-9")
    parser.add_argument("--posynomial", action="store_true")
    args = parser.parse_args()
    errors: dict[str, list[list[float]]] = {"index": [], "log": []}
    if args.posynomial:
        errors.update({f"posynomial-{s}": [] for s in POSY_STAGES})
    for seed in board_seeds(args.boards):
        name = f"gen:{seed}"
        space = narrowed_space(device(name), None, None)
        table = space_table(space)
        known = truth(name, WORKLOADS[seed % len(WORKLOADS)], "p99")
        located = [(table.grid.position(key), value) for key, value in known.items()]
        rows = np.array([row for row, _ in located if row is not None])
        values = np.array([value for row, value in located if row is not None])
        targets = (np.log(values[:, 0]), np.log(values[:, 1]))
        rng = np.random.default_rng(seed)
        encodings = {"index": table.x, "log": log_encoding(space, table)}
        z = posynomial_features(space, table, encodings["log"])[rows] if args.posynomial else None
        posy_rng = np.random.default_rng([seed, 1])
        for _ in range(3):
            pick = rng.choice(len(rows), size=15, replace=False)
            noise = [rng.normal(0, 0.02, 15) for _ in targets]
            for label, x in encodings.items():
                inputs = x[rows]
                basis = np.hstack([np.ones((len(rows), 1)), inputs[:, -1:]])
                row_errors = []
                for y, eps in zip(targets, noise, strict=True):
                    gp = GaussianProcess.fit(inputs[pick], y[pick] + eps, basis[pick])
                    mean, _ = gp.predict(inputs, basis)
                    row_errors.append(float(np.mean(np.abs(mean - y))))
                errors[label].append(row_errors)
            for stages in POSY_STAGES if z is not None else ():
                row_errors = []
                for y, eps in zip(targets, noise, strict=True):
                    theta = fit_posynomial(z[pick], y[pick] + eps, stages, posy_rng)
                    row_errors.append(float(np.mean(np.abs(posynomial(theta, stages, z) - y))))
                errors[f"posynomial-{stages}"].append(row_errors)
        print(name, json.dumps({k: np.round(np.mean(v[-3:], axis=0), 3).tolist() for k, v in errors.items()}))
    print(
        "mean |error| (log energy, log latency):",
        json.dumps({k: np.round(np.mean(v, axis=0), 3).tolist() for k, v in errors.items()}),
    )


if __name__ == "__main__":
    main()
