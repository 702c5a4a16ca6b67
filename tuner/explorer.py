"""The explorer: a random unmeasured configuration when the sampler keeps re-proposing measured ones."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable

import optuna

from tuner.space import Grid, SearchSpace

REPEATS_BEFORE_EXPLORING = 2


class Explorer:
    """Breaks a sampler's loop of re-proposing measured configurations.

    Model-based samplers on a small discrete space keep suggesting the
    incumbent; each repeat is free (the measurement is reused) but teaches
    nothing. After a few repeats in a row the next trial is an unmeasured
    configuration drawn at random, so every trial budget buys new points. Not
    in a fleet with a study quota: a queued trial in shared storage would be
    left waiting when the quota ends the study.
    """

    def __init__(self, space: SearchSpace, measured: Callable[[], Iterable[str]], seed: int | None) -> None:
        self.space = space
        self.measured = measured
        self.rng = random.Random(seed)

    def enqueue_unmeasured(self, study: optuna.Study) -> bool:
        """Queue a random unmeasured configuration; False when every one has been measured."""
        grid = Grid(self.space)
        measured = {grid.position(key) for key in self.measured()} - {None}
        left = len(grid) - len(measured)
        if left <= 0:
            return False
        # Draw by position; once most of the grid is measured, pick among the few left instead.
        if left * 4 >= len(grid):
            pick = next(i for i in iter(lambda: self.rng.randrange(len(grid)), None) if i not in measured)
        else:
            pick = self.rng.choice([i for i in range(len(grid)) if i not in measured])
        why = "the sampler re-proposed measured configurations: a random unmeasured one"
        study.enqueue_trial(
            self.space.params_for(grid[pick]),
            user_attrs={"proposed_by": "explorer", "why": why},
            skip_if_exists=False,
        )
        return True
