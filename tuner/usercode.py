"""Running a user's own Python (device plugins, model factories): every failure is one line.

A plugin module can fail in any way while it is imported or called (a
SyntaxError, an exception, ``sys.exit()``, even ``os._exit()``, which ends
the process at once with no message). Inside :func:`user_code` each becomes
a :class:`UserError` naming the plugin; ``os._exit`` is replaced for the
duration so that it raises instead of ending the process.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from tuner.errors import UserError


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
