"""Study storage shared by a fleet: Optuna's RDB storage with heartbeats, and one-commit trial attributes.

RDB storages get Optuna's heartbeat: a worker killed in the middle of a trial
stops beating, another worker marks that trial FAIL once the grace period has
passed and enqueues a copy of its parameters, which the next ``ask`` picks up.
A trial beats from the moment it starts (:class:`FleetStorage`), so a worker
killed before its heartbeat thread ran leaves nothing RUNNING forever.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import json
import warnings
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import optuna
from optuna.trial import TrialState

from tuner.storage.sqlite import prepare_sqlite, sqlite_path
from tuner.storage.urls import driver_url, is_rdb

DEFAULT_HEARTBEAT_S = 10
MAX_RETRY = 2


def _stale_callback_kwargs() -> dict[str, Any]:
    """Optuna renamed ``failed_trial_callback`` to ``heartbeat_stale_trial_callback`` in 4.9."""
    retry = optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=MAX_RETRY)
    params = inspect.signature(optuna.storages.RDBStorage).parameters
    name = "heartbeat_stale_trial_callback" if "heartbeat_stale_trial_callback" in params else "failed_trial_callback"
    return {name: retry}


class FleetStorage(optuna.storages.RDBStorage):
    """Optuna's RDB storage with two fleet guarantees on top of its heartbeat.

    A trial gets its first heartbeat in the step that makes it RUNNING, not
    when Optuna's heartbeat thread first runs: a worker killed in between
    would otherwise leave a RUNNING trial that no peer ever sees as stale (a
    trial with no heartbeat at all is never stale to Optuna), and a quota
    fleet would wait for it forever. A RUNNING trial that still has no
    heartbeat (killed between those two commits, or written by an older
    version) counts as stale once it started twice the grace period ago by
    this host's clock.

    With ``stale_checks_when_admitting`` (set by :class:`QuotaStudy`), stale
    trials are only looked for inside :meth:`admitting`, which QuotaStudy
    enters under the admission lock: Optuna's own check at the start of each
    trial runs outside that lock, and a peer could take the slot freed by
    the failed trial before its retry is queued.
    """

    def __init__(self, url: str, **kwargs: Any) -> None:
        super().__init__(url, **kwargs)
        self.stale_checks_when_admitting = False
        self._admitting = False

    @contextlib.contextmanager
    def admitting(self) -> Iterator[None]:
        self._admitting = True
        try:
            yield
        finally:
            self._admitting = False

    def set_trial_user_attrs(self, trial_id: int, attrs: dict[str, Any]) -> None:
        """Several user attributes in one statement and one commit, instead of a lookup, an upsert and a commit each.

        SQLite (3.24 or later) and PostgreSQL take a multi-row upsert, with
        the same conflict rule as Optuna's own single-attribute write; other
        databases get Optuna's per-attribute write inside the one transaction.
        """
        import sqlite3

        from optuna.storages._rdb import models
        from optuna.storages._rdb.storage import _create_scoped_session

        model = models.TrialUserAttributeModel
        name = self.engine.name
        upsert = name == "postgresql" or (name == "sqlite" and sqlite3.sqlite_version_info >= (3, 24, 0))
        with _create_scoped_session(self.scoped_session, True) as session:
            if not upsert:
                for key, value in attrs.items():
                    self._set_trial_attr_without_commit(session, model, trial_id, key, value)
                return
            trial = models.TrialModel.find_or_raise_by_id(trial_id, session)
            self.check_trial_is_updatable(trial_id, trial.state)
            dialect = importlib.import_module(f"sqlalchemy.dialects.{name}")
            rows = [{"trial_id": trial_id, "key": k, "value_json": json.dumps(v)} for k, v in attrs.items()]
            statement = dialect.insert(model).values(rows)
            statement = statement.on_conflict_do_update(
                index_elements=[model.trial_id, model.key], set_={"value_json": statement.excluded.value_json}
            )
            session.execute(statement)

    def _create_new_trial(self, study_id: int, template_trial: optuna.trial.FrozenTrial | None = None) -> Any:
        frozen = super()._create_new_trial(study_id, template_trial)
        if frozen.state == TrialState.RUNNING and self.heartbeat_interval is not None:
            self.record_heartbeat(frozen._trial_id)
        return frozen

    def set_trial_state_values(self, trial_id: int, state: TrialState, values: Any = None) -> bool:
        changed = super().set_trial_state_values(trial_id, state, values)
        if changed and state == TrialState.RUNNING and self.heartbeat_interval is not None:
            self.record_heartbeat(trial_id)
        return changed

    def _get_stale_trial_ids(self, study_id: int) -> list[int]:
        if self.stale_checks_when_admitting and not self._admitting:
            return []
        stale = super()._get_stale_trial_ids(study_id)
        return stale + self._never_beaten(study_id, exclude=set(stale))

    def _never_beaten(self, study_id: int, exclude: set[int]) -> list[int]:
        """RUNNING trials with no heartbeat row that started more than two grace periods ago."""
        from optuna.storages._rdb import models

        running = [
            t
            for t in self.get_all_trials(study_id, deepcopy=False, states=(TrialState.RUNNING,))
            if t._trial_id not in exclude
        ]
        if not running:
            return []
        session = self.scoped_session()
        try:
            query = session.query(models.TrialHeartbeatModel.trial_id)
            beaten = {
                row[0] for row in query.filter(models.TrialHeartbeatModel.trial_id.in_([t._trial_id for t in running]))
            }
        finally:
            session.close()
        limit = datetime.now() - timedelta(seconds=2 * (self.grace_period or 2 * (self.heartbeat_interval or 0)))
        return [
            t._trial_id
            for t in running
            if t._trial_id not in beaten and t.datetime_start is not None and t.datetime_start < limit
        ]


def set_user_attrs(trial: optuna.Trial, attrs: dict[str, Any]) -> None:
    """``trial.set_user_attr`` for each item, written in one transaction where the storage allows it.

    A trial writes about twenty attributes; as separate commits they cost a
    quick start several seconds. Readers see the same attributes either way.
    """
    backend = getattr(trial.storage, "_backend", trial.storage)
    if not attrs or not isinstance(trial, optuna.Trial) or not isinstance(backend, FleetStorage):
        for key, value in attrs.items():
            trial.set_user_attr(key, value)
        return
    backend.set_trial_user_attrs(trial._trial_id, attrs)
    trial._cached_frozen_trial.user_attrs.update(attrs)


def open_storage(
    url: str, heartbeat_s: int | None = DEFAULT_HEARTBEAT_S, readonly: bool = False
) -> str | optuna.storages.BaseStorage:
    """What ``optuna.create_study`` should get for ``url``: an RDBStorage with heartbeat where possible.

    An SQLite file is first made ready by :func:`prepare_sqlite` (``readonly``:
    a reading command, which must find a study there and write nothing).

    The grace period is three heartbeats, so one late beat on a loaded host
    does not fail a live trial. A failed-stale trial is retried at most
    ``MAX_RETRY`` times: a configuration that kills its worker every time must
    not take the whole fleet down with it.
    """
    if not is_rdb(url):
        return url
    prepare_sqlite(url, readonly)
    kwargs: dict[str, Any] = {"engine_kwargs": {"pool_pre_ping": True}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        if heartbeat_s is not None:
            kwargs.update(heartbeat_interval=int(heartbeat_s), grace_period=3 * int(heartbeat_s))
            kwargs.update(_stale_callback_kwargs())
        storage = FleetStorage(driver_url(url), **kwargs)
    if heartbeat_s is not None and sqlite_path(url) is not None:
        # Write-ahead logging: one sync per commit instead of several, which pays for the heartbeat's
        # extra writes, and readers (tune status) never block a running study. It persists in the file;
        # where it cannot be set (a read-only file) the study still works, only slower.
        import sqlalchemy

        with contextlib.suppress(sqlalchemy.exc.OperationalError), storage.engine.connect() as conn:
            conn.exec_driver_sql("PRAGMA journal_mode=WAL")
    return storage
