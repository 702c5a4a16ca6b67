"""Run ``tune`` as a user's shell would, for tests that need a real process.

A plain module in tests/support/ (like pgserver.py; the fakes are in
tests/fakes/), not conftest.py: tests/conftest.py puts both folders on
sys.path, so ``from clirun import run_cli`` works under both ``pytest`` and
``python -m pytest``.
"""

import hashlib
import os
import stat
import subprocess
import sys
import time
from collections.abc import Callable
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


def wait_while_running(check: Callable[[], bool], proc: subprocess.Popen, timeout: float = 120.0) -> None:
    """Poll ``check`` until it holds, failing with the process's output if it exits first or time runs out.

    The timeout is generous on purpose: it only bounds a hung test on a loaded machine; nothing is timed.
    """
    deadline = time.monotonic() + timeout
    while not check():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"still waiting after {timeout:.0f} s"
        time.sleep(0.1)


def in_process(*args: str) -> tuple[int, str, str]:
    """``tune ARGS`` in this process (tuner.cli.main): exit code, stdout and stderr as text."""
    import io
    from contextlib import redirect_stderr, redirect_stdout

    from tuner.cli import main

    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            main(list(args))
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
    return code, out.getvalue(), err.getvalue()


def folder_state(root: Path) -> dict[str, tuple]:
    """Every path under ``root`` with its type, size, mtime and content hash, to show a command wrote nothing.

    Only regular files of up to 1 MiB are read, so a named pipe planted as bad input is never opened.
    """
    found: dict[str, tuple] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames:
            found[os.path.relpath(os.path.join(dirpath, name), root)] = ("dir",)
        for name in filenames:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            digest = ""
            if stat.S_ISREG(st.st_mode) and st.st_size <= 1 << 20:
                with open(path, "rb") as fh:
                    digest = hashlib.sha1(fh.read()).hexdigest()
            found[os.path.relpath(path, root)] = (stat.S_IFMT(st.st_mode), st.st_size, st.st_mtime_ns, digest)
    return found
