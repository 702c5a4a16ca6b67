"""A device held for a run, an apply or a restore: locked, journaled first, put back however it ends.

Ctrl-C, SIGTERM, SIGHUP and SIGQUIT are recorded for the whole hold
(tuner.plumbing.interrupts) and raised at the next safe point or after the restore, so
success, errors and every signal leave through the same restore. What each
hold did to its device (restored, or a mode applied to stay) is kept for the
message a signal's exit prints.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tuner.devices.base import Device
from tuner.devices.journal import (
    clear_journal,
    device_key,
    fix_hint,
    journal_dir,
    journal_key,
    journal_path,
    lock_path,
    read_journal,
    write_journal,
)
from tuner.devices.lock import device_lock
from tuner.errors import DeviceRefused, UserError
from tuner.plumbing import interrupts

# What this process's holds left on each device, in order: "restored" or "applied" (a mode
# deployed to stay). Read by the exit message after a signal: a signal that lands after an
# apply's writes must say the board was changed, not that nothing was.
_outcomes: dict[str, str] = {}


def _left(device: str, outcome: str) -> None:
    _outcomes.pop(device, None)
    _outcomes[device] = outcome


class RestoreFailed(DeviceRefused):
    """The hardware could not be put back; the journal is kept for ``tune restore``."""


@contextmanager
def hold(device: Device) -> Iterator[None]:
    """One tuner per device: the lock beside its journal (twins hold nothing and take no lock).

    A journal that cannot be read stops the command here, before anything is written (the lock
    file included: it is read once before the lock is taken, and again under it).
    """
    if device.simulated:
        yield
        return
    journal_dir()
    read_journal(journal_key(device))
    with device_lock(lock_path(device_key(device)), device.name):
        read_journal(journal_key(device))
        yield


def restore_pending(device: Device, persist: bool = False) -> bool:
    """Restore a device from a journal left by a crashed run or ``tune apply``; True if there was one.

    The journal must be this device's (same name and kind): a journal is
    only ever restored to the board it was written for. A state the device
    cannot take (a key or value it does not know) is a one-line error naming
    the journal; the journal is kept. A journal of ``tune apply --persist``
    (key ``persist``: a file under /etc was changed) is restored only when
    ``persist`` says the user asked for it.
    """
    path = journal_path(journal_key(device))
    entry = read_journal(journal_key(device))
    if entry is None:
        return False
    if "persist" in entry.state and not persist:
        raise UserError(
            f"{device.name} runs a tuned mode made persistent by tune apply --persist (journal {path}): "
            f"remove it with tune restore --persist --device {device.name}"
        )
    if entry.kind != device.kind:
        raise UserError(
            f"journal {path} is for {entry.device} ({entry.kind}), not {device.name} ({device.kind}); {fix_hint(path)}"
        )
    try:
        with interrupts.restoring():
            device.restore(entry.state)
    except UserError as exc:
        exc.args = (f"journal {path}: {exc}",)  # same class and exit code: a part-way restore is 1
        raise
    except (KeyError, ValueError, TypeError, AttributeError) as exc:
        raise UserError(f"journal {path} holds a state {device.name} cannot take ({exc!r}); {fix_hint(path)}") from None
    clear_journal(journal_key(device))
    return True


def restore_device(device: Device, persist: bool = False) -> bool:
    """``tune restore``: put a device back from its journal, locked against a tuner using it; True if it was."""
    with interrupts.held(), hold(device):
        restored = restore_pending(device, persist)
    if restored:
        _left(device.name, "restored")
    return restored


@contextmanager
def deployment(device: Device, saved: dict[str, Any] | None = None) -> Iterator[None]:
    """Hold a device while a mode is applied to stay (``tune apply``): locked, journaled first, undone if cut short.

    The journal keeps the state from before the first apply, for ``tune
    restore``. If the apply fails or is interrupted, the board is put back
    as it was just before it (and a journal written only for it is removed),
    so a half-applied mode is never left behind. ``saved`` adds to the
    journaled state what only this deployment changes (a persistent mode's
    conf file); it needs a fresh journal, so the journal holds it whole.
    """
    with interrupts.held(), hold(device):
        interrupts.check()
        fresh = read_journal(journal_key(device)) is None
        if saved and not fresh:
            raise UserError(
                f"{device.name} already runs an applied mode (journal {journal_path(journal_key(device))}): "
                f"put it back first with tune restore --device {device.name}, then apply again"
            )
        before = {**device.read_state(), **(saved or {})}
        write_journal(device, before)
        try:
            interrupts.check()
            _left(device.name, "applying")
            yield
            interrupts.check()
        except BaseException:
            with interrupts.restoring():
                device.restore(before)
            if fresh:
                clear_journal(journal_key(device))
            _left(device.name, "restored")
            raise
        _left(device.name, "applied")


def left_behind() -> str:
    """What this process's holds did to hardware, in one phrase for the message a signal's exit prints.

    "no hardware was changed" only when no hold changed anything; a mode
    applied to stay (the signal came after the writes) is named with its undo.
    A hold cut mid-apply whose restore did not finish ("applying") is named
    as possibly changed, with the journal's restore.
    """
    restored = [name for name, outcome in _outcomes.items() if outcome == "restored"]
    applied = [name for name, outcome in _outcomes.items() if outcome == "applied"]
    cut = [name for name, outcome in _outcomes.items() if outcome == "applying"]
    said = []
    if restored:
        said.append(f"hardware state restored ({', '.join(restored)})")
    for name in applied:
        said.append(f"{name} keeps the mode applied before the signal (undo with tune restore --device {name})")
    for name in cut:
        said.append(f"{name} may be part-way through an apply (put it back with tune restore --device {name})")
    return "; ".join(said) or "no hardware was changed"


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
    read here is the board's true original. Ctrl-C, SIGTERM, SIGHUP and SIGQUIT
    are recorded for the whole session (see tuner.plumbing.interrupts) and raised at the
    next safe point or when the session ends, after the restore; success, errors
    and every signal leave through the same restore. Twins hold no hardware:
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
            clear_journal(journal_key(device))
            _left(device.name, "restored")
