"""Files written whole or not at all, never through a link another user planted.

A SIGTERM or a full disk while a file is written in place leaves it empty or
cut short (a 0-byte pareto.json was seen); a rename is atomic, so a reader
sees the old file or the new one, never half of one. A full disk or a
folder that cannot be written is a one-line error, with the old file intact.

The tool often runs as root, in folders (a server's working folder) that a
less-trusted user may write. A name that user planted (``band.json.tmp ->
/etc/shadow``) must never be written through, so temporary files get fresh
names created with O_EXCL (which never follows a link), appended files are
opened with O_NOFOLLOW and must be the caller's own plain files, and a
folder that another user can write (other than a sticky one such as /tmp,
where nobody can rename another's file) is refused before anything is
written there.
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from tuner.errors import UserError

DEFAULT_UMASK = 0o022


def _umask() -> int:
    """The process umask, read without changing it (Linux shows it in /proc; elsewhere assume 022)."""
    with suppress(OSError, ValueError), open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    return DEFAULT_UMASK


def folder_problem(info: os.stat_result) -> str | None:
    """Why a folder is not safe to write in as this user (None: it is).

    Safe: owned by this user or root, and not writable by everyone, unless
    sticky (there nobody can rename or remove another's file). A folder's
    group is trusted as its owner granted it (/var/log is root:syslog 0775
    on Ubuntu); a folder writable by every user is not.
    """
    if info.st_uid not in (os.geteuid(), 0):
        return f"it is owned by another user (uid {info.st_uid})"
    if info.st_mode & stat.S_IWOTH and not info.st_mode & stat.S_ISVTX:
        return "other users can write to it"
    return None


def check_folder(folder: Path, what: str = "folder") -> None:
    """Refuse, in one line, to write in a folder another user could use to redirect the write."""
    folder = Path(folder)
    try:
        info = os.stat(folder)
    except OSError as exc:
        raise UserError(f"cannot write in {folder}: {exc.strerror}; give a folder that exists") from None
    if not stat.S_ISDIR(info.st_mode):
        raise UserError(f"{folder} is not a folder: give a path in a folder")
    problem = folder_problem(info)
    if problem is not None:
        raise UserError(
            f"refusing to write in the {what} {folder}: {problem}; use a folder only you can write "
            "(chmod o-w, or chown it)"
        )


def _write_error(path: Path, exc: OSError) -> UserError:
    reason = exc.strerror or str(exc)
    fix = "free some space" if exc.errno in (errno.ENOSPC, errno.EDQUOT) else "choose another path"
    return UserError(f"cannot write {path}: {reason}; {fix} (the old file, if any, is unchanged)")


@contextmanager
def replacing(path: Path, mode: int | None = None) -> Iterator[Path]:
    """A fresh temporary path beside ``path`` (same suffix, so tools infer the format from it).

    The temporary file is created with O_EXCL under a random name in a
    folder checked with :func:`check_folder`, with the permissions a plain
    ``open()`` would give (or ``mode``). When the block ends normally it is
    renamed onto ``path``; on any error or interruption it is removed and
    ``path`` is left as it was. An OSError (a full disk, a read-only folder)
    becomes a one-line :class:`UserError`.
    """
    path = Path(path)
    check_folder(path.parent if str(path.parent) else Path("."))
    try:
        fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=f".tmp{path.suffix}")
    except OSError as exc:
        raise _write_error(path, exc) from None
    tmp = Path(name)
    try:
        try:
            os.fchmod(fd, (0o666 & ~_umask()) if mode is None else mode)
        finally:
            os.close(fd)
        yield tmp
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise _write_error(path, exc) from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_bytes(path: Path, data: bytes, mode: int | None = None, sync: bool = False) -> None:
    """Write ``data`` to ``path`` atomically; ``sync`` flushes it to the disk before the rename."""
    with replacing(path, mode) as tmp:
        fd = os.open(tmp, os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            if sync:
                fh.flush()
                os.fsync(fh.fileno())


def write_text(path: Path, text: str, mode: int | None = None, sync: bool = False) -> None:
    """``path.write_text(text)``, atomically and never through a planted link."""
    write_bytes(path, text.encode(), mode, sync)


def append_line(path: Path, line: str) -> None:
    """Append one line to a log file of this user's, created if missing; never through a link or a hard link."""
    path = Path(path)
    check_folder(path.parent if str(path.parent) else Path("."))
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o666 & ~_umask())
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UserError(f"refusing to write {path}: it is a symbolic link; remove it") from None
        raise _write_error(path, exc) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1 or info.st_uid != os.geteuid():
            raise UserError(
                f"refusing to write {path}: not a plain file of this user's (a device, a pipe, a hard link?); "
                "remove it or give another path"
            )
        os.write(fd, (line.rstrip("\n") + "\n").encode())
    except OSError as exc:
        raise _write_error(path, exc) from None
    finally:
        os.close(fd)


def check_target(path: Path, flag: str) -> None:
    """Before any work: ``path`` can be written here (by :func:`replacing` or :func:`append_line`).

    Its nearest existing folder must be one :func:`check_folder` accepts
    where it is the file's own folder, and must take a new file: a
    temporary one is created there and removed at once, which catches what
    permission bits do not show (a read-only mount, /sys, /proc).
    """
    path = Path(path).absolute()
    if os.path.islink(path) or (os.path.lexists(path) and not os.path.isfile(path)):
        raise UserError(f"{flag} {path} is a link or not a regular file: remove it or give another path")
    folder = next((p for p in path.parents if os.path.lexists(p)), Path("/"))
    if not os.path.isdir(folder):
        raise UserError(f"{flag} {path}: {folder} is not a folder: give a path in a folder")
    if folder == path.parent:
        check_folder(folder)
    try:
        fd, name = tempfile.mkstemp(dir=folder, prefix=".tune-probe.")
    except OSError as exc:
        raise UserError(
            f"{flag} {path}: cannot write in {folder} ({exc.strerror}): give a path you can write"
        ) from None
    os.close(fd)
    os.unlink(name)
