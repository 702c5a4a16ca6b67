"""The answer a study gives: its recommended configuration, read the way Optuna reads it.

The recommended configuration is Optuna's own best trial: the cheapest
completed trial whose constraints all hold (``study.best_trial``, what
optuna-dashboard marks). That is the right answer because of how trials are
recorded (tuner.objective): a window that would beat the best so far is
confirmed in the same trial by more windows, and the trial then carries their
mean energy and a latency constraint with a noise margin. A single lucky
window never holds the best value, and a trial's verdict never changes after
it completes, so ``tune run``, export, pareto, status, apply, the plots and
the dashboard all name one trial, in a resumed study and in a fleet alike.
"""

from __future__ import annotations

import optuna

from tuner.measurement import METRIC_KEYS

COMPLETE = optuna.trial.TrialState.COMPLETE
EARLY_STOP_ATTR = "early_stop"
"""The study user attribute that holds a stop decision (tuner.strategies.stopping): every worker reads it."""


def is_feasible(trial: optuna.trial.FrozenTrial) -> bool:
    """Feasible as Optuna counts it: completed, and every constraint <= 0."""
    return trial.state == COMPLETE and all(v <= 0 for v in trial.constraints.values())


def recommended(study: optuna.Study) -> optuna.trial.FrozenTrial | None:
    """The study's answer: Optuna's best trial, or None while no trial is feasible."""
    try:
        return study.best_trial
    except ValueError:
        return None


def recommended_of(trials: list[optuna.trial.FrozenTrial]) -> optuna.trial.FrozenTrial | None:
    """The answer a study holding only ``trials`` would give (Optuna's rule; ties: the earliest)."""
    feasible = [t for t in trials if is_feasible(t) and t.value is not None]
    return min(feasible, key=lambda t: (t.value, t.number)) if feasible else None


def windows(trial: optuna.trial.FrozenTrial) -> int:
    """How many windows a trial's figures are the mean of (a reuse counts those it copied)."""
    return int(trial.user_attrs.get("measurements", 1))


def tail_latency_ms(trial: optuna.trial.FrozenTrial) -> float | None:
    """The tail latency a trial is judged on (the percentile its study bounds, p99 if it does not say)."""
    latency = trial.user_attrs.get(trial.user_attrs.get("latency_key", "p99_ms"))
    return None if latency is None else float(latency)


def trial_record(trial: optuna.trial.FrozenTrial) -> dict:
    """A flat, JSON-ready view of a trial: configuration, metrics and feasibility."""
    attrs = trial.user_attrs
    record = {
        "trial": trial.number,
        "batch_size": attrs.get("batch_size"),
        "config": attrs.get("effective", attrs.get("config", {})),
        "feasible": is_feasible(trial),
        "windows": windows(trial),
        "verdict": attrs.get("verdict"),
        "twin": attrs.get("twin", False),
        "meter": attrs.get("meter"),
        "device": attrs.get("device"),
        "host": attrs.get("host"),
        "worker": attrs.get("worker"),
    }
    for key in METRIC_KEYS:
        record[key] = attrs.get(key)
    return record
