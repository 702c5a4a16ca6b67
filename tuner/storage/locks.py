"""One lock among every process using a study storage, wherever they run."""

from __future__ import annotations

import contextlib
import os
import zlib
from collections.abc import Iterator

from tuner.plumbing import atomicfile
from tuner.storage.sqlite import sqlite_path
from tuner.storage.urls import driver_url, is_postgres


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
