"""A `tune` command run as a user runs it, timed, and the line that says on what machine.

Shared by the start-up benchmarks (startup.py: the README's quick start;
command_startup.py: the light commands), which time this environment's
``tune`` script against earlier code with the same conditions, and by the
benchmarks that run a script against each version of the code in a child
(proposal_cost.py, proposal_identity.py: :func:`child_json`).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def tune_command() -> list[str]:
    """The ``tune`` console script of this environment, as the README runs it (``python -m tuner`` without one)."""
    script = Path(sys.executable).with_name("tune")
    return [str(script)] if script.exists() else [sys.executable, "-m", "tuner"]


def run_tune(args: list[str], cwd: Path | str, env: dict[str, str]) -> tuple[subprocess.CompletedProcess, float, float]:
    """``tune ARGS`` in CWD as a new process: what it did, its wall seconds and its CPU seconds (user + system)."""
    cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.monotonic()
    done = subprocess.run([*tune_command(), *args], cwd=cwd, env=env, capture_output=True, text=True)
    wall = time.monotonic() - began
    cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (cpu_after.ru_utime - cpu_before.ru_utime) + (cpu_after.ru_stime - cpu_before.ru_stime)
    return done, wall, cpu


def child_json(code: Path, script: str, args: list[str], env: dict[str, str], cwd: Path | str | None = None) -> Any:
    """``python -c SCRIPT ARGS`` on the code in CODE (its PYTHONPATH) as a new process: what it printed, as JSON."""
    done = subprocess.run(
        [sys.executable, "-c", script, *args],
        cwd=cwd,
        env={**env, "PYTHONPATH": str(code)},
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"{code} {' '.join(args)}: {done.stderr.strip().splitlines()[-1:]}")
    return json.loads(done.stdout)


def machine_line(load_before: tuple[float, float, float], load_after: tuple[float, float, float]) -> str:
    """Date, machine and the load average before and after, as the results files give them."""
    return (
        f"date: {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC; machine: {platform.node()} "
        f"({platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}); "
        f"load average before {load_before[0]:.1f} / {load_before[1]:.1f} / {load_before[2]:.1f}, "
        f"after {load_after[0]:.1f} / {load_after[1]:.1f} / {load_after[2]:.1f}"
    )
