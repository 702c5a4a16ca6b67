"""Sampler choice: which Optuna sampler explores the space.

The dependency runs one way: this module builds samplers and imports the
strategies; tuner.strategies never imports this module. ``learned`` (the
default) was called ``ours`` before; the old name is still accepted.
"""

from __future__ import annotations

import importlib

import optuna

from tuner.errors import UserError
from tuner.indexed import IndexedSampler
from tuner.strategies import LearnedSampler, TwoPhaseSampler, has_torch

SAMPLERS = ("auto", "learned", "gp", "tpe", "random", "two-phase")
# The samplers that fit Optuna's GP (on PyTorch) once their first trials are in.
GP_SAMPLERS = ("gp", "two-phase")
ALIASES = {"ours": "learned"}


def available_samplers() -> list[str]:
    """The samplers this installation can run (gp needs PyTorch, which the core install leaves out)."""
    return [s for s in SAMPLERS if s != "auto" and (s != "gp" or has_torch())]


def canonical(name: str) -> str:
    """A sampler name in lower case with an old alias replaced by its current name (``ours`` -> ``learned``)."""
    name = name.lower()
    return ALIASES.get(name, name)


def make_sampler(name: str, seed: int | None) -> optuna.samplers.BaseSampler:
    """Build a sampler that honours the latency constraint set with trial.set_constraint.

    Stock samplers are wrapped in IndexedSampler so they see the order of ordered knobs.
    """
    name = canonical(name)
    if name == "auto":
        name = "learned"
    if name in GP_SAMPLERS and has_torch():
        # Optuna imports PyTorch inside the first GP proposal: seconds of a trial that a signal waits
        # for (tuner.plumbing.interrupts). Here, before any trial, the import is paid once where a run starts.
        importlib.import_module("torch")
    if name == "tpe":
        return IndexedSampler(optuna.samplers.TPESampler(seed=seed, n_startup_trials=10, multivariate=True))
    if name == "random":
        return IndexedSampler(optuna.samplers.RandomSampler(seed=seed))
    if name == "learned":
        return LearnedSampler(seed=seed)
    if name == "two-phase":
        return TwoPhaseSampler(seed=seed)
    if name == "gp":
        if not has_torch():
            raise UserError("the gp sampler needs PyTorch: pip install 'powertune[torch]', or use --sampler tpe")
        return IndexedSampler(optuna.samplers.GPSampler(seed=seed, n_startup_trials=10, deterministic_objective=False))
    raise UserError(f"unknown sampler {name!r}: choose one of {', '.join(SAMPLERS)}")
