"""Where the governor reads the observed arrival rate from.

The serving process knows its own request rate; it hands it over one of three
ways, chosen with ``--rate-source``:

- ``file:PATH`` (or a bare path): a file whose last non-empty line is the rate
  in queries/s, rewritten by the server (best replaced atomically; an empty
  read, a rewrite caught between truncation and write, is read again);
- ``unix:PATH``: a local unix datagram socket the governor creates, to which
  the server sends the rate as text (the newest datagram wins);
- ``http://127.0.0.1:PORT/metrics#METRIC``: a Prometheus text endpoint on
  loopback (read directly: no proxy, no redirect, no cut body); a gauge is the
  rate itself, a counter (``..._total``) is turned into a rate from the change
  between two reads.

An embedding server calls ``Governor.observe(rate)`` instead. A source that
cannot be opened is a user error at start-up; one that fails later raises
:class:`RateUnavailable`, which the governor logs and answers with the
highest-throughput band.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import socket
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit

from tuner.errors import ConfigurationError, UserError
from tuner.plumbing import interrupts
from tuner.plumbing.readfile import read_tail

LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")
# Every read is bounded: an endpoint has this long in all to answer (a server
# that trickles a byte a second would otherwise hold the governor past a
# signal) and this many bytes; of a rate file only the tail is read; a
# datagram longer than a rate can be is refused, not cut.
HTTP_TIMEOUT_S = 2.0
MAX_HTTP_BYTES = 8 << 20
FILE_TAIL_BYTES = 4096
MAX_DATAGRAM = 256
MAX_DRAIN = 10_000  # datagrams taken per read; the newest of them wins
MAX_SOCKET_PATH = 108  # sun_path, with its terminating zero byte (Linux)
# A Prometheus text sample: name, optional {labels}, value, optional timestamp.
METRIC_NAME = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]{0,199}")
SAMPLE = re.compile(r"([A-Za-z_:][A-Za-z0-9_:]*)(?:\{.*\})?\s+(\S+)(?:\s+-?\d+)?")


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
    """The last non-empty line of a file the serving process rewrites (or appends to).

    Only the file's last ``FILE_TAIL_BYTES`` are read, so a file that grows
    without end costs no more than a short one; it must be a regular file (a
    named pipe would block the governor past a signal).

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
                tail = read_tail(self.path, "rate file", FILE_TAIL_BYTES)
            except UserError as exc:
                raise RateUnavailable(str(exc)) from None
            lines = [line for line in tail.decode(errors="replace").splitlines() if line.strip()]
            if lines:
                return _parse_rate(lines[-1].split(",")[-1], str(self.path))
            if attempt < self.retries:
                self.sleep(self.retry_s)
        raise RateUnavailable(f"{self.path} is empty")

    def close(self) -> None:
        """Nothing held open between reads."""


class SocketRate:
    """A unix datagram socket the governor creates and owns; the newest rate received is the rate.

    The socket is created only at a path where nothing exists, and removed
    at the end only if it is still the one this governor created: a second
    governor refused on the same path never deafens the first. A datagram
    longer than ``MAX_DATAGRAM`` bytes, or one that is not a rate, is refused
    (and reported through ``warn``); the last good rate is kept.
    """

    def __init__(self, path: Path, stale_s: float = 60.0, warn: Callable[[str], None] | None = None) -> None:
        self.path = path
        self.stale_s = stale_s
        self.warn = warn
        self.description = f"unix socket {path}"
        self.last: float | None = None
        self.last_at = 0.0
        if len(os.fsencode(path)) >= MAX_SOCKET_PATH:
            raise ConfigurationError(
                f"unix socket path {path} is longer than {MAX_SOCKET_PATH - 1} bytes: pick a shorter path"
            )
        if os.path.lexists(path):
            raise ConfigurationError(
                f"cannot listen on unix socket {path}: something exists there (another governor's socket?); "
                "remove it if nothing uses it, or pick another path"
            )
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            self.sock.bind(str(path))
            info = os.lstat(path)
        except OSError as exc:
            self.sock.close()
            reason = exc.strerror or str(exc)
            raise ConfigurationError(f"cannot listen on unix socket {path}: {reason}; pick a writable path") from None
        self.identity = (info.st_dev, info.st_ino)
        self.sock.setblocking(False)

    def read(self) -> float:
        for _ in range(MAX_DRAIN):  # a sender flooding the socket cannot hold the loop
            try:
                data = self.sock.recv(MAX_DATAGRAM + 1)
            except BlockingIOError:
                break
            try:
                if len(data) > MAX_DATAGRAM:
                    raise RateUnavailable(
                        f"{self.description}: a message of more than {MAX_DATAGRAM} bytes is not a rate"
                    )
                self.last = _parse_rate(data.decode(errors="replace"), self.description)
                self.last_at = time.monotonic()
            except RateUnavailable as exc:
                if self.warn is not None:
                    self.warn(f"{exc}; ignored, keeping the last good rate")
        if self.last is None:
            raise RateUnavailable(f"nothing received yet on {self.path}")
        if time.monotonic() - self.last_at > self.stale_s:
            raise RateUnavailable(f"nothing received on {self.path} for {self.stale_s:g} s")
        return self.last

    def close(self) -> None:
        """Close the socket, and remove its path only if it is still the socket this governor created."""
        self.sock.close()
        with contextlib.suppress(OSError):
            info = os.lstat(self.path)
            if (info.st_dev, info.st_ino) == self.identity and stat.S_ISSOCK(info.st_mode):
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
        text = self._fetch()
        total, found = 0.0, False
        for line in text.splitlines():
            if line.startswith("#") or not line.strip():
                continue
            match = SAMPLE.fullmatch(line.strip())
            if match is None:
                if line.split("{", 1)[0].split(" ", 1)[0] == self.metric:
                    raise RateUnavailable(f"{self.url}: cannot read the line {line.strip()[:60]!r} as a sample")
                continue
            if match.group(1) != self.metric:
                continue
            total += _parse_rate(match.group(2), self.description)
            found = True
        if not found:
            raise RateUnavailable(f"{self.url} has no metric {self.metric}")
        return total

    def _fetch(self) -> str:
        """The endpoint's body: a plain HTTP/1.0 GET on loopback, whole within HTTP_TIMEOUT_S and MAX_HTTP_BYTES.

        Written on a bare socket, not urllib: no proxy from the environment is
        consulted (the endpoint is on this host), no redirect is followed (a
        3xx is refused), the deadline covers the headers as well as the body
        (however slowly they trickle) and ends at the first signal, and a body
        shorter than its Content-Length, or without its final newline, is a
        cut reply, not a rate.
        """
        parts = urlsplit(self.url)
        host = "127.0.0.1" if parts.hostname == "localhost" else (parts.hostname or "")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        if parts.scheme != "http":
            raise RateUnavailable(f"{self.url}: only http:// is read on loopback (no TLS there)")
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        deadline = time.monotonic() + HTTP_TIMEOUT_S
        request = f"GET {path} HTTP/1.0\r\nHost: {parts.netloc}\r\nAccept: text/plain\r\nConnection: close\r\n\r\n"
        data = b""
        try:
            with socket.create_connection((host, port), timeout=HTTP_TIMEOUT_S) as sock:
                sock.sendall(request.encode("ascii"))
                while True:
                    left = deadline - time.monotonic()
                    if left <= 0 or interrupts.pending() is not None:
                        raise RateUnavailable(f"{self.url} did not answer within {HTTP_TIMEOUT_S:g} s")
                    sock.settimeout(min(left, 0.2))
                    try:
                        chunk = sock.recv(65536)
                    except TimeoutError:
                        continue
                    if not chunk:
                        break
                    data += chunk
                    if len(data) > MAX_HTTP_BYTES:
                        raise RateUnavailable(f"{self.url} answered more than {MAX_HTTP_BYTES >> 20} MiB")
        except (OSError, UnicodeEncodeError) as exc:
            raise RateUnavailable(f"cannot read {self.url}: {getattr(exc, 'strerror', None) or exc}") from None
        return _http_body(data, self.url)

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


def _http_body(data: bytes, url: str) -> str:
    """The body of a whole ``200`` reply; a redirect, another status, chunks or a cut body are refused."""
    head, sep, body = data.partition(b"\r\n\r\n")
    if not sep:
        raise RateUnavailable(f"{url} sent no complete HTTP header (a cut reply)")
    lines = head.decode("latin-1").split("\r\n")
    status = lines[0].split(" ", 2)
    if len(status) < 2 or not status[0].startswith("HTTP/1.") or not status[1].isdigit():
        raise RateUnavailable(f"{url} did not answer HTTP ({lines[0][:40]!r})")
    code = int(status[1])
    if 300 <= code < 400:
        raise RateUnavailable(f"{url} answered a redirect ({code}): redirects are not followed; give the final URL")
    if code != 200:
        raise RateUnavailable(f"{url} answered HTTP {code}")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    if "chunked" in headers.get("transfer-encoding", "").lower():
        raise RateUnavailable(f"{url} answered in chunks to an HTTP/1.0 request: not read")
    length = headers.get("content-length")
    if length is not None:
        if not length.isdigit() or int(length) != len(body):
            raise RateUnavailable(f"{url} sent {len(body)} bytes of a {length[:20]}-byte body (a cut reply)")
    elif body and not body.endswith(b"\n"):
        raise RateUnavailable(f"{url} sent a body that stops mid-line (a cut reply)")
    return body.decode(errors="replace")


def open_rate_source(spec: str, warn: Callable[[str], None] | None = None) -> RateSource:
    """Open ``--rate-source``; one that cannot work at all is a user error before anything is applied.

    A file or endpoint is read once here: one that exists but does not hold a
    rate (binary data, another metric) is refused now rather than sending the
    governor to its safe band for good.
    """
    if spec.startswith(("http://", "https://")):
        url, _, metric = spec.partition("#")
        usage = "write http://127.0.0.1:PORT/metrics#METRIC"
        if len(spec) > 2048 or not spec.isascii() or not spec.isprintable() or any(c.isspace() for c in spec):
            raise ConfigurationError(
                f"cannot read the rate source URL {spec[:80]!r}: printable ASCII without spaces; {usage}"
            )
        try:
            parts = urlsplit(url)
            host, _port = parts.hostname or "", parts.port
        except ValueError as exc:
            raise ConfigurationError(f"cannot read the rate source URL {url[:80]!r} ({exc}): {usage}") from None
        if parts.scheme != "http" or parts.username is not None or parts.password is not None:
            raise ConfigurationError(
                f"the rate source URL {url[:80]!r} must be plain http:// with no user or password: {usage}"
            )
        if host not in LOOPBACK and f"[{host}]" not in LOOPBACK:
            raise ConfigurationError(
                f"the Prometheus endpoint must be on loopback, not {host!r}: use http://127.0.0.1:PORT/..."
            )
        if not metric:
            raise ConfigurationError(f"name the metric after '#': e.g. {url}#serving_requests_per_second")
        if not METRIC_NAME.fullmatch(metric):
            raise ConfigurationError(
                f"{metric[:60]!r} is not a Prometheus metric name: e.g. {url}#serving_requests_per_second"
            )
        source: RateSource = PrometheusRate(url, metric)
        try:
            source.read()
        except RateUnavailable as exc:
            if "second read" not in str(exc):
                raise ConfigurationError(f"unreadable rate source: {exc}") from None
        return source
    if spec.startswith("unix:"):
        return SocketRate(Path(spec[len("unix:") :]), warn=warn)
    path = Path(spec[len("file:") :] if spec.startswith("file:") else spec)
    if not os.path.exists(path):
        raise ConfigurationError(
            f"unreadable rate source: no file {path}; the serving process must write its rate there"
        )
    source = FileRate(path)
    try:
        source.read()
    except RateUnavailable as exc:
        if not str(exc).endswith("is empty"):
            raise ConfigurationError(f"unreadable rate source: {exc}") from None
    return source
