"""The guided-sampler base: an Optuna sampler that proposes whole configurations of a SearchSpace.

A strategy subclasses GuidedSampler and implements ``propose(study)``: return
the next Config to measure, or None to let the inner model-based sampler
(GP where PyTorch is installed, multivariate TPE otherwise) choose. The study
loop binds the sampler to the space, model and bound before the first trial
(``bind``), because a proposal needs the grid and the latency bound, which an
Optuna sampler does not otherwise see.
"""

from __future__ import annotations

import importlib.util
import json
from typing import Any

import numpy as np
import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution

from tuner.indexed import IndexedSampler
from tuner.space import Config, SearchSpace

HEADROOM_KEY = "headroom"
"""Trial user attribute: the strategy's bound, at its proposal, on what an unmeasured configuration could save."""
WARM_START = "warm-start"
"""``proposed_by`` of a trial queued from an earlier study's configuration (measured again, never copied)."""
COULD_WIN_KEY = "could_win"
"""Trial user attribute: how many unmeasured configurations had any headroom at that proposal."""


def has_torch() -> bool:
    """Optuna's GP sampler runs on PyTorch, which the core install leaves out."""
    return importlib.util.find_spec("torch") is not None


def model_sampler(seed: int | None, startup: int) -> IndexedSampler:
    """The model-based sampler that refines after a guided start: GP where it can run, TPE otherwise."""
    if has_torch():
        return IndexedSampler(
            optuna.samplers.GPSampler(seed=seed, n_startup_trials=startup, deterministic_objective=False)
        )
    return IndexedSampler(optuna.samplers.TPESampler(seed=seed, n_startup_trials=startup, multivariate=True))


def measured_trials(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """Completed trials that measured (not reuses of an earlier measurement, not repeats)."""
    return measured_of(study.get_trials(deepcopy=False))


def measured_of(trials: list[optuna.trial.FrozenTrial]) -> list[optuna.trial.FrozenTrial]:
    """:func:`measured_trials` of trials already read (one storage read serves a whole proposal)."""
    return [
        t
        for t in trials
        if t.state == optuna.trial.TrialState.COMPLETE
        and "reused_from" not in t.user_attrs
        and "repeat_of" not in t.user_attrs
        and "qps" in t.user_attrs
    ]


def trial_config(t: optuna.trial.FrozenTrial) -> Config:
    return Config(knobs=t.user_attrs["effective"], batch_size=t.user_attrs["batch_size"])


def _draw(dist: CategoricalDistribution, rng: np.random.Generator) -> Any:
    return dist.choices[int(rng.integers(len(dist.choices)))]


class GuidedSampler(optuna.samplers.BaseSampler):
    """A sampler that proposes whole configurations when it can, and otherwise asks a model-based sampler."""

    def __init__(self, seed: int | None = None) -> None:
        self.seed = seed
        self.inner = model_sampler(seed, startup=10)
        self.space: SearchSpace | None = None
        self.device: Any = None
        self.reason: tuple[str, str] = ("", "")
        self.model = ""
        self.bound_ms = float("inf")
        self.percentile = "p99"
        self.headroom: tuple[float, int] | None = None

    def bind(self, space: SearchSpace, model: str, max_latency_ms: float, percentile: str, device: Any = None) -> None:
        self.device = device
        self.space = space
        self.model = model
        self.bound_ms = max_latency_ms
        self.percentile = percentile
        self.inner.bind(space)

    def propose(self, study: optuna.Study) -> Config | None:
        raise NotImplementedError

    def infer_relative_search_space(
        self, study: optuna.Study, trial: optuna.trial.FrozenTrial
    ) -> dict[str, BaseDistribution]:
        return self.space.distributions() if self.space is not None else {}

    def sample_relative(
        self, study: optuna.Study, trial: optuna.trial.FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        if self.space is None:
            return {}
        if "fixed_params" in trial.system_attrs:
            return {}
        self.reason = ("", "")
        self.headroom = None
        config = self.propose(study)
        if config is not None:
            self._log(study, trial, *self.reason)
            if self.headroom is not None:
                study._storage.set_trial_user_attr(trial._trial_id, HEADROOM_KEY, round(self.headroom[0], 6))
                study._storage.set_trial_user_attr(trial._trial_id, COULD_WIN_KEY, self.headroom[1])
            return self.space.params_for(config)
        self._log(study, trial, type(self.inner).__name__, self.reason[1] or "the strategy had nothing to propose")
        inner_space = self.inner.infer_relative_search_space(study, trial)
        params = self.adjust(self.inner.sample_relative(study, trial, inner_space))
        return self._unmeasured(study, params) if len(params) == len(search_space) else params

    @staticmethod
    def _log(study: optuna.Study, trial: optuna.trial.FrozenTrial, proposed_by: str, why: str) -> None:
        """Store who proposed the trial and why in its user attributes (exported with trials.csv)."""
        study._storage.set_trial_user_attr(trial._trial_id, "proposed_by", proposed_by)
        study._storage.set_trial_user_attr(trial._trial_id, "why", why)

    def _unmeasured(self, study: optuna.Study, params: dict[str, Any]) -> dict[str, Any]:
        """Replace a proposal that repeats a measured configuration by a random unmeasured one.

        Pinning parameters behind the inner sampler's back makes it propose
        the same point again and again; a measured point teaches it nothing.
        """
        done = {t.user_attrs.get("effective_key") for t in study.get_trials(deepcopy=False)}
        rng = np.random.default_rng(len(done) if self.seed is None else self.seed + len(done))
        dists = self.space.distributions()
        candidate = params
        for _ in range(50):
            key = json.dumps(self.space.effective(self.space.config_of(candidate)).key())
            if key not in done:
                return candidate
            candidate = self.adjust({name: _draw(d, rng) for name, d in dists.items()})
        return params

    def adjust(self, params: dict[str, Any]) -> dict[str, Any]:
        """Hook for strategies that pin some parameters while the inner sampler explores the rest."""
        return params

    def sample_independent(
        self,
        study: optuna.Study,
        trial: optuna.trial.FrozenTrial,
        param_name: str,
        param_distribution: BaseDistribution,
    ) -> Any:
        pinned = self.adjust({}).get(param_name)
        if pinned is not None:
            return pinned
        return self.inner.sample_independent(study, trial, param_name, param_distribution)

    def before_trial(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        self.inner.before_trial(study, trial)

    def after_trial(
        self,
        study: optuna.Study,
        trial: optuna.trial.FrozenTrial,
        state: optuna.trial.TrialState,
        values: list[float] | None,
    ) -> None:
        self.inner.after_trial(study, trial, state, values)

    def _fresh(self, study: optuna.Study, config: Config, keys: set[str] | None = None) -> Config | None:
        """The effective configuration if no trial has it yet (``keys``: the trials' keys, if already read)."""
        effective = self.space.effective(config)
        key = json.dumps(effective.key())
        if keys is None:
            keys = {t.user_attrs.get("effective_key") for t in study.get_trials(deepcopy=False)}
        return None if key in keys else effective


def proposal_counts(study: optuna.Study) -> dict[str, int]:
    """How many trials each model proposed in this study (from the trials' ``proposed_by``)."""
    counts: dict[str, int] = {}
    for t in study.get_trials(deepcopy=False):
        who = t.user_attrs.get("proposed_by")
        if who is not None:
            counts[who] = counts.get(who, 0) + 1
    return counts
