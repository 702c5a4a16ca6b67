import os
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def isolated_state(tmp_path, monkeypatch):
    """Journals of every test go to its own folder, never to the user's state dir."""
    monkeypatch.setenv("TUNE_STATE_DIR", str(tmp_path / "state"))


def run_cli(
    *args: str, cwd: Path | None = None, env: dict | None = None, timeout: float = 300
) -> subprocess.CompletedProcess:
    """Drive the CLI exactly as a user's shell would: a new process, real exit code, real streams."""
    full_env = {**os.environ, **(env or {}), "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "tuner", *args], cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout
    )
