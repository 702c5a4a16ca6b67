"""A throwaway PostgreSQL cluster for tests: initdb in a temp folder, loopback only, a free port.

It needs the server binaries (initdb, pg_ctl, postgres) of any PostgreSQL
version; Debian installs them under /usr/lib/postgresql/<version>/bin, which
is not on PATH, so both places are searched. PostgreSQL refuses to run as
root, so as root the cluster belongs to the ``postgres`` user (created by the
Debian package) or, failing that, ``nobody``. Password authentication is on,
so tests see the real credential path.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

USER = "tune"
PASSWORD = "fleet-s3cret-pw"


def find_bin(name: str) -> str | None:
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), key=lambda p: int(p.split("/")[4]))
    return candidates[-1] if candidates else shutil.which(name)


def missing_binaries() -> list[str]:
    return [name for name in ("initdb", "pg_ctl", "postgres") if find_bin(name) is None]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class PgServer:
    port: int
    base: Path

    def url(self, database: str, with_password: bool = True) -> str:
        secret = f":{PASSWORD}" if with_password else ""
        return f"postgresql://{USER}{secret}@127.0.0.1:{self.port}/{database}"

    def env(self, database: str) -> dict[str, str]:
        """The standard libpq variables, for ``--storage postgresql://`` with nothing else in it."""
        return {
            "PGHOST": "127.0.0.1",
            "PGPORT": str(self.port),
            "PGUSER": USER,
            "PGPASSWORD": PASSWORD,
            "PGDATABASE": database,
        }

    def create_database(self, name: str) -> None:
        import psycopg

        with psycopg.connect(
            host="127.0.0.1", port=self.port, user=USER, password=PASSWORD, dbname="postgres", autocommit=True
        ) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')


def _server_user() -> pwd.struct_passwd | None:
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name)
    raise RuntimeError("running as root and neither a postgres nor a nobody user exists to own the test cluster")


@contextlib.contextmanager
def running_server() -> Iterator[PgServer]:
    """Start a private cluster, yield it, and remove it (immediate shutdown) however the tests end."""
    user = _server_user()
    # /tmp, not $TMPDIR: the server user must be able to reach the folder, and root's TMPDIR may be private.
    base = Path(tempfile.mkdtemp(prefix="powertune-pg-", dir="/tmp" if user is not None else None))
    as_user: dict = {}
    if user is not None:
        os.chown(base, user.pw_uid, user.pw_gid)
        as_user = {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}
    (base / "pw").write_text(PASSWORD + "\n")
    if user is not None:
        os.chown(base / "pw", user.pw_uid, user.pw_gid)
    data = base / "data"
    port = free_port()
    env = {**os.environ, "LC_ALL": "C", "LANG": "C", "HOME": str(base)}

    def run(*cmd: str) -> None:
        done = subprocess.run(cmd, env=env, cwd=base, capture_output=True, text=True, timeout=120, **as_user)
        if done.returncode != 0:
            log = (base / "log").read_text() if (base / "log").exists() else ""
            raise RuntimeError(f"{' '.join(cmd[:2])} failed: {done.stdout}{done.stderr}{log}")

    try:
        run(
            find_bin("initdb") or "initdb",
            "-D",
            str(data),
            "-U",
            USER,
            f"--pwfile={base / 'pw'}",
            "--auth=scram-sha-256",
            "-E",
            "UTF8",
            "--no-locale",
        )
        pg_ctl = find_bin("pg_ctl") or "pg_ctl"
        for attempt in range(5):
            # Another process (an xdist worker starting its own cluster) may take the free port first: take another.
            options = f"-p {port} -c listen_addresses=127.0.0.1 -k {base} -c max_connections=200 -c fsync=off"
            try:
                run(pg_ctl, "-D", str(data), "-o", options, "-l", str(base / "log"), "-w", "start")
                break
            except RuntimeError as exc:
                if attempt == 4 or "already in use" not in str(exc):
                    raise
                (base / "log").unlink(missing_ok=True)
                port = free_port()
        yield PgServer(port=port, base=base)
    finally:
        if (data / "postmaster.pid").exists():
            with contextlib.suppress(Exception):
                run(find_bin("pg_ctl") or "pg_ctl", "-D", str(data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(base, ignore_errors=True)


@contextlib.contextmanager
def server_for_tests() -> Iterator[PgServer]:
    """A private server for a fixture; without the binaries a test skips, or fails in CI (.ci/run installs them)."""
    import pytest

    missing = missing_binaries()
    if missing:
        reason = f"PostgreSQL server binaries not found ({', '.join(missing)}): apt-get install postgresql"
        if os.environ.get("CI"):
            pytest.fail(f"{reason} (.ci/run installs them, so CI must not skip)")
        pytest.skip(reason)
    with running_server() as server:
        yield server
