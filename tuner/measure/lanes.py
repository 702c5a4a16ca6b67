"""What a window needs from a runner: its ``infer`` and the engines (lanes) that pull its batches."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol


class Runner(Protocol):
    """What a window needs from a runner (runners/base.py has the full protocol)."""

    def infer(self, size: int | None = None) -> int: ...


Lane = tuple[str, int, Callable[[int | None], int]]


def lanes_of(runner: Runner, batch_size: int) -> list[Lane]:
    """The engines that pull batches from the window's one queue: ``(name, batch size, infer)`` each.

    A runner with several engines (the GPU and the DLAs beside it) lists them
    in ``lanes()``; any other runner is one lane, ``main``, at the study's
    batch size.
    """
    lanes = getattr(runner, "lanes", None)
    listed = list(lanes()) if callable(lanes) else []
    return listed or [("main", batch_size, runner.infer)]
