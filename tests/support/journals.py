"""Every journal a test left behind, read the way ``tune restore`` reads them."""

from __future__ import annotations

from tuner.devices.journal import JournalEntry, journal_files, load_journal


def pending_journals() -> list[JournalEntry]:
    """Each journal file, parsed and checked; an empty list when the board is back as it was."""
    return [load_journal(p) for p in journal_files()]
