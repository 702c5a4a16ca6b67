"""What a study records about itself (what was tuned, how, its space key); no resuming it with another space."""

from __future__ import annotations

import hashlib
import json
import warnings

import optuna

from runners.llm_spec import is_llm
from tuner.devices.base import Device
from tuner.errors import UserError
from tuner.measure.prompts import DEFAULT_SHAPE
from tuner.pareto import LLM_OBJECTIVE
from tuner.provenance import provenance
from tuner.run_options import RunOptions
from tuner.space import SearchSpace
from tuner.storage import OBJECTIVE_NAME


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


def stamp(study: optuna.Study, device: Device, options: RunOptions, space: SearchSpace) -> None:
    """Study-level attributes so results and exports can say what was tuned, and how."""
    study.set_user_attr("model", options.model)
    study.set_user_attr("device", device.name)
    study.set_user_attr("device_kind", device.kind)
    study.set_user_attr("device_slug", device.slug)
    study.set_user_attr("twin", device.simulated)
    study.set_user_attr("max_latency_ms", options.max_latency_ms)
    study.set_user_attr("percentile", options.window.percentile)
    # What optuna-dashboard shows: the objective's name and, beside each trial's constraint, the bound it is against.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study.set_metric_names([OBJECTIVE_NAME])
    said = [
        f"{attr.removesuffix('_ms')} <= {bound:g} ms (constraint {name} <= 0)"
        for name, (attr, bound) in options.bounds().items()
    ]
    study.set_user_attr("latency_bound", ", ".join(said))
    if is_llm(options.model):
        study.set_user_attr("objective", LLM_OBJECTIVE)
        study.set_user_attr("max_ttft_ms", options.window.max_ttft_ms)
        study.set_user_attr("max_tpot_ms", options.window.max_tpot_ms)
        study.set_user_attr("prompts", options.window.prompts or DEFAULT_SHAPE)
    study.set_user_attr("scenario", options.window.scenario)
    if options.window.scenario == "server":
        study.set_user_attr("target_qps", options.window.options["server_target_qps"])
    study.set_user_attr("tuned_knobs", space.tuned_knobs)
    study.set_user_attr("batch_sizes", space.batch_sizes)
    study.set_user_attr("space_key", space_key(space))
    study.set_user_attr("provenance", provenance(device))
    if options.study_trials is not None:
        study.set_user_attr("study_trials", options.study_trials)
