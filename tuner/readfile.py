"""Reading the files users hand to the tool: regular files only, and never more than a cap.

A named pipe in place of a policy, a trace or a rate file blocks ``open()``
and ``read()`` until a writer comes, and a signal does not end the wait (the
system call is retried); a device such as /dev/zero never ends. So a file is
opened without blocking, must be a regular file, and is read up to a size
cap; anything else is a one-line error naming the file.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from tuner.errors import UserError


def _open(path: Path, what: str) -> int:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise UserError(f"cannot read {what} {path}: {exc.strerror}; check the path") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UserError(f"{what} {path} is not a regular file (a folder, a pipe or a device?): check the path")
    return fd


def read_capped(path: Path, what: str, cap: int, fix: str) -> bytes:
    """The whole of a regular file no larger than ``cap`` bytes; anything else is a one-line error."""
    fd = _open(Path(path), what)
    try:
        if os.fstat(fd).st_size > cap:
            raise UserError(f"{what} {path} is larger than {_size(cap)}: {fix}")
        with os.fdopen(fd, "rb", closefd=False) as fh:
            data = fh.read(cap + 1)
    except OSError as exc:
        raise UserError(f"cannot read {what} {path}: {exc.strerror}; check the path") from None
    finally:
        os.close(fd)
    if len(data) > cap:
        raise UserError(f"{what} {path} is larger than {_size(cap)}: {fix}")
    return data


def read_tail(path: Path, what: str, size: int) -> bytes:
    """The last ``size`` bytes of a regular file (a log that only grows costs no more to read)."""
    fd = _open(Path(path), what)
    try:
        end = os.fstat(fd).st_size
        os.lseek(fd, max(0, end - size), os.SEEK_SET)
        return os.read(fd, size)
    except OSError as exc:
        raise UserError(f"cannot read {what} {path}: {exc.strerror}; check the path") from None
    finally:
        os.close(fd)


def _size(cap: int) -> str:
    return f"{cap >> 20} MiB" if cap >= 1 << 20 else f"{cap >> 10} KiB"
