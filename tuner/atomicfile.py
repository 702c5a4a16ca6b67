"""Result files written whole or not at all: a temporary name beside the target, then a rename.

A SIGTERM or a full disk while a file is written in place leaves it empty or
cut short (a 0-byte pareto.json was seen); a rename is atomic, so a reader
sees the old file or the new one, never half of one.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

DEFAULT_UMASK = 0o022


def _umask() -> int:
    """The process umask, read without changing it (Linux shows it in /proc; elsewhere assume 022)."""
    with suppress(OSError, ValueError), open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    return DEFAULT_UMASK


@contextmanager
def replacing(path: Path) -> Iterator[Path]:
    """A fresh temporary path beside ``path`` (same suffix, so tools infer the format from it).

    When the block ends normally the file gets the permissions a plain
    ``open()`` would have given it and is renamed onto ``path``; on any error
    or interruption it is removed and ``path`` is left as it was.
    """
    path = Path(path)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=f".tmp{path.suffix}")
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text(path: Path, text: str) -> None:
    """``path.write_text(text)``, atomically."""
    with replacing(path) as tmp:
        tmp.write_text(text)
