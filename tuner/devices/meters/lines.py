"""A line-based TCP connection with a deadline on every reply, shared by the PTD and remote-meter clients.

Any failure to send or receive (refused, reset, closed, silent or trickling
past the reply's total deadline, a signal) is raised as :class:`MeterLost`
with what was being done, so a window metered over the network either gets
its whole reading or none. Each wait is cut into short slices, between which a
signal recorded by tuner.plumbing.interrupts ends it: a silent peer never holds the
tuner past Ctrl-C or SIGTERM. :func:`json_line` reads one JSON line from a
peer (either side) with its nesting and numbers bounded.
"""

from __future__ import annotations

import json
import math
import socket
import time
from typing import Any

from tuner.measure.meters import MeterLost
from tuner.plumbing import interrupts

MAX_LINE = 1 << 20
MAX_DEPTH = 16  # a protocol message nests two levels; a peer's 100,000 '[' are refused, not recursed into
SLICE_S = 0.2  # longest blind wait between looks at a pending signal


class BadMessage(ValueError):
    """A line that is not a protocol message (not JSON, nested too deep, a non-finite number)."""


def _depth(text: str) -> int:
    """The deepest nesting of ``[``/``{`` in a JSON text, outside strings (counted before parsing)."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def _refuse_constant(name: str) -> float:
    raise BadMessage(f"{name} is not a number a peer may send")


def json_line(line: str | bytes, max_depth: int = MAX_DEPTH) -> dict[str, Any]:
    """One protocol message: a JSON object, at most ``max_depth`` deep, with no NaN or Infinity."""
    text = line.decode("utf-8", "replace") if isinstance(line, bytes) else line
    if _depth(text) > max_depth:
        raise BadMessage(f"nested deeper than {max_depth} levels")
    try:
        value = json.loads(text, parse_constant=_refuse_constant)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise BadMessage(f"not JSON ({exc.__class__.__name__})") from None
    if not isinstance(value, dict):
        raise BadMessage("a message is a JSON object")
    return value


def finite(value: Any, what: str, low: float = 0.0, high: float = 1e15) -> float:
    """A number a peer sent, finite and within [low, high]; anything else is :class:`BadMessage`."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadMessage(f"{what} is {type(value).__name__}, not a number")
    number = float(value)
    if not math.isfinite(number) or not low <= number <= high:
        raise BadMessage(f"{what} {number!r} is outside {low:g}..{high:g}")
    return number


def text(value: Any, what: str, limit: int = 200) -> str:
    """A string a peer sent, printable and at most ``limit`` characters."""
    if not isinstance(value, str) or len(value) > limit or not value.isprintable():
        raise BadMessage(f"{what} is not a printable string of at most {limit} characters")
    return value


_CONTROL = bytes(c for c in range(32) if c not in (9, 10, 13)) + b"\x7f"


class LineConnection:
    """Send a line, read a line; ``\\r\\n`` out, ``\\n`` (optionally after ``\\r``) in.

    Both protocols spoken over it are text lines, so a control byte from the
    peer ends the exchange at once (it is not the peer we expect, and waiting
    for a newline would only wait out the deadline); so does a line that
    cannot begin as ``line_start`` says (``{`` for a JSON protocol).
    """

    def __init__(self, host: str, port: int, what: str, timeout_s: float = 10.0, line_start: bytes = b"") -> None:
        self.what = what
        self.timeout_s = timeout_s
        self.line_start = line_start
        self._buffer = b""
        try:
            self._sock: socket.socket | None = socket.create_connection((host, port), timeout=min(timeout_s, 5.0))
        except OSError as exc:
            raise MeterLost(f"cannot reach {what} at {host}:{port}: {exc.strerror or exc}") from None
        interrupted = interrupts.pending()
        if interrupted is not None:
            self.close()
            raise MeterLost(f"a signal ({interrupted}) arrived while connecting to {what}")

    def send(self, line: str) -> None:
        if self._sock is None:
            raise MeterLost(f"the connection to {self.what} is closed")
        try:
            self._sock.settimeout(min(self.timeout_s, 5.0))
            self._sock.sendall(line.encode() + b"\r\n")
        except OSError as exc:
            self.close()
            raise MeterLost(f"lost the connection to {self.what} sending {line.split(',')[0]!r}: {exc}") from None

    def receive(self, doing: str, deadline: float | None = None) -> str:
        """The next line, within ``timeout_s`` in all (or by ``deadline``, a monotonic time), however it trickles."""
        end = time.monotonic() + self.timeout_s if deadline is None else deadline
        while b"\n" not in self._buffer:
            if self._sock is None:
                raise MeterLost(f"the connection to {self.what} is closed")
            left = end - time.monotonic()
            if interrupts.pending() is not None or left <= 0:
                self.close()
                why = "a signal arrived" if left > 0 else f"no whole reply within {self.timeout_s:g} s"
                raise MeterLost(f"{self.what}: {why} waiting for {doing}")
            try:
                self._sock.settimeout(min(left, SLICE_S))
                chunk = self._sock.recv(65536)
            except TimeoutError:
                continue
            except OSError as exc:
                self.close()
                raise MeterLost(f"lost the connection to {self.what} waiting for {doing}: {exc}") from None
            if not chunk:
                self.close()
                raise MeterLost(f"{self.what} closed the connection during {doing}")
            self._buffer += chunk
            self._check_text(chunk, doing)
            if len(self._buffer) > MAX_LINE:
                self.close()
                raise MeterLost(f"{self.what} sent a line over {MAX_LINE} bytes during {doing}")
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.rstrip(b"\r").decode("utf-8", "replace")

    def _check_text(self, chunk: bytes, doing: str) -> None:
        """Fail at once on bytes that no line of this protocol holds, rather than wait for a newline."""
        head = self._buffer[:64].split(b"\n", 1)[0].lstrip(b" \t\r")
        start = head[: len(self.line_start)]
        bad = any(c in _CONTROL for c in chunk) or not self.line_start.startswith(start)
        if bad:
            shown = self._buffer[:40]
            self.close()
            raise MeterLost(
                f"{self.what} answered {doing} with {shown!r}, which is not this protocol: is it the right port?"
            )

    def ask(self, line: str) -> str:
        self.send(line)
        return self.receive(repr(line.split(",")[0]))

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
