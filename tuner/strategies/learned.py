"""The learned strategy: Gaussian processes of energy and latency fitted on the trials, the roofline as their prior.

The default sampler of ``tune run``; docs/search.md describes its steps and
what they were measured against.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import optuna

from runners.profile import ModelProfile
from tuner.models import model_profile
from tuner.records import recommended_of
from tuner.roofline import RooflineParams, features, fit_measurements
from tuner.space import Config, Grid, SearchSpace
from tuner.strategies.base import WARM_START, GuidedSampler, measured_of, model_sampler, trial_config
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


@dataclass
class Table:
    """What the learned strategy needs of a space, built once: its grid, every configuration's encoding and mode.

    ``modes`` holds each configuration's power mode as an index into
    ``mode_names`` (None in a space without a mode knob). ``rows`` and
    ``around`` remember each effective key's grid row and each row's
    neighbours once looked up: every proposal asks again for the same ones.
    """

    grid: Grid
    x: np.ndarray
    modes: np.ndarray | None = None
    mode_names: list[str] | None = None
    features: Any = None
    rows: dict[str, int | None] = field(default_factory=dict)
    around: dict[int, list[int]] = field(default_factory=dict)

    def row(self, key: str | None) -> int | None:
        """The grid row of an effective key (None if it is not in the grid)."""
        if key is None:
            return None
        if key not in self.rows:
            self.rows[key] = self.grid.position(key)
        return self.rows[key]


def space_table(space: SearchSpace) -> Table:
    """The space's Grid and encoding (tuner.surrogate.encode_grid), cached per space; no Config per point."""
    key = space.model_dump_json()
    if key not in _TABLES:
        grid = Grid(space)
        table = Table(grid, encode_grid(space, grid))
        if space.mode_knob is not None:
            names = [str(v) for v in space.knobs[space.mode_knob].values]
            table.mode_names = names
            table.modes = grid.column(space.mode_knob, lambda v: names.index(str(v))).astype(int)
        _TABLES[key] = table
    return _TABLES[key]


class LearnedSampler(GuidedSampler):
    """GPs of log energy and log latency learned from the trials, with the roofline as a prior it can lose.

    Trials 1-2 measure the default configuration at the largest and smallest
    batch size, trial 3 the centre of the space. From then on two GP pairs
    are fitted on every measured trial, ``gp+roofline`` (prior mean linear in
    the batch size and the fitted roofline) and ``gp`` (batch size alone);
    each is scored on trials it had not seen, and trust moves to ``gp`` when
    the roofline is in misfit. Proposals alternate a global step (expected
    improvement times P(meets the bound with a noise margin)^pf_power) and a
    local step around the best feasible configurations that first probes a
    knob direction no trial has tried.

    Parameters: ``local_around`` best feasible configurations whose
    neighbours a local step scores; every ``global_every``-th step is global;
    the roofline is in misfit when its error exceeds ``misfit_factor`` x the
    noise over the last ``recent`` trials; each step scores ``sample`` random
    configurations plus up to ``box_sample`` within ``box_steps`` steps of the
    incumbent; ``pf_power`` and ``pf_margin`` (noise standard deviations)
    shape the feasibility term; ``center`` measures the centre as trial 3;
    ``probe`` enables direction probes, skipped below ``probe_min_prob``
    P(bound), judged over ``probe_batches`` neighbouring batch sizes.
    ``switch_tie``: a candidate in the board's current power mode is taken
    over a better-scoring one in another mode when it scores within this
    fraction of it (a mode switch costs seconds on a Jetson; 0 never
    prefers); a mode whose switch asked for a reboot is not proposed again.
    Each proposal also bounds what an unmeasured configuration could still
    save (``headroom``: energy ``stop_z`` standard deviations below the mean
    of the trusted model, among configurations at least ``stop_feasible`` likely to
    meet the bound; the whole grid is scored once the sample leaves under
    ``full_check``), which tells the study when it is done.
    """

    def __init__(
        self,
        seed: int | None = None,
        *,
        local_around: int = 3,
        global_every: int = 2,
        misfit_factor: float = 3.0,
        recent: int = 5,
        sample: int = 3000,
        box_steps: int = 2,
        box_sample: int = 1000,
        pf_power: float = 2.0,
        center: bool = True,
        pf_margin: float = 2.0,
        probe: bool = True,
        probe_min_prob: float = 0.2,
        probe_batches: int = 1,
        switch_tie: float = 0.1,
        stop_z: float = 3.0,
        stop_feasible: float = 0.05,
        full_check: float = 0.05,
    ) -> None:
        super().__init__(seed)
        self.local_around = local_around
        self.global_every = global_every
        self.misfit_factor = misfit_factor
        self.recent = recent
        self.sample = sample
        self.box_steps = box_steps
        self.box_sample = box_sample
        self.pf_power = pf_power
        self.center = center
        self.pf_margin = pf_margin
        self.probe = probe
        self.probe_min_prob = probe_min_prob
        self.probe_batches = probe_batches
        self.switch_tie = switch_tie
        self.stop_z = stop_z
        self.stop_feasible = stop_feasible
        self.full_check = full_check
        self.mode_now: int | None = None
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
        self.box: tuple[int, np.ndarray] | None = None
        self.rng = np.random.default_rng(seed)

    def bind(self, space: SearchSpace, model: str, max_latency_ms: float, percentile: str, device: Any = None) -> None:
        super().bind(space, model, max_latency_ms, percentile, device)
        self.profile, self.profile_note = model_profile(model, device)
        if self.profile is None:
            self.trust = "gp"
            self.profile_note += ": the roofline prior is off, the model learned from the trials proposes alone"

    def notes(self) -> list[str]:
        """What this run's strategy could and could not use (shown by tune run, stored with the study)."""
        return [f"learned: {self.profile_note}"]

    def propose(self, study: optuna.Study) -> Config | None:
        if self.steps == 0 and self.space is not None:
            self._note(study)
        trials = study.get_trials(deepcopy=False)
        done = [t for t in measured_of(trials) if f"{self.percentile}_ms" in t.user_attrs]
        keys = {t.user_attrs.get("effective_key") for t in trials}
        designed = len([t for t in done if t.user_attrs.get("proposed_by") != WARM_START])
        if designed < 2:
            default = self.space.default_config()
            for label, batch in (("largest", self.space.batch_sizes[-1]), ("smallest", self.space.batch_sizes[0])):
                fresh = self._fresh(study, default.model_copy(update={"batch_size": batch}), keys)
                if fresh is not None:
                    self.reason = ("baseline", f"default configuration at the {label} batch size ({batch})")
                    return fresh
        if self.center and designed < 3:
            fresh = self._fresh(study, self._center(), keys)
            if fresh is not None:
                self.reason = ("design", "centre of the space: ordered knobs and the batch size at their middle")
                return fresh
        table = space_table(self.space)
        positions = [table.row(t.user_attrs.get("effective_key", "")) for t in done]
        pairs = [(r, t) for r, t in zip(positions, done, strict=True) if r is not None]
        if len(pairs) < 2:
            return None
        rows = np.array([r for r, _ in pairs])
        y_e = np.log([t.user_attrs["j_per_query"] for _, t in pairs])
        y_l = np.log([t.user_attrs[f"{self.percentile}_ms"] for _, t in pairs])
        self._score_prospective(rows, y_e, y_l)
        seen = {table.row(k) for k in keys if k is not None}
        seen |= self._refused_rows(table, trials)
        self.mode_now = self._mode_of(table, done[-1]) if done else None
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
        best = recommended_of([t for t in trials if t.state == optuna.trial.TrialState.COMPLETE])
        if best is not None and best.value is not None and float(best.value) > 0:
            trusted = {self.trust: models[self.trust]}
            self.headroom = self._headroom(table, cand, seen - {None}, trusted, float(best.value))
        return self._acquire(table, cand, local_rows, feasible, mu_e, sd_e, mu_l, sd_l, why_model)

    def _headroom(
        self, table: Table, cand: np.ndarray, seen: set[int], models: dict[str, Callable], best_j: float
    ) -> tuple[float, int]:
        """The most any unmeasured configuration could save against ``best_j``, and how many could save anything.

        Optimistic by the models given (the one that proposes): energy
        ``stop_z`` standard deviations below its mean, among the configurations at least ``stop_feasible``
        likely to meet the bound (without the proposal's margin). Scored on
        the proposal's candidates; when they are a sample of a larger grid
        and leave under ``full_check`` headroom, on every unmeasured
        configuration (tuner.strategies.stopping reads the result).
        """
        gain, could = self._gain(cand, models, best_j)
        unmeasured = len(table.grid) - len(seen)
        if gain < self.full_check and len(cand) < unmeasured:
            rest = np.setdiff1d(np.arange(len(table.grid)), np.fromiter(seen, dtype=int), assume_unique=False)
            gain, could = 0.0, 0
            for start in range(0, len(rest), 8192):
                g, c = self._gain(rest[start : start + 8192], models, best_j)
                gain, could = max(gain, g), could + c
        return gain, could

    def _gain(self, rows: np.ndarray, models: dict[str, Callable], best_j: float) -> tuple[float, int]:
        """:meth:`_headroom` over ``rows``: the largest optimistic relative saving, and the rows with any."""
        if len(rows) == 0:
            return 0.0, 0
        best = math.log(best_j)
        gain = 0.0
        any_gain = np.zeros(len(rows), dtype=bool)
        for predict in models.values():
            mu_e, sd_e, mu_l, sd_l = predict(rows)
            plausible = _normal_cdf((math.log(self.bound_ms) - mu_l) / sd_l) >= self.stop_feasible
            saving = best - (mu_e - self.stop_z * sd_e)
            wins = plausible & (saving > 0)
            any_gain |= wins
            if wins.any():
                gain = max(gain, math.expm1(float(saving[wins].max())))
        return gain, int(any_gain.sum())

    def _mode_of(self, table: Table, trial: optuna.trial.FrozenTrial) -> int | None:
        """The power mode (index into table.mode_names) a trial ran in: the board's mode after it."""
        if table.mode_names is None or self.space.mode_knob is None:
            return None
        value = str(trial.user_attrs.get("effective", {}).get(self.space.mode_knob))
        return table.mode_names.index(value) if value in table.mode_names else None

    def _refused_rows(self, table: Table, trials: list[optuna.trial.FrozenTrial]) -> set[int]:
        """Every configuration in a mode whose switch asked for a reboot in this study: none is proposed."""
        refused = {t.user_attrs["needs_reboot"] for t in trials if t.user_attrs.get("needs_reboot")}
        if not refused or table.modes is None or table.mode_names is None:
            return set()
        index = [i for i, name in enumerate(table.mode_names) if name in refused]
        return {int(r) for r in np.flatnonzero(np.isin(table.modes, index))}

    def _stay(self, table: Table, cand: np.ndarray, score: np.ndarray, allowed: np.ndarray, pick: int) -> int:
        """``pick``, or the best allowed candidate in the current mode if it scores within ``switch_tie`` of it."""
        if self.switch_tie <= 0 or self.mode_now is None or table.modes is None:
            return pick
        modes = table.modes[cand]
        if modes[pick] == self.mode_now:
            return pick
        same = allowed & (modes == self.mode_now) & (score >= (1 - self.switch_tie) * score[pick])
        return int(np.argmax(np.where(same, score, -np.inf))) if same.any() else pick

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
            box = self._box(table, around[0])
            if len(box) > self.box_sample:
                box = self.rng.choice(box, size=self.box_sample, replace=False)
            parts.append(box)
        local = set(self._neighbours(table, around)) - seen
        parts.append(np.array(sorted(local), dtype=int))
        cand = np.unique(np.concatenate(parts).astype(int))
        if seen:
            cand = cand[~np.isin(cand, np.fromiter(seen, dtype=int))]
        return cand, local

    def _box(self, table: Table, row: int) -> np.ndarray:
        """Grid rows within ``box_steps`` steps of ``row`` in every encoded column, kept while the incumbent stays."""
        if self.box is None or self.box[0] != row:
            steps = self._steps()
            inside = np.all(np.abs(table.x - table.x[row]) <= steps * self.box_steps + 1e-9, axis=1)
            self.box = (row, np.flatnonzero(inside))
        return self.box[1]

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
                pick = self._stay(table, cand, score, is_local, int(np.argmax(np.where(is_local, score, -np.inf))))
            incumbent = table.grid[feasible[0][1]].label()
            kind = "untried direction of a knob from" if probe.any() else "neighbour of"
            self.reason = (
                f"local({self.trust})",
                f"{kind} the best feasible ({incumbent}): {what} {score[pick]:.3g}; {why_model}",
            )
            return table.grid[int(cand[pick])]
        pick = self._stay(table, cand, score, np.ones(len(cand), dtype=bool), int(np.argmax(score)))
        label = "local" if is_local[pick] else "global"
        self.reason = (
            f"{label}({self.trust})" if label == "local" else self.trust,
            f"{label} best of {len(cand)} unmeasured candidates: {what} {score[pick]:.3g}, predicted "
            f"{math.exp(mu_e[pick]):.4g} J/query, P(bound) {feasible_prob[pick]:.2f}; {why_model}",
        )
        return table.grid[int(cand[pick])]

    def _untested(self, table: Table, cand: np.ndarray, is_local: np.ndarray, incumbent: int) -> np.ndarray:
        """Local candidates that move the incumbent along one ordered knob in a direction no measured trial went.

        Untried: no measured trial within ``probe_batches`` batch steps of the
        incumbent has that knob on that side of its value. The models only
        extrapolate there, and a prior wrong about the direction is never
        corrected unless one trial looks. Unordered knobs have no direction and
        are not probed. Returned as a priority (-inf: not such a move): minus
        the number of distinct values of the moved knob measured nearby, so the
        least explored knob comes first.
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
        for row in rows:
            if row not in table.around:
                table.around[row] = self._neighbours_of(table, row)
            out += [i for i in table.around[row] if i not in out]
        return out

    def _neighbours_of(self, table: Table, row: int) -> list[int]:
        """:meth:`_neighbours` of one row, in the order of the knobs and then the batch size."""
        out: list[int] = []
        batches = self.space.batch_sizes
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
            i = table.row(json.dumps(self.space.effective(move).key()))
            if i is not None and i not in out:
                out.append(i)
        return out
