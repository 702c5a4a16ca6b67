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

A fleet that should reach N completed trials in total admits trials under a
lock held in the database (PostgreSQL advisory lock) or next to it (a file
lock beside an SQLite file): a new trial starts only while completed plus
running trials are fewer than N. Running trials that fail free their slot
again, so waiting workers keep polling until N trials are complete.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import re
import time
import warnings
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

import optuna
from optuna.trial import TrialState

from tuner.errors import UserError

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
        if type(exc).__module__.startswith(("sqlalchemy", "psycopg")) or isinstance(exc, ValueError):
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise UserError(f"cannot open study storage {redact(url)}: {scrub(first, url)}; check the URL") from None
        raise


def _stale_callback_kwargs() -> dict[str, Any]:
    """Optuna renamed ``failed_trial_callback`` to ``heartbeat_stale_trial_callback`` in 4.9."""
    retry = optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=MAX_RETRY)
    params = inspect.signature(optuna.storages.RDBStorage).parameters
    name = "heartbeat_stale_trial_callback" if "heartbeat_stale_trial_callback" in params else "failed_trial_callback"
    return {name: retry}


def open_storage(url: str, heartbeat_s: int | None = DEFAULT_HEARTBEAT_S) -> str | optuna.storages.BaseStorage:
    """What ``optuna.create_study`` should get for ``url``: an RDBStorage with heartbeat where possible.

    The grace period is three heartbeats, so one late beat on a loaded host
    does not fail a live trial. A failed-stale trial is retried at most
    ``MAX_RETRY`` times: a configuration that kills its worker every time must
    not take the whole fleet down with it.
    """
    if not is_rdb(url):
        return url
    kwargs: dict[str, Any] = {"engine_kwargs": {"pool_pre_ping": True}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        if heartbeat_s is not None:
            kwargs.update(heartbeat_interval=int(heartbeat_s), grace_period=3 * int(heartbeat_s))
            kwargs.update(_stale_callback_kwargs())
        storage = optuna.storages.RDBStorage(driver_url(url), **kwargs)
    if heartbeat_s is not None and sqlite_path(url) is not None:
        # Write-ahead logging: one sync per commit instead of several, which pays for the heartbeat's
        # extra writes, and readers (tune status) never block a running study. It persists in the file;
        # where it cannot be set (a read-only file) the study still works, only slower.
        import sqlalchemy

        with contextlib.suppress(sqlalchemy.exc.OperationalError), storage.engine.connect() as conn:
            conn.exec_driver_sql("PRAGMA journal_mode=WAL")
    return storage


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

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


class StudyFull(Exception):
    """Raised by :meth:`QuotaStudy.ask` when no further trial may start: quota reached or time up."""


class QuotaStudy(optuna.Study):
    """A study whose ``ask`` admits a trial only while the study-wide quota has room.

    Admission (count, then create or pop a waiting trial) happens under
    :func:`storage_lock`, so two workers can never both take the last slot:
    completed plus running trials never exceed ``quota``, and since workers
    only stop once ``quota`` trials are COMPLETE, the study ends with exactly
    that many. A worker that finds every slot taken by running trials waits,
    failing stale ones (a dead worker's) so their slots, and their retries,
    come back.
    """

    def __init__(
        self,
        study: optuna.Study,
        url: str,
        quota: int,
        deadline: float | None = None,
        poll_s: float = 1.0,
    ) -> None:
        super().__init__(study_name=study.study_name, storage=study._storage, sampler=study.sampler)
        self.url = url
        self.quota = quota
        self.deadline = deadline
        self.poll_s = poll_s

    def counts(self) -> tuple[int, int]:
        trials = self.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.RUNNING))
        done = sum(t.state == TrialState.COMPLETE for t in trials)
        return done, len(trials) - done

    def ask(self, fixed_distributions: dict | None = None) -> optuna.Trial:
        while True:
            with storage_lock(self.url, self.study_name):
                done, running = self.counts()
                if done >= self.quota:
                    raise StudyFull(f"the study has its {self.quota} completed trials")
                if done + running < self.quota:
                    return super().ask(fixed_distributions)
            if self.deadline is not None and time.monotonic() >= self.deadline:
                raise StudyFull("timeout")
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                optuna.storages.fail_stale_trials(self)
            time.sleep(self.poll_s)
