"""A meter on another host, served by ``tune meter-serve`` (``--meter remote://host:port``).

The protocol (version 1) is one JSON object per line each way. The client
opens with ``hello`` and the shared token, then names what it wants:
``time`` (the server's clock, for the offset), ``start``, ``read`` (energy so
far, where the meter has it) and ``stop`` (the reading). The client measures
the offset between the two clocks from the ``time`` exchange with the
shortest round trip (offset = server time - midpoint of send and receive) and
moves every server time onto its own clock with it. A connection lost at any
point raises :class:`MeterLost`: the window has no energy.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tuner.devices.meters.lines import LineConnection
from tuner.errors import UserError
from tuner.measure.meters import EnergyReading, MeterLost
from tuner.readfile import read_capped

PROTOCOL_VERSION = 1
DEFAULT_PORT = 4951
TOKEN_ENV = "TUNE_METER_TOKEN"
OFFSET_EXCHANGES = 5


def read_token(token_file: str | None = None) -> str:
    """The shared token: from ``token_file`` if given, else ``$TUNE_METER_TOKEN``."""
    if token_file is not None:
        raw = read_capped(Path(token_file), "token file", 4096, "give the file holding the token", secret=True)
        token = raw.decode(errors="replace").strip()
    else:
        token = os.environ.get(TOKEN_ENV, "").strip()
    if not token:
        raise UserError(f"no meter token: set {TOKEN_ENV} to the token tune meter-serve printed, or pass ?token_file=")
    return token


class RemoteMeter:
    """The client side: a Meter whose readings come from a ``tune meter-serve`` on another host."""

    def __init__(
        self, host: str, port: int, token: str, timeout_s: float = 30.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.host, self.port = host, port
        self._token = token
        self.timeout_s = timeout_s
        self.clock = clock
        self.name = f"remote@{host}:{port}"
        self.rails: list[str] = []
        self.min_window_s = 0.0
        self.offset_s = 0.0
        self.rtt_s = 0.0
        self.live = False
        self._conn: LineConnection | None = None

    @classmethod
    def from_url(cls, url: str) -> RemoteMeter:
        """``remote://host[:port][?token_file=PATH]``; the token is never part of the URL."""
        parts = urlsplit(url)
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        if parts.scheme != "remote" or not parts.hostname or set(query) - {"token_file"}:
            raise UserError(
                f"cannot read --meter {url}: write remote://HOST:PORT (what tune meter-serve printed), "
                f"with the token in ${TOKEN_ENV} or ?token_file=PATH"
            )
        try:
            port = parts.port or DEFAULT_PORT
        except ValueError:
            raise UserError(f"--meter {url}: the port must be a number") from None
        return cls(parts.hostname, port, read_token(query.get("token_file")))

    def _ask(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self._conn is not None
        line = self._conn.ask(json.dumps(request))
        try:
            reply = json.loads(line)
        except json.JSONDecodeError:
            raise MeterLost(f"{self.name} answered {request['op']} with {line[:60]!r}, not JSON") from None
        if not isinstance(reply, dict) or not reply.get("ok"):
            error = reply.get("error") if isinstance(reply, dict) else reply
            raise MeterLost(f"{self.name} refused {request['op']}: {error}")
        return reply

    def connect(self) -> None:
        """Open the connection, show the token, learn the meter and measure the clock offset."""
        self._conn = LineConnection(self.host, self.port, f"meter server {self.host}:{self.port}", self.timeout_s)
        hello = self._ask({"op": "hello", "version": PROTOCOL_VERSION, "token": self._token})
        self.name = f"{hello['meter']}@{self.host}:{self.port}"
        self.rails = [str(r) for r in hello.get("rails", [])]
        self.min_window_s = float(hello.get("min_window_s", 0.0))
        self.live = bool(hello.get("live"))
        best: tuple[float, float] | None = None
        for _ in range(OFFSET_EXCHANGES):
            sent = self.clock()
            server = float(self._ask({"op": "time"})["t"])
            received = self.clock()
            rtt = received - sent
            if best is None or rtt < best[0]:
                best = (rtt, server - (sent + received) / 2)
        assert best is not None
        self.rtt_s, self.offset_s = best

    def probe(self) -> dict[str, str]:
        """Connect and hang up: a wrong address or token fails before anything is measured."""
        try:
            self.connect()
        finally:
            self.close()
        return {"meter": self.name, "rails": ", ".join(self.rails)}

    def start(self) -> None:
        try:
            self.connect()
            self._ask({"op": "start"})
        except MeterLost:
            self.close()
            raise

    def energy_now(self) -> tuple[float, float] | None:
        """The server meter's energy so far, its time moved onto this host's clock."""
        if not self.live or self._conn is None:
            return None
        reply = self._ask({"op": "read"})
        if reply.get("t") is None:
            return None
        return float(reply["t"]) - self.offset_s, float(reply["j"])

    def stop(self) -> EnergyReading:
        try:
            r = self._ask({"op": "stop"})["reading"]
        finally:
            self.close()
        extra = {str(k): v for k, v in dict(r.get("extra", {})).items() if isinstance(v, int | float | str)}
        extra.update({"clock_offset_s": self.offset_s, "clock_rtt_s": self.rtt_s, "server": f"{self.host}:{self.port}"})
        return EnergyReading(
            energy_j=float(r["energy_j"]),
            duration_s=float(r["duration_s"]),
            avg_w=float(r["avg_w"]),
            meter=self.name,
            rails=list(self.rails),
            samples=int(r["samples"]),
            warning=str(r.get("warning", "")),
            extra=extra,
        )

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
