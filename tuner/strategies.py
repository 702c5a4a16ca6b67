"""Search strategies beyond Optuna's stock samplers: ours (a model learned from the trials) and two-phase.

Both are Optuna samplers, so ``tune run`` drives them through the same study
loop as the stock ones. They are bound to the (narrowed) space and the run's
options by run_study before the first trial (``bind``): proposing a
configuration needs the space's grid and the latency bound, which a sampler
does not otherwise see. A proposal is returned for every parameter of the
trial; when a strategy has nothing to propose, an inner model-based sampler
does (GP where PyTorch is installed, multivariate TPE otherwise).

Every trial a strategy proposes carries user attributes ``proposed_by`` (which
model chose it) and ``why`` (in a line), so a run can be audited afterwards
(trials.csv, ``tune status``); study-level notes (``strategy_notes``) say what
the run could not use, e.g. a model without a per-layer profile.
"""

from __future__ import annotations

import importlib.util
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution

from runners.profile import ModelProfile
from tuner.indexed import IndexedSampler
from tuner.models import model_profile
from tuner.roofline import RooflineParams, features, fit_measurements, knob_roles
from tuner.space import Config, Grid, SearchSpace
from tuner.surrogate import GaussianProcess, encode_grid

_TABLES: dict[str, Table] = {}


def _normal_cdf(z: np.ndarray) -> np.ndarray:
    """Standard normal cdf, imported on first use: scipy.special is a fifth of a second of start-up.

    (scipy.stats, the usual home of ``norm``, costs about a second.)
    """
    from scipy.special import ndtr

    return ndtr(z)


def _normal_pdf(z: np.ndarray) -> np.ndarray:
    """Standard normal density, in numpy: nothing to import."""
    return np.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)


def has_torch() -> bool:
    """Optuna's GP sampler runs on PyTorch, which the core install leaves out."""
    return importlib.util.find_spec("torch") is not None


def model_sampler(seed: int | None, startup: int) -> IndexedSampler:
    """The model-based sampler that refines after a guided start: GP where it can run, TPE otherwise."""
    if has_torch():
        return IndexedSampler(
            optuna.samplers.GPSampler(seed=seed, n_startup_trials=startup, deterministic_objective=False)
        )
    return IndexedSampler(optuna.samplers.TPESampler(seed=seed, n_startup_trials=startup, multivariate=True))


def measured_trials(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """Completed trials that measured (not reuses of an earlier measurement, not repeats)."""
    return [
        t
        for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
        if "reused_from" not in t.user_attrs and "repeat_of" not in t.user_attrs and "qps" in t.user_attrs
    ]


def trial_config(t: optuna.trial.FrozenTrial) -> Config:
    return Config(knobs=t.user_attrs["effective"], batch_size=t.user_attrs["batch_size"])


def _draw(dist: CategoricalDistribution, rng: np.random.Generator) -> Any:
    return dist.choices[int(rng.integers(len(dist.choices)))]


class GuidedSampler(optuna.samplers.BaseSampler):
    """A sampler that proposes whole configurations when it can, and otherwise asks a model-based sampler."""

    def __init__(self, seed: int | None = None) -> None:
        self.seed = seed
        self.inner = model_sampler(seed, startup=10)
        self.space: SearchSpace | None = None
        self.device: Any = None
        self.reason: tuple[str, str] = ("", "")
        self.model = ""
        self.bound_ms = float("inf")
        self.percentile = "p99"

    def bind(self, space: SearchSpace, model: str, max_latency_ms: float, percentile: str, device: Any = None) -> None:
        self.device = device
        self.space = space
        self.model = model
        self.bound_ms = max_latency_ms
        self.percentile = percentile
        self.inner.bind(space)

    def propose(self, study: optuna.Study) -> Config | None:
        raise NotImplementedError

    def infer_relative_search_space(
        self, study: optuna.Study, trial: optuna.trial.FrozenTrial
    ) -> dict[str, BaseDistribution]:
        return self.space.distributions() if self.space is not None else {}

    def sample_relative(
        self, study: optuna.Study, trial: optuna.trial.FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        if self.space is None:
            return {}
        if "fixed_params" in trial.system_attrs:
            return {}
        self.reason = ("", "")
        config = self.propose(study)
        if config is not None:
            self._log(study, trial, *self.reason)
            return self.space.params_for(config)
        self._log(study, trial, type(self.inner).__name__, self.reason[1] or "the strategy had nothing to propose")
        inner_space = self.inner.infer_relative_search_space(study, trial)
        params = self.adjust(self.inner.sample_relative(study, trial, inner_space))
        return self._unmeasured(study, params) if len(params) == len(search_space) else params

    @staticmethod
    def _log(study: optuna.Study, trial: optuna.trial.FrozenTrial, proposed_by: str, why: str) -> None:
        """Store who proposed the trial and why in its user attributes (exported with trials.csv)."""
        study._storage.set_trial_user_attr(trial._trial_id, "proposed_by", proposed_by)
        study._storage.set_trial_user_attr(trial._trial_id, "why", why)

    def _unmeasured(self, study: optuna.Study, params: dict[str, Any]) -> dict[str, Any]:
        """Replace a proposal that repeats a measured configuration by a random unmeasured one.

        Pinning parameters behind the inner sampler's back makes it propose
        the same point again and again; a measured point teaches it nothing.
        """
        done = {t.user_attrs.get("effective_key") for t in study.get_trials(deepcopy=False)}
        rng = np.random.default_rng(len(done) if self.seed is None else self.seed + len(done))
        dists = self.space.distributions()
        candidate = params
        for _ in range(50):
            key = json.dumps(self.space.effective(self.space.config_of(candidate)).key())
            if key not in done:
                return candidate
            candidate = self.adjust({name: _draw(d, rng) for name, d in dists.items()})
        return params

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


@dataclass
class Table:
    """What the learned strategy needs of a space, built once: its grid and every configuration's encoding."""

    grid: Grid
    x: np.ndarray
    features: Any = None


def space_table(space: SearchSpace) -> Table:
    """The space's Grid and encoding (tuner.surrogate.encode_grid), cached per space; no Config per point."""
    key = space.model_dump_json()
    if key not in _TABLES:
        grid = Grid(space)
        _TABLES[key] = Table(grid, encode_grid(space, grid))
    return _TABLES[key]


class LearnedSampler(GuidedSampler):
    """Ours: a Gaussian-process model learned from the trials, with the roofline as a prior it can lose.

    Trials 1-2 are the baseline: the default configuration at the largest and
    the smallest batch size (what a user gets untuned, and the two ends of
    the strongest knob); trial 3 is the centre of the space (every ordered
    knob and the batch size at its middle value), so the models see the
    knobs move away from their defaults before they extrapolate from one
    corner (on the Orin Nano twin with a loose bound the search otherwise
    stayed at the largest batch and top GPU clock). From then on two models of log energy per query and
    log tail latency are fitted on every measured trial, both GPs over every
    tuned knob whatever its name plus the batch size: ``gp+roofline``, whose
    prior mean is a linear function of the batch size and of the fitted
    roofline's prediction (Pagoda's form, when the model has a per-layer
    profile), and ``gp``, whose prior mean uses the batch size alone. Before
    each refit both are scored on the trials measured since they last
    predicted (prospective error). The roofline is in misfit when its own
    prospective error exceeds three times the measurement noise; trust then
    goes to whichever GP predicted the new trials better, and ``gp`` is
    preferred unless the roofline-based one is clearly (20%) better.

    Proposals alternate between a global step (constrained expected
    improvement: expected improvement of log energy times the squared
    probability of meeting the bound with a margin of two noise standard
    deviations) and a local step (the same score over the unmeasured
    neighbours of the incumbent and of the next-best feasible configurations:
    one step either way in every ordered knob and in the batch size, any
    other value of an unordered one). The local step first takes a move of
    the incumbent along an ordered knob in a direction no trial near its
    batch size has tried (``_untested``), if the latency model does not rule it out: the
    models only extrapolate there, and a prior wrong about a direction is
    otherwise never corrected. Scoring the whole grid every trial
    would cost most of a quick start on a small machine, so each step scores
    a candidate set: a fresh random sample of the grid, every configuration
    in a box of a few steps around the incumbent, and its neighbours. Before
    the best is declared, the run re-measures the top candidates (tuner.remeasure,
    for every strategy, best first), so the export is judged on a mean.

    Why the margin and the square: a configuration whose true latency is
    within the noise of the bound is a poor proposal either way. Measured
    over the bound it teaches little; measured under it by luck it becomes
    an incumbent that is truly infeasible, which then anchors the search and
    fails the re-measurement. Both were seen in traces of tuning boards
    (gen:5, gen:9) under plain expected improvement x P(bound).
    """

    local_around = 3
    global_every = 2
    misfit_factor = 3.0
    recent = 5
    sample = 3000
    box_steps = 2
    box_sample = 1000
    pf_power = 2.0
    center = True
    pf_margin = 2.0
    probe = True
    probe_min_prob = 0.2
    probe_batches = 1

    def __init__(self, seed: int | None = None) -> None:
        super().__init__(seed)
        self.inner = model_sampler(seed, startup=4)
        self.profile: ModelProfile | None = None
        self.profile_note = ""
        self.roof_params: RooflineParams | None = None
        self.errors: dict[str, list[float]] = {"roofline": [], "gp+roofline": [], "gp": []}
        self.predictors: dict[str, Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]] = {}
        self.scored: set[int] = set()
        self.trust = "gp+roofline"
        self.steps = 0
        self.fits: dict[str, GaussianProcess] = {}
        self.rng = np.random.default_rng(seed)

    def bind(self, space: SearchSpace, model: str, max_latency_ms: float, percentile: str, device: Any = None) -> None:
        super().bind(space, model, max_latency_ms, percentile, device)
        self.profile, self.profile_note = model_profile(model, device)
        if self.profile is None:
            self.trust = "gp"
            self.profile_note += ": the roofline prior is off, the model learned from the trials proposes alone"

    def notes(self) -> list[str]:
        """What this run's strategy could and could not use (shown by tune run, stored with the study)."""
        return [f"ours: {self.profile_note}"]

    def propose(self, study: optuna.Study) -> Config | None:
        if self.steps == 0 and self.space is not None:
            self._note(study)
        done = [t for t in measured_trials(study) if f"{self.percentile}_ms" in t.user_attrs]
        if len(done) < 2:
            default = self.space.default_config()
            for label, batch in (("largest", self.space.batch_sizes[-1]), ("smallest", self.space.batch_sizes[0])):
                fresh = self._fresh(study, default.model_copy(update={"batch_size": batch}))
                if fresh is not None:
                    self.reason = ("baseline", f"default configuration at the {label} batch size ({batch})")
                    return fresh
        if self.center and len(done) < 3:
            fresh = self._fresh(study, self._center())
            if fresh is not None:
                self.reason = ("design", "centre of the space: ordered knobs and the batch size at their middle")
                return fresh
        table = space_table(self.space)
        positions = [table.grid.position(t.user_attrs.get("effective_key", "")) for t in done]
        pairs = [(r, t) for r, t in zip(positions, done, strict=True) if r is not None]
        if len(pairs) < 2:
            return None
        rows = np.array([r for r, _ in pairs])
        y_e = np.log([t.user_attrs["j_per_query"] for _, t in pairs])
        y_l = np.log([t.user_attrs[f"{self.percentile}_ms"] for _, t in pairs])
        self._score_prospective(rows, y_e, y_l)
        keys = {t.user_attrs.get("effective_key") for t in study.get_trials(deepcopy=False)}
        seen = {table.grid.position(k) for k in keys if k is not None}
        feasible = sorted(
            (t.user_attrs["j_per_query"], r) for r, t in pairs if t.user_attrs[f"{self.percentile}_ms"] <= self.bound_ms
        )
        cand, local_rows = self._candidates(table, seen - {None}, [r for _, r in feasible[: self.local_around]])
        if len(cand) == 0:
            self.reason = ("", "every configuration has been measured")
            return None
        roof = self._roofline(table, [t for _, t in pairs])
        models = self._fit_models(table, rows, y_e, y_l, roof)
        self.scored |= {int(r) for r in rows}
        why_model = self._choose_trust(roof is not None)
        mu_e, sd_e, mu_l, sd_l = models[self.trust](cand)
        return self._acquire(table, cand, local_rows, feasible, mu_e, sd_e, mu_l, sd_l, why_model)

    def _center(self) -> Config:
        """Every ordered tuned knob at its middle value, the others at their default, the middle batch size."""
        knobs = dict(self.space.default_config().knobs)
        for name in self.space.tuned_knobs:
            knob = self.space.knobs[name]
            if knob.ordered:
                knobs[name] = knob.values[(len(knob.values) - 1) // 2]
        batches = self.space.batch_sizes
        return Config(knobs=knobs, batch_size=batches[(len(batches) - 1) // 2])

    def _latency_margin(self) -> float:
        """``pf_margin`` standard deviations of the latency model's measurement noise (log units)."""
        fit = self.fits.get(f"{self.trust}:l")
        return self.pf_margin * (fit.noise if fit is not None else 0.0)

    def _candidates(self, table: Table, seen: set[int], around: list[int]) -> tuple[np.ndarray, set[int]]:
        """Unmeasured rows to score: a random sample of the grid, a box around the incumbent, its neighbours."""
        n = len(table.grid)
        if n <= self.sample + self.box_sample:
            pool = np.arange(n)
        else:
            pool = self.rng.choice(n, size=self.sample, replace=False)
        parts = [pool]
        if around:
            steps = self._steps()
            inside = np.all(np.abs(table.x - table.x[around[0]]) <= steps * self.box_steps + 1e-9, axis=1)
            box = np.flatnonzero(inside)
            if len(box) > self.box_sample:
                box = self.rng.choice(box, size=self.box_sample, replace=False)
            parts.append(box)
        local = set(self._neighbours(table, around)) - seen
        parts.append(np.array(sorted(local), dtype=int))
        cand = np.unique(np.concatenate(parts).astype(int))
        if seen:
            cand = cand[~np.isin(cand, np.fromiter(seen, dtype=int))]
        return cand, local

    def _steps(self) -> np.ndarray:
        """Width of one step of each encoded column (one-hot columns: any value is one step)."""
        widths: list[float] = []
        for name in self.space.tuned_knobs:
            knob = self.space.knobs[name]
            if knob.ordered:
                widths.append(1.0 / max(len(knob.values) - 1, 1))
            else:
                widths += [1.0] * len(knob.values)
        if len(self.space.batch_sizes) > 1:
            widths.append(1.0 / (len(self.space.batch_sizes) - 1))
        return np.array(widths)

    def _fit_models(
        self, table: Table, rows: np.ndarray, y_e: np.ndarray, y_l: np.ndarray, roof: Any
    ) -> dict[str, Callable[[np.ndarray], tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]]:
        """Both GPs (with and without the roofline in the prior mean), as predictors over grid rows."""
        batch_col = len(self.space.batch_sizes) > 1

        def linear(at: np.ndarray) -> np.ndarray:
            batch = table.x[at, -1:] if batch_col else np.zeros((len(at), 1))
            return np.hstack([np.ones((len(at), 1)), batch])

        bases: dict[str, tuple[Callable, Callable]] = {"gp": (linear, linear)}
        if roof is not None:
            bases["gp+roofline"] = (
                lambda at: np.hstack([linear(at), roof(at)[0][:, None]]),
                lambda at: np.hstack([linear(at), roof(at)[1][:, None]]),
            )
        optimize = len(rows) <= 8 or len(rows) % 3 == 0
        out = {}
        for name, (basis_e, basis_l) in bases.items():
            gp_e = GaussianProcess.fit(table.x[rows], y_e, basis_e(rows), self.fits.get(f"{name}:e"), optimize)
            gp_l = GaussianProcess.fit(table.x[rows], y_l, basis_l(rows), self.fits.get(f"{name}:l"), optimize)
            self.fits[f"{name}:e"], self.fits[f"{name}:l"] = gp_e, gp_l

            def predict(at: np.ndarray, gp_e=gp_e, gp_l=gp_l, basis_e=basis_e, basis_l=basis_l) -> tuple:
                mu_e, sd_e = gp_e.predict(table.x[at], basis_e(at))
                mu_l, sd_l = gp_l.predict(table.x[at], basis_l(at))
                return mu_e, sd_e, mu_l, sd_l

            out[name] = predict
            self.predictors[name] = lambda at, p=predict: (lambda m: (m[0], m[2]))(p(at))
        if roof is not None:
            self.predictors["roofline"] = roof
        return out

    def _note(self, study: optuna.Study) -> None:
        notes = list(study.user_attrs.get("strategy_notes", []))
        for note in self.notes():
            if note not in notes:
                notes.append(note)
        study.set_user_attr("strategy_notes", notes)

    def _roofline(self, table: Table, trials: list[optuna.trial.FrozenTrial]) -> Callable | None:
        """The roofline refitted on the trials, as log energy and log latency of grid rows (None without profile)."""
        if self.profile is None:
            return None
        warm = self.roof_params if len(trials) % 5 else None
        fitted = fit_measurements(
            self.profile,
            self.space,
            [trial_config(t) for t in trials],
            [t.user_attrs for t in trials],
            self.percentile,
            warm,
        )
        self.roof_params = fitted.params
        if table.features is None:
            table.features = features(self.space, table.grid)

        memo: dict[bytes, tuple[np.ndarray, np.ndarray]] = {}

        def predict(at: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            key = at.tobytes()
            if key not in memo:
                _, energy, latency = fitted.predict(table.features.take(at))
                memo[key] = (np.log(np.maximum(energy, 1e-30)), np.log(np.maximum(latency, 1e-9)))
            return memo[key]

        return predict

    def _score_prospective(self, rows: np.ndarray, y_e: np.ndarray, y_l: np.ndarray) -> None:
        """Error of each model's last predictions on trials measured since (what it did not see)."""
        new = [i for i, r in enumerate(rows) if int(r) not in self.scored]
        if not new or not self.predictors:
            return
        at = rows[new]
        for name, predict in self.predictors.items():
            pred_e, pred_l = predict(at)
            err = 0.5 * (np.abs(pred_e - y_e[new]) + np.abs(pred_l - y_l[new]))
            self.errors.setdefault(name, []).extend(float(e) for e in err)

    def _noise(self) -> float:
        fit = self.fits.get("gp:e")
        return max(fit.noise if fit is not None else 0.015, 0.01)

    def _choose_trust(self, have_roofline: bool) -> str:
        """Which model proposes: the roofline-based GP until its prior is in misfit and the data say so."""
        if not have_roofline:
            self.trust = "gp"
            return f"gp: {self.profile_note or 'no roofline'}"
        recent = {k: v[-self.recent :] for k, v in self.errors.items()}
        if len(recent.get("roofline", [])) < 2 or len(recent.get("gp", [])) < 2:
            self.trust = "gp+roofline"
            return "gp+roofline: too few trials to judge the roofline yet"
        noise = self._noise()
        roof_err = float(np.median(recent["roofline"]))
        with_roof = float(np.mean(recent["gp+roofline"]))
        plain = float(np.mean(recent["gp"]))
        misfit = roof_err > self.misfit_factor * noise
        if misfit and with_roof > 0.8 * plain:
            self.trust = "gp"
            return (
                f"gp: roofline misfit (its error on new trials {roof_err:.1%} > {self.misfit_factor:g} x noise "
                f"{noise:.1%}); data-driven error {plain:.1%} vs {with_roof:.1%} with the roofline"
            )
        self.trust = "gp+roofline" if with_roof <= plain or not misfit else "gp"
        state = "misfit" if misfit else "fits"
        return (
            f"{self.trust}: roofline {state} (error on new trials {roof_err:.1%}, noise {noise:.1%}); "
            f"errors with/without it {with_roof:.1%}/{plain:.1%}"
        )

    def _acquire(
        self,
        table: Table,
        cand: np.ndarray,
        local: set[int],
        feasible: list[tuple[float, int]],
        mu_e: np.ndarray,
        sd_e: np.ndarray,
        mu_l: np.ndarray,
        sd_l: np.ndarray,
        why_model: str,
    ) -> Config:
        """Constrained expected improvement over the candidates, alternating global and local steps."""
        feasible_prob = _normal_cdf((math.log(self.bound_ms) - self._latency_margin() - mu_l) / sd_l)
        if feasible:
            best = math.log(feasible[0][0])
            z = (best - mu_e) / sd_e
            score = sd_e * (z * _normal_cdf(z) + _normal_pdf(z)) * feasible_prob**self.pf_power
            what = "expected improvement x P(meets bound)"
        else:
            score = np.where(feasible_prob >= 0.5, 1.0 + np.exp(-(mu_e - mu_e.min())), feasible_prob)
            what = "no feasible trial yet: most likely to meet the bound, then lowest predicted energy"
        self.steps += 1
        is_local = np.isin(cand, np.fromiter(local, dtype=int)) if local else np.zeros(len(cand), dtype=bool)
        if self.steps % self.global_every != 1 and is_local.any():
            priority = np.where(
                feasible_prob >= self.probe_min_prob, self._untested(table, cand, is_local, feasible[0][1]), -np.inf
            )
            probe = np.isfinite(priority)
            if probe.any():
                pick = int(np.lexsort((score, priority))[-1])
            else:
                pick = int(np.argmax(np.where(is_local, score, -np.inf)))
            incumbent = table.grid[feasible[0][1]].label()
            kind = "untried direction of a knob from" if probe.any() else "neighbour of"
            self.reason = (
                f"local({self.trust})",
                f"{kind} the best feasible ({incumbent}): {what} {score[pick]:.3g}; {why_model}",
            )
            return table.grid[int(cand[pick])]
        pick = int(np.argmax(score))
        label = "local" if is_local[pick] else "global"
        self.reason = (
            f"{label}({self.trust})" if label == "local" else self.trust,
            f"{label} best of {len(cand)} unmeasured candidates: {what} {score[pick]:.3g}, predicted "
            f"{math.exp(mu_e[pick]):.4g} J/query, P(bound) {feasible_prob[pick]:.2f}; {why_model}",
        )
        return table.grid[int(cand[pick])]

    def _untested(self, table: Table, cand: np.ndarray, is_local: np.ndarray, incumbent: int) -> np.ndarray:
        """Local candidates that move the incumbent along one ordered knob in a direction no measured trial went.

        Untried means: no measured trial at the incumbent's batch size or
        within ``probe_batches`` batch steps of it has that knob on that
        side of the incumbent's value. There the models only extrapolate,
        and a prior that is wrong about the direction (the roofline charged
        a higher memory clock more energy than it saved on the H200 twin) is
        never corrected unless one trial goes and looks. Unordered knobs
        (precision, a power mode) have no direction and are not probed:
        probing their other values too cost three trials in median on the
        measured H200 board (benchmarks/results/search.md). Counting the neighbouring
        batch sizes too keeps a move of the incumbent to the next batch size
        from opening every direction again (at its own batch size alone, a
        12-trial run on the Orin Nano twin spent its last trials on that).
        Returned as a priority (-inf: not such a move): minus the number of
        distinct values of the moved knob measured at those batch sizes, so
        the least explored knob is looked at first.
        """
        out = np.full(len(cand), -np.inf)
        if not self.probe or not self.scored:
            return out
        x = table.x
        here = x[incumbent]
        measured = x[np.fromiter(self.scored, dtype=int)]
        groups = self._groups()
        if len(self.space.batch_sizes) > 1:
            reach = self.probe_batches / (len(self.space.batch_sizes) - 1) + 1e-9
            measured = measured[np.abs(measured[:, -1] - here[-1]) <= reach]
            groups = groups[:-1]
        for i in np.flatnonzero(is_local):
            diff = x[cand[i]] - here
            moved = [g for g in groups if np.any(np.abs(diff[g]) > 1e-9)]
            if len(moved) != 1 or len(moved[0]) != 1:
                continue
            j = moved[0][0]
            if not np.any((measured[:, j] - here[j]) * np.sign(diff[j]) > 1e-9):
                out[i] = -len(np.unique(measured[:, j]))
        return out

    def _groups(self) -> list[list[int]]:
        """Encoded columns of each tuned knob (one for an ordered knob, one-hot for others), then the batch size."""
        groups: list[list[int]] = []
        col = 0
        for name in self.space.tuned_knobs:
            knob = self.space.knobs[name]
            width = 1 if knob.ordered else len(knob.values)
            groups.append(list(range(col, col + width)))
            col += width
        if len(self.space.batch_sizes) > 1:
            groups.append([col])
        return groups

    def _neighbours(self, table: Table, rows: list[int]) -> list[int]:
        """Grid rows one step away from the given ones in every ordered knob and the batch size."""
        out: list[int] = []
        batches = self.space.batch_sizes
        for row in rows:
            base = table.grid[row]
            moves: list[Config] = []
            for name in self.space.tuned_knobs:
                knob = self.space.knobs[name]
                values = knob.values
                at = next((i for i, v in enumerate(values) if str(v) == str(base.knobs[name])), 0)
                steps = (at - 1, at + 1) if knob.ordered else range(len(values))
                for j in steps:
                    if 0 <= j < len(values) and j != at:
                        moves.append(Config(knobs={**base.knobs, name: values[j]}, batch_size=base.batch_size))
            at_b = batches.index(base.batch_size) if base.batch_size in batches else 0
            for j in (at_b - 1, at_b + 1):
                if 0 <= j < len(batches):
                    moves.append(base.model_copy(update={"batch_size": batches[j]}))
            for move in moves:
                i = table.grid.position(json.dumps(self.space.effective(move).key()))
                if i is not None and i not in out:
                    out.append(i)
        return out


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
                    self.reason = ("two-phase:cpu", "phase one: a spread of CPU settings at the default device knobs")
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
            self.pinned = {k: v for k, v in params.items() if k in self._cpu_knobs()}
        self.reason = ("", "phase two: the inner sampler searches the device knobs, CPU knobs pinned")
        return None

    def adjust(self, params: dict[str, Any]) -> dict[str, Any]:
        return {**params, **self.pinned}


def proposal_counts(study: optuna.Study) -> dict[str, int]:
    """How many trials each model proposed in this study (from the trials' ``proposed_by``)."""
    counts: dict[str, int] = {}
    for t in study.get_trials(deepcopy=False):
        who = t.user_attrs.get("proposed_by")
        if who is not None:
            counts[who] = counts.get(who, 0) + 1
    return counts
