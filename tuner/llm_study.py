"""What an LLM study does apart from a CNN's: its first trial, when it stops, the baseline it already measured.

An LLM study (tuner.llm) is searched by a stock constrained sampler, which
records no headroom, so it stops on a plateau (tuner.strategies.stopping
.decide_settled); it starts from the configuration likeliest to keep up with
the rate (tuner.llm.first_config), so it holds an answer from its first
trial; in Server then the fewest sequences that hold what the rate keeps
in flight within the bounds (tuner.llm.sized_config); then the first with
the smallest prefill chunk (tuner.llm.chunked_config), so its first trials
bracket TTFT against TPOT; and
when its answer's baseline (the default at the answer's batch size) is a
configuration it measured whole, that trial is the baseline: a Server
window is hundreds of generated answers, not run twice.
"""

from __future__ import annotations

import json

import optuna

from tuner import baseline
from tuner.devices.base import Device
from tuner.llm import STOP_MIN_MEASURED, STOP_PATIENCE, STOP_RESOLUTION, chunked_config, first_config, sized_config
from tuner.measure.prompts import load_prompts
from tuner.measure.settings import WindowSettings
from tuner.space import SearchSpace
from tuner.strategies.stopping import StopRule

FIRST_WHY = "the default configuration at the most sequences, decode captured: the answer to beat, from the first trial"
CHUNKED_WHY = "the first trial with the smallest prefill chunk: decode stalls less, prompts prefill slower (TPOT/TTFT)"
SIZED_WHY = "the fewest sequences that hold what the rate keeps in flight within the bounds: a smaller decode step"


def stop_rule(ci: float) -> StopRule:
    """The plateau an LLM study stops on: its window's ``--ci`` or :data:`tuner.llm.STOP_RESOLUTION`, if wider."""
    return StopRule(resolution=max(ci, STOP_RESOLUTION), patience=STOP_PATIENCE, min_measured=STOP_MIN_MEASURED)


def enqueue_first(study: optuna.Study, space: SearchSpace, settings: WindowSettings) -> None:
    """Queue a fresh study's first trial (tuner.llm.first_config), then its sized and chunked twins where they apply."""
    first = first_config(space)
    prompts = load_prompts(settings.prompts).samples
    mean_output = sum(p.output_tokens for p in prompts) / len(prompts)
    queued = [(first, FIRST_WHY)]
    queued.append((sized_config(space, first, settings, mean_output), SIZED_WHY))
    queued.append((chunked_config(space, first), CHUNKED_WHY))
    for config, why in queued:
        if config is not None:
            study.enqueue_trial(space.params_for(config), user_attrs={"proposed_by": "design", "why": why})


def measured_baseline(
    study: optuna.Study, device: Device, space: SearchSpace, text: str | None, batch: int
) -> baseline.BaselineRecord | None:
    """The ``default`` baseline at ``batch`` read (and stored) from a whole, uncut trial of it, if one ran."""
    if text != "default":
        return None
    key = json.dumps(space.effective(space.default_config(batch)).key())
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
        attrs = t.user_attrs
        if attrs.get("effective_key") == key and not attrs.get("cut") and "reused_from" not in attrs:
            record = baseline.from_trial(t, text, baseline.label_of(text, device, space))
            baseline.store(study, record)
            return record
    return None
