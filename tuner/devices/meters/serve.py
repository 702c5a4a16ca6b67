"""``tune meter-serve``: one local meter served over TCP to a tuner on another host (see remote.py).

Loopback only unless another address is named. Every connection is greeted
with a fresh random challenge; the client must answer with an HMAC of it under
the shared token (remote.py's ``login_mac``), so the token never crosses the
wire and a captured login cannot be replayed. The server proves it holds the
token too, with an HMAC over both nonces in its welcome.

Before a client has logged in it gets little: one line of at most
``MAX_HELLO`` bytes, ``LOGIN_S`` seconds to send it, JSON nested at most a few
levels, and at most ``MAX_CLIENTS`` connections at a time (more are closed at
once). Running out of file descriptors is waited out, never fatal: a flood of
idle connections cannot stop the server. One client at a time holds the
meter; a second is told the meter is busy. A client that disappears
mid-window has its window stopped and thrown away.
"""

from __future__ import annotations

import hmac
import json
import secrets
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from tuner.devices.meters.lines import BadMessage, json_line
from tuner.devices.meters.remote import PROTOCOL_VERSION, login_mac, welcome_mac
from tuner.errors import UserError
from tuner.measure.meters import Meter, checked_reading, energy_reader

MAX_REQUEST = 64 * 1024
MAX_HELLO = 1024
MAX_CLIENTS = 32
LOGIN_S = 5.0  # time a new connection has to log in
IDLE_S = 2 * 3600.0 + 60.0  # an authenticated client's longest silence: longer than the longest window
ACCEPT_RETRY_S = 0.1  # wait after accept() failed for lack of descriptors


class MeterServer:
    """Serve ``make_meter()`` (a fresh meter per window) at ``host:port`` to clients holding ``token``."""

    def __init__(
        self,
        make_meter: Callable[[], Meter],
        token: str,
        host: str = "127.0.0.1",
        port: int = 0,
        clock: Callable[[], float] = time.monotonic,
        login_s: float = LOGIN_S,
        max_clients: int = MAX_CLIENTS,
    ) -> None:
        self.make_meter = make_meter
        self.meter = make_meter()
        self._token = token.encode()
        self.clock = clock
        self.login_s = login_s
        self.max_clients = max_clients
        self._busy = threading.Lock()
        self._closed = threading.Event()
        self._clients: set[socket.socket] = set()
        self._clients_lock = threading.Lock()
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        try:
            self._sock = socket.create_server((host, port), family=family)
        except OSError as exc:
            raise UserError(f"cannot listen on {host}:{port}: {exc.strerror or exc}: pick another --listen") from None
        self.address: tuple[str, int] = self._sock.getsockname()[:2]

    def serve_forever(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                if self._closed.is_set():
                    return
                time.sleep(ACCEPT_RETRY_S)  # out of descriptors (a flood): the clients' timeouts free them
                continue
            with self._clients_lock:
                full = len(self._clients) >= self.max_clients
                if not full:
                    self._clients.add(conn)
            if full:
                conn.close()
                continue
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
        with self._clients_lock:
            clients = list(self._clients)
        for conn in clients:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            conn.close()

    def _login(self, conn: socket.socket) -> bool:
        """Challenge, then check the client's answer; True once it is logged in (False: refused and told why)."""
        nonce = secrets.token_hex(16)
        conn.settimeout(self.login_s)
        _send(conn, {"op": "challenge", "version": PROTOCOL_VERSION, "nonce": nonce})
        request = _read_hello(conn, time.monotonic() + self.login_s)
        if request.get("op") != "hello" or request.get("version") != PROTOCOL_VERSION:
            _send(conn, {"ok": False, "error": f"log in with hello, protocol version {PROTOCOL_VERSION} only"})
            return False
        client_nonce, shown = request.get("nonce"), request.get("mac")
        if not isinstance(client_nonce, str) or not 16 <= len(client_nonce) <= 64 or not isinstance(shown, str):
            _send(conn, {"ok": False, "error": "a hello carries a nonce of 16-64 characters and a mac"})
            return False
        if not hmac.compare_digest(shown.encode(), login_mac(self._token, nonce, client_nonce).encode()):
            _send(conn, {"ok": False, "error": "wrong token"})
            return False
        holds = self._busy.acquire(blocking=False)
        if not holds:
            _send(conn, {"ok": False, "error": "busy: another tuner holds this meter"})
            return False
        conn.settimeout(IDLE_S)
        _send(
            conn,
            {
                "ok": True,
                "version": PROTOCOL_VERSION,
                "mac": welcome_mac(self._token, nonce, client_nonce),
                "meter": self.meter.name,
                "rails": list(self.meter.rails),
                "min_window_s": self.meter.min_window_s,
                "live": energy_reader(self.meter) is not None,
            },
        )
        return True

    def _handle(self, conn: socket.socket) -> None:
        reader = conn.makefile("rb")
        meter: Meter | None = None
        holds = False
        try:
            holds = self._login(conn)
            while holds:
                request = _read(reader, MAX_REQUEST)
                if not request:
                    return
                meter, reply = self._answer(request, meter)
                _send(conn, reply)
        except BadMessage as exc:
            try:
                _send(conn, {"ok": False, "error": f"not a request: {exc}"})
            except OSError:
                pass
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
            with self._clients_lock:
                self._clients.discard(conn)
            reader.close()
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
                reading = asdict(checked_reading(meter.name, meter.stop()))
                return None, {"ok": True, "reading": reading}
        except Exception as exc:
            return None if op in ("start", "stop") else meter, {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        return meter, {"ok": False, "error": f"{str(op)[:40]!r} is not a request now (start, read, stop; time)"}


def _read_hello(conn: socket.socket, deadline: float) -> dict[str, Any]:
    """The login line, whole by ``deadline`` however it trickles, and at most ``MAX_HELLO`` bytes."""
    data = b""
    while b"\n" not in data:
        left = deadline - time.monotonic()
        if left <= 0:
            raise BadMessage("no login in time")
        conn.settimeout(left)
        chunk = conn.recv(MAX_HELLO + 1 - len(data))
        if not chunk:
            return {}
        data += chunk
        if len(data) > MAX_HELLO:
            raise BadMessage(f"a login is at most {MAX_HELLO} bytes")
    return json_line(data.partition(b"\n")[0])


def _read(reader: Any, limit: int) -> dict[str, Any]:
    """One request line of at most ``limit`` bytes ({} at end of stream); a longer one is refused, not cut."""
    line = reader.readline(limit + 1)
    if not line:
        return {}
    if len(line) > limit:
        raise BadMessage(f"a request is at most {limit} bytes")
    return json_line(line)


def _send(conn: socket.socket, reply: dict[str, Any]) -> None:
    conn.sendall(json.dumps(reply).encode() + b"\r\n")
