"""Stock Optuna samplers on ordered knobs: they see positions, the study keeps values.

A study stores every knob by its real value (a categorical parameter), so it
reads in MHz, watts, cores and batch sizes wherever it is opened. TPE and GP
treat a categorical as unordered, which throws away what a clock ladder says
(918 MHz lies between 816 and 1020). :class:`IndexedSampler` wraps such a
sampler: it keeps a shadow copy of the study in memory in which each ordered
parameter is its position on the ladder (an integer), lets the wrapped sampler
work on that copy, and turns its proposals back into values. The wrapped
sampler sees the study it would have seen had positions been stored.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, IntDistribution
from optuna.trial import FrozenTrial, TrialState

from tuner.space import KnobValue, SearchSpace
from tuner.storage import CONSTRAINTS_KEY, NAMED_PREFIX

_FINISHED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)


def _constraints(system_attrs: dict[str, Any]) -> dict[str, Any]:
    """The constraints the wrapped sampler sees: Optuna's named ones, or an older study's list if it has none.

    A study keeps each named constraint and, for optuna-dashboard, the same
    values again as a list (tuner.storage.set_constraint); shown both, a
    sampler would count every constraint twice, and one trial with the list
    and one without make Optuna's GP sampler refuse the study ("the number
    of constraints must be the same for all trials").
    """
    named = {k: v for k, v in system_attrs.items() if k.startswith(NAMED_PREFIX)}
    if named:
        return named
    return {k: v for k, v in system_attrs.items() if k == CONSTRAINTS_KEY}


class IndexedSampler(optuna.samplers.BaseSampler):
    """Show ``inner`` each ordered parameter as its position; store the value it stands for."""

    def __init__(self, inner: optuna.samplers.BaseSampler) -> None:
        self.inner = inner
        self.ordered: dict[str, list[KnobValue]] = {}
        self._shadow: optuna.Study | None = None
        self._source: tuple[int, int] | None = None
        self._synced: set[int] = set()
        self._stand_ins: dict[int, int] = {}
        self._announced: set[int] = set()

    def bind(self, space: SearchSpace, *_: Any, **__: Any) -> None:
        """Learn which parameters are ordered, and their values in order, from the run's space."""
        self.ordered = space.ordered_params()
        self._shadow = None

    def _position(self, name: str, value: Any) -> int | None:
        for i, candidate in enumerate(self.ordered[name]):
            if str(candidate) == str(value):
                return i
        return None

    def _to_inner(self, name: str, dist: BaseDistribution) -> BaseDistribution:
        if name in self.ordered and isinstance(dist, CategoricalDistribution):
            return IntDistribution(0, len(self.ordered[name]) - 1)
        return dist

    def _from_inner(self, name: str, value: Any) -> Any:
        return self.ordered[name][int(value)] if name in self.ordered else value

    def _view(self, study: optuna.Study) -> optuna.Study:
        """The shadow study, brought up to date with the finished trials of ``study``."""
        source = (id(study._storage), study._study_id)
        if self._shadow is None or self._source != source:
            self._shadow = optuna.create_study(directions=study.directions)
            self._source, self._synced, self._stand_ins = source, set(), {}
        for t in study.get_trials(deepcopy=False, states=_FINISHED):
            if t.number not in self._synced:
                self._synced.add(t.number)
                self._record(t)
        return self._shadow

    def _record(self, t: FrozenTrial) -> None:
        """Copy a finished trial into the shadow, finishing its stand-in if the wrapped sampler saw it run."""
        shadow = self._shadow_trial(t)
        stand_in = self._stand_ins.pop(t.number, None)
        if stand_in is None:
            if shadow is not None:
                self._shadow.add_trial(shadow)
            return
        storage = self._shadow._storage
        if shadow is None:
            storage.set_trial_state_values(stand_in, TrialState.FAIL)
            return
        for name, value in shadow.params.items():
            dist = shadow.distributions[name]
            storage.set_trial_param(stand_in, name, dist.to_internal_repr(value), dist)
        for key, value in shadow.system_attrs.items():
            storage.set_trial_system_attr(stand_in, key, value)
        storage.set_trial_state_values(stand_in, shadow.state, shadow.values)

    def _stand_in(self, study: optuna.Study, trial: FrozenTrial) -> FrozenTrial:
        """The running shadow trial that stands for ``trial`` (samplers write their proposal on it).

        The wrapped sampler hears of the trial (``before_trial``) here, when it
        is first asked about it, not when the trial starts: a strategy that
        proposes most trials itself asks it rarely, and each copy of the study
        into the shadow costs a storage read.
        """
        shadow = self._view(study)
        if trial.number not in self._stand_ins:
            self._stand_ins[trial.number] = shadow._storage.create_new_trial(shadow._study_id)
        stand_in = shadow._storage.get_trial(self._stand_ins[trial.number])
        if trial.number in self._announced:
            self._announced.discard(trial.number)
            self.inner.before_trial(shadow, stand_in)
            stand_in = shadow._storage.get_trial(self._stand_ins[trial.number])
        return stand_in

    def _shadow_trial(self, t: FrozenTrial) -> FrozenTrial | None:
        params, dists = {}, {}
        for name, value in t.params.items():
            if name in self.ordered:
                position = self._position(name, value)
                if position is None:
                    return None
                params[name], dists[name] = position, self._to_inner(name, t.distributions[name])
            else:
                params[name], dists[name] = value, t.distributions[name]
        return optuna.trial.create_trial(
            state=t.state,
            values=t.values,
            params=params,
            distributions=dists,
            intermediate_values=t.intermediate_values,
            system_attrs=_constraints(t.system_attrs),
        )

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        inner = self.inner.infer_relative_search_space(self._view(study), self._stand_in(study, trial))
        return {
            name: CategoricalDistribution(self.ordered[name]) if name in self.ordered else dist
            for name, dist in inner.items()
        }

    def sample_relative(
        self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        inner_space = {name: self._to_inner(name, dist) for name, dist in search_space.items()}
        proposal = self.inner.sample_relative(self._view(study), self._stand_in(study, trial), inner_space)
        return {name: self._from_inner(name, value) for name, value in proposal.items()}

    def sample_independent(
        self, study: optuna.Study, trial: FrozenTrial, param_name: str, param_distribution: BaseDistribution
    ) -> Any:
        dist = self._to_inner(param_name, param_distribution)
        value = self.inner.sample_independent(self._view(study), self._stand_in(study, trial), param_name, dist)
        return self._from_inner(param_name, value) if dist is not param_distribution else value

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        """Passed on when the wrapped sampler is first asked about the trial (see _stand_in)."""
        self._announced.add(trial.number)

    def after_trial(
        self, study: optuna.Study, trial: FrozenTrial, state: TrialState, values: Sequence[float] | None
    ) -> None:
        """Passed on for a trial the wrapped sampler was asked about; it learns the others as finished trials."""
        self._announced.discard(trial.number)
        if trial.number in self._stand_ins:
            self.inner.after_trial(self._view(study), self._stand_in(study, trial), state, values)

    def reseed_rng(self) -> None:
        self.inner.reseed_rng()
