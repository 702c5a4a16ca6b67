"""Reading results out of a study: feasibility, the best feasible trial, and flat trial records.

Used by the run loop, the re-measurement step, exports, fleets and result
files alike, so every one of them picks the same winner.
"""

from __future__ import annotations

import math

import optuna

from tuner.objective import METRIC_KEYS

SINGLE_WINDOW_MARGIN = math.sqrt(2) / math.sqrt(1 + 1 / 3)


def is_feasible(trial: optuna.trial.FrozenTrial) -> bool:
    return bool(trial.constraints) and all(v <= 0 for v in trial.constraints.values())


def best_feasible(study: optuna.Study) -> optuna.trial.FrozenTrial | None:
    """The completed feasible trial with the lowest energy per query (ties: earliest).

    A configuration measured more than once is judged on its latest
    re-measurement trial, which carries the mean of all its windows; once any
    configuration was re-measured, only re-measured ones are candidates (if
    one of them is feasible), so a single lucky window cannot win.
    """
    return best_of(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)))


def best_of(trials: list[optuna.trial.FrozenTrial]) -> optuna.trial.FrozenTrial | None:
    """best_feasible over a list of completed trials (a study, or the first n trials of one)."""
    done = candidates(trials)
    return min(done, key=lambda t: (t.value, t.number)) if done else None


def candidates(trials: list[optuna.trial.FrozenTrial]) -> list[optuna.trial.FrozenTrial]:
    """The trials best_of may pick from: anything else shown as a "best" would contradict it."""
    done = [t for t in representatives(trials) if t.value is not None and math.isfinite(t.value) and is_feasible(t)]
    repeats = [t for t in representatives(trials) if "repeat_of" in t.user_attrs]
    if repeats:
        passed = [t for t in done if "repeat_of" in t.user_attrs]
        if passed:
            done = passed
        else:
            margin = max(t.user_attrs.get("latency_margin", 0.0) for t in repeats) * SINGLE_WINDOW_MARGIN
            done = [t for t in done if _meets_with_margin(t, margin)]
    return done


def tail_latency_ms(trial: optuna.trial.FrozenTrial) -> float | None:
    """The tail latency a trial is judged on (the percentile its study bounds, p99 if it does not say)."""
    latency = trial.user_attrs.get(trial.user_attrs.get("latency_key", "p99_ms"))
    return None if latency is None else float(latency)


def _meets_with_margin(trial: optuna.trial.FrozenTrial, margin: float) -> bool:
    """A single-window trial whose latency, raised by the noise margin, still meets the bound."""
    latency = tail_latency_ms(trial)
    slack = trial.constraints.get("latency")
    if latency is None or slack is None:
        return False
    return slack + latency * margin <= 0


def representatives(trials: list[optuna.trial.FrozenTrial]) -> list[optuna.trial.FrozenTrial]:
    """One trial per effective configuration where it was re-measured (the latest repeat); others unchanged."""
    latest: dict[str, optuna.trial.FrozenTrial] = {}
    for t in trials:
        if "repeat_of" in t.user_attrs:
            key = t.user_attrs.get("effective_key")
            if key not in latest or t.number > latest[key].number:
                latest[key] = t
    return [
        t
        for t in trials
        if t.user_attrs.get("effective_key") not in latest or latest[t.user_attrs.get("effective_key")] is t
    ]


def finite_representatives(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """The study's completed representatives with a finite value: the candidates for re-measurement."""
    done = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    return [t for t in representatives(done) if t.value is not None and math.isfinite(t.value)]


def trial_record(trial: optuna.trial.FrozenTrial) -> dict:
    """A flat, JSON-ready view of a trial: configuration, metrics and feasibility."""
    attrs = trial.user_attrs
    record = {
        "trial": trial.number,
        "batch_size": attrs.get("batch_size"),
        "config": attrs.get("effective", attrs.get("config", {})),
        "feasible": is_feasible(trial),
        "twin": attrs.get("twin", False),
        "meter": attrs.get("meter"),
        "device": attrs.get("device"),
        "host": attrs.get("host"),
        "worker": attrs.get("worker"),
    }
    for key in METRIC_KEYS:
        record[key] = attrs.get(key)
    return record
