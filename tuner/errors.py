"""User-facing errors.

Every mistake a user can make (bad flag, unknown model, corrupt file, missing
privilege) is raised as :class:`UserError`; the CLI prints its one-line message
and exits with code 2, before any hardware write where the check allows it.
"""


class UserError(Exception):
    """A problem the user can fix; the message names the problem and the fix."""

    exit_code = 2


class Terminated(KeyboardInterrupt):
    """SIGTERM, turned into an exception so the same finally-blocks restore the hardware."""
