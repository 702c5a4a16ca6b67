"""Wall power from SPEC PTDaemon, the power director MLPerf Power uses (``--meter ptd://host:port``).

PTDaemon talks lines over TCP (``\\r\\n``-terminated commands, one reply line
each). The commands and replies used here are those the MLCommons
power-dev client/server (ptd_client_server/lib/server.py, and the replies its
compliance/check.py expects of PTDaemon 1.11.1) sends and reads:

- ``Hello`` -> ``Hello, PTDaemon here!``; ``Identify`` -> the analyzer's model
  first (``YokogawaWT310,...``) and ``version=1.11.1-...``;
- ``RR`` -> ``Ranges,{amps auto},{amps range},{volts auto},{volts range}``;
- ``SR,A,{range|Auto}`` -> ``Range A changed``, ``SR,V,...`` -> ``Range V changed``;
- ``Go,{interval ms},0,{mark}`` -> ``Starting untimed measurement, ...``: the
  analyzer logs a sample every interval, tagged with the mark;
- ``Stop`` -> ``Stopping untimed measurement``;
- ``RL`` (``RL,*,*`` on multichannel analyzers, ``DC-RL`` on DC ones) ->
  ``Last N samples`` and then N lines ``Time,{t},Watts,{w},Volts,...``.

A window is ``Go`` sent just before it and ``Stop`` right after, with a mark
of its own; its energy is the mean of the samples logged between them times
the window's length, as MLPerf computes it (mean power over the run's
duration). Ranges given in the URL are set before ``Go`` (then ``settle_s``
is waited, as power-dev waits for the analyzer) and the analyzer's own are
put back after ``Stop``.
"""

from __future__ import annotations

import itertools
import math
import re
import time
import uuid

from tuner.devices.meters.lines import LineConnection
from tuner.devices.meters.urls import peer_url
from tuner.errors import UserError
from tuner.measure.meters import EnergyReading, MeterLost
from tuner.plumbing import interrupts

HELLO = "Hello, PTDaemon here!"
DEFAULT_PORT = 8888
SAMPLES_NEEDED = 5
MAX_SAMPLES = 1_000_000
_VERSION = re.compile(r"version=([^\s,-]+)")
_COUNTER = itertools.count(1)


class PtdMeter:
    """One analyzer behind PTDaemon; the reading names its model, PTDaemon's version and the ranges used."""

    def __init__(
        self,
        host: str,
        port: int = DEFAULT_PORT,
        amps: str | None = None,
        volts: str | None = None,
        interval_ms: int = 1000,
        settle_s: float = 10.0,
        timeout_s: float = 30.0,
    ) -> None:
        self.host, self.port = host, port
        self.amps, self.volts = amps, volts
        self.interval_ms = interval_ms
        self.settle_s = settle_s
        self.timeout_s = timeout_s
        self.name = "ptd"
        self.rails = [f"wall (AC) power through PTDaemon at {host}:{port}"]
        self.min_window_s = SAMPLES_NEEDED * interval_ms / 1000.0
        self.identity = ""
        self._conn: LineConnection | None = None
        self._ranges: tuple[str, str] = ("Auto", "Auto")
        self._mark = ""
        self._t0 = 0.0

    @classmethod
    def from_url(cls, url: str) -> PtdMeter:
        """``ptd://host[:port][?amps=A&volts=V&interval_ms=N&settle_s=S]``; a malformed one is a user error."""
        usage = (
            "write ptd://HOST:PORT (PTDaemon's -p port, 8888 by default), "
            "optionally ?amps=RANGE&volts=RANGE&interval_ms=1000&settle_s=10"
        )
        host, port, query = peer_url(url, "ptd", DEFAULT_PORT, {"amps", "volts", "interval_ms", "settle_s"}, usage)
        shown = f"ptd://{host}:{port}"
        try:
            interval = int(query.get("interval_ms", "1000"))
            settle = float(query.get("settle_s", "10"))
        except ValueError:
            raise UserError(f"--meter {shown}: interval_ms and settle_s must be numbers") from None
        if not 10 <= interval <= 60_000 or not 0 <= settle <= 600:  # NaN fails both comparisons: refused
            raise UserError(f"--meter {shown}: interval_ms must be 10..60000 and settle_s 0..600")
        for key in ("amps", "volts"):
            if key in query and query[key] != "Auto" and not _positive(query[key]):
                raise UserError(f"--meter {shown}: {key} must be a range in {key} or Auto, not {query[key][:20]!r}")
        return cls(host, port, query.get("amps"), query.get("volts"), interval, settle)

    def _connect(self) -> LineConnection:
        conn = LineConnection(self.host, self.port, f"PTDaemon at {self.host}:{self.port}", self.timeout_s)
        try:
            reply = conn.ask("Hello")
            if reply != HELLO:
                raise MeterLost(f"{self.host}:{self.port} is not PTDaemon (it answered Hello with {reply[:60]!r})")
            identity = conn.ask("Identify")
            self.identity = "".join(c for c in identity if c.isprintable())[:200]  # it goes into every reading
            self._ranges = _ranges(conn.ask("RR"))
        except MeterLost:
            conn.close()
            raise
        return conn

    def probe(self) -> dict[str, str]:
        """Connect, identify the analyzer and disconnect: what a command checks before it measures."""
        conn = self._connect()
        conn.close()
        return self.describe()

    def describe(self) -> dict[str, str]:
        match = _VERSION.search(self.identity)
        return {
            "analyzer": self.identity.split(",")[0] if self.identity else "",
            "ptd_version": match.group(1) if match else "",
            "amps_range": self.amps or self._ranges[0],
            "volts_range": self.volts or self._ranges[1],
            "interval_ms": str(self.interval_ms),
        }

    def _set(self, conn: LineConnection, which: str, value: str) -> None:
        reply = conn.ask(f"SR,{which},{value}")
        if reply != f"Range {which} changed":
            raise MeterLost(f"PTDaemon refused range {which}={value}: {reply[:80]}")

    def start(self) -> None:
        self._conn = conn = self._connect()
        try:
            self._go(conn)
        except MeterLost:
            conn.close()
            self._conn = None
            raise
        self._t0 = time.monotonic()

    def _go(self, conn: LineConnection) -> None:
        """Ranges if asked (then the settling wait), then Go with this window's mark."""
        changed = False
        for which, value in (("A", self.amps), ("V", self.volts)):
            if value is not None:
                self._set(conn, which, value)
                changed = True
        if changed:
            interrupts.sleep(self.settle_s)
            if interrupts.pending() is not None:
                raise MeterLost("a signal arrived while the analyzer's ranges settled")
        self._mark = f"powertune-{uuid.uuid4().hex[:8]}-{next(_COUNTER)}"
        reply = conn.ask(f"Go,{self.interval_ms},0,{self._mark}")
        if not reply.startswith("Starting untimed measurement"):
            raise MeterLost(f"PTDaemon did not start measuring: {reply[:80]}")

    def stop(self) -> EnergyReading:
        conn = self._conn
        if conn is None:
            raise MeterLost("stop() without start()")
        duration = time.monotonic() - self._t0
        try:
            reply = conn.ask("Stop")
            if not reply.startswith("Stopping untimed measurement"):
                raise MeterLost(f"PTDaemon did not stop measuring: {reply[:80]}")
            watts = _read_samples(conn, max_samples(duration, self.interval_ms))
            for which, value, initial in (("A", self.amps, self._ranges[0]), ("V", self.volts, self._ranges[1])):
                if value is not None:
                    self._set(conn, which, initial)
        finally:
            conn.close()
            self._conn = None
        good = [w for w in watts if math.isfinite(w) and w >= 0]
        if not good and watts:
            raise MeterLost(
                f"PTDaemon logged no valid sample: all {len(watts)} read NaN, negative or no Watts field: "
                "check the analyzer and its wiring (PTDaemon's own log says why)"
            )
        if not good:
            raise MeterLost(
                f"PTDaemon logged no valid sample in a {duration:.2f} s window: lengthen --window "
                f"(the analyzer samples every {self.interval_ms} ms)"
            )
        avg = sum(good) / len(good)
        warning = "" if len(good) == len(watts) else f"{len(watts) - len(good)} invalid analyzer samples left out"
        extra: dict[str, float | str] = {**self.describe(), "mark": self._mark, "ptd_samples": float(len(good))}
        if avg <= 0:
            raise MeterLost(f"PTDaemon read {avg:.3g} W over the window: check the analyzer's wiring")
        return EnergyReading(avg * duration, duration, avg, self.name, list(self.rails), len(good), warning, extra)


def max_samples(duration_s: float, interval_ms: int) -> int:
    """The most samples a window of ``duration_s`` can hold at ``interval_ms``, with room for the analyzer's slack."""
    return min(MAX_SAMPLES, 2 * math.ceil(duration_s * 1000.0 / interval_ms) + 10)


def _read_samples(conn: LineConnection, most: int) -> list[float]:
    """``RL`` (or the multichannel/DC form power-dev falls back to): the window's samples, first Watts of each.

    A count above ``most`` (more than the window can hold) is refused before a
    sample is read, and all of them must arrive within the connection's timeout.
    """
    header = conn.ask("RL,*,*")
    if "Invalid number of parameters" in header:
        header = conn.ask("RL")
    elif "Unknown command" in header:
        header = conn.ask("DC-RL")
    match = re.fullmatch(r"Last (\d{1,12}) samples.*", header)
    if match is None:
        raise MeterLost(f"PTDaemon answered RL with {header[:80]!r}, not 'Last N samples'")
    count = int(match.group(1))
    if count > most:
        raise MeterLost(f"PTDaemon announced {count} samples; a window this long holds at most {most}: not read")
    deadline = time.monotonic() + conn.timeout_s
    watts = []
    for _ in range(count):
        fields = conn.receive("the window's samples", deadline).split(",")
        try:
            watts.append(float(fields[fields.index("Watts") + 1]))
        except (ValueError, IndexError):
            watts.append(float("nan"))
    return watts


def _ranges(reply: str) -> tuple[str, str]:
    """``Ranges,{amps auto},{amps},{volts auto},{volts}``: a fixed range where autoranging is off, else Auto."""
    fields = reply.split(",")

    def pick(i: int) -> str:
        if len(fields) > i + 1 and fields[i] == "0" and _positive(fields[i + 1]):
            return fields[i + 1]
        return "Auto"

    return pick(1), pick(3)


def _positive(text: str) -> bool:
    """A finite positive number (an analyzer range): PTDaemon would be sent it verbatim."""
    try:
        value = float(text)
    except ValueError:
        return False
    return math.isfinite(value) and value > 0 and len(text) <= 20 and text.replace(".", "", 1).isdigit()
