"""The journal file: a device's original state, written before the first write.

If the process dies (kill -9, power loss) between apply and restore, the
journal still holds what the board looked like, and ``tune restore`` puts it
back (tuner.devices.hardware_session). One file per physical device, named
by :func:`device_key` (whatever name the device was opened by: ``orin`` and
``orin-agx`` are one board), in one state folder per machine for root
(``/var/lib/powertune``: ``sudo tune`` and a root shell find the same
journal); it is removed only after a successful restore.

The tool often runs as root, so the state folder is private (0700), journals
are created under fresh names with O_EXCL (0600, never through a planted
symbolic link) and renamed into place, and a journal is only ever read as a
regular file, never through a link. A journal that cannot be read is a
one-line error naming the file, never a traceback.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from tuner.devices.base import Device
from tuner.errors import UserError
from tuner.plumbing import atomicfile, readfile

JOURNAL_VERSION = 1
MAX_JOURNAL_BYTES = 1 << 20


class JournalEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: int = JOURNAL_VERSION
    device: str
    kind: str
    pid: int
    written_at: float
    state: dict[str, Any]
    key: str | None = None  # the device_key the file is named by (absent: the device's name)


SYSTEM_STATE_DIR = Path("/var/lib/powertune")


def device_key(device: Device) -> str:
    """The physical device a journal and lock belong to: ``device.physical_key`` where it has one, else its name.

    A backend whose device can be reached by several names (a Jetson board as
    ``orin`` or ``orin-agx``, a GPU by index or UUID) sets ``physical_key`` to
    something of the hardware itself (the board's serial number, the GPU's UUID),
    so every name finds one lock and one journal.
    """
    key = getattr(device, "physical_key", None)
    return key if isinstance(key, str) and key else device.name


def journal_key(device: Device) -> str:
    """The name the device's journal is filed under: its :func:`device_key`, or its own name for a journal
    filed by name (by a version of the tool that named journals so) while none is filed under the key."""
    key = device_key(device)
    if key != device.name and not os.path.lexists(journal_path(key)) and os.path.lexists(journal_path(device.name)):
        return device.name
    return key


def state_dir() -> Path:
    """Where journals live: $TUNE_STATE_DIR; for root /var/lib/powertune; else the user's XDG state folder.

    Root's is one folder per machine, not per home: ``sudo tune`` keeps HOME (and
    XDG_STATE_HOME) on some systems and not on others, and a crash's journal must
    be found by whichever root shell runs ``tune restore``.
    """
    if os.environ.get("TUNE_STATE_DIR"):
        return Path(os.environ["TUNE_STATE_DIR"])
    if os.geteuid() == 0:
        return SYSTEM_STATE_DIR
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "powertune"


def _safe(device_name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in device_name).lstrip(".") or "-"


def journal_path(device_name: str) -> Path:
    return state_dir() / "journal" / f"{_safe(device_name)}.json"


def lock_path(device_name: str) -> Path:
    return state_dir() / "journal" / f"{_safe(device_name)}.lock"


def journal_dir() -> Path:
    """The private journal folder, created 0700 (with any missing parents) and checked to be this user's.

    A state folder or journal folder reached through a link, owned by
    another user, or one that another user can write, is refused: whoever
    can write there can plant a journal that a restore would trust, or
    remove the one a crash left.
    """
    folder = state_dir() / "journal"
    try:
        return atomicfile.ensure_folder(folder, private=True)
    except UserError as exc:
        raise UserError(
            f"refusing the state folder {folder}: {exc}; or set TUNE_STATE_DIR to a folder only you can write"
        ) from None


def write_journal(device: Device, state: dict[str, Any]) -> Path:
    """Persist the original state atomically (fresh 0600 file, fsync, rename), unless one is pending.

    A pending journal means an earlier run died before restoring: its state is
    the true original, so it must not be overwritten by the current (changed) one.
    """
    key = journal_key(device)
    path = journal_path(key)
    if os.path.lexists(path):
        return path
    journal_dir()
    entry = JournalEntry(
        device=device.name,
        kind=device.kind,
        pid=os.getpid(),
        written_at=time.time(),
        state=state,
        key=None if key == device.name else key,
    )
    try:
        text = entry.model_dump_json(indent=2)
    except (ValueError, TypeError) as exc:  # a plugin's read_state() returned what JSON cannot hold
        raise UserError(
            f"{device.name}'s state cannot be saved ({str(exc).splitlines()[0]}): its read_state() must return "
            "plain JSON values; see docs/plugins.md"
        ) from None
    atomicfile.write_text(path, text, mode=0o600, sync=True)
    return path


def fix_hint(path: Path) -> str:
    return (
        f"repair or remove {path} (it holds the state from before tuning; remove it once the device is as you want it)"
    )


def load_journal(path: Path) -> JournalEntry:
    """Read one journal file: a trusted regular file, bounded JSON, the known format, named after its device."""
    if os.path.islink(path):
        raise UserError(f"cannot read journal {path}: it is a symbolic link; {fix_hint(path)}")
    data = readfile.read_json(path, "journal", MAX_JOURNAL_BYTES, fix_hint(path), trusted=True)
    try:
        entry = JournalEntry.model_validate(data)
    except ValidationError as exc:
        raise UserError(f"journal {path} is corrupt ({_first_error(exc)}); {fix_hint(path)}") from None
    if entry.version != JOURNAL_VERSION:
        raise UserError(
            f"journal {path} has version {entry.version}, this tool reads {JOURNAL_VERSION}; "
            "restore with the tool that wrote it"
        )
    if journal_path(entry.key or entry.device).name != path.name:
        raise UserError(f"journal {path} names device {entry.device!r}, not the one it is filed for; {fix_hint(path)}")
    return entry


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    return f"{'.'.join(map(str, err['loc'])) or 'top level'}: {err['msg']}"


def read_journal(device_name: str) -> JournalEntry | None:
    path = journal_path(device_name)
    if not os.path.lexists(path):
        return None
    return load_journal(path)


def journal_files() -> list[Path]:
    """Every journal file left by a run or an apply."""
    folder = state_dir() / "journal"
    return sorted(folder.glob("*.json")) if folder.is_dir() else []


def clear_journal(device_name: str) -> None:
    atomicfile.remove_file(journal_path(device_name))
