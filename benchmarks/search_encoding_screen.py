"""How well the search's GP predicts a generated board from a few trials, with two encodings of the knobs.

Usage: PYTHONPATH=. python benchmarks/search_encoding_screen.py [--boards 0-9]

The seventh round's screen for the log-value encoding (benchmarks/results/search.md): per
board, 15 random configurations with 2% lognormal noise (three draws), the GP of the default
strategy (tuner/surrogate.py, prior mean linear in the batch size) fitted on them, and its mean
absolute error over the whole grid in log energy and log latency. ``index``: every ordered knob
at its index scaled to [0, 1] (the code's encoding); ``log``: ordered knobs whose values are all
positive numbers at their log value scaled to [0, 1]. A screen of model accuracy, not of the
search: the search with the log encoding was level (search.md).
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from tuner.bench import device, truth
from tuner.landscapes import WORKLOADS, board_seeds
from tuner.space import SearchSpace
from tuner.strategies import Table, space_table
from tuner.study import narrowed_space
from tuner.surrogate import GaussianProcess


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--boards", default="0-9")
    args = parser.parse_args()
    errors: dict[str, list[list[float]]] = {"index": [], "log": []}
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
        print(name, json.dumps({k: np.round(np.mean(v[-3:], axis=0), 3).tolist() for k, v in errors.items()}))
    print(
        "mean |error| (log energy, log latency):",
        json.dumps({k: np.round(np.mean(v, axis=0), 3).tolist() for k, v in errors.items()}),
    )


if __name__ == "__main__":
    main()
