"""Reading the files users hand to the tool: regular files only, never more than a cap, trusted if asked.

A named pipe in place of a policy, a trace or a rate file blocks ``open()``
and ``read()`` until a writer comes, and a signal does not end the wait (the
system call is retried); a device such as /dev/zero never ends. So a file is
opened without blocking, must be a regular file, and is read up to a size
cap; anything else is a one-line error naming the file.

A file that decides what root does (an export, a policy, a study, a token,
a governor state, a journal) is read with ``trusted=True``: the descriptor
just opened must pass :func:`tuner.plumbing.trust.check_file`, so the bytes read are
the ones checked. JSON is parsed here too, with its nesting depth, integer
size and finiteness bounded (:func:`parse_json`), so a hostile file is a
one-line error rather than a RecursionError or an OverflowError later.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
from itertools import accumulate
from pathlib import Path
from typing import Any

from tuner.errors import ConfigurationError, UserError
from tuner.plumbing import trust

MAX_DEPTH = 64
MAX_INT = 2**63 - 1
_STRINGS = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


def _open(path: Path, what: str, trusted: bool = False, secret: bool = False) -> int:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise ConfigurationError(f"cannot read {what} {path}: {exc.strerror}; check the path") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise ConfigurationError(f"{what} {path} is not a regular file (a folder, a pipe or a device?): check the path")
    if trusted or secret:
        try:
            trust.check_file(info, path, what, secret)
        except UserError:
            os.close(fd)
            raise
    return fd


def check_trusted(path: Path, what: str, secret: bool = False) -> None:
    """Refuse, in one line, an input file another user could have written (see :mod:`tuner.plumbing.trust`)."""
    os.close(_open(Path(path), what, trusted=True, secret=secret))


def read_capped(path: Path, what: str, cap: int, fix: str, trusted: bool = False, secret: bool = False) -> bytes:
    """The whole of a regular file no larger than ``cap`` bytes; anything else is a one-line error.

    ``trusted``: the file must be one :func:`tuner.plumbing.trust.file_problem` accepts;
    ``secret``: also unreadable by group and others (a token).
    """
    fd = _open(Path(path), what, trusted, secret)
    try:
        if os.fstat(fd).st_size > cap:
            raise ConfigurationError(f"{what} {path} is larger than {_size(cap)}: {fix}")
        with os.fdopen(fd, "rb", closefd=False) as fh:
            data = fh.read(cap + 1)
    except OSError as exc:
        raise ConfigurationError(f"cannot read {what} {path}: {exc.strerror}; check the path") from None
    finally:
        os.close(fd)
    if len(data) > cap:
        raise ConfigurationError(f"{what} {path} is larger than {_size(cap)}: {fix}")
    return data


def read_json(path: Path, what: str, cap: int, fix: str, trusted: bool = False) -> Any:
    """A JSON file read by :func:`read_capped` and parsed by :func:`parse_json`."""
    return parse_json(read_capped(path, what, cap, fix, trusted), f"{what} {path}", fix)


def parse_json(data: bytes | str, what: str, fix: str) -> Any:
    """JSON of bounded shape: at most MAX_DEPTH nested, integers within 64 bits, numbers finite.

    ``what`` names the source in the one-line error, ``fix`` says what to do.
    """
    raw = data.encode() if isinstance(data, str) else data
    if _depth(raw) > MAX_DEPTH:
        raise ConfigurationError(f"{what} is corrupt (nested more than {MAX_DEPTH} deep): {fix}")
    try:
        return json.loads(raw, parse_int=_int, parse_float=_float, parse_constant=_constant)
    except _OutOfRange as exc:
        raise ConfigurationError(f"{what} is corrupt (it holds {exc}): {fix}") from None
    except (ValueError, RecursionError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else "not JSON"
        raise ConfigurationError(f"{what} is corrupt (not valid JSON: {reason[:120]}): {fix}") from None


class _OutOfRange(ValueError):
    pass


def _int(text: str) -> int:
    if len(text) > 20 or abs(int(text)) > MAX_INT:
        raise _OutOfRange(f"an integer out of range ({text[:24]})")
    return int(text)


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _OutOfRange(f"a number out of range ({text[:24]})")
    return value


def _constant(text: str) -> float:
    raise _OutOfRange(f"{text}, which is not a number")


def _depth(raw: bytes) -> int:
    """The deepest bracket nesting outside strings, counted at C speed (re, translate, accumulate)."""
    brackets = _STRINGS.sub(b"", raw).translate(None, _NOT_BRACKETS)
    if not brackets:
        return 0
    steps = (1 if b in b"[{" else -1 for b in brackets)
    return max(accumulate(steps))


def read_tail(path: Path, what: str, size: int) -> bytes:
    """The last ``size`` bytes of a regular file (a log that only grows costs no more to read)."""
    fd = _open(Path(path), what)
    try:
        end = os.fstat(fd).st_size
        os.lseek(fd, max(0, end - size), os.SEEK_SET)
        return os.read(fd, size)
    except OSError as exc:
        raise ConfigurationError(f"cannot read {what} {path}: {exc.strerror}; check the path") from None
    finally:
        os.close(fd)


def _size(cap: int) -> str:
    return f"{cap >> 20} MiB" if cap >= 1 << 20 else f"{cap >> 10} KiB"
