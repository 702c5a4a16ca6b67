"""The ``tune`` app: every command registered on one Typer application, and its entry point.

Each command is a plain function in the module of its kind (tuning, results,
deploy, verify, fleet, search, serve, report, meters); COMMANDS names them all, in the
order ``tune --help`` lists them (tuner.cli.catalog). A command's module is
imported when the command is looked up, not before: ``tune status`` loads what
status needs, not the twins, the serving planner or the report (each command
module imports a different part of the library, a third of a second together).

Every command calls a library function; user mistakes surface as one line on
stderr and exit code 2, never a traceback. That includes Click's own usage
errors (a mistyped flag, a value that is not a number): they are printed as
one line with the fix, not as a usage box.
"""

from __future__ import annotations

import importlib
import os
import signal
import sys
import traceback
from collections.abc import Iterator, MutableMapping
from typing import Any

import typer
import typer.main
from typer.core import TyperCommand, TyperGroup

from tuner import __version__
from tuner.errors import BoundUnmet, ConfigurationError, DeviceRefused, UserError
from tuner.plumbing import atomicfile, interrupts

INTERRUPTED = 130  # what Click returns for Ctrl-C, and the shell's code for SIGINT
TERMINATED = 128 + signal.SIGTERM

COMMANDS: dict[str, str] = {
    "run": "tuning.run",
    "sweep": "tuning.sweep",
    "measure": "tuning.measure",
    "pareto": "results.pareto",
    "export": "results.export",
    "dashboard": "results.dashboard",
    "apply": "deploy.apply",
    "restore": "deploy.restore",
    "verify": "verify.verify",
    "status": "fleet.status",
    "bench": "search.bench",
    "roofline": "search.roofline",
    "devices": "search.devices",
    "plan": "serve.plan",
    "govern": "serve.govern",
    "replay": "serve.replay_cmd",
    "report": "report.report",
    "meter-serve": "meters.meter_serve",
}
"""Each command's function, as ``module.function`` under tuner.cli."""


def command(name: str) -> TyperCommand:
    """The Click command of ``tune NAME``, its module imported now.

    A signal during the import is held and raised once it is complete (as
    tuner.launch does for this module), never inside a library's C import.
    """
    with interrupts.held():
        from tuner.cli.options import CheckedCommand

        module, function = COMMANDS[name].rsplit(".", 1)
        callback = getattr(importlib.import_module(f"tuner.cli.{module}"), function)
    one = typer.Typer(add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None)
    one.command(name, cls=CheckedCommand)(callback)
    built = typer.main.get_command(one)
    assert isinstance(built, TyperCommand)
    return built


class _Commands(MutableMapping[str, TyperCommand]):
    """The group's commands by name, in COMMANDS' order; each is built the first time it is looked up."""

    def __init__(self) -> None:
        self._built: dict[str, TyperCommand] = {}

    def __getitem__(self, name: str) -> TyperCommand:
        if name not in self._built:
            if name not in COMMANDS:
                raise KeyError(name)
            self._built[name] = command(name)
        return self._built[name]

    def __setitem__(self, name: str, value: TyperCommand) -> None:
        self._built[name] = value

    def __delitem__(self, name: str) -> None:
        del self._built[name]

    def __iter__(self) -> Iterator[str]:
        return iter([*COMMANDS, *(name for name in self._built if name not in COMMANDS)])

    def __len__(self) -> int:
        return len(set(COMMANDS) | set(self._built))


class _Group(TyperGroup):
    """Typer's group with the lazily built commands: listing them (and "Did you mean") imports nothing."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.commands = _Commands()


app = typer.Typer(
    name="tune",
    help="Find the power mode and batch size that minimise energy per query under a latency bound.",
    cls=_Group,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"powertune {__version__}")
        raise typer.Exit()


Version = typer.Option(False, "--version", callback=_version, is_eager=True, help="print the version and exit")


@app.callback()
def _root(version: bool = Version) -> None:
    """Find the power mode and batch size that minimise energy per query under a latency bound."""


def usage_line(exc: Exception) -> str:
    """One line for a Click usage error: Click's own message (with its "Did you mean") and where help is."""
    message = " ".join(str(exc.format_message()).split()) if hasattr(exc, "format_message") else str(exc)
    ctx = getattr(exc, "ctx", None)
    path = getattr(ctx, "command_path", None) or "tune"
    return f"error: {message.rstrip('.')}: see {path} --help"


BOUND_UNMET = 3


def exit_code(exc: UserError) -> int:
    """The exit code of a user error: 2 for bad input, 1 when the input was fine and the device refused it,
    3 when no configuration met the bound (an answer, docs/cli-exit-codes.md).

    The one place errors become exit codes; the library raises classes (tuner.errors) and never
    names a code. Bad input outranks a refusal (a journal whose own values the board refused is 2).
    """
    if isinstance(exc, BoundUnmet):
        return BOUND_UNMET
    if isinstance(exc, DeviceRefused) and not isinstance(exc, ConfigurationError):
        return 1
    return 2


def _say(exc: UserError) -> None:
    """The error's one line on stderr, after its traceback when ``TUNE_DEBUG=1`` asks for it."""
    if os.environ.get("TUNE_DEBUG") == "1":
        traceback.print_exception(exc, file=sys.stderr)
    typer.echo(f"error: {' '.join(str(exc).split())}", err=True)


def main(argv: list[str] | None = None) -> None:
    """Entry point of the console script (``argv`` lets tests call it in-process)."""
    interrupts.install_process_handlers()
    try:
        with atomicfile.undone_on_failure():
            code = app(args=argv, prog_name="tune", standalone_mode=False)
    except UserError as exc:
        _say(exc)
        sys.exit(exit_code(exc))
    except KeyboardInterrupt:
        code = INTERRUPTED
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        sys.exit(1)
    except Exception as exc:
        # Click's usage errors (bad flag, missing option): Typer vendors Click in recent
        # releases and depends on it in older ones, so they are recognised by shape.
        show, click_code = getattr(exc, "show", None), getattr(exc, "exit_code", None)
        if callable(show) and isinstance(click_code, int):
            if type(exc).__name__ == "NoArgsIsHelpError":
                show()  # a bare `tune` or `tune run`: the help is the answer
            else:
                typer.echo(usage_line(exc), err=True)
            sys.exit(click_code)
        raise
    if code == INTERRUPTED or interrupts.last_signal() is not None:
        code = _interrupted()
    if isinstance(code, int) and code:
        sys.exit(code)


def _interrupted() -> int:
    """Say what an interruption left behind; the exit code is 128 + the signal (130 Ctrl-C, 143 SIGTERM, 129 SIGHUP)."""
    from tuner.devices.hardware_session import left_behind

    signum = interrupts.last_signal() or signal.SIGINT
    typer.echo(f"{interrupts.ending(signum)}: {left_behind()}", err=True)
    return 128 + signum
