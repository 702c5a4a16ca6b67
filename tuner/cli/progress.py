"""tune run's progress on stderr: a bar on a terminal, otherwise a line per finished trial."""

from __future__ import annotations

import time

import optuna
import typer
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from tuner.cli import common


def value_unit(trial: optuna.trial.FrozenTrial) -> str:
    """What a trial's value is in: J per output token for an LLM trial, else J per query."""
    return "J/token" if "j_per_token" in trial.user_attrs else "J/query"


class trial_progress:
    """Progress on stderr: trial n/N, the recommended configuration's energy so far, ETA.

    On a terminal a rich progress bar; otherwise (logs, CI, ssh without a
    tty) one line per finished trial, as Optuna's own logging prints. With
    ``study_wide`` the count is the study's completed trials from every
    worker, which is what ``--study-trials`` aims at.
    """

    def __init__(self, total: int, quiet: bool, study_wide: bool = False) -> None:
        self.total = total
        self.quiet = quiet
        self.study_wide = study_wide
        self.lines = not common.err_console.is_terminal
        self.started = time.monotonic()
        self.progress = Progress(
            TextColumn("trial {task.completed}/{task.total}"),
            BarColumn(),
            TextColumn("best {task.fields[best]}"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=common.err_console,
            disable=quiet or self.lines,
            transient=False,
        )
        self.task: TaskID | None = None

    def __enter__(self):
        return self.update

    def update(self, study: optuna.Study, trial: optuna.trial.FrozenTrial, measured: int) -> None:
        """Show the bar from the first finished trial on, so an error before it prints alone."""
        from tuner.records import recommended

        if self.quiet:
            return  # nothing is shown: reading every trial back for the "best" label would be wasted
        best = recommended(study)
        unit = value_unit(trial)
        label = "-" if best is None else f"{best.value:.4g} {unit} (trial {best.number})"
        if self.study_wide:
            measured = len(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)))
        if self.lines:
            typer.echo(self.line(trial, min(measured, self.total), label), err=True)
            return
        if self.task is None:
            self.progress.__enter__()
            self.task = self.progress.add_task("trials", total=self.total, best="-")
        self.progress.update(self.task, completed=min(measured, self.total), best=label)

    def line(self, trial: optuna.trial.FrozenTrial, done: int, best: str) -> str:
        """One finished trial: its number, value and verdict, the best so far, elapsed time and ETA."""
        elapsed = time.monotonic() - self.started
        left = "-" if done == 0 else common.clock(elapsed / done * (self.total - done))
        if trial.state == optuna.trial.TrialState.COMPLETE and trial.value is not None:
            outcome = f"{trial.value:.4g} {value_unit(trial)}, {trial.user_attrs.get('verdict', '')}".rstrip(", ")
        else:
            outcome = f"{trial.state.name.lower()}: {trial.user_attrs.get('fail_reason', 'no measurement')}"
        return (
            f"trial {trial.number} finished ({done}/{self.total}): {outcome}; best {best}; "
            f"elapsed {common.clock(elapsed)}, ETA {left}"
        )

    def __exit__(self, *exc: object) -> None:
        if self.task is not None:
            self.progress.__exit__(*exc)
