"""A real full disk for tests: a small tmpfs mounted (as root) over a fresh folder, filled to the byte.

A monkeypatched ``os.write`` shows what one call does with ENOSPC; a real
filesystem that runs out shows what SQLite, the kernel and every write path
do together (SQLite's SQLITE_FULL, a short write, a rename onto a full
folder). Where mounting is not allowed (not root, or no CAP_SYS_ADMIN in a
container) the tests that need it are skipped, saying why.
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def small_disk(folder: Path, size_kib: int) -> Iterator[Path]:
    """``folder`` as a tmpfs of ``size_kib`` KiB for the duration (unmounted afterwards)."""
    folder.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        pytest.skip("a real full disk needs root (mount -t tmpfs)")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_kib}k,mode=0755", "tmpfs", str(folder)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def fill(folder: Path, leave: int = 0) -> None:
    """Fill the filesystem of ``folder`` until at most ``leave`` bytes are free (one file, ``fill``)."""
    with open(folder / "fill", "ab") as fh:
        chunk = b"\0" * 4096
        while True:
            info = os.statvfs(folder)
            if info.f_bavail * info.f_frsize <= leave:
                return
            try:
                fh.write(chunk)
                fh.flush()
            except OSError as exc:
                if exc.errno == errno.ENOSPC:
                    return
                raise
