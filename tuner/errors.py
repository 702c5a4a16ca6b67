"""User-facing errors.

Every mistake a user can make (bad flag, unknown model, corrupt file, missing
privilege) is raised as :class:`UserError`; the CLI prints its one-line message
and exits with code 2, before any hardware write where the check allows it.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class UserError(Exception):
    """A problem the user can fix; the message names the problem and the fix."""

    exit_code = 2


class NeedsReboot(UserError):
    """A configuration the device takes only after a reboot, which the tuner never does by itself.

    A study records such a trial as failed with this message and goes on
    without that configuration; a single command (``tune apply``) stops.
    """

    exit_code = 1


class BoundUnmet(UserError):
    """No configuration measured met the latency bound: an answer, not bad input or a failure (exit code 3).

    The message names the fastest configuration measured, its latency and the
    bound that would admit it (tuner.records.unmet_bound); docs/cli-exit-codes.md
    lists every code.
    """

    exit_code = 3


class Terminated(KeyboardInterrupt):
    """SIGTERM, SIGHUP or SIGQUIT, turned into an exception so the same finally-blocks restore the hardware.

    ``signum`` says which (a dropped SSH session is SIGHUP); it sets the exit code, 128 + signum.
    """

    def __init__(self, signum: int = 15) -> None:
        super().__init__()
        self.signum = signum


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """' (did you mean resnet50?)' for a near miss among ``choices``, else ''.

    A typo is the commonest bad input; naming the likely intent is a better fix
    than a list the user has to scan.
    """
    close = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""
