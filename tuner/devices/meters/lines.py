"""A line-based TCP connection with a deadline on every reply, shared by the PTD and remote-meter clients.

Any failure to send or receive (refused, reset, closed, silent past the
timeout) is raised as :class:`MeterLost` with what was being done, so a window
metered over the network either gets its whole reading or none.
"""

from __future__ import annotations

import socket

from tuner.measure.meters import MeterLost

MAX_LINE = 1 << 20


class LineConnection:
    """Send a line, read a line; ``\\r\\n`` out, ``\\n`` (optionally after ``\\r``) in."""

    def __init__(self, host: str, port: int, what: str, timeout_s: float = 10.0) -> None:
        self.what = what
        self.timeout_s = timeout_s
        self._buffer = b""
        try:
            self._sock: socket.socket | None = socket.create_connection((host, port), timeout=timeout_s)
        except OSError as exc:
            raise MeterLost(f"cannot reach {what} at {host}:{port}: {exc.strerror or exc}") from None

    def send(self, line: str) -> None:
        if self._sock is None:
            raise MeterLost(f"the connection to {self.what} is closed")
        try:
            self._sock.sendall(line.encode() + b"\r\n")
        except OSError as exc:
            self.close()
            raise MeterLost(f"lost the connection to {self.what} sending {line.split(',')[0]!r}: {exc}") from None

    def receive(self, doing: str) -> str:
        while b"\n" not in self._buffer:
            if self._sock is None:
                raise MeterLost(f"the connection to {self.what} is closed")
            try:
                chunk = self._sock.recv(65536)
            except OSError as exc:
                self.close()
                raise MeterLost(f"lost the connection to {self.what} waiting for {doing}: {exc}") from None
            if not chunk:
                self.close()
                raise MeterLost(f"{self.what} closed the connection during {doing}")
            self._buffer += chunk
            if len(self._buffer) > MAX_LINE:
                self.close()
                raise MeterLost(f"{self.what} sent a line over {MAX_LINE} bytes during {doing}")
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.rstrip(b"\r").decode("utf-8", "replace")

    def ask(self, line: str) -> str:
        self.send(line)
        return self.receive(repr(line.split(",")[0]))

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
