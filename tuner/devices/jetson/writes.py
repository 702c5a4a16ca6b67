"""One step of applying a configuration, the (min, max) write order, and reads that may fail."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from tuner.devices.jetson import sysfs


class Write(NamedTuple):
    """One step of applying a configuration: a sysfs write, or the nvpmodel mode change.

    For the mode change ``path`` is the nvpmodel executable and ``value`` its
    arguments, so a dry run can print every step as the shell line it stands for.
    """

    path: str
    value: str

    def shell(self) -> str:
        if self.value.startswith("-m "):
            return f"{self.path} {self.value}"
        return f"echo {self.value} > {self.path}"


def _floor(table: list[int], value: int) -> int:
    """The highest table entry not above ``value``: what a cap lets the board run."""
    below = [f for f in table if f <= value]
    return max(below) if below else min(table)


def _try_read(path: Path) -> str | None:
    try:
        return sysfs.read(path)
    except OSError:
        return None


def _try_int(path: Path) -> int | None:
    try:
        return int(sysfs.read(path))
    except (OSError, ValueError):
        return None


def _pair(
    min_path: Path,
    max_path: Path,
    target: int | tuple[int, int],
    cur: tuple[int | None, int | None],
    include_all: bool,
) -> list[Write]:
    """Writes that move a (min, max) pair to ``target`` without ever having min above max."""
    lo, hi = (target, target) if isinstance(target, int) else target
    cur_lo, cur_hi = cur
    min_w = Write(str(min_path), str(lo)) if include_all or cur_lo != lo else None
    max_w = Write(str(max_path), str(hi)) if include_all or cur_hi != hi else None
    order = [max_w, min_w] if cur_hi is None or lo > cur_hi else [min_w, max_w]
    return [w for w in order if w is not None]
