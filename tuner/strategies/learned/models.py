"""The learned strategy's models: the roofline refitted on the trials and two GP pairs, and which one to trust.

``gp+roofline`` has a prior mean linear in the batch size and the fitted
roofline, ``gp`` in the batch size alone; each GP pair models log energy
and log tail latency. Every model is scored on the trials it had not seen,
and trust moves to ``gp`` when the roofline is in misfit.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import optuna

from runners.profile import ModelProfile
from tuner.roofline import RooflineParams, features, fit_measurements
from tuner.space import SearchSpace
from tuner.strategies.base import trial_config
from tuner.strategies.learned.table import Table
from tuner.surrogate import GaussianProcess

Predictor = Callable[..., tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]
"""Grid rows -> mean and spread of log energy, mean and spread of log latency (``latent=True``: no window noise)."""


class Models:
    """The fits of one study, kept between proposals (warm starts, prospective errors, the trusted model).

    The roofline is in misfit when its error on new trials exceeds
    ``misfit_factor`` x the noise over the last ``recent`` trials.
    """

    def __init__(
        self, space: SearchSpace, percentile: str, profile: ModelProfile | None, misfit_factor: float, recent: int
    ) -> None:
        self.space = space
        self.percentile = percentile
        self.profile = profile
        self.misfit_factor = misfit_factor
        self.recent = recent
        self.roof_params: RooflineParams | None = None
        self.errors: dict[str, list[float]] = {"roofline": [], "gp+roofline": [], "gp": []}
        self.predictors: dict[str, Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]] = {}
        self.scored: set[int] = set()
        self.trust = "gp+roofline" if profile is not None else "gp"
        self.fits: dict[str, GaussianProcess] = {}

    def fit(self, table: Table, rows: np.ndarray, y_e: np.ndarray, y_l: np.ndarray, roof: Any) -> dict[str, Predictor]:
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

            def predict(
                at: np.ndarray, latent: bool = False, gp_e=gp_e, gp_l=gp_l, basis_e=basis_e, basis_l=basis_l
            ) -> tuple:
                mu_e, sd_e = gp_e.predict(table.x[at], basis_e(at), latent=latent)
                mu_l, sd_l = gp_l.predict(table.x[at], basis_l(at), latent=latent)
                return mu_e, sd_e, mu_l, sd_l

            out[name] = predict
            self.predictors[name] = lambda at, p=predict: (lambda m: (m[0], m[2]))(p(at))
        if roof is not None:
            self.predictors["roofline"] = roof
        return out

    def roofline(self, table: Table, trials: list[optuna.trial.FrozenTrial]) -> Callable | None:
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

    def score_prospective(self, rows: np.ndarray, y_e: np.ndarray, y_l: np.ndarray) -> None:
        """Error of each model's last predictions on trials measured since (what it did not see)."""
        new = [i for i, r in enumerate(rows) if int(r) not in self.scored]
        if not new or not self.predictors:
            return
        at = rows[new]
        for name, predict in self.predictors.items():
            pred_e, pred_l = predict(at)
            err = 0.5 * (np.abs(pred_e - y_e[new]) + np.abs(pred_l - y_l[new]))
            self.errors.setdefault(name, []).extend(float(e) for e in err)

    def noise(self) -> float:
        """The energy noise the data-driven GP fitted (relative; at least 1%)."""
        fit = self.fits.get("gp:e")
        return max(fit.noise if fit is not None else 0.015, 0.01)

    def latency_noise(self) -> float:
        """The trusted latency model's measurement noise (log units; 0 before its first fit)."""
        fit = self.fits.get(f"{self.trust}:l")
        return fit.noise if fit is not None else 0.0

    def choose_trust(self, have_roofline: bool, profile_note: str) -> str:
        """Which model proposes: the roofline-based GP until its prior is in misfit and the data say so."""
        if not have_roofline:
            self.trust = "gp"
            return f"gp: {profile_note or 'no roofline'}"
        recent = {k: v[-self.recent :] for k, v in self.errors.items()}
        if len(recent.get("roofline", [])) < 2 or len(recent.get("gp", [])) < 2:
            self.trust = "gp+roofline"
            return "gp+roofline: too few trials to judge the roofline yet"
        noise = self.noise()
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
