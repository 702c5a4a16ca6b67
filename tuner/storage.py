"""Study storage shared by a fleet: URLs, secrets, locks, heartbeats and the study quota.

Users type ``postgresql://user:pass@host/db`` (or just ``postgresql://`` and
let libpq read PGHOST, PGPORT, PGUSER, PGPASSWORD and PGDATABASE); SQLAlchemy
would pick the psycopg2 driver for that scheme, so the URL is rewritten to the
psycopg 3 dialect that the ``postgres`` extra installs. Passwords never leave
this module in clear: every URL that is printed or stored goes through
:func:`redact`, and every driver error through :func:`scrub`.

RDB storages get Optuna's heartbeat: a worker killed in the middle of a trial
stops beating, another worker marks that trial FAIL once the grace period has
passed and enqueues a copy of its parameters, which the next ``ask`` picks up.
A trial beats from the moment it starts (:class:`FleetStorage`), so a worker
killed before its heartbeat thread ran leaves nothing RUNNING forever.

A fleet that should reach N completed trials in total admits trials under a
lock held in the database (PostgreSQL advisory lock) or next to it (a file
lock beside an SQLite file): a new trial starts only while completed plus
running trials are fewer than N. Running trials that fail free their slot
again, so waiting workers keep polling until N trials are complete. Failing a
stale trial and queuing its retry happen under that lock too, in one step, so
no peer can take the freed slot while the retry is not yet queued.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import json
import os
import re
import time
import warnings
import zlib
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

import optuna
from optuna.storages._heartbeat import get_heartbeat_thread
from optuna.study._constrained_optimization import _CONSTRAINTS_KEY
from optuna.study.study import _SYSTEM_ATTR_METRIC_NAMES
from optuna.trial import FrozenTrial, TrialState

from tuner import atomicfile, interrupts, readfile
from tuner.errors import UserError
from tuner.records import EARLY_STOP_ATTR

PG_SCHEMES = ("postgresql", "postgres")
PG_DIALECT = "postgresql+psycopg"
RDB_PREFIXES = ("sqlite", "postgresql", "postgres", "mysql", "oracle", "mssql")
DEFAULT_HEARTBEAT_S = 10
MAX_RETRY = 2
# The password runs to the last "@": an unescaped "@" or "/" in it must not leave a piece of it behind.
# (A query holding "@" is then hidden too: too much is hidden, never too little.)
_USERINFO = re.compile(r"^(?P<scheme>[\w+.-]+)://(?P<user>[^:/@]*)(?::(?P<password>.*))?@")
_QUERY_SECRET = re.compile(r"(?i)((?:^|[?&;])(?:ssl)?password=)[^&#;]*")


def scheme(url: str) -> str:
    return url.split("://", 1)[0].lower() if "://" in url else ""


def storage_url(value: str) -> str:
    """What ``--storage`` names, as a URL: a path without a scheme (``/tmp/x.db``, ``x.db``) is that SQLite file.

    The path is made absolute (``sqlite:////tmp/x.db``), so every message and
    output names the same file whatever the working folder.
    """
    if "://" in value or not value.strip() or value == ":memory:":
        return value
    if any(ch in value for ch in "?#") or value.startswith(("sqlite:", "postgresql:", "postgres:")):
        raise UserError(f"--storage {value!r} is neither a URL nor a file path: write sqlite:////abs/path/tune.db")
    return f"sqlite:///{Path(os.path.abspath(value)).as_posix()}"


def is_postgres(url: str) -> bool:
    return scheme(url).split("+", 1)[0] in PG_SCHEMES


def is_rdb(url: str) -> bool:
    return scheme(url).split("+", 1)[0] in RDB_PREFIXES


def driver_url(url: str) -> str:
    """The URL SQLAlchemy should open: plain ``postgresql://`` and ``postgres://`` use psycopg 3.

    Missing host, user, password or database are left out on purpose: libpq
    then fills them from the standard PG* environment variables, so a password
    kept in PGPASSWORD (or ~/.pgpass) is never part of any URL.
    """
    name = scheme(url)
    url = _password_from_env(url)
    if name in PG_SCHEMES:
        return f"{PG_DIALECT}://{url.split('://', 1)[1]}"
    return url


_PASSWORD_ENV = re.compile(r"(?i)([?&;])password_env=([^&#;]*)&?")


def password_env(url: str) -> str | None:
    """The environment variable named by ``?password_env=VAR`` in a storage URL, if any."""
    match = _PASSWORD_ENV.search(url)
    return match.group(2) if match else None


def _password_from_env(url: str) -> str:
    """Move the password named by ``password_env=VAR`` into the URL handed to the driver.

    The typed URL (and so the process list) holds only the variable's name;
    the secret goes straight from the environment to the driver.
    """
    var = password_env(url)
    if var is None:
        return url
    secret = os.environ.get(var)
    if not secret:
        raise UserError(f"--storage names password_env={var}, but {var} is not set: export {var}=... first")
    url = _PASSWORD_ENV.sub(lambda m: m.group(1), url).rstrip("?&;")
    head, rest = url.split("://", 1)
    userinfo, at, hostpart = rest.rpartition("@")
    user = userinfo.split(":", 1)[0] if at else ""
    return f"{head}://{user}:{quote(secret, safe='')}@{hostpart}"


def redact(url: str) -> str:
    """A storage URL without its password (in the user part or a ``password=`` query), for logs and outputs."""
    match = _USERINFO.match(url)
    if match is not None and match.group("password") is not None:
        url = f"{match.group('scheme')}://{match.group('user')}:***@{url[match.end() :]}"
    return _QUERY_SECRET.sub(r"\1***", url)


def secrets_of(url: str) -> list[str]:
    """Every password this URL could connect with: its own, and PGPASSWORD for PostgreSQL."""
    found = []
    match = _USERINFO.match(url)
    if match is not None and match.group("password"):
        found += [match.group("password"), unquote(match.group("password"))]
    for query in re.finditer(r"(?i)(?:^|[?&;])(?:ssl)?password=([^&#;]*)", url):
        if query.group(1):
            found += [query.group(1), unquote(query.group(1))]
    if is_postgres(url) and os.environ.get("PGPASSWORD"):
        found.append(os.environ["PGPASSWORD"])
    var = password_env(url)
    if var and os.environ.get(var):
        found += [os.environ[var], quote(os.environ[var], safe="")]
    return sorted(set(found), key=len, reverse=True)


def scrub(text: str, url: str) -> str:
    """A driver message made safe to print: URLs redacted and any password replaced by ***."""
    text = text.replace(url, redact(url)).replace(driver_url(url), redact(driver_url(url)))
    for secret in secrets_of(url):
        text = text.replace(secret, "***")
    return text


@contextlib.contextmanager
def storage_errors(url: str) -> Iterator[None]:
    """Turn a missing driver or an unreachable or refused database into one safe line.

    The message names the redacted URL and the driver's first line with any
    password scrubbed out, never a traceback.
    """
    try:
        yield
    except ImportError as exc:
        missing = getattr(exc.__cause__, "name", None) or exc.name or "a database driver"
        fix = (
            "pip install 'powertune[postgres]'" if is_postgres(url) else f"install the Python driver for {scheme(url)}"
        )
        raise UserError(f"storage {redact(url)} needs {missing}, which is not installed: {fix}") from None
    except Exception as exc:
        cause = _driver_error(exc)
        if cause is not None and _disk_full(cause):
            raise UserError(
                f"study storage {redact(url)}: the database or its disk is full; free some space (the study keeps "
                "every trial it had recorded: resume it with the same command)"
            ) from None
        if type(exc).__module__.startswith(("sqlalchemy", "psycopg")) or isinstance(exc, ValueError):
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise UserError(f"cannot open study storage {redact(url)}: {scrub(first, url)}; check the URL") from None
        raise


def _driver_error(exc: BaseException) -> BaseException | None:
    """The database driver's error behind ``exc``, however Optuna wrapped or replaced it (cause and context)."""
    seen: set[int] = set()
    pending: list[BaseException | None] = [exc]
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if type(current).__module__.startswith(("sqlalchemy", "sqlite3", "psycopg")):
            return current
        pending += [current.__cause__, current.__context__]
    return None


def _disk_full(exc: BaseException) -> bool:
    """SQLite's SQLITE_FULL ("database or disk is full") or PostgreSQL's disk_full (SQLSTATE 53100)."""
    text = str(exc)
    return "disk is full" in text or "No space left on device" in text or "53100" in text


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


# Where Optuna keeps a trial's constraints: a list under this key (the form optuna-dashboard reads) and,
# since Optuna 5, one "constraints:<name>" key each. Optuna reads both; the list mirrors the named ones.
CONSTRAINTS_KEY = _CONSTRAINTS_KEY
# Where Optuna keeps the objectives' names (Study.set_metric_names), which optuna-dashboard shows.
METRIC_NAMES_KEY = _SYSTEM_ATTR_METRIC_NAMES
OBJECTIVE_NAME = "J/query"
NAMED_PREFIX = f"{CONSTRAINTS_KEY}:"


def named_constraints(system_attrs: dict[str, Any]) -> dict[str, float]:
    """A trial's named constraints (``latency``), in the order they were set; the mirrored list left out."""
    return {k.removeprefix(NAMED_PREFIX): float(v) for k, v in system_attrs.items() if k.startswith(NAMED_PREFIX)}


def set_constraint(trial: optuna.Trial, name: str, value: float) -> None:
    """Optuna's named constraint, mirrored into the list form optuna-dashboard reads.

    The dashboard (0.21) reads a trial's constraints from ``constraints`` only;
    without the list it shows no trial as infeasible and draws the best-value
    line through trials that broke the bound.
    """
    trial.set_constraint(name, value)
    listed = list(named_constraints(trial.storage.get_trial_system_attrs(trial._trial_id)).values())
    trial.storage.set_trial_system_attr(trial._trial_id, CONSTRAINTS_KEY, listed)
    trial._cached_frozen_trial.system_attrs[CONSTRAINTS_KEY] = listed


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


def prepare_sqlite(url: str, readonly: bool) -> None:
    """An SQLite study file checked before SQLite opens it (other storages: nothing to do).

    A writer gets the file created by :func:`tuner.atomicfile.create_file`
    (no link on the way, trusted folders, so SQLite's -wal and -journal
    files beside it are safe too, and a file another user could rewrite is
    refused). A reader gets the file checked by the trust rule, and one
    that holds no Optuna study (empty, or another database) is a one-line
    error: opening it through Optuna would write Optuna's schema into it.
    """
    path = sqlite_path(url)
    if path is None:
        return
    if not readonly:
        atomicfile.create_file(path, "study storage")
        return
    readfile.check_trusted(path, "study storage")
    if not _holds_studies(path):
        raise UserError(f"no study in {path}: it holds no Optuna study yet; run tune run first, or give --storage")


def _holds_studies(path: Path) -> bool:
    """True when the SQLite file has Optuna's studies table (opened read-only: nothing is written)."""
    import sqlite3

    if path.stat().st_size == 0:
        return False
    uri = f"file:{quote(str(path.absolute()))}?mode=ro"
    try:
        with contextlib.closing(sqlite3.connect(uri, uri=True)) as conn:
            found = conn.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='studies'").fetchone()
    except sqlite3.DatabaseError as exc:
        raise UserError(f"study storage {path} is not an SQLite database ({exc}): give a study's tune.db") from None
    return found is not None


def sqlite_path(url: str) -> Path | None:
    if not url.startswith("sqlite:///") or ":memory:" in url:
        return None
    return Path(url[len("sqlite:///") :].split("?", 1)[0])


@contextlib.contextmanager
def storage_lock(url: str, key: str) -> Iterator[None]:
    """Mutual exclusion among every process using ``url`` (for ``key``), wherever they run.

    PostgreSQL: a session advisory lock, released by the server if the holder
    dies. SQLite: an flock on a file beside the database, released by the
    kernel if the holder dies. Other storages get no lock (documented: a
    fleet on them may overshoot its quota by the number of racing workers).
    """
    if is_postgres(url):
        import sqlalchemy

        engine = sqlalchemy.create_engine(driver_url(url), poolclass=sqlalchemy.pool.NullPool)
        lock_id = zlib.crc32(f"powertune:{key}".encode()) - 2**31
        try:
            with engine.connect() as conn:
                conn.execute(sqlalchemy.text("SELECT pg_advisory_lock(:k)"), {"k": lock_id})
                try:
                    yield
                finally:
                    conn.execute(sqlalchemy.text("SELECT pg_advisory_unlock(:k)"), {"k": lock_id})
        finally:
            engine.dispose()
        return
    path = sqlite_path(url)
    if path is None:
        yield
        return
    import fcntl

    fd = atomicfile.open_lock(path.with_name(path.name + ".lock"))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


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


class ConstrainedBestStorage(optuna.storages.RDBStorage):
    """An RDB storage whose best trial honours constraints, as ``Study.best_trial`` does.

    optuna-dashboard marks ``storage.get_best_trial`` as a study's best, and
    Optuna's storages pick the lowest value whatever its constraints, so the
    dashboard would crown a trial that missed the latency bound. Served
    through this class, it marks the trial that ``study.best_trial``, ``tune
    run``, ``tune export`` and ``tune pareto`` name.
    """

    def get_best_trial(self, study_id: int) -> optuna.trial.FrozenTrial:
        best = super().get_best_trial(study_id)
        if all(v <= 0 for v in best.constraints.values()):
            return best
        done = self.get_all_trials(study_id, deepcopy=False, states=(TrialState.COMPLETE,))
        feasible = [t for t in done if all(v <= 0 for v in t.constraints.values())]
        if not feasible:
            return best
        if self.get_study_directions(study_id)[0] == optuna.study.StudyDirection.MAXIMIZE:
            return max(feasible, key=lambda t: float(t.value))
        return min(feasible, key=lambda t: float(t.value))

    def get_all_trials(self, study_id: int, deepcopy: bool = True, states: Any = None) -> list[FrozenTrial]:
        """Every trial with its constraints in the list form the dashboard reads (studies written before it)."""
        trials = super().get_all_trials(study_id, deepcopy=deepcopy, states=states)
        for t in trials:
            named = named_constraints(t.system_attrs)
            if named and CONSTRAINTS_KEY not in t.system_attrs:
                t.system_attrs = {**t.system_attrs, CONSTRAINTS_KEY: list(named.values())}
        return trials

    def get_all_studies(self) -> list[optuna.study.FrozenStudy]:
        """Every study, a powertune study written before it named them with its objective's name and bound."""
        studies = super().get_all_studies()
        for study in studies:
            attrs = study.user_attrs
            if "max_latency_ms" not in attrs:
                continue
            study.system_attrs.setdefault(METRIC_NAMES_KEY, [OBJECTIVE_NAME])
            bound = f"{attrs.get('percentile', 'p99')} <= {float(attrs['max_latency_ms']):g} ms"
            study.user_attrs.setdefault("latency_bound", f"{bound} (constraint latency <= 0)")
        return studies


def dashboard_storage(url: str) -> ConstrainedBestStorage:
    """The storage ``tune dashboard`` serves: read-only use, no heartbeat, constrained best."""
    if not is_rdb(url):
        raise UserError(f"tune dashboard reads database storages (sqlite:///..., postgresql://...), not {redact(url)}")
    prepare_sqlite(url, readonly=True)
    return ConstrainedBestStorage(driver_url(url), engine_kwargs={"pool_pre_ping": True})
