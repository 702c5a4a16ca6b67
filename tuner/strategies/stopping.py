"""When a study is done: the strategy's bound on what an unmeasured configuration could still save.

A model-based strategy records on each trial it proposes (user attributes)
``headroom``: its optimistic bound on how much less energy per query than the
best feasible trial any unmeasured configuration that may meet the bound could
use (relative, 0.004 = 0.4%), and ``could_win``: how many unmeasured
configurations have any headroom at all. The study is done when

- ``converged``: the headroom stayed below what a window can resolve (the
  study's ``--ci``) for ``patience`` proposals in a row, none of which
  improved the best by more than that; or
- ``exhausted``: the same, with no unmeasured configuration that could
  save anything at all by the bound,

and at least ``min_measured`` configurations were measured. The rule reads
only finished trials, so every worker of a fleet, a resumed study and the
benchmark (on a prefix of a run's trials) reach the same decision from the
same trials. A strategy that records no headroom never stops early by it.

:func:`decide_settled` is the rule for a stock sampler, which records no
headroom (an LLM study's constrained TPE): ``settled`` once the last
``patience`` measured configurations that met the bounds bettered the best
feasible one before them by no more than the resolution, with at least
``min_measured`` measured (a configuration that misses the bounds says
nothing about the answer, so it does not count towards the streak). It
bounds nothing an unmeasured configuration could save, so it is a plateau,
said as one; ``--no-early-stop`` runs to ``--trials``.
"""

from __future__ import annotations

import optuna
from pydantic import BaseModel, ConfigDict

from tuner.records import is_feasible, recommended_of
from tuner.storage import EARLY_STOP_ATTR
from tuner.strategies.base import COULD_WIN_KEY, HEADROOM_KEY, measured_of

CONVERGED = "converged"
SETTLED = "settled"
EXHAUSTED = "exhausted"
FINISHED = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.FAIL)


class StopRule(BaseModel):
    """The rule's settings: ``resolution`` (relative energy a window resolves), ``patience``, ``min_measured``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    resolution: float = 0.01
    patience: int = 3
    min_measured: int = 8


class StopDecision(BaseModel):
    """Why a study stopped early: the reason, the bound at the last proposal, the trial after which it stopped."""

    model_config = ConfigDict(extra="forbid")

    reason: str
    headroom: float
    resolution: float
    trial: int
    measured: int
    line: str


def decide(trials: list[optuna.trial.FrozenTrial], rule: StopRule) -> StopDecision | None:
    """The stop decision the finished ``trials`` support, or None to go on."""
    done = sorted((t for t in trials if t.state in FINISHED), key=lambda t: t.number)
    measured = len(measured_of(done))
    if measured < rule.min_measured:
        return None
    proposed = [i for i, t in enumerate(done) if HEADROOM_KEY in t.user_attrs]
    if not proposed:
        return None
    last = done[proposed[-1]]
    headroom = float(last.user_attrs[HEADROOM_KEY])
    if recommended_of([t for t in done if t.state == optuna.trial.TrialState.COMPLETE]) is None:
        return None
    streak = proposed[-rule.patience :]
    if len(streak) < rule.patience:
        return None
    if any(float(done[i].user_attrs[HEADROOM_KEY]) >= rule.resolution for i in streak):
        return None
    if any(_improved(done, i, rule.resolution) for i in streak):
        return None
    worst = max(float(done[i].user_attrs[HEADROOM_KEY]) for i in streak)
    if all(int(done[i].user_attrs.get(COULD_WIN_KEY, 1)) == 0 for i in streak):
        reason = EXHAUSTED
        line = (
            f"every configuration that could still win has been measured: no unmeasured one could save anything "
            f"by the model's bound for {rule.patience} proposals in a row; {measured} configurations measured"
        )
    else:
        reason = CONVERGED
        line = (
            f"the model's bound on what an unmeasured configuration could still save stayed below "
            f"{rule.resolution:.1%} (what a window resolves) for {rule.patience} proposals in a row "
            f"(at most {worst:.2%}, last {headroom:.2%}); {measured} configurations measured"
        )
    return StopDecision(
        reason=reason,
        headroom=headroom,
        resolution=rule.resolution,
        trial=done[-1].number,
        measured=measured,
        line=line,
    )


def decide_settled(trials: list[optuna.trial.FrozenTrial], rule: StopRule) -> StopDecision | None:
    """The plateau decision the finished ``trials`` support (see the module docstring), or None to go on."""
    done = sorted((t for t in trials if t.state in FINISHED), key=lambda t: t.number)
    measured = measured_of(done)
    feasible = [t for t in measured if is_feasible(t)]
    if len(measured) < rule.min_measured or len(feasible) < rule.patience + 1:
        return None
    complete = [t for t in done if t.state == optuna.trial.TrialState.COMPLETE]
    best = recommended_of(complete)
    since = feasible[-rule.patience]
    before = recommended_of([t for t in complete if t.number < since.number])
    if best is None or before is None or float(best.value) < float(before.value) * (1 - rule.resolution):
        return None
    line = (
        f"the last {rule.patience} configurations that met the bounds bettered the best before them by "
        f"{rule.resolution:.1%} or less (a plateau; best: trial {best.number}); {len(measured)} configurations measured"
    )
    return StopDecision(
        reason=SETTLED,
        headroom=0.0,
        resolution=rule.resolution,
        trial=done[-1].number,
        measured=len(measured),
        line=line,
    )


def _improved(done: list[optuna.trial.FrozenTrial], i: int, resolution: float) -> bool:
    """Whether trial ``done[i]`` lowered the best feasible energy by more than ``resolution``."""
    complete = [t for t in done[: i + 1] if t.state == optuna.trial.TrialState.COMPLETE]
    after = recommended_of(complete)
    before = recommended_of(complete[:-1]) if complete and complete[-1] is done[i] else after
    if after is None or before is None or after.number == before.number:
        return after is not None and before is None
    return float(after.value) < float(before.value) * (1 - resolution)


def stored_decision(study: optuna.Study) -> StopDecision | None:
    """The decision a worker stored in the study (every worker and a resumed run read it), if any."""
    raw = study.user_attrs.get(EARLY_STOP_ATTR)
    if not isinstance(raw, dict):
        return None
    try:
        return StopDecision.model_validate(raw)
    except ValueError:
        return None
