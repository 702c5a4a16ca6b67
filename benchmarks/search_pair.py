"""Pair two sets of benchmark runs landscape by landscape and run seed: the figures of search.md's variant tables.

Usage: PYTHONPATH=. python benchmarks/search_pair.py BASE.json[:key.path] VARIANT.json[:key.path] ...

One run seed per board moves a set's mean by 3-5 trials (search.md, fifth round), so a variant
is judged on the difference of its runs from the base's on the same landscapes (device, model,
bound) at the same run seed. Reads the run records the variant scripts write
(search_variants.py, search_dominance.py, search_twin_seeds.py: a list under ``runs``, the run
seed in each record or once at the top) and ``tune bench``'s own files (search.py: runs that
name their landscape by index). ``:key.path`` picks a list inside a file
(``search-ninth-energy-prior.json:dev_boards``). Prints, per variant: runs paired, median and
p90 of trials to within 2% for both, the mean with a miss counted as 41, the mean paired
difference +- its standard error, runs better / worse, and how often each export violated the
bound in fresh windows.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

MISS = 41

Key = tuple[Any, str, str, str]


def load(spec: str) -> dict[Key, dict[str, Any]]:
    """Run records of one file (or of a list inside it), by (run seed, device, model, bound)."""
    path, _, inner = spec.partition(":")
    data: Any = json.loads(Path(path).read_text())
    for part in filter(None, inner.split(".")):
        data = data[part]
    seed = data.get("seed") if isinstance(data, dict) else None
    landscapes = data.get("landscapes") if isinstance(data, dict) else None
    runs = data["runs"] if isinstance(data, dict) else data
    out: dict[Key, dict[str, Any]] = {}
    for run in runs:
        if landscapes is not None:
            land = landscapes[run["landscape"]]
            reach = run["reach"]["2%"] if isinstance(run["reach"], dict) else run["reach"]
            run = {**run, "device": land["device"], "model": land["model"], "bound": land["bound"], "reach": reach}
        out[(run.get("seed", seed), run["device"], run["model"], run["bound"])] = run
    return out


def _trials(runs: list[dict[str, Any]]) -> np.ndarray:
    return np.array([min(r["reach"] or MISS, MISS) for r in runs], dtype=float)


def _quantile(values: np.ndarray, q: float) -> str:
    v = float(np.percentile(np.where(values >= MISS, np.inf, values), q, method="higher"))
    return ">40" if math.isinf(v) else f"{v:g}"


def compare(base: dict[Key, dict[str, Any]], variant: dict[Key, dict[str, Any]]) -> str:
    """One line: the variant against the base on the runs both have."""
    keys = [k for k in variant if k in base]
    if len(keys) < 2:
        return f"only {len(keys)} run(s) in common: nothing to pair"
    a = _trials([base[k] for k in keys])
    b = _trials([variant[k] for k in keys])
    diff = b - a
    violations = [np.mean([runs[k].get("violation") or 0.0 for k in keys]) for runs in (base, variant)]
    return (
        f"{len(keys)} runs: median {_quantile(a, 50)} -> {_quantile(b, 50)}, p90 {_quantile(a, 90)} -> "
        f"{_quantile(b, 90)}, mean (miss = {MISS}) {a.mean():.2f} -> {b.mean():.2f}, difference "
        f"{diff.mean():+.2f} +- {diff.std(ddof=1) / math.sqrt(len(diff)):.2f}, better / worse "
        f"{int((diff < 0).sum())} / {int((diff > 0).sum())}, export violates {violations[0]:.1%} -> {violations[1]:.1%}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("base")
    parser.add_argument("variants", nargs="+")
    args = parser.parse_args()
    base = load(args.base)
    for spec in args.variants:
        print(f"{spec}: {compare(base, load(spec))}")


if __name__ == "__main__":
    main()
