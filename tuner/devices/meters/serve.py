"""``tune meter-serve``: one local meter served over TCP to a tuner on another host (see remote.py).

Loopback only unless another address is named; every connection must show
the token first (compared in constant time) or is refused and closed. One
client at a time holds the meter; a second is told the meter is busy. A
client that disappears mid-window has its window stopped and thrown away.
"""

from __future__ import annotations

import hmac
import json
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from tuner.devices.meters.remote import PROTOCOL_VERSION
from tuner.errors import UserError
from tuner.measure.meters import Meter, energy_reader

MAX_REQUEST = 64 * 1024


class MeterServer:
    """Serve ``make_meter()`` (a fresh meter per window) at ``host:port`` to clients holding ``token``."""

    def __init__(
        self,
        make_meter: Callable[[], Meter],
        token: str,
        host: str = "127.0.0.1",
        port: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.make_meter = make_meter
        self.meter = make_meter()
        self._token = token.encode()
        self.clock = clock
        self._busy = threading.Lock()
        self._closed = threading.Event()
        self._clients: set[socket.socket] = set()
        try:
            self._sock = socket.create_server((host, port))
        except OSError as exc:
            raise UserError(f"cannot listen on {host}:{port}: {exc.strerror or exc}: pick another --listen") from None
        self.address: tuple[str, int] = self._sock.getsockname()[:2]

    def serve_forever(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            self._clients.add(conn)
            threading.Thread(target=self._handle, args=(conn,), daemon=True, name="powertune-meter-client").start()

    def start_background(self) -> threading.Thread:
        thread = threading.Thread(target=self.serve_forever, daemon=True, name="powertune-meter-server")
        thread.start()
        return thread

    def close(self) -> None:
        """Stop accepting and drop every client (as a killed server would)."""
        self._closed.set()
        try:
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes a thread blocked in accept(); close() alone does not
        except OSError:
            pass
        self._sock.close()
        for conn in list(self._clients):
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            conn.close()

    def _handle(self, conn: socket.socket) -> None:
        reader = conn.makefile("rb")
        meter: Meter | None = None
        holds = False
        try:
            request = _read(reader)
            shown = str(request.get("token", "")).encode()
            if request.get("op") != "hello" or not hmac.compare_digest(shown, self._token):
                _send(conn, {"ok": False, "error": "wrong token"})
                return
            if request.get("version") != PROTOCOL_VERSION:
                _send(conn, {"ok": False, "error": f"protocol version {PROTOCOL_VERSION} only"})
                return
            holds = self._busy.acquire(blocking=False)
            if not holds:
                _send(conn, {"ok": False, "error": "busy: another tuner holds this meter"})
                return
            _send(
                conn,
                {
                    "ok": True,
                    "version": PROTOCOL_VERSION,
                    "meter": self.meter.name,
                    "rails": list(self.meter.rails),
                    "min_window_s": self.meter.min_window_s,
                    "live": energy_reader(self.meter) is not None,
                },
            )
            while True:
                request = _read(reader)
                if not request:
                    return
                meter, reply = self._answer(request, meter)
                _send(conn, reply)
        except (OSError, ValueError):
            return
        finally:
            if meter is not None:
                try:
                    meter.stop()  # the client is gone: its window is thrown away
                except Exception:
                    pass
            if holds:
                self._busy.release()
            self._clients.discard(conn)
            conn.close()

    def _answer(self, request: dict[str, Any], meter: Meter | None) -> tuple[Meter | None, dict[str, Any]]:
        op = request.get("op")
        try:
            if op == "time":
                return meter, {"ok": True, "t": self.clock()}
            if op == "start" and meter is None:
                meter = self.make_meter()
                meter.start()
                return meter, {"ok": True, "t": self.clock()}
            if op == "read" and meter is not None:
                read = energy_reader(meter)
                now = read() if read is not None else None
                return meter, {"ok": True, "t": None if now is None else now[0], "j": None if now is None else now[1]}
            if op == "stop" and meter is not None:
                reading = asdict(meter.stop())
                return None, {"ok": True, "reading": reading}
        except Exception as exc:
            return None if op in ("start", "stop") else meter, {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        return meter, {"ok": False, "error": f"{op!r} is not a request now (start, read, stop in that order; time)"}


def _read(reader: Any) -> dict[str, Any]:
    line = reader.readline(MAX_REQUEST)
    if not line:
        return {}
    value = json.loads(line)
    if not isinstance(value, dict):
        raise ValueError("a request is a JSON object")
    return value


def _send(conn: socket.socket, reply: dict[str, Any]) -> None:
    conn.sendall(json.dumps(reply).encode() + b"\r\n")
