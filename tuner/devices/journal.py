"""Journal of original hardware state, written before the first write.

If the process dies (kill -9, power loss) between apply and restore, the
journal still holds what the board looked like, and ``tune restore`` puts it
back. One file per device; it is removed only after a successful restore.

The tool often runs as root, so the state folder is private (0700), journals
are created under fresh names with O_EXCL (0600, never through a planted
symbolic link) and renamed into place, and a journal is only ever read as a
regular file, never through a link. A journal that cannot be read is a
one-line error naming the file, never a traceback.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import re
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from tuner import atomicfile, interrupts
from tuner.devices.base import Device
from tuner.devices.lock import device_lock
from tuner.errors import UserError

JOURNAL_VERSION = 1
_restored: list[str] = []  # devices a hardware session of this process put back


class RestoreFailed(UserError):
    """The hardware could not be put back; the journal is kept for ``tune restore``."""

    exit_code = 1


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


def _safe(device_name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in device_name).lstrip(".") or "-"


def journal_path(device_name: str) -> Path:
    return state_dir() / "journal" / f"{_safe(device_name)}.json"


def lock_path(device_name: str) -> Path:
    return state_dir() / "journal" / f"{_safe(device_name)}.lock"


def journal_dir() -> Path:
    """The private journal folder, created 0700 (with any missing parents) and checked to be this user's.

    A state folder or journal folder owned by another user, or one that
    another user can write, is refused: whoever can write there can plant a
    journal that a restore would trust, or remove the one a crash left.
    """
    folder = state_dir() / "journal"
    missing = [p for p in (folder, *folder.parents) if not os.path.lexists(p)]
    try:
        for p in reversed(missing):
            with suppress(FileExistsError):
                os.mkdir(p, 0o700)
        info = os.lstat(folder)
        if stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid() and stat.S_IMODE(info.st_mode) != 0o700:
            os.chmod(folder, 0o700)
            info = os.lstat(folder)
        parent = os.stat(folder.parent)
    except OSError as exc:
        raise UserError(
            f"cannot use the state folder {folder}: {exc.strerror}; set TUNE_STATE_DIR to a writable folder"
        ) from None
    if not stat.S_ISDIR(info.st_mode):
        raise UserError(f"state folder {folder} is not a folder (a link?): remove it, or set TUNE_STATE_DIR")
    where, problem = folder.parent, atomicfile.folder_problem(parent)
    if problem is None and info.st_uid != os.geteuid():
        where, problem = folder, f"it is owned by another user (uid {info.st_uid})"
    if problem is not None:
        raise UserError(
            f"refusing the state folder {where}: {problem}; "
            "remove it, or set TUNE_STATE_DIR to a folder only you can write"
        )
    return folder


@contextmanager
def hold(device: Device) -> Iterator[None]:
    """One tuner per device: the lock beside its journal (twins hold nothing and take no lock).

    A journal that cannot be read stops the command here, before anything is written.
    """
    if device.simulated:
        yield
        return
    journal_dir()
    with device_lock(lock_path(device.name), device.name):
        read_journal(device.name)
        yield


def write_journal(device: Device, state: dict[str, Any]) -> Path:
    """Persist the original state atomically (fresh 0600 file, fsync, rename), unless one is pending.

    A pending journal means an earlier run died before restoring: its state is
    the true original, so it must not be overwritten by the current (changed) one.
    """
    path = journal_path(device.name)
    if os.path.lexists(path):
        return path
    journal_dir()
    entry = JournalEntry(device=device.name, kind=device.kind, pid=os.getpid(), written_at=time.time(), state=state)
    try:
        text = entry.model_dump_json(indent=2)
    except (ValueError, TypeError) as exc:  # a plugin's read_state() returned what JSON cannot hold
        raise UserError(
            f"{device.name}'s state cannot be saved ({str(exc).splitlines()[0]}): its read_state() must return "
            "plain JSON values; see docs/plugins.md"
        ) from None
    atomicfile.write_text(path, text, mode=0o600, sync=True)
    return path


def _fix(path: Path) -> str:
    return (
        f"repair or remove {path} (it holds the state from before tuning; remove it once the device is as you want it)"
    )


def load_journal(path: Path) -> JournalEntry:
    """Read one journal file: a regular file, valid JSON, the known format, and named after its device."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise UserError(f"cannot read journal {path}: {exc.strerror}; {_fix(path)}") from None
    with os.fdopen(fd, "rb") as fh:
        info = os.fstat(fh.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise UserError(f"journal {path} is not a regular file; {_fix(path)}")
        if info.st_uid != os.geteuid() or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise UserError(
                f"journal {path} is not this user's own private file (owner uid {info.st_uid}, "
                f"mode {stat.S_IMODE(info.st_mode):o}): it cannot be trusted; {_fix(path)}"
            )
        data = fh.read(1 << 20)
    try:
        entry = JournalEntry.model_validate(json.loads(data))
    except (ValueError, ValidationError) as exc:
        reason = str(exc).splitlines()[0] if not isinstance(exc, ValidationError) else _first_error(exc)
        raise UserError(f"journal {path} is corrupt ({reason}); {_fix(path)}") from None
    if entry.version != JOURNAL_VERSION:
        raise UserError(
            f"journal {path} has version {entry.version}, this tool reads {JOURNAL_VERSION}; "
            "restore with the tool that wrote it"
        )
    if journal_path(entry.device).name != path.name:
        raise UserError(f"journal {path} names device {entry.device!r}, not the one it is filed for; {_fix(path)}")
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


def pending_journals() -> list[JournalEntry]:
    """Every journal left by a run or an apply (each at journal_path of its device); a bad one is a one-line error."""
    return [load_journal(p) for p in journal_files()]


def clear_journal(device_name: str) -> None:
    journal_path(device_name).unlink(missing_ok=True)


_BUILTIN = re.compile(r"cuda:\d{1,3}|cpu")


def builtin_device_name(name: str) -> bool:
    """A device name that opens a built-in backend (a Jetson board, an NVIDIA GPU), never a plugin."""
    from tuner.devices.jetson import DEVICE_KINDS

    return name in DEVICE_KINDS or _BUILTIN.fullmatch(name) is not None


def restore_pending(device: Device) -> bool:
    """Restore a device from a journal left by a crashed run or ``tune apply``; True if there was one.

    The journal must be this device's (same name and kind): a journal is
    only ever restored to the board it was written for. A state the device
    cannot take (a key or value it does not know) is a one-line error naming
    the journal; the journal is kept.
    """
    path = journal_path(device.name)
    entry = read_journal(device.name)
    if entry is None:
        return False
    if entry.device != device.name or entry.kind != device.kind:
        raise UserError(
            f"journal {path} is for {entry.device} ({entry.kind}), not {device.name} ({device.kind}); {_fix(path)}"
        )
    try:
        with interrupts.restoring():
            device.restore(entry.state)
    except UserError as exc:
        exc.args = (f"journal {path}: {exc}",)  # same class and exit code: a part-way restore is 1
        raise
    except (KeyError, ValueError, TypeError, AttributeError) as exc:
        raise UserError(f"journal {path} holds a state {device.name} cannot take ({exc!r}); {_fix(path)}") from None
    clear_journal(device.name)
    return True


def restore_device(device: Device) -> bool:
    """``tune restore``: put a device back from its journal, locked against a tuner using it; True if it was."""
    with interrupts.held(), hold(device):
        restored = restore_pending(device)
    if restored:
        _restored.append(device.name)
    return restored


@contextmanager
def deployment(device: Device) -> Iterator[None]:
    """Hold a device while a mode is applied to stay (``tune apply``): locked, journaled first, undone if cut short.

    The journal keeps the state from before the first apply, for ``tune
    restore``. If the apply fails or is interrupted, the board is put back
    as it was just before it (and a journal written only for it is removed),
    so a half-applied mode is never left behind.
    """
    with interrupts.held(), hold(device):
        interrupts.check()
        fresh = read_journal(device.name) is None
        before = device.read_state()
        write_journal(device, before)
        try:
            interrupts.check()
            yield
            interrupts.check()
        except BaseException:
            with interrupts.restoring():
                device.restore(before)
            if fresh:
                clear_journal(device.name)
            _restored.append(device.name)
            raise


def restored_devices() -> list[str]:
    """Devices that a hardware session of this process journaled and put back (for the exit message)."""
    return list(_restored)


def _preload_runtime() -> None:
    """Import torch before the first write, not in the middle of the first trial.

    Its import takes seconds and triggers garbage collection; done here, a
    signal during it finds nothing changed yet.
    """
    if importlib.util.find_spec("torch") is not None:
        importlib.import_module("torch")


@contextmanager
def hardware_session(device: Device) -> Iterator[dict[str, Any]]:
    """Hold a device for a run: lock it, journal its state first, restore it however the run ends.

    A journal left by a crashed earlier run is restored first, so the state
    read here is the board's true original. Ctrl-C and SIGTERM are recorded
    for the whole session (see tuner.interrupts) and raised at the next safe
    point or when the session ends, after the restore; success, errors and
    both signals all leave through the same restore. Twins hold no hardware:
    nothing is locked or journaled for them, but signals are handled alike.
    """
    with interrupts.held(), hold(device):
        interrupts.check()
        if device.simulated:
            yield {}
            return
        _preload_runtime()
        interrupts.check()
        restore_pending(device)
        state = device.read_state()
        path = write_journal(device, state)
        try:
            interrupts.check()
            yield state
        finally:
            try:
                with interrupts.restoring():
                    device.restore(state)
            except Exception as exc:
                raise RestoreFailed(
                    f"restoring {device.name} failed ({exc}); its original state is kept in {path}: "
                    f"fix the cause, then run tune restore --device {device.name}"
                ) from exc
            clear_journal(device.name)
            _restored.append(device.name)
