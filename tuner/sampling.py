"""Sampler choice: which Optuna sampler explores the space."""

from __future__ import annotations

import optuna

from tuner.errors import UserError

SAMPLERS = ("ours", "gp", "tpe", "random", "two-phase")
DEFAULT_SAMPLER = "ours"


def make_sampler(name: str, seed: int | None) -> optuna.samplers.BaseSampler:
    """Build a sampler that honours the latency constraint set with trial.set_constraint."""
    name = name.lower()
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=10, multivariate=True)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "ours":
        from tuner.strategies import RooflineSampler

        return RooflineSampler(seed=seed)
    if name == "two-phase":
        from tuner.strategies import TwoPhaseSampler

        return TwoPhaseSampler(seed=seed)
    if name == "gp":
        return optuna.samplers.GPSampler(seed=seed, n_startup_trials=10, deterministic_objective=False)
    raise UserError(f"unknown sampler {name!r}: choose one of {', '.join(SAMPLERS)}")
