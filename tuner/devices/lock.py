"""One tuner per device: an advisory lock file beside the device's journal.

Without it a second ``tune run`` on a board being tuned restores the board
under the first run and takes over its journal, and the first, when it ends,
resets the board in the middle of the second. The lock is an ``flock`` on
``<device>.lock``: the kernel drops it when its holder exits however it dies,
so a lock left by a dead process (kill -9, power loss) is simply taken over.
The file records the holder's PID and command line so the refusal can name
them. It is re-entrant within a process (a run holds it, and its hardware
session takes it again).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tuner.errors import UserError
from tuner.plumbing import atomicfile

_held: dict[str, list[int]] = {}  # path -> [fd, depth]


def _command() -> str:
    """This process's command line as the user typed it, with any storage password hidden."""
    args = ["tune", *sys.argv[1:]] if sys.argv and sys.argv[0].endswith(("tune", "__main__.py")) else sys.argv
    return " ".join(re.sub(r"(://[^:/@\s]*:)[^@\s]*@", r"\1***@", a) for a in args)


def _holder(fd: int) -> tuple[str, str]:
    os.lseek(fd, 0, os.SEEK_SET)
    try:
        data = json.loads(os.read(fd, 65536) or b"{}")
        return str(data.get("pid", "?")), str(data.get("command", "?"))
    except (ValueError, AttributeError):
        return "?", "?"


@contextmanager
def device_lock(path: Path, device_name: str) -> Iterator[None]:
    """Hold ``path`` for ``device_name`` for the duration, or refuse in one line naming the holder."""
    key = str(path)
    if key in _held:
        _held[key][1] += 1
        try:
            yield
        finally:
            _held[key][1] -= 1
        return
    while True:
        fd = atomicfile.open_lock(path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid, command = _holder(fd)
            os.close(fd)
            raise UserError(
                f"{device_name} is in use by PID {pid} ({command}): wait for it to finish or stop it "
                "(one tuner per device)"
            ) from None
        if atomicfile.lock_is_live(fd):
            break
        os.close(fd)  # removed by a command that created it and failed: take the new one
    holder = json.dumps({"pid": os.getpid(), "command": _command(), "since": time.time()}).encode()
    try:
        atomicfile.write_lock_holder(fd, path, holder)
    except UserError:
        os.close(fd)
        raise
    _held[key] = [fd, 1]
    try:
        yield
    finally:
        del _held[key]
        os.ftruncate(fd, 0)
        os.close(fd)  # closing drops the flock
