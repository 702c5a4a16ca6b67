"""The storage ``tune dashboard`` serves: read-only, no heartbeat, and the best trial honours constraints."""

from __future__ import annotations

from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from tuner.errors import UserError
from tuner.storage.constraints import CONSTRAINTS_KEY, METRIC_NAMES_KEY, OBJECTIVE_NAME, named_constraints
from tuner.storage.sqlite import prepare_sqlite
from tuner.storage.urls import driver_url, is_rdb, redact


class ConstrainedBestStorage(optuna.storages.RDBStorage):
    """An RDB storage whose best trial honours constraints, as ``Study.best_trial`` does.

    optuna-dashboard marks ``storage.get_best_trial`` as a study's best, and
    Optuna's storages pick the lowest value whatever its constraints, so the
    dashboard would crown a trial that missed the latency bound. Served
    through this class, it marks the trial that ``study.best_trial``, ``tune
    run``, ``tune export`` and ``tune pareto`` name.
    """

    def get_best_trial(self, study_id: int) -> optuna.trial.FrozenTrial:
        best = super().get_best_trial(study_id)
        if all(v <= 0 for v in best.constraints.values()):
            return best
        done = self.get_all_trials(study_id, deepcopy=False, states=(TrialState.COMPLETE,))
        feasible = [t for t in done if all(v <= 0 for v in t.constraints.values())]
        if not feasible:
            return best
        if self.get_study_directions(study_id)[0] == optuna.study.StudyDirection.MAXIMIZE:
            return max(feasible, key=lambda t: float(t.value))
        return min(feasible, key=lambda t: float(t.value))

    def get_all_trials(self, study_id: int, deepcopy: bool = True, states: Any = None) -> list[FrozenTrial]:
        """Every trial with its constraints in the list form the dashboard reads (studies written before it)."""
        trials = super().get_all_trials(study_id, deepcopy=deepcopy, states=states)
        for t in trials:
            named = named_constraints(t.system_attrs)
            if named and CONSTRAINTS_KEY not in t.system_attrs:
                t.system_attrs = {**t.system_attrs, CONSTRAINTS_KEY: list(named.values())}
        return trials

    def get_all_studies(self) -> list[optuna.study.FrozenStudy]:
        """Every study, a powertune study written before it named them with its objective's name and bound."""
        studies = super().get_all_studies()
        for study in studies:
            attrs = study.user_attrs
            if "max_latency_ms" not in attrs:
                continue
            study.system_attrs.setdefault(METRIC_NAMES_KEY, [OBJECTIVE_NAME])
            bound = f"{attrs.get('percentile', 'p99')} <= {float(attrs['max_latency_ms']):g} ms"
            study.user_attrs.setdefault("latency_bound", f"{bound} (constraint latency <= 0)")
        return studies


def dashboard_storage(url: str) -> ConstrainedBestStorage:
    """The storage ``tune dashboard`` serves: read-only use, no heartbeat, constrained best."""
    if not is_rdb(url):
        raise UserError(f"tune dashboard reads database storages (sqlite:///..., postgresql://...), not {redact(url)}")
    prepare_sqlite(url, readonly=True)
    return ConstrainedBestStorage(driver_url(url), engine_kwargs={"pool_pre_ping": True})
