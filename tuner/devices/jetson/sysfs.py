"""Reading and writing a Jetson's sysfs files the way the kernel expects, and no other way.

Writes open an existing attribute for writing only: never ``O_CREAT`` (nothing
can be created under /sys, so a missing file is a finding, not something to
make), never through a symlink at the attribute itself (``O_NOFOLLOW``: sysfs
attributes are never links, so one planted there is refused), and never to a
file whose real path leaves the sysfs root the board was found under (a linked
folder pointing elsewhere). Reads strip the trailing newline and the NUL the
device tree puts at the end of its strings.

Whether this user may read or write a file is asked of :data:`access`
(``os.access``: the kernel's own check for the real uid), so a test run as root
can stand in for another user (tests/fakes/fakeboard.py ``as_user``).
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path

access: Callable[[Path, int], bool] = os.access


class BoardWriteError(OSError):
    """A write the kernel (or the root check) refused; ``rule`` says why in words."""

    def __init__(self, path: Path, code: int, rule: str) -> None:
        super().__init__(code, os.strerror(code), str(path))
        self.rule = rule


def read(path: Path) -> str:
    """An attribute's text without trailing newline, spaces or NUL."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        data = os.read(fd, 1 << 16)
    finally:
        os.close(fd)
    return data.decode(errors="replace").strip().strip("\0").strip()


def is_file(path: Path) -> bool:
    """Like Path.is_file, but False where a non-root user may not look (debugfs is root-only)."""
    try:
        return path.is_file()
    except OSError:
        return False


def can_read(path: Path) -> bool:
    """The file exists and this user may read it."""
    return is_file(path) and access(path, os.R_OK)


def can_write(path: Path) -> bool:
    """This user may open the file for writing (the kernel may still refuse the value)."""
    return access(path, os.W_OK)


def denied(path: Path) -> bool:
    """The file is there, or a folder on its way cannot be searched, but this user may not read it."""
    try:
        there = path.is_file()
    except PermissionError:
        return True
    except OSError:
        return False
    if not there:
        return any(not access(folder, os.X_OK) for folder in path.parents if folder.is_dir())
    return not access(path, os.R_OK)


def ints(text: str) -> list[int]:
    """The integers of a frequency list ("114750000 216750000 ... " ends with a space on a board)."""
    return sorted({int(tok) for tok in text.split() if tok.isdigit()})


def inside(root: Path, path: Path) -> bool:
    """True if the file's real path stays under the real sysfs root."""
    real_root = os.path.realpath(root)
    real = os.path.realpath(path)
    return real == real_root or real.startswith(real_root.rstrip("/") + "/")


def write(root: Path, path: Path, value: str) -> None:
    """Write one value to an existing attribute (see the module docstring for what is refused)."""
    if not inside(root, path):
        raise BoardWriteError(path, errno.EXDEV, f"it leads outside the sysfs root {root}")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise BoardWriteError(path, exc.errno or errno.EIO, _rule(path, exc.errno)) from None
    try:
        os.write(fd, f"{value}\n".encode())
    except OSError as exc:
        raise BoardWriteError(path, exc.errno or errno.EIO, _rule(path, exc.errno)) from None
    finally:
        os.close(fd)


def _rule(path: Path, code: int | None) -> str:
    """The kernel rule a refused write most likely broke, in the words a user can act on."""
    name = path.name
    if code == errno.ELOOP:
        return "the attribute is a symlink, which sysfs never has: refusing to follow it"
    if code == errno.ENOENT:
        return "the attribute does not exist on this board (nothing can be created under /sys)"
    if name in ("scaling_min_freq", "scaling_max_freq", "scaling_governor") and code in (
        errno.EPERM,
        errno.EBUSY,
        errno.EINVAL,
    ):
        return "the kernel refuses the limits of a CPU cluster whose cores are all offline"
    if code == errno.EACCES:
        return "the attribute is read-only, or changing clocks needs root (run with sudo)"
    if code == errno.EINVAL:
        return "the kernel refused the value (not one this attribute accepts)"
    return "the kernel refused the write"
