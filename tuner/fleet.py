"""A study's progress across the workers of a fleet, for ``tune status``.

Every trial carries the worker (host:pid unless ``--worker-id`` named it),
host and device that ran it, so one storage read tells how far the study is,
who is doing the work, whose trials fail, and how many stale trials were
queued for a retry. Reading never changes the study: a stale trial is only
failed by a running worker, never by looking at it.
"""

from __future__ import annotations

import math
import statistics

import optuna
from optuna.trial import FrozenTrial, TrialState
from pydantic import BaseModel, ConfigDict, Field

from tuner.records import is_feasible, recommended, trial_record
from tuner.storage import open_storage, redact, storage_errors

STATUS_VERSION = 1


class WorkerStatus(BaseModel):
    model_config = ConfigDict(extra="forbid")

    worker: str
    host: str | None
    device: str | None
    complete: int = 0
    running: int = 0
    failed: int = 0
    pruned: int = 0
    best_trial: int | None = None
    best_j_per_query: float | None = None
    last_finished: str | None = None


class StudyStatus(BaseModel):
    """What ``tune status --json`` prints for one study."""

    model_config = ConfigDict(extra="forbid")

    version: int = STATUS_VERSION
    study: str
    storage: str
    model: str | None
    device_kind: str | None
    max_latency_ms: float | None
    target: int | None
    complete: int
    running: int
    waiting: int
    failed: int
    pruned: int
    retried: int
    best: dict | None
    workers: list[WorkerStatus] = Field(default_factory=list)


def worker_of(trial: FrozenTrial) -> str:
    attrs = trial.user_attrs
    return str(attrs.get("worker") or attrs.get("host") or "unknown")


def _feasible_value(trial: FrozenTrial) -> float | None:
    ok = trial.state == TrialState.COMPLETE and trial.value is not None and math.isfinite(trial.value)
    return trial.value if ok and is_feasible(trial) else None


def study_status(study: optuna.Study, url: str) -> StudyStatus:
    """Counts by state for the study and each worker; the study's recommended trial, each worker's cheapest."""
    trials = study.get_trials(deepcopy=False)
    workers: dict[str, WorkerStatus] = {}
    for t in trials:
        if t.state == TrialState.WAITING:
            continue
        name = worker_of(t)
        w = workers.setdefault(name, WorkerStatus(worker=name, host=t.user_attrs.get("host"), device=None))
        w.device = t.user_attrs.get("device", w.device)
        field = {TrialState.COMPLETE: "complete", TrialState.RUNNING: "running", TrialState.FAIL: "failed"}.get(
            t.state, "pruned"
        )
        setattr(w, field, getattr(w, field) + 1)
        value = _feasible_value(t)
        if value is not None and (w.best_j_per_query is None or value < w.best_j_per_query):
            w.best_trial, w.best_j_per_query = t.number, value
        if t.datetime_complete is not None:
            stamp = t.datetime_complete.astimezone().isoformat(timespec="seconds")
            w.last_finished = max(w.last_finished or "", stamp)
    by_state = {s: sum(t.state == s for t in trials) for s in TrialState}
    best = recommended(study)
    attrs = study.user_attrs
    return StudyStatus(
        study=study.study_name,
        storage=redact(url),
        model=attrs.get("model"),
        device_kind=attrs.get("device_kind"),
        max_latency_ms=attrs.get("max_latency_ms"),
        target=attrs.get("study_trials"),
        complete=by_state[TrialState.COMPLETE],
        running=by_state[TrialState.RUNNING],
        waiting=by_state[TrialState.WAITING],
        failed=by_state[TrialState.FAIL],
        pruned=by_state[TrialState.PRUNED],
        retried=sum("failed_trial" in t.system_attrs for t in trials),
        best=trial_record(best) if best else None,
        workers=sorted(workers.values(), key=lambda w: w.worker),
    )


def all_statuses(url: str) -> list[StudyStatus]:
    """The status of every study in a storage, for ``tune status`` without a model and device."""
    with storage_errors(url):
        storage = open_storage(url, None, readonly=True)
        names = optuna.get_all_study_names(storage=storage)
        return [study_status(optuna.load_study(study_name=n, storage=storage), url) for n in names]


UNIT_PREFIX = "unit:"


class UnitVerdict(BaseModel):
    """One unit's verdict as ``tune verify`` wrote it on the fleet study (the fields status reads)."""

    model_config = ConfigDict(extra="ignore")

    unit: str
    device: str
    verdict: str
    reason: str
    windows: int
    j_per_query: float
    latency_ms: float
    study_j_per_query: float
    retune: dict | None = None
    at: str = ""

    @property
    def deployed_j(self) -> float:
        """Energy per query as the unit runs now: the re-tuned answer's where it re-tuned."""
        return float(self.retune["j_per_query"]) if self.retune else self.j_per_query


class FleetStatus(BaseModel):
    """Every unit's verdict on one study's export: how many verified, re-tuned and why, the energy spread."""

    version: int = STATUS_VERSION
    study: str
    units: list[UnitVerdict]
    verified: int
    retuned: int
    unreadable: list[str] = Field(default_factory=list)
    spread: dict[str, float] | None = None


def fleet_summary(url: str) -> list[FleetStatus]:
    """The fleet verdicts recorded on each study of a storage (studies without any are left out).

    The spread is over the energy per query each unit runs as deployed (its
    measured export, or its re-tuned answer): min, median, max and
    (max - min) / median.
    """
    with storage_errors(url):
        storage = open_storage(url, None)
        out = []
        for summary in optuna.get_all_study_summaries(storage):
            attrs = summary.user_attrs
            units, unreadable = [], []
            for key, value in sorted(attrs.items()):
                if not key.startswith(UNIT_PREFIX):
                    continue
                try:
                    units.append(UnitVerdict.model_validate(value))
                except ValueError:
                    unreadable.append(key[len(UNIT_PREFIX) :])
            if not units and not unreadable:
                continue
            energies = sorted(u.deployed_j for u in units)
            spread = None
            if energies:
                median = statistics.median(energies)
                spread = {"min": energies[0], "median": median, "max": energies[-1]}
                spread["relative"] = (energies[-1] - energies[0]) / median if median else math.nan
            out.append(
                FleetStatus(
                    study=summary.study_name,
                    units=units,
                    verified=sum(u.verdict == "verified" for u in units),
                    retuned=sum(u.verdict == "retuned" for u in units),
                    unreadable=unreadable,
                    spread=spread,
                )
            )
        return out
