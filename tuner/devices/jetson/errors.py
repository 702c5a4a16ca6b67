"""How a Jetson board refuses: a value it did not take, a mode needing a reboot, a restore left unfinished."""

from __future__ import annotations

from tuner.errors import ConfigurationError, DeviceRefused, NeedsReboot


class JetsonError(DeviceRefused):
    """A trial that must fail: the board did not take a configuration, or it ran too hot.

    The run stops there with one line naming the file and the rule (exit code 1, not 2: the
    input was fine, the board refused), after the hardware session has restored the board.
    """


class ApplyError(JetsonError):
    """The board did not take a value: read back differs, nvpmodel did not switch, write failed."""


class ModeNeedsReboot(ApplyError, NeedsReboot):
    """nvpmodel asked for a reboot to enter a mode: it was answered no, and the board is as it was."""


class MaskChangeRefused(NeedsReboot, ConfigurationError):
    """A mode whose TPC mask differs from the board's, not asked for by name: refused before any write.

    Once a GPU context exists nvpmodel can enter such a mode, or come back from
    it, only through a reboot; the tool never reboots, so it never goes there
    unless the user named the mode (see :meth:`JetsonDevice.offer_modes`).
    Bad input for ``tune apply`` (exit 2); a study never proposes such a mode.
    """

    exit_code = 2


class ThermalLimitError(JetsonError):
    """A thermal zone is above the limit: the trial is aborted and the board restored."""


class RestoreIncomplete(DeviceRefused):
    """Some saved values could not be put back: the journal stays, and the message says what remains."""


class JournalRefused(RestoreIncomplete, ConfigurationError):
    """A restore whose only failures are the journal's own values, refused against the board: bad input (exit 2)."""
