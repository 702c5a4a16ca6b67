"""The ``tune`` console script and ``python -m tuner``: signal handlers first, then the CLI.

Importing the CLI (Typer, Rich, Optuna, pydantic) takes about a second; a
Ctrl-C or SIGTERM in that second, in a process that inherited SIGINT as
ignored, would otherwise be dropped, and the run would go on as if asked to.
"""

from __future__ import annotations


def main() -> None:
    from tuner.interrupts import install_process_handlers

    install_process_handlers()
    from tuner.cli import main as cli_main

    cli_main()
