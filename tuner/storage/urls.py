"""Storage URLs: what ``--storage`` names, the driver URL, and passwords kept out of every message.

Users type ``postgresql://user:pass@host/db`` (or just ``postgresql://`` and
let libpq read PGHOST, PGPORT, PGUSER, PGPASSWORD and PGDATABASE); SQLAlchemy
would pick the psycopg2 driver for that scheme, so the URL is rewritten to the
psycopg 3 dialect that the ``postgres`` extra installs. Passwords never leave
this module in clear: every URL that is printed or stored goes through
:func:`redact`, and every driver error through :func:`scrub`.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote, unquote

from tuner.errors import UserError

PG_SCHEMES = ("postgresql", "postgres")
PG_DIALECT = "postgresql+psycopg"
RDB_PREFIXES = ("sqlite", "postgresql", "postgres", "mysql", "oracle", "mssql")
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
