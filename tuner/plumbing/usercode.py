"""Running a user's own Python (device and meter plugins, model factories): one import rule, one-line failures.

Every ``py:package.module:name`` (``--device``, ``--meter``, ``--model``) is
found by :func:`import_module` the way ``python -m`` finds a module: the
working folder first, then ``PYTHONPATH`` and the installed packages. Before
a line of it runs, each file that would be executed (the module and the
packages above it) and the folder holding it must pass the trust rule
(:mod:`tuner.plumbing.trust`): as root, a module another user can rewrite would run
their code as root.

A plugin module can fail in any way while it is imported or called (a
SyntaxError, an exception, ``sys.exit()``, even ``os._exit()``, which ends
the process at once with no message). Inside :func:`user_code` each becomes
a :class:`UserError` naming the plugin; ``os._exit`` is replaced for the
duration so that it raises instead of ending the process.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

from tuner.errors import UserError
from tuner.plumbing import trust

PREFIX = "py:"


class _ExitCalled(BaseException):
    """``os._exit`` called by user code (raised in its place)."""


@contextmanager
def user_code(what: str, fix: str) -> Iterator[None]:
    """Run the block as ``what`` (e.g. "plugin py:m:C"); its failures become one line ending in ``fix``."""
    real_exit = os._exit

    def refuse_exit(code: int) -> None:
        raise _ExitCalled(code)

    os._exit = refuse_exit  # type: ignore[assignment]
    try:
        yield
    except UserError:
        raise
    except _ExitCalled as exc:
        raise UserError(f"{what} called os._exit({exc.args[0]!r}): a plugin must raise instead; {fix}") from None
    except SystemExit as exc:
        raise UserError(f"{what} called sys.exit({exc.code!r}): a plugin must raise instead; {fix}") from None
    except Exception as exc:
        raise UserError(f"{what} failed: {type(exc).__name__}: {' '.join(str(exc).split())[:200]}; {fix}") from None
    finally:
        os._exit = real_exit  # type: ignore[assignment]


def split_target(spec: str, flag: str, example: str) -> tuple[str, str]:
    """``py:package.module:name`` split into the module path and the name; a malformed one names ``example``."""
    module, sep, name = spec.removeprefix(PREFIX).rpartition(":")
    if not (spec.startswith(PREFIX) and sep and module and name.isidentifier()) or not all(
        part.isidentifier() for part in module.split(".")
    ):
        raise UserError(f"cannot read {flag} {spec}: write {example} (a module path, a colon, a name)")
    return module, name


def _search_path() -> list[str]:
    """Where a ``py:`` module is looked for: the working folder first, as ``python -m`` does, then sys.path."""
    cwd = os.getcwd()
    return [cwd, *(p for p in sys.path if p not in ("", cwd))]


def _check_trusted(origin: str, module: str, flag: str, spec: str) -> None:
    """The trust rule on a file that would be run and on its folder (no link, no other user's hand in either)."""
    path = Path(origin)
    for what, target in (("folder", path.parent), ("file", path)):
        try:
            info = os.stat(target)
        except OSError as exc:
            raise UserError(f"cannot read {target} for {flag} {spec}: {exc.strerror}") from None
        problem = trust.folder_problem(info) if what == "folder" else trust.file_problem(info)
        if problem is not None:
            fix = trust.folder_fix(problem) if what == "folder" else f"chmod go-w {target} (or chown it)"
            raise UserError(
                f"refusing to run {module} for {flag} {spec}: the {what} {target}: {problem}, so anyone "
                f"who can change it would run code as this user; {fix}"
            )


def find_module(module: str, flag: str, spec: str) -> str:
    """Find ``module`` and each package above it without running any of them, and check every file found.

    Returns the module's file ("" for a namespace package or a built-in), which
    callers key caches on.
    """
    locations: list[str] | None = _search_path()
    origin = ""
    parts = module.split(".")
    for depth in range(1, len(parts) + 1):
        name = ".".join(parts[:depth])
        loaded = sys.modules.get(name)
        if loaded is not None:
            locations = list(getattr(loaded, "__path__", None) or [])
            origin = getattr(loaded, "__file__", None) or ""
            continue
        found = importlib.machinery.PathFinder.find_spec(name, locations)
        if found is None:
            raise UserError(
                f"cannot import {module} for {flag} {spec}: cannot find module {name!r}; run from the folder "
                "that holds it, or check PYTHONPATH"
            )
        origin = found.origin if found.origin and found.has_location else ""
        if origin:
            _check_trusted(origin, module, flag, spec)
        locations = list(found.submodule_search_locations or [])
    return origin


def import_module(module: str, flag: str, spec: str) -> ModuleType:
    """The module a ``py:`` spec names, found and checked by the one rule (see the module docstring), imported."""
    find_module(module, flag, spec)
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    with user_code(f"importing {module} for {flag} {spec}", "fix the module"):
        return importlib.import_module(module)


def import_target(spec: str, flag: str, example: str) -> Any:
    """The object ``py:package.module:name`` names (a plugin's factory), by :func:`import_module`."""
    module_name, name = split_target(spec, flag, example)
    module = import_module(module_name, flag, spec)
    if not hasattr(module, name):
        raise UserError(f"{module_name} has no {name!r} for {flag} {spec}: check the name")
    return getattr(module, name)
