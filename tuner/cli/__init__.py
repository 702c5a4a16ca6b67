"""The ``tune`` command line: a thin Typer layer over the library.

Every command calls a library function; user mistakes surface as one line on
stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import sys

import typer

from tuner.cli import deploy, fleet, results, search, serve, tuning
from tuner.errors import UserError

INTERRUPTED = 130  # what Click returns for Ctrl-C, and the shell's code for SIGINT

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
serve.register(app)


def main() -> None:
    """Entry point of the console script."""
    try:
        code = app(standalone_mode=False)
    except UserError as exc:
        typer.echo(f"error: {exc}", err=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        typer.echo("interrupted: hardware state restored", err=True)
        sys.exit(INTERRUPTED)
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
    if code == INTERRUPTED:
        typer.echo("interrupted: hardware state restored", err=True)
    if isinstance(code, int) and code:
        sys.exit(code)
