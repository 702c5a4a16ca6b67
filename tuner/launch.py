"""The ``tune`` console script and ``python -m tuner``: signal handlers first, then the CLI.

Importing the CLI (Typer here; the command's module, with Optuna, pydantic and
NumPy, once Typer looks the command up) takes up to a second; a
Ctrl-C, SIGTERM, SIGHUP or SIGQUIT in that second, in a process that inherited SIGINT as
ignored, would otherwise be dropped, and the run would go on as if asked to.
One that lands during either import ends the process before anything was done;
one that lands after the command ended (while the process exits) ends it with
the signal's exit code and one line, never a traceback (tuner.plumbing.interrupts.exit_at_once).
(A signal that arrives before the interpreter runs this, in its first few
hundred milliseconds, is out of reach: an inherited "ignored" SIGINT is
discarded by the kernel then.)

``tune --version`` and ``tune --help`` import none of that: they are answered
from tuner.cli.catalog, so they return at once.
"""

from __future__ import annotations

import os
import signal
import sys


def main() -> None:
    if _answered_at_once(sys.argv[1:]):
        return
    # Before numpy loads: the search's matrices are a few dozen rows, and OpenBLAS threads on them
    # cost four times the CPU (they spin between calls, on the cores the runner measures on).
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    from tuner.plumbing.interrupts import ending, exit_at_once, held, install_process_handlers, last_signal

    install_process_handlers()
    try:
        with held():  # recorded, raised once the import is complete: never inside torch's C++ import
            from tuner.cli import main as cli_main
    except KeyboardInterrupt:
        signum = last_signal() or signal.SIGINT
        print(f"{ending(signum)}: nothing was started", file=sys.stderr)
        sys.exit(128 + signum)
    try:
        cli_main()
    except KeyboardInterrupt:  # Terminated too: a signal after the command ended, before the process did
        exit_at_once()
        signum = last_signal() or signal.SIGINT
        print(f"{ending(signum)}: after the command had ended", file=sys.stderr)
        sys.exit(128 + signum)
    finally:
        exit_at_once()


def _answered_at_once(argv: list[str]) -> bool:
    """Print the version or the command list for a bare ``--version``/``--help``; True if done."""
    if argv == ["--version"]:
        from tuner import __version__

        print(f"powertune {__version__}")
        return True
    if argv == ["--help"]:
        from tuner.cli.catalog import root_help

        print(root_help())
        return True
    return False
