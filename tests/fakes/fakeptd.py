"""A stand-in for SPEC PTDaemon on loopback, speaking what MLCommons power-dev's server sends it.

Modelled on power-dev at commit c4b3ad8 (2025-02-21): ptd_client_server/lib/server.py (the
commands and the RL fallback) and compliance/check.py (the replies it expects of PTDaemon
1.11.1: "Range A changed", "Starting untimed measurement, ...", "Stopping untimed
measurement", "Error: no measurement to stop"). A single-channel analyzer: ``RL,*,*`` answers
"Invalid number of parameters" and ``RL`` gives the samples. The analyzer draws ``watts``
constantly and logs one sample per interval between Go and Stop (at least one).
"""

from __future__ import annotations

import socket
import threading
import time

IDENTITY = "YokogawaWT310,C2PH13047V,F1.03,PTDaemon version=1.11.1-c4b3ad82 (fake for tests)"


class FakePtd:
    def __init__(self, watts: float = 230.0, ranges: str = "Ranges,0,5.0,1,300.0") -> None:
        self.watts = watts
        self.ranges = ranges
        self.commands: list[str] = []
        self.amps_range, self.volts_range = "5.0", "Auto"
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self._go: tuple[float, int, str] | None = None
        self._unread: list[str] = []
        self._conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            self._conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        reader = conn.makefile("rb")
        try:
            for raw in reader:
                command = raw.decode().rstrip("\r\n")
                self.commands.append(command)
                for line in self._reply(command):
                    conn.sendall(line.encode() + b"\r\n")
        except OSError:
            pass
        finally:
            conn.close()

    def _reply(self, command: str) -> list[str]:
        parts = command.split(",")
        if command == "Hello":
            return ["Hello, PTDaemon here!"]
        if command == "Identify":
            return [IDENTITY]
        if command == "RR":
            return [self.ranges]
        if parts[0] == "SR" and len(parts) == 3 and parts[1] in ("A", "V"):
            if parts[1] == "A":
                self.amps_range = parts[2]
            else:
                self.volts_range = parts[2]
            return [f"Range {parts[1]} changed"]
        if parts[0] == "Go" and len(parts) == 4:
            self._go = (time.monotonic(), int(parts[1]), parts[3])
            return [f"Starting untimed measurement, maximum 500000 samples at {parts[1]}ms with 0 rampup samples"]
        if command == "Stop":
            if self._go is None:
                return ["Error: no measurement to stop"]
            started, interval_ms, _mark = self._go
            count = max(1, int((time.monotonic() - started) * 1000 // interval_ms))
            self._unread = [
                f"Time,01-12-2026 12:00:{i:02d}.000,Watts,{self.watts:.6f},Volts,230.100000,Amps,1.000000,PF,0.990000"
                for i in range(count)
            ]
            self._go = None
            return ["Stopping untimed measurement"]
        if command == "RL,*,*":
            return ["Invalid number of parameters"]
        if command == "RL":
            unread, self._unread = self._unread, []
            return [f"Last {len(unread)} samples", *unread]
        if command == "Watts":
            return [f"Watts,{self.watts:.6f}"]
        return ["Unknown command"]

    def kill(self) -> None:
        """Drop the listener and every connection, as a crashed PTDaemon would."""
        self._sock.close()
        for conn in self._conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
