"""The learned strategy: Gaussian processes of energy and latency fitted on the trials, the roofline as their prior.

The default sampler of ``tune run``; docs/search.md describes its steps and
what they were measured against. This module runs one proposal; its steps
live beside it (design, candidates, models, acquisition, headroom).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import optuna

from runners.profile import ModelProfile
from tuner.models import model_profile
from tuner.records import recommended_of
from tuner.space import Config, SearchSpace
from tuner.strategies.base import WARM_START, GuidedSampler, measured_of, model_sampler
from tuner.strategies.learned.acquisition import Acquisition
from tuner.strategies.learned.candidates import Candidates
from tuner.strategies.learned.design import design
from tuner.strategies.learned.headroom import Headroom
from tuner.strategies.learned.models import Models, Predictor
from tuner.strategies.learned.table import Table, space_table


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
    ``full_check``; ``stop_latent``: the spread of the true energy, not of a
    window), which tells the study when it is done. ``settle``: once at most
    this many unmeasured configurations could still win by that bound, the
    next proposal is the one that could save most (0: never), so a study
    that has found its answer measures what stands between it and its end.
    ``confirm_within``: the study confirms a window that would become the best
    by more windows only when it is within this share of the best or its
    latency is near the bound (a close call; tuner.objective); a clear win
    stays one window, its latency judged with one window's noise margin;
    None: every such window is confirmed. ``ladder``: before the study may
    end, where two or more batch sizes measured with the best's knobs are
    within this share of it, their unmeasured batch-size neighbours are
    measured (the bound counts them as saving this much; 0: never): where
    energy is flat across batch sizes the models miss a dip between them.
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
        stop_latent: bool = False,
        settle: int = 3,
        confirm_within: float | None = 0.05,
        ladder: float = 0.01,
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
        self.stop_latent = stop_latent
        self.settle = settle
        self.confirm_within = confirm_within
        self.ladder = ladder
        self.beside: list[tuple[int, float]] = []
        self.inner = model_sampler(seed, startup=4)
        self.profile: ModelProfile | None = None
        self.profile_note = ""
        self.rng = np.random.default_rng(seed)
        self.bounding = Headroom(stop_z, stop_feasible, full_check, stop_latent)
        self.models: Models | None = None
        self.candidates: Candidates | None = None
        self.acquisition: Acquisition | None = None

    def bind(self, space: SearchSpace, model: str, max_latency_ms: float, percentile: str, device: Any = None) -> None:
        super().bind(space, model, max_latency_ms, percentile, device)
        self.profile, self.profile_note = model_profile(model, device)
        if self.profile is None:
            self.profile_note += ": the roofline prior is off, the model learned from the trials proposes alone"
        self.models = Models(space, percentile, self.profile, self.misfit_factor, self.recent)
        self.candidates = Candidates(space, self.rng, self.sample, self.box_steps, self.box_sample)
        self.acquisition = Acquisition(
            self.candidates,
            self.global_every,
            self.pf_power,
            self.pf_margin,
            self.probe,
            self.probe_min_prob,
            self.probe_batches,
            self.switch_tie,
        )

    def notes(self) -> list[str]:
        """What this run's strategy could and could not use (shown by tune run, stored with the study)."""
        return [f"learned: {self.profile_note}"]

    def propose(self, study: optuna.Study) -> Config | None:
        if self.acquisition.steps == 0 and self.space is not None:
            self._note(study)
        self.beside = []
        trials = study.get_trials(deepcopy=False)
        done = [t for t in measured_of(trials) if f"{self.percentile}_ms" in t.user_attrs]
        keys = {t.user_attrs.get("effective_key") for t in trials}
        designed = len([t for t in done if t.user_attrs.get("proposed_by") != WARM_START])
        planned = design(self.space, designed, self.center, lambda config: self._fresh(study, config, keys))
        if planned is not None:
            config, self.reason = planned
            return config
        table = space_table(self.space)
        positions = [table.row(t.user_attrs.get("effective_key", "")) for t in done]
        pairs = [(r, t) for r, t in zip(positions, done, strict=True) if r is not None]
        if len(pairs) < 2:
            return None
        models, candidates, acquisition = self.models, self.candidates, self.acquisition
        rows = np.array([r for r, _ in pairs])
        y_e = np.log([t.user_attrs["j_per_query"] for _, t in pairs])
        y_l = np.log([t.user_attrs[f"{self.percentile}_ms"] for _, t in pairs])
        models.score_prospective(rows, y_e, y_l)
        seen = {table.row(k) for k in keys if k is not None}
        seen |= candidates.refused(table, trials)
        acquisition.mode_now = candidates.mode_of(table, done[-1]) if done else None
        feasible = sorted(
            (t.user_attrs["j_per_query"], r) for r, t in pairs if t.user_attrs[f"{self.percentile}_ms"] <= self.bound_ms
        )
        cand, local_rows = candidates.pick(table, seen - {None}, [r for _, r in feasible[: self.local_around]])
        if len(cand) == 0:
            self.reason = ("", "every configuration has been measured")
            return None
        roof = models.roofline(table, [t for _, t in pairs])
        fitted = models.fit(table, rows, y_e, y_l, roof)
        models.scored |= {int(r) for r in rows}
        why_model = models.choose_trust(roof is not None, self.profile_note)
        best = recommended_of([t for t in trials if t.state == optuna.trial.TrialState.COMPLETE])
        if best is not None and best.value is not None and float(best.value) > 0:
            gain, could = self.bounding.bound(
                table, cand, seen - {None}, fitted, models.trust, float(best.value), self.bound_ms
            )
            best_row = table.row(best.user_attrs.get("effective_key"))
            self.beside = self._beside(table, seen, feasible, best_row, fitted[models.trust], float(best.value))
            self.headroom = self.widened((gain, could))
            if self.beside and could <= self.settle:
                row, near = self.beside[0]
                self.reason = (
                    "ladder",
                    f"batch {table.grid[row].batch_size} beside a measured configuration within {near:.1%} of the "
                    f"best: where energy is flat across batch sizes the models cannot rule it out",
                )
                return table.grid[row]
            if 0 < could <= self.settle and self.bounding.winners:
                self.reason = (
                    f"settle({models.trust})",
                    f"one of the {could} unmeasured configurations that could still beat the best by the model's "
                    f"bound (up to {gain:.1%}): measured so the study can end",
                )
                return table.grid[self.bounding.winners[0]]
        config, self.reason = acquisition.choose(
            table,
            cand,
            local_rows,
            feasible,
            fitted[models.trust](cand),
            self.bound_ms,
            models.latency_noise(),
            models.scored,
            models.trust,
            why_model,
        )
        return config

    def widened(self, bound: tuple[float, int]) -> tuple[float, int]:
        """A bound (saving, could win) with the last proposal's batch neighbours still to measure (``ladder``)."""
        gain, could = bound
        return (max(gain, self.ladder), could + len(self.beside)) if self.beside else bound

    def _beside(
        self,
        table: Table,
        seen: set[int | None],
        feasible: list[tuple[float, int]],
        best_row: int | None,
        predict: Predictor,
        best_j: float,
    ) -> list[tuple[int, float]]:
        """Unmeasured batch neighbours on the best's batch curve where it is flat: within ``ladder`` of the best.

        The curve: the feasible measured configurations with the best's knobs
        at any batch size; flat: two or more of its batch sizes within
        ``ladder`` (one alone says nothing of its shape). Each neighbour comes
        with its measured neighbour's share over the best; only those the
        trusted model gives at least ``stop_feasible`` P(meets the bound).
        """
        if self.ladder <= 0 or best_row is None:
            return []
        knobs = table.grid[best_row].knobs
        near: dict[int, float] = {}
        for j, row in feasible:
            if j <= best_j * (1 + self.ladder) and table.grid[row].knobs == knobs:
                near.setdefault(row, max(j / best_j - 1, 0.0))
        if len({table.grid[row].batch_size for row in near}) < 2:
            return []
        out: dict[int, float] = {}
        for row, share in near.items():
            for n in self.candidates.batch_neighbours(table, row):
                if n not in seen:
                    out.setdefault(n, share)
        keep = self.bounding.plausible(list(out), predict, self.bound_ms)
        return [(r, out[r]) for r in keep]

    def _note(self, study: optuna.Study) -> None:
        notes = list(study.user_attrs.get("strategy_notes", []))
        for note in self.notes():
            if note not in notes:
                notes.append(note)
        study.set_user_attr("strategy_notes", notes)
