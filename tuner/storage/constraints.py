"""Where Optuna and optuna-dashboard read a trial's constraints and the objectives' names."""

from __future__ import annotations

from typing import Any

import optuna
from optuna.study._constrained_optimization import _CONSTRAINTS_KEY
from optuna.study.study import _SYSTEM_ATTR_METRIC_NAMES

# Where Optuna keeps a trial's constraints: a list under this key (the form optuna-dashboard reads) and,
# since Optuna 5, one "constraints:<name>" key each. Optuna reads both; the list mirrors the named ones.
CONSTRAINTS_KEY = _CONSTRAINTS_KEY
# Where Optuna keeps the objectives' names (Study.set_metric_names), which optuna-dashboard shows.
METRIC_NAMES_KEY = _SYSTEM_ATTR_METRIC_NAMES
OBJECTIVE_NAME = "J/query"
NAMED_PREFIX = f"{CONSTRAINTS_KEY}:"


def named_constraints(system_attrs: dict[str, Any]) -> dict[str, float]:
    """A trial's named constraints (``latency``), in the order they were set; the mirrored list left out."""
    return {k.removeprefix(NAMED_PREFIX): float(v) for k, v in system_attrs.items() if k.startswith(NAMED_PREFIX)}


def set_constraint(trial: optuna.Trial, name: str, value: float) -> None:
    """Optuna's named constraint, mirrored into the list form optuna-dashboard reads.

    The dashboard (0.21) reads a trial's constraints from ``constraints`` only;
    without the list it shows no trial as infeasible and draws the best-value
    line through trials that broke the bound.
    """
    trial.set_constraint(name, value)
    listed = list(named_constraints(trial.storage.get_trial_system_attrs(trial._trial_id)).values())
    trial.storage.set_trial_system_attr(trial._trial_id, CONSTRAINTS_KEY, listed)
    trial._cached_frozen_trial.system_attrs[CONSTRAINTS_KEY] = listed
