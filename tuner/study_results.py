"""What a study run returns: its summary (the answer, the trials, why it ended), the request and the result."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import optuna
from pydantic import BaseModel, ConfigDict, Field

from tuner import baseline
from tuner.pareto import ParetoFile
from tuner.run_options import RunOptions
from tuner.strategies.stopping import StopDecision


class RunSummary(BaseModel):
    """What a run reports back: the study, how many trials ran, and its recommended trial.

    ``previous_best`` is the recommended trial before this run (a resumed
    study), so a change of answer is said, never hidden. ``trial_seconds`` says
    where this run's trials spent their time: ``setup_s`` (apply, model load
    and preparation, warm-up), ``windows_s`` and ``search_s`` (the rest: the
    sampler, storage writes and progress between and around windows).
    ``unmet``: when no trial met the bound, the line that names the fastest
    one measured and the bound that would admit it (tuner.records.unmet_bound).
    ``saved``: the answer against its baseline (tuner.baseline), when one was asked for.
    """

    study: str
    storage: str
    measured: int
    total_trials: int
    best_trial: int | None
    best: dict | None
    previous_best: dict | None = None
    trial_seconds: dict[str, float] = {}
    stopped: str = ""
    early_stop: StopDecision | None = None
    reused: list[str] = []
    unmet: str | None = None
    saved: baseline.Saved | None = None


class StudyRequest(BaseModel):
    """What ``tune run`` asks for: a device by name (and how to open it) and the run's options."""

    model_config = ConfigDict(extra="forbid")

    device: str
    options: RunOptions
    allow_clock_changes: bool = False
    sysfs_root: Path | None = None
    space_file: Path | None = None


class StudyResult(BaseModel):
    """What ``tune run`` reports: the run's summary, the device it ran on, and where its result files are.

    ``study`` and ``pareto`` (the Optuna study and the fronts written to pareto.json) are for the
    library's callers (tuner.api) and left out of the report's JSON.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    summary: RunSummary
    device: str
    twin: bool
    twin_note: str = ""
    model: str
    max_latency_ms: float
    max_ttft_ms: float | None = None
    max_tpot_ms: float | None = None
    percentile: str
    scenario: str
    results: Path
    seconds: float
    pareto_points: int
    strategy_notes: list[str] = Field(default_factory=list)
    proposed_by: dict[str, int] = Field(default_factory=dict)
    study: optuna.Study | None = Field(default=None, exclude=True, repr=False)
    pareto: ParetoFile | None = Field(default=None, exclude=True, repr=False)


TrialCallback = Callable[[optuna.Study, optuna.trial.FrozenTrial, int], None]
