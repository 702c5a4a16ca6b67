"""The ``tune`` command line: a thin Typer layer over the library (tuner.cli.root builds it).

This package's own import is light: ``app`` and ``main`` are loaded from
tuner.cli.root on first use, so tuner.cli.catalog (what ``tune --help`` lists)
can be read without importing Typer, Optuna or NumPy.
"""

from __future__ import annotations

from typing import Any

_FROM_ROOT = ("INTERRUPTED", "TERMINATED", "app", "main", "usage_line")


def __getattr__(name: str) -> Any:
    if name in _FROM_ROOT:
        from tuner.cli import root

        return getattr(root, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
