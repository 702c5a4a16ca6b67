"""The ``tune`` command line: a thin Typer layer over the library.

Every command calls a library function; user mistakes surface as one line on
stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import signal
import sys

import typer

from tuner import interrupts
from tuner.cli import deploy, fleet, results, search, tuning
from tuner.errors import UserError

INTERRUPTED = 130  # what Click returns for Ctrl-C, and the shell's code for SIGINT
TERMINATED = 128 + signal.SIGTERM

app = typer.Typer(
    name="tune",
    help="Find the power mode and batch size that minimise energy per query under a latency bound.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
tuning.register(app)
results.register(app)
deploy.register(app)
fleet.register(app)
search.register(app)


def main() -> None:
    """Entry point of the console script."""
    interrupts.install_process_handlers()
    try:
        code = app(standalone_mode=False)
    except UserError as exc:
        typer.echo(f"error: {exc}", err=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        code = INTERRUPTED
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        sys.exit(1)
    except Exception as exc:
        # Click's usage errors (bad flag, missing option): Typer vendors Click in recent
        # releases and depends on it in older ones, so they are recognised by shape.
        show, exit_code = getattr(exc, "show", None), getattr(exc, "exit_code", None)
        if callable(show) and isinstance(exit_code, int):
            show()
            sys.exit(exit_code)
        raise
    if code == INTERRUPTED or interrupts.last_signal() is not None:
        code = _interrupted()
    if isinstance(code, int) and code:
        sys.exit(code)


def _interrupted() -> int:
    """Say what an interruption left behind; the exit code says which signal (130 Ctrl-C, 143 SIGTERM)."""
    from tuner.devices.journal import restored_devices

    restored = restored_devices()
    note = f"hardware state restored ({', '.join(dict.fromkeys(restored))})" if restored else "no hardware was changed"
    terminated = interrupts.last_signal() == signal.SIGTERM
    typer.echo(f"{'terminated' if terminated else 'interrupted'}: {note}", err=True)
    return TERMINATED if terminated else INTERRUPTED
