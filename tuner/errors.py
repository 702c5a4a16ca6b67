"""The errors a caller can tell apart.

Every mistake a user can make (bad flag, unknown model, corrupt file, missing
privilege) is a :class:`UserError` whose one-line message names the problem
and the fix. Its subclasses say where the problem lies, so a library caller
can catch one kind and let the others through::

    try:
        tuner.tune("resnet50", "orin", "50ms")
    except tuner.DeviceError as exc:
        print("no board here:", exc)

The CLI alone turns them into exit codes (tuner.cli.root.exit_code): 2 for
bad input, 1 when the input was fine and the device refused it
(:class:`DeviceRefused`); ``TUNE_DEBUG=1`` prints the traceback too.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class UserError(Exception):
    """A problem the user can fix; the message names the problem and the fix."""


class ConfigurationError(UserError):
    """Bad input: a flag, a number, a unit, a model or knob name, a space, export or policy file."""


class DeviceError(UserError):
    """A device that cannot be opened, read, changed or restored here (unknown, absent, no permission)."""


class DeviceRefused(DeviceError):
    """The input was fine, but the device did not take it, or could not be put back as it was."""


class StorageError(UserError):
    """The study storage: a URL or database that cannot be opened, or a study of another space."""


class MeasurementError(UserError):
    """A measurement that cannot be made or trusted: no meter, a runner that fails, a window too short."""


class NeedsReboot(DeviceRefused):
    """A configuration the device takes only after a reboot, which the tuner never does by itself.

    A study records such a trial as failed with this message and goes on
    without that configuration; a single command (``tune apply``) stops.
    """


class BoundUnmet(UserError):
    """No configuration measured met the latency bound: an answer, not bad input or a failure.

    The message names the fastest configuration measured, its latency and the
    bound that would admit it (tuner.records.unmet_bound); docs/cli-exit-codes.md
    lists every code (this one's is 3, mapped in tuner.cli.root).
    """


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
