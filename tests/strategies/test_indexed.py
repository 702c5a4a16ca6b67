"""IndexedSampler: the wrapped sampler sees positions, and hears of a trial only when it is asked about it."""

from __future__ import annotations

from typing import Any

import optuna
import pytest
from optuna.distributions import CategoricalDistribution

from tuner.indexed import IndexedSampler

CLOCKS = [100, 200, 300, 400]


class Ladder:
    """The one thing IndexedSampler.bind reads of a space: its ordered parameters."""

    def ordered_params(self) -> dict[str, list[Any]]:
        return {"clock": CLOCKS}


class Recording(optuna.samplers.RandomSampler):
    """A random sampler that records what it is told and what study it is shown."""

    def __init__(self) -> None:
        super().__init__(seed=0)
        self.calls: list[tuple[str, int]] = []
        self.seen: list[list[Any]] = []

    def before_trial(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        self.calls.append(("before", trial.number))

    def after_trial(self, study, trial, state, values) -> None:
        self.calls.append(("after", trial.number))

    def sample_independent(self, study, trial, param_name, param_distribution) -> Any:
        self.seen.append([t.params[param_name] for t in study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))])
        return super().sample_independent(study, trial, param_name, param_distribution)


def objective(trial: optuna.Trial) -> float:
    return float(trial.suggest_categorical("clock", CLOCKS))


def wrapped(inner: Recording) -> IndexedSampler:
    sampler = IndexedSampler(inner)
    sampler.bind(Ladder())
    return sampler


def test_the_wrapped_sampler_sees_positions_and_hears_of_every_trial_it_samples() -> None:
    inner = Recording()
    study = optuna.create_study(sampler=wrapped(inner))
    study.optimize(objective, n_trials=4)
    assert inner.calls == [(kind, n) for n in range(4) for kind in ("before", "after")]
    assert inner.seen[-1] == [CLOCKS.index(t.params["clock"]) for t in study.trials[:3]]
    assert all(t.params["clock"] in CLOCKS for t in study.trials)


class AsksOnce(optuna.samplers.BaseSampler):
    """A strategy that chooses every trial itself except trial ``ask_at``, which it leaves to the wrapped sampler."""

    def __init__(self, inner: IndexedSampler, ask_at: int) -> None:
        self.inner = inner
        self.ask_at = ask_at

    def infer_relative_search_space(self, study, trial) -> dict:
        return {}

    def sample_relative(self, study, trial, search_space) -> dict:
        return {}

    def sample_independent(self, study, trial, param_name, param_distribution) -> Any:
        if trial.number == self.ask_at:
            return self.inner.sample_independent(study, trial, param_name, param_distribution)
        return CLOCKS[trial.number % len(CLOCKS)]

    def before_trial(self, study, trial) -> None:
        self.inner.before_trial(study, trial)

    def after_trial(self, study, trial, state, values) -> None:
        self.inner.after_trial(study, trial, state, values)


def test_a_trial_the_wrapped_sampler_is_never_asked_about_reaches_it_only_as_a_finished_trial() -> None:
    inner = Recording()
    study = optuna.create_study(sampler=AsksOnce(wrapped(inner), ask_at=3))
    study.optimize(objective, n_trials=6)
    assert inner.calls == [("before", 3), ("after", 3)]
    assert inner.seen == [[CLOCKS.index(t.params["clock"]) for t in study.trials[:3]]]
    assert isinstance(study.trials[3].distributions["clock"], CategoricalDistribution)


class SeesConstraints(Recording):
    """Records the constraints of the finished trials it is shown."""

    def sample_independent(self, study, trial, param_name, param_distribution) -> Any:
        self.seen.append([t.constraints for t in study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))])
        return optuna.samplers.RandomSampler.sample_independent(self, study, trial, param_name, param_distribution)


def test_the_wrapped_sampler_sees_each_named_constraint_once_whether_or_not_the_dashboard_list_was_written() -> None:
    from tuner.storage import set_constraint

    def constrained(trial: optuna.Trial) -> float:
        clock = trial.suggest_categorical("clock", CLOCKS)
        if trial.number % 2:
            set_constraint(trial, "latency", clock - 250.0)  # named and mirrored for the dashboard
        else:
            trial.set_constraint("latency", clock - 250.0)  # named only
        return float(clock)

    inner = SeesConstraints()
    study = optuna.create_study(sampler=wrapped(inner))
    study.optimize(constrained, n_trials=4)
    assert len(study.trials[1].constraints) == 2  # the study keeps the list optuna-dashboard reads
    shown = inner.seen[-1]
    assert len(shown) == 3 and all(set(c) == {"latency"} for c in shown)
    assert [c["latency"] for c in shown] == [t.params["clock"] - 250.0 for t in study.trials[:3]]


def test_optuna_s_gp_sampler_runs_a_study_whose_windows_are_cut() -> None:
    """Cut trials carry the named constraint only, the others the dashboard's list too: GP must take both."""
    pytest.importorskip("torch")
    from tuner.devices.virtual.twin import TwinDevice
    from tuner.run_options import RunOptions
    from tuner.sampling import make_sampler
    from tuner.study import MEMORY_STORAGE, run_study

    options = RunOptions(model="resnet50", max_latency_ms=50.0, trials=12, seed=1, storage=MEMORY_STORAGE)
    study, _ = run_study(TwinDevice("sim:orin"), options, sampler=make_sampler("gp", 1))
    finished = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert any(t.user_attrs.get("cut") for t in finished) and not all(t.user_attrs.get("cut") for t in finished)
    assert len(finished) >= 12
