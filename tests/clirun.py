"""Run ``tune`` as a user's shell would, for tests that need a real process.

A plain module beside the tests (like fakeboard.py and pgserver.py), not
conftest.py: pytest puts this folder on sys.path, so ``from clirun import
run_cli`` works under both ``pytest`` and ``python -m pytest``.
"""

import os
import subprocess
import sys
from pathlib import Path


def run_cli(
    *args: str, cwd: Path | None = None, env: dict | None = None, timeout: float = 300
) -> subprocess.CompletedProcess:
    """Drive the CLI exactly as a user's shell would: a new process, real exit code, real streams."""
    full_env = {**os.environ, **(env or {}), "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "tuner", *args], cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout
    )


def tiny_cpu(command: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """``tune <command>`` with the tiny CNN on this machine's CPU, in one-second LoadGen windows (the real path)."""
    return run_cli(command, "--model", "tiny-cnn", "--device", "cpu", "--window", "1", *args, env=env)
