"""Search strategies beyond Optuna's stock samplers, one module each.

The sampler protocol, as ``tune run`` drives it:

1. ``tuner.sampling.make_sampler(name, seed)`` builds the sampler; its
   settings are constructor parameters.
2. The study loop calls ``bind(space, model, max_latency_ms, percentile,
   device)`` once before the first trial: a strategy proposes whole
   configurations of the (narrowed) space against the latency bound.
3. Optuna asks ``sample_relative`` for every trial; GuidedSampler calls the
   strategy's ``propose(study)``, which returns a Config, or None to let the
   inner model-based sampler (GP with PyTorch, multivariate TPE without)
   choose.
4. Each proposed trial carries user attributes ``proposed_by`` and ``why``
   (trials.csv, ``tune status``); ``notes()`` gives study-level notes
   (``strategy_notes``), e.g. a model without a per-layer profile.

Modules: base (GuidedSampler and the helpers every strategy shares), stopping
(when a study is done, from its trials), learned (the default: Gaussian
processes with the roofline as prior; a package, one module per step), two_phase
(PolyThrottle-style CPU first).
"""

from tuner.strategies.base import (
    GuidedSampler,
    has_torch,
    measured_trials,
    model_sampler,
    proposal_counts,
    trial_config,
)
from tuner.strategies.learned import LearnedSampler, Table, space_table
from tuner.strategies.two_phase import TwoPhaseSampler

__all__ = [
    "GuidedSampler",
    "LearnedSampler",
    "Table",
    "TwoPhaseSampler",
    "has_torch",
    "measured_trials",
    "model_sampler",
    "proposal_counts",
    "space_table",
    "trial_config",
]
