"""A loopback TCP peer that behaves as the test scripts it: silent, trickling, lying, flooding.

``HostilePeer(handler)`` listens on 127.0.0.1 (an ephemeral port) and runs
``handler(conn)`` on a thread per connection; the helpers below are handlers
for the classes of misbehaviour the clients must survive. Used by
tests/devices/meters/test_peers.py and scripts/probe_peers.py; nothing leaves loopback.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Callable


class HostilePeer:
    def __init__(self, handler: Callable[[socket.socket], None]) -> None:
        self.handler = handler
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self._stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._run, args=(conn,), daemon=True).start()

    def _run(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError), conn:
            self.handler(conn)

    def close(self) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()

    def __enter__(self) -> HostilePeer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def silent(conn: socket.socket) -> None:
    """Accept and say nothing for a minute."""
    time.sleep(60)


def trickle(payload: bytes, every_s: float = 0.5) -> Callable[[socket.socket], None]:
    """Send ``payload`` a byte at a time (a slowloris peer), ignoring what is sent to it."""

    def handler(conn: socket.socket) -> None:
        for byte in payload:
            conn.sendall(bytes([byte]))
            time.sleep(every_s)

    return handler


def replies(*lines: bytes, then_wait_s: float = 5.0) -> Callable[[socket.socket], None]:
    """Send each of ``lines`` after a line is received (the first at once), then wait."""

    def handler(conn: socket.socket) -> None:
        reader = conn.makefile("rb")
        for i, line in enumerate(lines):
            if i:
                reader.readline(1 << 20)
            conn.sendall(line)
        time.sleep(then_wait_s)

    return handler


def challenge(nonce: str = "ab" * 16) -> bytes:
    """A meter-serve protocol-2 greeting."""
    return json.dumps({"op": "challenge", "version": 2, "nonce": nonce}).encode() + b"\r\n"


def http(raw: bytes) -> Callable[[socket.socket], None]:
    """Read a request's head, answer ``raw`` verbatim and close."""

    def handler(conn: socket.socket) -> None:
        conn.settimeout(5)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(4096)
            if not chunk:
                return
            data += chunk
        conn.sendall(raw)

    return handler
