"""A meter on another host, served by ``tune meter-serve`` (``--meter remote://host:port``).

The protocol (version 2) is one JSON object per line each way. The server
opens with a ``challenge`` holding a fresh nonce; the client logs in with
``hello``, its own nonce and :func:`login_mac` (an HMAC-SHA256 of both nonces
under the shared token, so the token never crosses the wire and a recorded
login is worthless on the next connection), and the server's welcome carries
:func:`welcome_mac`, which proves it holds the token too. Then the client
names what it wants:
``time`` (the server's clock, for the offset), ``start``, ``read`` (energy so
far, where the meter has it) and ``stop`` (the reading). The client measures
the offset between the two clocks from the ``time`` exchange with the
shortest round trip (offset = server time - midpoint of send and receive) and
moves every server time onto its own clock with it. A connection lost at any
point raises :class:`MeterLost`: the window has no energy, and so does a
reply with a field that is missing, of the wrong type, not finite or out of
range: nothing a server sends reaches a measurement unchecked.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tuner.devices.meters.lines import BadMessage, LineConnection, finite, json_line, text
from tuner.devices.meters.urls import peer_url
from tuner.errors import UserError
from tuner.measure.meters import EnergyReading, MeterLost
from tuner.plumbing.readfile import read_capped

PROTOCOL_VERSION = 2
DEFAULT_PORT = 4951
TOKEN_ENV = "TUNE_METER_TOKEN"
OFFSET_EXCHANGES = 5
MAX_RAILS = 64
MAX_EXTRA = 64
MAX_SAMPLES = 10**9
MAX_WINDOW_S = 3600.0


def login_mac(token: bytes, server_nonce: str, client_nonce: str) -> str:
    """What a client shows to log in: HMAC-SHA256 under the token of both nonces (hex)."""
    message = f"powertune-meter login {server_nonce} {client_nonce}".encode()
    return hmac.new(token, message, hashlib.sha256).hexdigest()


def welcome_mac(token: bytes, server_nonce: str, client_nonce: str) -> str:
    """What the server shows back: a different HMAC of the same nonces, so it cannot be echoed."""
    message = f"powertune-meter welcome {server_nonce} {client_nonce}".encode()
    return hmac.new(token, message, hashlib.sha256).hexdigest()


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
        usage = (
            f"write remote://HOST:PORT (what tune meter-serve printed), with the token in ${TOKEN_ENV} "
            "or ?token_file=PATH"
        )
        host, port, query = peer_url(url, "remote", DEFAULT_PORT, {"token_file"}, usage)
        return cls(host, port, read_token(query.get("token_file")))

    def _message(self, line: str, doing: str) -> dict[str, Any]:
        try:
            return json_line(line)
        except BadMessage as exc:
            raise MeterLost(f"{self.name} answered {doing} with {line[:60]!r}: {exc}") from None

    def _ask(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self._conn is not None
        reply = self._message(self._conn.ask(json.dumps(request)), request["op"])
        if reply.get("ok") is not True:
            error = str(reply.get("error", "no reason given"))[:200]
            raise MeterLost(f"{self.name} refused {request['op']}: {error}")
        return reply

    def _checked(self, doing: str, read: Callable[[], Any]) -> Any:
        """``read()`` over a reply's fields; a field missing, mistyped or out of range is :class:`MeterLost`."""
        try:
            return read()
        except (BadMessage, KeyError, TypeError, ValueError) as exc:
            raise MeterLost(f"{self.name} sent a malformed {doing} reply ({exc}): is it tune meter-serve?") from None

    def _login(self) -> dict[str, Any]:
        """Answer the server's challenge; check that its welcome proves it holds the token."""
        assert self._conn is not None
        challenge = self._message(self._conn.receive("the login challenge"), "the connection")
        nonce = self._checked("challenge", lambda: text(challenge["nonce"], "nonce", 64))
        if challenge.get("version") != PROTOCOL_VERSION:
            raise MeterLost(
                f"{self.name} speaks protocol {str(challenge.get('version'))[:20]}, not {PROTOCOL_VERSION}: "
                "run the same powertune release on both hosts"
            )
        mine = secrets.token_hex(16)
        token = self._token.encode()
        hello = self._ask(
            {"op": "hello", "version": PROTOCOL_VERSION, "nonce": mine, "mac": login_mac(token, nonce, mine)}
        )
        shown = self._checked("welcome", lambda: text(hello["mac"], "mac", 64))
        if not hmac.compare_digest(shown.encode(), welcome_mac(token, nonce, mine).encode()):
            raise MeterLost(f"{self.name} does not hold the token: it is not the meter server you set up")
        return hello

    def connect(self) -> None:
        """Open the connection, log in, learn the meter and measure the clock offset."""
        self._conn = LineConnection(
            self.host, self.port, f"meter server {self.host}:{self.port}", self.timeout_s, line_start=b"{"
        )
        hello = self._login()

        def describe() -> tuple[str, list[str], float, bool]:
            rails = hello.get("rails", [])
            if not isinstance(rails, list) or len(rails) > MAX_RAILS:
                raise BadMessage(f"rails is not a list of at most {MAX_RAILS}")
            live = hello.get("live", False)
            if not isinstance(live, bool):
                raise BadMessage("live is not true or false")
            return (
                text(hello["meter"], "meter", 80),
                [text(r, "rail") for r in rails],
                finite(hello.get("min_window_s", 0.0), "min_window_s", 0.0, MAX_WINDOW_S),
                live,
            )

        meter, self.rails, self.min_window_s, self.live = self._checked("welcome", describe)
        self.name = f"{meter}@{self.host}:{self.port}"
        best: tuple[float, float] | None = None
        for _ in range(OFFSET_EXCHANGES):
            sent = self.clock()
            reply = self._ask({"op": "time"})
            server = self._checked("time", lambda reply=reply: finite(reply["t"], "t", -1e15))
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
        return self._checked(
            "read", lambda: (finite(reply["t"], "t", -1e15) - self.offset_s, finite(reply["j"], "j", 0.0))
        )

    def stop(self) -> EnergyReading:
        try:
            reply = self._ask({"op": "stop"})
        finally:
            self.close()
        return self._checked("stop", lambda: self._reading(reply["reading"]))

    def _reading(self, r: Any) -> EnergyReading:
        if not isinstance(r, dict):
            raise BadMessage("reading is not an object")
        raw_extra = r.get("extra", {})
        if not isinstance(raw_extra, dict) or len(raw_extra) > MAX_EXTRA:
            raise BadMessage(f"extra is not an object of at most {MAX_EXTRA} entries")
        extra: dict[str, Any] = {}
        for key, value in raw_extra.items():
            if isinstance(value, str):
                extra[text(key, "extra key", 80)] = text(value, f"extra {key[:40]}")
            elif isinstance(value, int | float) and not isinstance(value, bool):
                extra[text(key, "extra key", 80)] = finite(value, f"extra {key[:40]}", -1e15)
        extra.update({"clock_offset_s": self.offset_s, "clock_rtt_s": self.rtt_s, "server": f"{self.host}:{self.port}"})
        samples = finite(r["samples"], "samples", 0, MAX_SAMPLES)
        if samples != int(samples):
            raise BadMessage("samples is not a whole number")
        return EnergyReading(
            energy_j=finite(r["energy_j"], "energy_j"),
            duration_s=finite(r["duration_s"], "duration_s", 0.0, 2 * MAX_WINDOW_S),
            avg_w=finite(r["avg_w"], "avg_w", 0.0, 1e7),
            meter=self.name,
            rails=list(self.rails),
            samples=int(samples),
            warning=text(r.get("warning", ""), "warning", 500),
            extra=extra,
        )

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
