"""Search strategies beyond Optuna's stock samplers: ours (roofline-guided) and a PolyThrottle-style two-phase search.

Both are Optuna samplers, so ``tune run`` drives them through the same study
loop as the stock ones. They are bound to the (narrowed) space and the run's
options by run_study before the first trial (``bind``): proposing a
configuration needs the space's grid and the latency bound, which a sampler
does not otherwise see. A proposal is returned for every parameter of the
trial; when a strategy has nothing to propose, an inner model-based sampler
does (GP where PyTorch is installed, multivariate TPE otherwise).
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, IntDistribution

from runners.profile import load_profile
from tuner.roofline import Features, Roofline, features, fit_measurements, knob_roles
from tuner.sampling import model_sampler
from tuner.space import Config, Grid, SearchSpace

_GRIDS: dict[str, tuple[Grid, Features]] = {}


def distributions(space: SearchSpace) -> dict[str, BaseDistribution]:
    """The Optuna distributions SearchSpace.suggest draws from (same names and ranges)."""
    out: dict[str, BaseDistribution] = {}
    for name in space.tuned_knobs:
        knob = space.knobs[name]
        if knob.ordered:
            out[f"{name}_index"] = IntDistribution(0, len(knob.values) - 1)
        else:
            out[name] = CategoricalDistribution(knob.values)
    if len(space.batch_sizes) > 1:
        out["batch_size_index"] = IntDistribution(0, len(space.batch_sizes) - 1)
    return out


def grid_features(space: SearchSpace) -> tuple[Grid, Features]:
    """The space's grid (configurations by position, positions by effective key) and its roofline features.

    Cached per space content; built from per-knob tables, so even the first
    call costs milliseconds.
    """
    key = space.model_dump_json()
    if key not in _GRIDS:
        grid = Grid(space)
        _GRIDS[key] = (grid, features(space, grid))
    return _GRIDS[key]


def measured_trials(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """Completed trials that measured (not reuses of an earlier measurement, not repeats)."""
    return [
        t
        for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
        if "reused_from" not in t.user_attrs and "repeat_of" not in t.user_attrs and "qps" in t.user_attrs
    ]


def trial_config(t: optuna.trial.FrozenTrial) -> Config:
    return Config(knobs=t.user_attrs["effective"], batch_size=t.user_attrs["batch_size"])


def _draw(dist: BaseDistribution, rng: np.random.Generator) -> Any:
    if isinstance(dist, IntDistribution):
        return int(rng.integers(dist.low, dist.high + 1))
    return dist.choices[int(rng.integers(len(dist.choices)))]


class GuidedSampler(optuna.samplers.BaseSampler):
    """A sampler that proposes whole configurations when it can, and otherwise asks a model-based sampler."""

    remeasure: tuple[int, int] = (0, 0)

    def __init__(self, seed: int | None = None) -> None:
        self.seed = seed
        self.inner = model_sampler(seed, startup=10)
        self.space: SearchSpace | None = None
        self.model = ""
        self.bound_ms = float("inf")
        self.percentile = "p99"

    def bind(self, space: SearchSpace, model: str, max_latency_ms: float, percentile: str) -> None:
        self.space = space
        self.model = model
        self.bound_ms = max_latency_ms
        self.percentile = percentile

    def propose(self, study: optuna.Study) -> Config | None:
        raise NotImplementedError

    def infer_relative_search_space(
        self, study: optuna.Study, trial: optuna.trial.FrozenTrial
    ) -> dict[str, BaseDistribution]:
        return distributions(self.space) if self.space is not None else {}

    def sample_relative(
        self, study: optuna.Study, trial: optuna.trial.FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        if self.space is None or "fixed_params" in trial.system_attrs:
            return {}
        config = self.propose(study)
        if config is not None:
            return self.space.params_for(config)
        inner_space = self.inner.infer_relative_search_space(study, trial)
        params = self.adjust(self.inner.sample_relative(study, trial, inner_space))
        return self._unmeasured(study, params) if len(params) == len(search_space) else params

    def _unmeasured(self, study: optuna.Study, params: dict[str, Any]) -> dict[str, Any]:
        """Replace a proposal that repeats a measured configuration by a random unmeasured one.

        Pinning parameters behind the inner sampler's back makes it propose
        the same point again and again; a measured point teaches it nothing.
        """
        done = {t.user_attrs.get("effective_key") for t in study.get_trials(deepcopy=False)}
        rng = np.random.default_rng(len(done) if self.seed is None else self.seed + len(done))
        dists = distributions(self.space)
        candidate = params
        for _ in range(50):
            key = json.dumps(self.space.effective(self._config_of(candidate)).key())
            if key not in done:
                return candidate
            candidate = self.adjust({name: _draw(d, rng) for name, d in dists.items()})
        return params

    def _config_of(self, params: dict[str, Any]) -> Config:
        knobs = {}
        for name, knob in self.space.knobs.items():
            if name not in self.space.tuned_knobs:
                knobs[name] = knob.default
            elif knob.ordered:
                knobs[name] = knob.values[params[f"{name}_index"]]
            else:
                knobs[name] = params[name]
        batches = self.space.batch_sizes
        return Config(knobs=knobs, batch_size=batches[params["batch_size_index"]] if len(batches) > 1 else batches[0])

    def adjust(self, params: dict[str, Any]) -> dict[str, Any]:
        """Hook for strategies that pin some parameters while the inner sampler explores the rest."""
        return params

    def sample_independent(
        self,
        study: optuna.Study,
        trial: optuna.trial.FrozenTrial,
        param_name: str,
        param_distribution: BaseDistribution,
    ) -> Any:
        pinned = self.adjust({}).get(param_name)
        if pinned is not None:
            return pinned
        return self.inner.sample_independent(study, trial, param_name, param_distribution)

    def before_trial(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        self.inner.before_trial(study, trial)

    def after_trial(
        self,
        study: optuna.Study,
        trial: optuna.trial.FrozenTrial,
        state: optuna.trial.TrialState,
        values: list[float] | None,
    ) -> None:
        self.inner.after_trial(study, trial, state, values)

    def _fresh(self, study: optuna.Study, config: Config) -> Config | None:
        """The effective configuration if it has not been measured yet, else None."""
        effective = self.space.effective(config)
        key = json.dumps(effective.key())
        done = {t.user_attrs.get("effective_key") for t in study.get_trials(deepcopy=False)}
        return None if key in done else effective


class RooflineSampler(GuidedSampler):
    """Ours: default mode as a baseline, then the fitted roofline's predicted best, then GP; re-measure the top.

    The first two trials measure the default mode at the largest and the
    smallest batch size (the baseline a user would get, and the two ends of the
    batch axis). From then on the roofline is refitted on every measured trial
    and the unmeasured configuration it predicts cheapest within the bound
    (less a margin of its own latency error) is measured, until it has
    proposed ``stall`` configurations in a row that did not improve the best
    measured one; the GP sampler then refines. Before the best is declared,
    the ``remeasure`` top candidates are measured again (run_study), so the
    exported configuration is judged on a mean, not on one lucky window.
    """

    remeasure = (2, 2)

    def __init__(self, seed: int | None = None, stall: int = 4) -> None:
        super().__init__(seed)
        self.stall = stall
        self.inner = model_sampler(seed, startup=4)
        self.roofline: Roofline | None = None

    def propose(self, study: optuna.Study) -> Config | None:
        done = measured_trials(study)
        if len(done) < 2:
            default = self.space.default_config()
            for batch in (self.space.batch_sizes[-1], self.space.batch_sizes[0]):
                fresh = self._fresh(study, default.model_copy(update={"batch_size": batch}))
                if fresh is not None:
                    return fresh
        if self._stalled(done):
            return None
        configs, feats = grid_features(self.space)
        try:
            self.roofline = fit_measurements(
                load_profile(self.model),
                self.space,
                [trial_config(t) for t in done],
                [t.user_attrs for t in done],
                self.percentile,
            )
        except Exception:
            return None
        _, energy, latency = self.roofline.predict(feats)
        margin = max(0.02, 2 * self._latency_error(done))
        ok = latency <= self.bound_ms * (1 - margin)
        if np.isfinite(feats.power_limit).any():
            ok &= self._uncapped(configs, feats)
        seen = {t.user_attrs.get("effective_key") for t in study.get_trials(deepcopy=False)}
        for key in seen:
            i = None if key is None else configs.position(key)
            if i is not None:
                ok[i] = False
        if not ok.any():
            return None
        return configs[int(np.argmin(np.where(ok, energy, np.inf)))]

    def _uncapped(self, configs: Grid, feats: Features) -> np.ndarray:
        """Configurations at the highest power limit the roofline predicts they stay under.

        Where clocks can be locked, a power limit that does not bind changes
        nothing, and one that binds only lowers the clock to one the table
        already offers: proposing the same clocks under every limit would
        spend trials on duplicates.
        """
        knob = knob_roles(self.space).get("power_limit_w")
        if knob is None or knob not in self.space.tuned_knobs:
            return np.ones(len(configs), dtype=bool)
        top = max(float(v) for v in self.space.knobs[knob].values)
        return (feats.power_limit >= top) & (self.roofline.power(feats) <= feats.power_limit)

    def _latency_error(self, done: list[optuna.trial.FrozenTrial]) -> float:
        """Relative error of the current roofline's latency on the measured points."""
        if self.roofline is None:
            return 0.0
        grid, feats = grid_features(self.space)
        rows = [grid.position(t.user_attrs["effective_key"]) for t in done]
        pairs = [(i, t) for i, t in zip(rows, done, strict=True) if i is not None]
        if not pairs:
            return 0.0
        sub = feats.take(np.array([i for i, _ in pairs]))
        _, _, latency = self.roofline.predict(sub)
        measured = np.array([t.user_attrs[f"{self.percentile}_ms"] for _, t in pairs])
        return float(np.median(np.abs(latency / measured - 1)))

    def _stalled(self, done: list[optuna.trial.FrozenTrial]) -> bool:
        """True once the last ``stall`` measured trials have not improved the best feasible one."""
        best, since = float("inf"), 0
        for t in done:
            feasible = bool(t.constraints) and all(c <= 0 for c in t.constraints.values())
            if feasible and t.value < best:
                best, since = t.value, 0
            else:
                since += 1
        return len(done) >= 2 + self.stall and since >= self.stall


class TwoPhaseSampler(GuidedSampler):
    """PolyThrottle-style: CPU knobs first (others at their defaults), then GPU, memory and batch jointly.

    Phase one measures a spread of CPU settings at the default device knobs
    and the middle batch size and keeps the cheapest feasible one (the
    fastest if none meets the bound). Phase two pins the CPU knobs there and
    lets the GP sampler search the remaining knobs and the batch size.
    """

    def __init__(self, seed: int | None = None, phase_one: int = 6) -> None:
        super().__init__(seed)
        self.phase_one = phase_one
        self.pinned: dict[str, Any] = {}

    def _cpu_knobs(self) -> list[str]:
        roles = knob_roles(self.space)
        return [
            k for k in (roles.get("cpu_mhz"), roles.get("cpu_cores")) if k is not None and k in self.space.tuned_knobs
        ]

    def _phase_one_configs(self) -> list[Config]:
        cpu = self._cpu_knobs()
        base = self.space.default_config(self.space.batch_sizes[len(self.space.batch_sizes) // 2])
        if not cpu:
            return []
        axes = [self.space.knobs[k].values for k in cpu]
        picks = np.linspace(0, 1, self.phase_one)
        configs = []
        for j, frac in enumerate(picks):
            knobs = dict(base.knobs)
            for a, (name, values) in enumerate(zip(cpu, axes, strict=True)):
                spread = frac if a == 0 else (picks[(j * 2 + 1) % len(picks)])
                knobs[name] = values[round(spread * (len(values) - 1))]
            configs.append(self.space.effective(Config(knobs=knobs, batch_size=base.batch_size)))
        return configs

    def propose(self, study: optuna.Study) -> Config | None:
        plan = self._phase_one_configs()
        done = measured_trials(study)
        if len(done) < len(plan):
            for config in plan:
                fresh = self._fresh(study, config)
                if fresh is not None:
                    return fresh
        if not self.pinned and plan:
            phase = done[: len(plan)]
            feasible = [t for t in phase if t.constraints and all(c <= 0 for c in t.constraints.values())]
            pick = (
                min(feasible, key=lambda t: t.value)
                if feasible
                else min(phase, key=lambda t: t.user_attrs[f"{self.percentile}_ms"])
            )
            params = self.space.params_for(trial_config(pick))
            self.pinned = {k: v for k, v in params.items() if k.removesuffix("_index") in self._cpu_knobs()}
        return None

    def adjust(self, params: dict[str, Any]) -> dict[str, Any]:
        return {**params, **self.pinned}
