"""Sampler choice: which Optuna sampler explores the space."""

from __future__ import annotations

import importlib.util

import optuna

from tuner.errors import UserError

SAMPLERS = ("auto", "ours", "gp", "tpe", "random", "two-phase")
DEFAULT_SAMPLER = "auto"


def has_torch() -> bool:
    """Optuna's GP sampler runs on PyTorch, which the core install leaves out."""
    return importlib.util.find_spec("torch") is not None


def model_sampler(seed: int | None, startup: int) -> optuna.samplers.BaseSampler:
    """The model-based sampler that refines after a guided start: GP where it can run, TPE otherwise."""
    if has_torch():
        return optuna.samplers.GPSampler(seed=seed, n_startup_trials=startup, deterministic_objective=False)
    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=startup, multivariate=True)


def make_sampler(name: str, seed: int | None) -> optuna.samplers.BaseSampler:
    """Build a sampler that honours the latency constraint set with trial.set_constraint."""
    name = name.lower()
    if name == "auto":
        name = "ours"
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
        if not has_torch():
            raise UserError("the gp sampler needs PyTorch: pip install 'powertune[torch]', or use --sampler tpe")
        return optuna.samplers.GPSampler(seed=seed, n_startup_trials=10, deterministic_objective=False)
    raise UserError(f"unknown sampler {name!r}: choose one of {', '.join(SAMPLERS)}")
