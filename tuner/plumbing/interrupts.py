"""Ctrl-C, SIGTERM, SIGHUP and SIGQUIT while the tuner holds hardware: record the signal, act on it at safe points.

An exception raised from inside a signal handler lands at an arbitrary
bytecode: in the middle of a board write, inside Optuna while it starts a
trial's heartbeat thread (which then never stops, so the process hangs), or
inside a garbage-collection callback, where Python prints "Exception
ignored" and drops it, so the run goes on as if nothing happened. So while
:func:`held` is active the handlers only record the signal (and tell the
listeners, e.g. a LoadGen window, to wind down); the code calls
:func:`check` at safe points (before and after a configuration is applied,
after a measured window, between trials) and :func:`held` raises the signal
when it ends, so the run unwinds through the same ``finally`` blocks that
restore the hardware after an error.

All four are installed for the whole of :func:`held`, whatever the
previous disposition (SIGHUP is a dropped SSH session, SIGQUIT Ctrl-\\; by
default either kills the process with the board left as the trial set it): a process started in the background by a
non-interactive shell inherits SIGINT as *ignored*, and would otherwise never
hear it. A second signal while the first is still pending raises at once
(the user insists; something is stuck between safe points), except while the
hardware is being restored (:func:`restoring`), which is never cut short.
(Raising inside an import is worse than late: a KeyboardInterrupt raised in
torch's import, inside a pybind11 callback, aborts the process.)
"""

from __future__ import annotations

import functools
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from tuner.errors import Terminated, UserError

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
# What the exit message calls each signal's ending.
ENDINGS = {signal.SIGINT: "interrupted", signal.SIGTERM: "terminated", signal.SIGHUP: "hung up", signal.SIGQUIT: "quit"}


class _State:
    """Process-wide: signals are delivered to the process, and only the main thread may install handlers."""

    def __init__(self) -> None:
        self.depth = 0
        self.received: list[int] = []
        self.listeners: list[Callable[[], None]] = []
        self.previous: dict[int, Any] = {}
        self.restoring = 0
        self.last: int | None = None


_state = _State()


def exception_for(signum: int) -> KeyboardInterrupt:
    """KeyboardInterrupt for SIGINT, :class:`Terminated` for the others; remembered for the exit code."""
    _state.last = signum
    return KeyboardInterrupt() if signum == signal.SIGINT else Terminated(signum)


def ending(signum: int | None) -> str:
    """How the exit message names the end a signal brought ("interrupted" for Ctrl-C, "hung up" for SIGHUP)."""
    return ENDINGS.get(signum or signal.SIGINT, "terminated")


def last_signal() -> int | None:
    """The signal behind the last interruption raised in this process (None: none)."""
    return _state.last


def _record(signum: int, frame: Any) -> None:
    again = bool(_state.received)
    _state.received.append(signum)
    for listener in list(_state.listeners):
        listener()
    if again and not _state.restoring:
        raise exception_for(signum)


def _raise(signum: int, frame: Any) -> None:
    raise exception_for(signum)


def install_process_handlers() -> None:
    """For a CLI process: every signal of SIGNALS raises, even if SIGINT was inherited as ignored.

    Outside :func:`held` nothing is held, so raising at once is what a user
    expects; SIGTERM, SIGHUP and SIGQUIT then end a command as cleanly as Ctrl-C does. Each is
    remembered (:func:`last_signal`), so one whose exception Python swallowed
    (raised inside a garbage-collection callback) still ends the command
    with the signal's exit code.
    """
    _state.last = None
    if threading.current_thread() is threading.main_thread():
        for sig in SIGNALS:
            signal.signal(sig, _raise)


def exit_at_once() -> None:
    """For a CLI process whose command is over: a signal from here on ends it with 128 + signum, no traceback.

    The command's files are written and the hardware restored by then; a
    signal during the interpreter's shutdown (atexit callbacks, thread joins)
    would otherwise print a traceback and be dropped, or wait on whatever
    holds the exit. Output already printed is flushed first.
    """
    if threading.current_thread() is threading.main_thread():
        for sig in SIGNALS:
            signal.signal(sig, _exit_now)


def _exit_now(signum: int, frame: Any) -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, RuntimeError, ValueError):
            pass  # closed, or the signal landed inside this very flush
    os._exit(128 + signum)


def pending() -> int | None:
    """The first signal recorded by the active :func:`held`, if any."""
    return _state.received[0] if _state.received else None


def check() -> None:
    """A safe point: raise the recorded signal, if any (it stays recorded until :func:`held` ends)."""
    if _state.received:
        raise exception_for(_state.received[0])


@contextmanager
def held() -> Iterator[None]:
    """Record the signals of SIGNALS instead of raising, for the duration; raise a recorded one at the end.

    Re-entrant: only the outermost level installs and puts back the
    handlers, and raises. If the block ends with an error while a signal is
    pending, the signal is raised from it (the error was most likely the
    signal's doing, e.g. a child process killed by the same Ctrl-C); a
    :class:`UserError` (such as a failed restore) is reported as it is. Off the
    main thread no handler can be installed and this does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if _state.depth == 0:
        _state.received.clear()
        _state.previous = {sig: signal.signal(sig, _record) for sig in SIGNALS}
    _state.depth += 1
    outermost = _state.depth == 1
    try:
        yield
    except (KeyboardInterrupt, UserError):
        raise
    except BaseException as exc:
        if outermost and _state.received:
            raise exception_for(_state.received[0]) from exc
        raise
    finally:
        _state.depth -= 1
        if outermost:
            received = list(_state.received)
            for sig, handler in _state.previous.items():
                signal.signal(sig, signal.SIG_DFL if handler is None else handler)
            _state.received.clear()
            _state.previous = {}
    if outermost and received:
        raise exception_for(received[0])


def deferring(command: Callable[..., Any]) -> Callable[..., Any]:
    """A CLI command that holds hardware runs wholly under :func:`held` (its signature kept for Typer)."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with held():
            return command(*args, **kwargs)

    return wrapper


@contextmanager
def listening(callback: Callable[[], None]) -> Iterator[None]:
    """Within :func:`held`, also call ``callback`` on a signal (at once if one is already pending)."""
    with held():
        _state.listeners.append(callback)
        try:
            if _state.received:
                callback()
            yield
        finally:
            _state.listeners.remove(callback)


def sleep(seconds: float) -> None:
    """Wait ``seconds``, or less: the wait ends at the first signal (which stays recorded for :func:`check`)."""
    woken = threading.Event()
    with listening(woken.set):
        woken.wait(seconds)


@contextmanager
def restoring() -> Iterator[None]:
    """While the hardware is put back, even a repeated signal only records itself."""
    _state.restoring += 1
    try:
        yield
    finally:
        _state.restoring -= 1
