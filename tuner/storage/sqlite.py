"""An SQLite study file: its path in a URL, and the checks before SQLite opens it."""

from __future__ import annotations

import contextlib
from pathlib import Path
from urllib.parse import quote

from tuner.errors import UserError
from tuner.plumbing import atomicfile, readfile


def prepare_sqlite(url: str, readonly: bool) -> None:
    """An SQLite study file checked before SQLite opens it (other storages: nothing to do).

    A writer gets the file created by :func:`tuner.plumbing.atomicfile.create_file`
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
