"""A study's warm start: the cheapest configurations earlier studies of the model on the device kind found."""

from __future__ import annotations

import optuna

from tuner.devices.base import Device
from tuner.run_options import RunOptions
from tuner.space import Config, Grid, SearchSpace
from tuner.strategies.base import WARM_START

WARM_SEEDS = 3
WARM_ATTR = "warm_start"


def warm_start(study: optuna.Study, storage: str, space: SearchSpace, options: RunOptions, device: Device) -> None:
    """Queue the cheapest configurations earlier studies of this model on this device kind found, to measure again.

    Studies in the same storage (a fleet's is shared) at another bound or
    scenario: their completed, measured trials whose tail latency met this
    study's bound, in this space, cheapest first, ``WARM_SEEDS`` distinct
    configurations. They are enqueued, so measured afresh under this study's
    bound, never copied; what was queued is stored in the study (``WARM_ATTR``)
    and the run summary says it.
    """
    summaries = optuna.get_all_study_summaries(storage=study._storage, include_best_trial=False)
    grid = Grid(space)
    lat_key = f"{options.window.percentile}_ms"
    found: dict[str, tuple[float, str, int, dict]] = {}
    for summary in summaries:
        attrs = summary.user_attrs
        if summary.study_name == study.study_name or attrs.get("model") != options.model:
            continue
        if attrs.get("device_kind") != device.kind:
            continue
        other = optuna.load_study(study_name=summary.study_name, storage=study._storage)
        for t in other.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
            a = t.user_attrs
            key, latency = a.get("effective_key"), a.get(lat_key)
            if key is None or latency is None or "reused_from" in a or "j_per_query" not in a:
                continue
            if float(latency) > options.max_latency_ms or grid.position(key) is None:
                continue
            j = float(a["j_per_query"])
            if key not in found or j < found[key][0]:
                found[key] = (j, summary.study_name, t.number, a)
    picked = sorted(found.values(), key=lambda item: item[0])[:WARM_SEEDS]
    lines = []
    for j, source, number, a in picked:
        config = Config(knobs=a["effective"], batch_size=a["batch_size"])
        why = (
            f"warm start: trial {number} of study {source} ({j:.4g} J/query at {float(a[lat_key]):.4g} ms), "
            "measured again under this bound"
        )
        study.enqueue_trial(space.params_for(config), user_attrs={"proposed_by": WARM_START, "why": why})
        lines.append(f"trial {number} of {source}")
    if lines:
        study.set_user_attr(
            WARM_ATTR,
            [f"warm start: {len(lines)} configurations of earlier studies measured again ({'; '.join(lines)})"],
        )
