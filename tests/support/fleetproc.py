"""Fleet workers as separate processes (fleet_worker.py beside it), for the fleet tests and benchmarks/fleet_kill.py.

A worker runs in a folder of its own, so PYTHONPATH names the source of the
tuner that started it: the worker then runs the code under test, not whatever
``PYTHONPATH=.`` means in its folder.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import tuner

WORKER = Path(__file__).with_name("fleet_worker.py")
SOURCE = str(Path(tuner.__file__).resolve().parents[1])


def child_env(extra: dict[str, str]) -> dict[str, str]:
    """The caller's environment plus ``extra``, importing this tuner first, with wide tables."""
    path = os.pathsep.join(p for p in (SOURCE, os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, **extra, "PYTHONPATH": path, "COLUMNS": "200"}


def start_worker(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.Popen:
    """``tune ARGS`` through the fleet worker in ``cwd``, its output captured as text."""
    return subprocess.Popen(
        [sys.executable, str(WORKER), *args],
        cwd=cwd,
        env=child_env(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
