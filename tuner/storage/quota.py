"""A fleet's study quota: a trial starts only while completed plus running trials are fewer than N.

Admission happens under a lock held in the database (PostgreSQL advisory
lock) or next to it (a file lock beside an SQLite file). Running trials that
fail free their slot again, so waiting workers keep polling until N trials
are complete. Failing a stale trial and queuing its retry happen under that
lock too, in one step, so no peer can take the freed slot while the retry is
not yet queued.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from typing import Any

import optuna
from optuna.storages._heartbeat import get_heartbeat_thread
from optuna.trial import TrialState

from tuner.plumbing import interrupts
from tuner.records import EARLY_STOP_ATTR
from tuner.storage.fleet import FleetStorage
from tuner.storage.locks import storage_lock


class StudyFull(Exception):
    """Raised by :meth:`QuotaStudy.ask` when no further trial may start: quota reached or time up."""


class QuotaStudy(optuna.Study):
    """A study whose ``ask`` admits a trial only while the study-wide quota has room.

        Admission happens under :func:`storage_lock`, in this order: fail stale
        trials (a dead worker's) and queue their retries; count; then create a
        trial or take a queued one, and sample all its parameters (``propose``,
    the objective's own suggest calls, which later return the same values). So two workers
        can never both take the last slot (completed plus running trials never
        exceed ``quota``, and since workers only stop once ``quota`` trials are
        COMPLETE, the study ends with exactly that many); a slot freed by a
        failed trial goes to its retry first; and every proposal sees the
        parameters of every trial already running. A worker that finds every
        slot taken by running trials waits and polls. With ``early_stop``, a
        stop decision stored in the study (``EARLY_STOP_ATTR``, by any worker)
        ends admission too: the fleet stops as one study.
    """

    def __init__(
        self,
        study: optuna.Study,
        url: str,
        quota: int,
        deadline: float | None = None,
        poll_s: float = 1.0,
        propose: Callable[[optuna.Trial], Any] | None = None,
        early_stop: bool = False,
    ) -> None:
        super().__init__(study_name=study.study_name, storage=study._storage, sampler=study.sampler)
        self.early_stop = early_stop
        self.url = url
        self.quota = quota
        self.deadline = deadline
        self.poll_s = poll_s
        self.propose = propose
        self._fleet = getattr(self._storage, "_backend", self._storage)
        if isinstance(self._fleet, FleetStorage):
            self._fleet.stale_checks_when_admitting = True

    def counts(self) -> tuple[int, int]:
        trials = self.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.RUNNING))
        done = sum(t.state == TrialState.COMPLETE for t in trials)
        return done, len(trials) - done

    def ask(self, fixed_distributions: dict | None = None) -> optuna.Trial:
        while True:
            with storage_lock(self.url, self.study_name):
                self._fail_stale()
                done, running = self.counts()
                if done >= self.quota:
                    raise StudyFull(f"the study has its {self.quota} completed trials")
                if self.early_stop and EARLY_STOP_ATTR in self.user_attrs:
                    raise StudyFull("the study stopped early")
                if done + running < self.quota:
                    return self._start(fixed_distributions)
            if self.deadline is not None and time.monotonic() >= self.deadline:
                raise StudyFull("timeout")
            if interrupts.pending():
                raise StudyFull("interrupted")  # the run raises the signal once the loop has ended
            time.sleep(self.poll_s)

    def _start(self, fixed_distributions: dict | None) -> optuna.Trial:
        """Create or take the trial and sample it, beating meanwhile: a slow proposal is not a dead worker."""
        trial = super().ask(fixed_distributions)
        if self.propose is not None:
            try:
                with get_heartbeat_thread(trial._trial_id, self._storage):
                    self.propose(trial)
            except BaseException:
                # Ctrl-C or a sampler error before the objective ran: no trial left RUNNING behind.
                self.tell(trial, state=TrialState.FAIL)
                raise
        return trial

    def _fail_stale(self) -> None:
        """Fail stale trials and queue their retries: one step, as the caller holds the admission lock."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            if isinstance(self._fleet, FleetStorage):
                with self._fleet.admitting():
                    optuna.storages.fail_stale_trials(self)
            else:
                optuna.storages.fail_stale_trials(self)
