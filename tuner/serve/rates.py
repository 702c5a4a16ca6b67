"""Where the governor reads the observed arrival rate from.

The serving process knows its own request rate; it hands it over one of three
ways, chosen with ``--rate-source``:

- ``file:PATH`` (or a bare path): a file whose last non-empty line is the rate
  in queries/s, rewritten by the server (best replaced atomically; an empty
  read, a rewrite caught between truncation and write, is read again);
- ``unix:PATH``: a local unix datagram socket the governor creates, to which
  the server sends the rate as text (the newest datagram wins);
- ``http://127.0.0.1:PORT/metrics#METRIC``: a Prometheus text endpoint on
  loopback; a gauge is the rate itself, a counter (``..._total``) is turned into
  a rate from the change between two reads.

An embedding server calls ``Governor.observe(rate)`` instead. A source that
cannot be opened is a user error at start-up; one that fails later raises
:class:`RateUnavailable`, which the governor logs and answers with the
highest-throughput band.
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit

from tuner.errors import UserError

LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")
HTTP_TIMEOUT_S = 2.0


class RateUnavailable(Exception):
    """The rate could not be read this time (the message says why)."""


class RateSource(Protocol):
    description: str

    def read(self) -> float: ...

    def close(self) -> None: ...


def _parse_rate(text: str, where: str) -> float:
    try:
        rate = float(text.strip())
    except ValueError:
        raise RateUnavailable(f"{where}: {text.strip()[:40]!r} is not a rate in queries/s") from None
    if not math.isfinite(rate) or rate < 0:
        raise RateUnavailable(f"{where}: {rate} is not a rate in queries/s")
    return rate


class FileRate:
    """The last non-empty line of a file the serving process rewrites.

    A server that rewrites the file in place (``echo 250 > rate``) truncates
    it before it writes, and a read in between finds it empty; on a loaded
    machine the writer can be descheduled there for milliseconds. An empty
    read is therefore read again ``retries`` times, ``retry_s`` apart, before
    it counts as unreadable (which sends the governor to its safe band).
    Replacing the file atomically (write a temporary file, rename it) avoids
    the window altogether.
    """

    def __init__(
        self, path: Path, retries: int = 3, retry_s: float = 0.01, sleep: Callable[[float], None] = time.sleep
    ) -> None:
        self.path = path
        self.description = f"file {path}"
        self.retries = retries
        self.retry_s = retry_s
        self.sleep = sleep

    def read(self) -> float:
        for attempt in range(self.retries + 1):
            try:
                lines = [line for line in self.path.read_text().splitlines() if line.strip()]
            except OSError as exc:
                raise RateUnavailable(f"cannot read {self.path}: {exc.strerror}") from None
            if lines:
                return _parse_rate(lines[-1].split(",")[-1], str(self.path))
            if attempt < self.retries:
                self.sleep(self.retry_s)
        raise RateUnavailable(f"{self.path} is empty")

    def close(self) -> None:
        """Nothing held open between reads."""


class SocketRate:
    """A unix datagram socket the governor owns; the newest datagram received is the rate."""

    def __init__(self, path: Path, stale_s: float = 60.0) -> None:
        self.path = path
        self.stale_s = stale_s
        self.description = f"unix socket {path}"
        self.last: float | None = None
        self.last_at = 0.0
        with contextlib.suppress(FileNotFoundError):
            if path.is_socket():
                path.unlink()
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            self.sock.bind(str(path))
        except OSError as exc:
            self.sock.close()
            raise UserError(f"cannot listen on unix socket {path}: {exc.strerror}; pick a writable path") from None
        self.sock.setblocking(False)

    def read(self) -> float:
        while True:
            try:
                data = self.sock.recv(256)
            except BlockingIOError:
                break
            self.last = _parse_rate(data.decode(errors="replace"), self.description)
            self.last_at = time.monotonic()
        if self.last is None:
            raise RateUnavailable(f"nothing received yet on {self.path}")
        if time.monotonic() - self.last_at > self.stale_s:
            raise RateUnavailable(f"nothing received on {self.path} for {self.stale_s:g} s")
        return self.last

    def close(self) -> None:
        self.sock.close()
        with contextlib.suppress(OSError):
            os.unlink(self.path)


class PrometheusRate:
    """A metric from a Prometheus text endpoint on loopback (sum over its label sets)."""

    def __init__(self, url: str, metric: str) -> None:
        self.url = url
        self.metric = metric
        self.description = f"{metric} at {url}"
        self.counter = metric.endswith("_total")
        self.previous: tuple[float, float] | None = None

    def _value(self) -> float:
        try:
            with urllib.request.urlopen(self.url, timeout=HTTP_TIMEOUT_S) as response:
                text = response.read().decode(errors="replace")
        except (urllib.error.URLError, OSError) as exc:
            raise RateUnavailable(f"cannot read {self.url}: {getattr(exc, 'reason', exc)}") from None
        total, found = 0.0, False
        for line in text.splitlines():
            if line.startswith("#") or not line.strip():
                continue
            name = line.split("{", 1)[0].split()[0]
            if name != self.metric:
                continue
            value = line.rsplit("}", 1)[-1].split()[0] if "}" in line else line.split()[1]
            total += _parse_rate(value, self.description)
            found = True
        if not found:
            raise RateUnavailable(f"{self.url} has no metric {self.metric}")
        return total

    def read(self) -> float:
        value, now = self._value(), time.monotonic()
        if not self.counter:
            return value
        previous, self.previous = self.previous, (value, now)
        if previous is None or now <= previous[1] or value < previous[0]:
            raise RateUnavailable(f"counter {self.metric} needs a second read for a rate")
        return (value - previous[0]) / (now - previous[1])

    def close(self) -> None:
        """Nothing held open between reads."""


def open_rate_source(spec: str) -> RateSource:
    """Open ``--rate-source``; one that cannot work at all is a user error before anything is applied."""
    if spec.startswith(("http://", "https://")):
        url, _, metric = spec.partition("#")
        host = urlsplit(url).hostname or ""
        if host not in LOOPBACK and f"[{host}]" not in LOOPBACK:
            raise UserError(f"the Prometheus endpoint must be on loopback, not {host!r}: use http://127.0.0.1:PORT/...")
        if not metric:
            raise UserError(f"name the metric after '#': e.g. {url}#serving_requests_per_second")
        source: RateSource = PrometheusRate(url, metric)
        try:
            source.read()
        except RateUnavailable as exc:
            if "second read" not in str(exc):
                raise UserError(f"unreadable rate source: {exc}") from None
        return source
    if spec.startswith("unix:"):
        return SocketRate(Path(spec[len("unix:") :]))
    path = Path(spec[len("file:") :] if spec.startswith("file:") else spec)
    if not path.is_file():
        raise UserError(f"unreadable rate source: no file {path}; the serving process must write its rate there")
    return FileRate(path)
