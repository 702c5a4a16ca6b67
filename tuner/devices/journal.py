"""Journal of original hardware state, written before the first write.

If the process dies (kill -9, power loss) between apply and restore, the
journal still holds what the board looked like, and ``tune restore`` puts it
back. One file per device; it is removed only after a successful restore.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from tuner.devices.base import Device
from tuner.errors import Terminated

JOURNAL_VERSION = 1


class JournalEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: int = JOURNAL_VERSION
    device: str
    kind: str
    pid: int
    written_at: float
    state: dict[str, Any]


def state_dir() -> Path:
    """Where journals live: $TUNE_STATE_DIR, else $XDG_STATE_HOME/powertune, else ~/.local/state/powertune."""
    if os.environ.get("TUNE_STATE_DIR"):
        return Path(os.environ["TUNE_STATE_DIR"])
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "powertune"


def journal_path(device_name: str) -> Path:
    safe = "".join(c if c.isalnum() or c in "-_." else "-" for c in device_name)
    return state_dir() / "journal" / f"{safe}.json"


def write_journal(device: Device, state: dict[str, Any]) -> Path:
    """Persist the original state atomically (write, fsync, rename), unless one is pending.

    A pending journal means an earlier run died before restoring: its state is
    the true original, so it must not be overwritten by the current (changed) one.
    """
    path = journal_path(device.name)
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    entry = JournalEntry(device=device.name, kind=device.kind, pid=os.getpid(), written_at=time.time(), state=state)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as fh:
        fh.write(entry.model_dump_json(indent=2))
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    return path


def read_journal(device_name: str) -> JournalEntry | None:
    path = journal_path(device_name)
    if not path.exists():
        return None
    return JournalEntry.model_validate(json.loads(path.read_text()))


def pending_journals() -> list[JournalEntry]:
    folder = state_dir() / "journal"
    if not folder.is_dir():
        return []
    return [JournalEntry.model_validate(json.loads(p.read_text())) for p in sorted(folder.glob("*.json"))]


def clear_journal(device_name: str) -> None:
    journal_path(device_name).unlink(missing_ok=True)


def restore_pending(device: Device) -> bool:
    """Restore a device from a journal left by a crashed run; True if there was one."""
    entry = read_journal(device.name)
    if entry is None:
        return False
    device.restore(entry.state)
    clear_journal(device.name)
    return True


@contextmanager
def hardware_session(device: Device) -> Iterator[dict[str, Any]]:
    """Hold a device for a run: journal its state first, restore it however the run ends.

    A journal left by a crashed earlier run is restored first, so the state
    read here is the board's true original. SIGTERM is turned into
    :class:`Terminated` for the duration, and Ctrl-C already raises
    KeyboardInterrupt, so success, exceptions, Ctrl-C and SIGTERM all reach
    the finally block. Twins hold no hardware, so nothing is journaled for them.
    """
    if device.simulated:
        yield {}
        return
    restore_pending(device)
    state = device.read_state()
    write_journal(device, state)

    def _on_term(signum: int, frame: Any) -> None:
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, _on_term)
    try:
        yield state
    finally:
        try:
            device.restore(state)
            clear_journal(device.name)
        finally:
            signal.signal(signal.SIGTERM, previous)
