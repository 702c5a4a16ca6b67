"""Which candidate a proposal takes: constrained expected improvement, global and local steps, direction probes.

Proposals alternate a global step (expected improvement times P(meets the
bound with a noise margin)^pf_power over every candidate) and a local step
among the neighbours of the best feasible configurations that first probes
a knob direction no trial has tried.
"""

from __future__ import annotations

import math

import numpy as np

from tuner.space import Config
from tuner.strategies.learned.candidates import Candidates
from tuner.strategies.learned.table import Table


def normal_cdf(z: np.ndarray) -> np.ndarray:
    """Standard normal cdf, imported on first use: scipy.special is a fifth of a second of start-up.

    (scipy.stats, the usual home of ``norm``, costs about a second.)
    """
    from scipy.special import ndtr

    return ndtr(z)


def normal_pdf(z: np.ndarray) -> np.ndarray:
    """Standard normal density, in numpy: nothing to import."""
    return np.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)


class Acquisition:
    """The scoring and choice of one proposal; counts its steps (every ``global_every``-th is global).

    ``pf_power`` and ``pf_margin`` (noise standard deviations) shape the
    feasibility term; ``probe`` enables direction probes, skipped below
    ``probe_min_prob`` P(bound), judged over ``probe_batches`` neighbouring
    batch sizes. ``switch_tie``: a candidate in the board's current power
    mode is taken over a better-scoring one in another mode when it scores
    within this fraction of it (a mode switch costs seconds on a Jetson; 0
    never prefers).
    """

    def __init__(
        self,
        candidates: Candidates,
        global_every: int,
        pf_power: float,
        pf_margin: float,
        probe: bool,
        probe_min_prob: float,
        probe_batches: int,
        switch_tie: float,
    ) -> None:
        self.candidates = candidates
        self.global_every = global_every
        self.pf_power = pf_power
        self.pf_margin = pf_margin
        self.probe = probe
        self.probe_min_prob = probe_min_prob
        self.probe_batches = probe_batches
        self.switch_tie = switch_tie
        self.steps = 0
        self.mode_now: int | None = None

    def choose(
        self,
        table: Table,
        cand: np.ndarray,
        local: set[int],
        feasible: list[tuple[float, int]],
        predicted: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
        bound_ms: float,
        latency_noise: float,
        scored: set[int],
        who: str,
        why_model: str,
    ) -> tuple[Config, tuple[str, str]]:
        """Constrained expected improvement over the candidates, alternating global and local steps.

        ``predicted``: the trusted model's (``who``) means and spreads over
        ``cand``; ``scored``: the rows already measured; returns the pick and
        the reason the trial carries.
        """
        mu_e, sd_e, mu_l, sd_l = predicted
        margin = self.pf_margin * latency_noise
        feasible_prob = normal_cdf((math.log(bound_ms) - margin - mu_l) / sd_l)
        if feasible:
            best = math.log(feasible[0][0])
            z = (best - mu_e) / sd_e
            score = sd_e * (z * normal_cdf(z) + normal_pdf(z)) * feasible_prob**self.pf_power
            what = "expected improvement x P(meets bound)"
        else:
            score = np.where(feasible_prob >= 0.5, 1.0 + np.exp(-(mu_e - mu_e.min())), feasible_prob)
            what = "no feasible trial yet: most likely to meet the bound, then lowest predicted energy"
        self.steps += 1
        is_local = np.isin(cand, np.fromiter(local, dtype=int)) if local else np.zeros(len(cand), dtype=bool)
        if self.steps % self.global_every != 1 and is_local.any():
            priority = np.where(
                feasible_prob >= self.probe_min_prob,
                self.untested(table, cand, is_local, feasible[0][1], scored),
                -np.inf,
            )
            probe = np.isfinite(priority)
            if probe.any():
                pick = int(np.lexsort((score, priority))[-1])
            else:
                pick = self._stay(table, cand, score, is_local, int(np.argmax(np.where(is_local, score, -np.inf))))
            incumbent = table.grid[feasible[0][1]].label()
            kind = "untried direction of a knob from" if probe.any() else "neighbour of"
            reason = (f"local({who})", f"{kind} the best feasible ({incumbent}): {what} {score[pick]:.3g}; {why_model}")
            return table.grid[int(cand[pick])], reason
        pick = self._stay(table, cand, score, np.ones(len(cand), dtype=bool), int(np.argmax(score)))
        label = "local" if is_local[pick] else "global"
        reason = (
            f"{label}({who})" if label == "local" else who,
            f"{label} best of {len(cand)} unmeasured candidates: {what} {score[pick]:.3g}, predicted "
            f"{math.exp(mu_e[pick]):.4g} J/query, P(bound) {feasible_prob[pick]:.2f}; {why_model}",
        )
        return table.grid[int(cand[pick])], reason

    def _stay(self, table: Table, cand: np.ndarray, score: np.ndarray, allowed: np.ndarray, pick: int) -> int:
        """``pick``, or the best allowed candidate in the current mode if it scores within ``switch_tie`` of it."""
        if self.switch_tie <= 0 or self.mode_now is None or table.modes is None:
            return pick
        modes = table.modes[cand]
        if modes[pick] == self.mode_now:
            return pick
        same = allowed & (modes == self.mode_now) & (score >= (1 - self.switch_tie) * score[pick])
        return int(np.argmax(np.where(same, score, -np.inf))) if same.any() else pick

    def untested(
        self, table: Table, cand: np.ndarray, is_local: np.ndarray, incumbent: int, scored: set[int]
    ) -> np.ndarray:
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
        if not self.probe or not scored:
            return out
        x = table.x
        here = x[incumbent]
        measured = x[np.fromiter(scored, dtype=int)]
        groups = self.candidates.groups()
        batches = self.candidates.space.batch_sizes
        if len(batches) > 1:
            reach = self.probe_batches / (len(batches) - 1) + 1e-9
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
