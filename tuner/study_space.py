"""Which space a study was tuned over: its key, and the refusal to resume a study with another space."""

from __future__ import annotations

import hashlib
import json

import optuna

from tuner.errors import UserError
from tuner.space import SearchSpace


def space_key(space: SearchSpace) -> str:
    """A short hash of what a trial's parameters mean: each tuned knob's values in order, and the batch sizes.

    Pinned knobs are left out (they are not parameters), so an observe-only
    GPU whose clocks were changed between runs still resumes its study.
    """
    meaning = {
        "knobs": {n: [str(v) for v in space.knobs[n].values] for n in space.tuned_knobs},
        "batch_sizes": space.batch_sizes,
    }
    return hashlib.sha256(json.dumps(meaning, sort_keys=True).encode()).hexdigest()[:10]


def _space_flags(tuned: list[str], batch_sizes: list[int] | None) -> str:
    flags = f"--knobs {','.join(tuned)}"
    return flags + (f" --batch-sizes {','.join(map(str, batch_sizes))}" if batch_sizes else "")


def check_same_space(study: optuna.Study, space: SearchSpace) -> None:
    """Refuse to resume a study with another space: its parameter indexes would change meaning.

    Studies from before the key was recorded are compared by their tuned knobs,
    the only part of the space they recorded.
    """
    attrs = study.user_attrs
    if any(name.endswith("_index") for t in study.get_trials(deepcopy=False) for name in t.params):
        raise UserError(
            f"study {study.study_name} was written by an older powertune that stored knob positions, not values: "
            "give another --out or --storage to start afresh (tune pareto, export and status still read it)"
        )
    recorded = attrs.get("space_key")
    if recorded is None and "tuned_knobs" not in attrs:
        return
    same = recorded == space_key(space) if recorded is not None else attrs["tuned_knobs"] == space.tuned_knobs
    if not same:
        before = _space_flags(attrs.get("tuned_knobs", []), attrs.get("batch_sizes"))
        raise UserError(
            f"study {study.study_name} was tuned over another space ({before}, or another --space file): "
            "run with the same flags to resume it, or give another --out or --storage for this space"
        )
