"""What an unmeasured configuration could still save: the bound that tells a study it is done.

tuner.strategies.stopping reads it from each proposal's trial
(``headroom``, ``could_win``); it never changes a proposal.
"""

from __future__ import annotations

import math

import numpy as np

from tuner.strategies.learned.acquisition import normal_cdf
from tuner.strategies.learned.models import Predictor
from tuner.strategies.learned.table import Table


class Headroom:
    """The optimistic saving of the best unmeasured configuration against the best feasible trial.

    Optimistic by the models given (the one that proposes): energy
    ``stop_z`` standard deviations below its mean, among the configurations
    at least ``stop_feasible`` likely to meet the bound (without the
    proposal's margin). Scored on the proposal's candidates; when they are a
    sample of a larger grid and leave under ``full_check`` headroom, on every
    unmeasured configuration. ``latent``: the spreads are those of the
    configuration's true energy and latency, without a window's noise (what
    the configuration could save, not what one window of it could read).
    ``every_model``: optimistic by every model fitted, not only the trusted
    one (where the models disagree, the bound stays open).
    """

    def __init__(
        self, stop_z: float, stop_feasible: float, full_check: float, latent: bool = False, every_model: bool = False
    ) -> None:
        self.stop_z = stop_z
        self.stop_feasible = stop_feasible
        self.full_check = full_check
        self.latent = latent
        self.every_model = every_model
        self.winners: list[int] = []

    def bound(
        self,
        table: Table,
        cand: np.ndarray,
        seen: set[int],
        fitted: dict[str, Predictor],
        trust: str,
        best_j: float,
        bound_ms: float,
    ) -> tuple[float, int]:
        """The most any unmeasured configuration could save against ``best_j``, and how many could save anything.

        ``fitted``: every model of this proposal, ``trust`` the one that
        proposes. ``winners`` then holds the rows that could, the largest saving first.
        """
        models = fitted if self.every_model else {trust: fitted[trust]}
        found: list[tuple[float, int]] = []
        gain, could = self.gain(cand, models, best_j, bound_ms, found)
        unmeasured = len(table.grid) - len(seen)
        if gain < self.full_check and len(cand) < unmeasured:
            rest = np.setdiff1d(np.arange(len(table.grid)), np.fromiter(seen, dtype=int), assume_unique=False)
            gain, could, found = 0.0, 0, []
            for start in range(0, len(rest), 8192):
                g, c = self.gain(rest[start : start + 8192], models, best_j, bound_ms, found)
                gain, could = max(gain, g), could + c
        best: dict[int, float] = {}
        for saving, row in found:
            best[row] = max(saving, best.get(row, saving))
        self.winners = sorted(best, key=lambda r: (-best[r], r))
        return gain, could

    def plausible(self, rows: list[int], predict: Predictor, bound_ms: float) -> list[int]:
        """The rows at least ``stop_feasible`` likely to meet the bound by ``predict``, in their order."""
        if not rows:
            return []
        _, _, mu_l, sd_l = predict(np.array(rows, dtype=int), latent=self.latent)
        return [r for r, ok in zip(rows, self._plausible(mu_l, sd_l, bound_ms), strict=True) if ok]

    def _plausible(self, mu_l: np.ndarray, sd_l: np.ndarray, bound_ms: float) -> np.ndarray:
        """Which predicted log latencies are at least ``stop_feasible`` likely to meet the bound (no margin)."""
        return normal_cdf((math.log(bound_ms) - mu_l) / sd_l) >= self.stop_feasible

    def gain(
        self,
        rows: np.ndarray,
        models: dict[str, Predictor],
        best_j: float,
        bound_ms: float,
        found: list[tuple[float, int]] | None = None,
    ) -> tuple[float, int]:
        """:meth:`bound` over ``rows``: the largest optimistic relative saving, and the rows with any.

        ``found`` collects (saving, row) of every row that could save anything.
        """
        if len(rows) == 0:
            return 0.0, 0
        best = math.log(best_j)
        gain = 0.0
        any_gain = np.zeros(len(rows), dtype=bool)
        for predict in models.values():
            mu_e, sd_e, mu_l, sd_l = predict(rows, latent=self.latent)
            plausible = self._plausible(mu_l, sd_l, bound_ms)
            saving = best - (mu_e - self.stop_z * sd_e)
            wins = plausible & (saving > 0)
            any_gain |= wins
            if wins.any():
                gain = max(gain, math.expm1(float(saving[wins].max())))
                if found is not None:
                    found += [(float(v), int(r)) for v, r in zip(saving[wins], rows[wins], strict=True)]
        return gain, int(any_gain.sum())
