"""After the search: re-measure the best feasible configurations so a lucky window cannot win."""

from __future__ import annotations

from collections.abc import Callable

import optuna

from tuner.objective import MeasurementRejected, Objective
from tuner.records import finite_representatives, is_feasible
from tuner.space import Config, SearchSpace


def remeasure_top(
    study: optuna.Study,
    objective: Objective,
    space: SearchSpace,
    top: int,
    repeats: int,
    on_trial: Callable[[optuna.Study, optuna.trial.FrozenTrial, int], None] | None = None,
) -> None:
    """Re-measure the best feasible configurations, best first, ``repeats`` more windows each.

    A candidate whose mean (with its noise margin) misses the bound does not
    count: the next one is re-measured instead, until ``top`` candidates
    passed or ``top x repeats`` windows are spent.
    """
    ranked = sorted(finite_representatives(study), key=lambda t: (t.value, t.number))
    budget, passed = top * repeats, 0
    callbacks = [] if on_trial is None else [lambda s, tr: on_trial(s, tr, objective.measured)]
    for t in [t for t in ranked if is_feasible(t)]:
        if budget < repeats or passed >= top:
            break
        config = Config(knobs=t.user_attrs["config"], batch_size=t.user_attrs["batch_size"])
        for _ in range(repeats):
            why = f"re-measure of trial {t.number}: the best is judged on a mean, not one window"
            attrs = {"repeat_of": t.number, "proposed_by": "remeasure", "why": why}
            study.enqueue_trial(space.params_for(config), user_attrs=attrs, skip_if_exists=False)
        study.optimize(
            objective, n_trials=repeats, callbacks=callbacks, catch=(MeasurementRejected,), gc_after_trial=False
        )
        budget -= repeats
        last = study.get_trials(deepcopy=False)[-1]
        passed += last.state == optuna.trial.TrialState.COMPLETE and is_feasible(last)
