"""Probe the signal, peer and value classes as an attacker would, on loopback only; print pass/fail counts.

    python scripts/probe_peers.py [--out benchmarks/results/probe-peers.md] [--quick]

Classes (each case says what must hold):

- values: a bad number typed into a command (seed, target-qps, batch-timeout,
  windows, board ranges, pseudo-filesystem storage) exits 2 with one line and
  leaves its folder byte-identical (in-process CLI, many commands);
- urls: a malformed ``remote://`` / ``ptd://`` meter or Prometheus rate source
  is one line (a UserError), never a traceback;
- server: ``MeterServer`` fed garbage, deep nesting, overlong lines, replayed
  logins, trickled logins and a flood of 300 idle connections before a login
  keeps serving a real client afterwards;
- clients: a remote meter server, PTDaemon or Prometheus endpoint that lies
  (NaN, strings, missing fields, 10^8 samples, cut or redirected replies), is
  silent or trickles, ends as MeterLost / RateUnavailable with one line, within
  its deadline, and at once on a signal;
- signals: SIGTERM, SIGHUP and SIGQUIT during a hardware session or an apply
  on a fake Jetson board leave it byte-identical, and the message after a
  signal that lands past apply's writes says the mode stays;
- plugins: ``tune meter-serve --meter py:...`` with a plugin that raises,
  exits or ``os._exit``s is one line, exit 2 (a subprocess each).

Every peer listens on 127.0.0.1 (or ::1) on an ephemeral port; nothing else is
contacted. Timing bounds are generous (10 s): they catch a hang, not a slow machine.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "tests" / d) for d in ("fakes", "support", "devices/meters")] + [str(REPO)]

from clirun import folder_state, in_process  # noqa: E402
from fakeboard import make_fake_board  # noqa: E402
from fakemeter import ConstantMeter  # noqa: E402
from hostilepeer import HostilePeer, http, silent, trickle  # noqa: E402
from test_peers import BAD_URLS, LIES, PRE_LOGIN, PROMETHEUS, TOKEN, lying, ptd, raw, works  # noqa: E402

from tuner.devices.hardware_session import deployment, hardware_session, left_behind  # noqa: E402
from tuner.devices.jetson import JetsonDevice  # noqa: E402
from tuner.devices.meters.ptd import PtdMeter  # noqa: E402
from tuner.devices.meters.registry import open_meter  # noqa: E402
from tuner.devices.meters.remote import RemoteMeter  # noqa: E402
from tuner.devices.meters.serve import MeterServer  # noqa: E402
from tuner.errors import Terminated, UserError  # noqa: E402
from tuner.measure.meters import MeterLost  # noqa: E402
from tuner.plumbing import interrupts  # noqa: E402
from tuner.serve.rates import PrometheusRate, RateUnavailable, open_rate_source  # noqa: E402
from tuner.space import Config  # noqa: E402

BOUND_S = 10.0
Case = tuple[str, str, Callable[[], None]]  # class, name, check (raises AssertionError on a failure)


# -- values ---------------------------------------------------------------------------------------

COMMANDS = {
    "run": ("run", "-m", "tiny-cnn", "-d", "sim:orin", "-l", "50ms", "-n", "2"),
    "plan": ("plan", "-m", "tiny-cnn", "-d", "sim:orin", "-l", "50ms", "--rates", "10,20", "-n", "2"),
    "sweep": ("sweep", "-m", "tiny-cnn", "-d", "sim:orin"),
    "measure": ("measure", "-m", "tiny-cnn", "-d", "sim:orin", "-b", "1"),
    "roofline": ("roofline", "-m", "tiny-cnn", "-d", "sim:orin"),
    "report": ("report", "-m", "tiny-cnn", "-d", "sim:orin"),
    "replay": ("replay", "policy.yaml", "--trace", "diurnal", "-d", "sim:orin"),
}
SERVER_COMMANDS = ("run", "measure", "report")


def value_rows() -> list[tuple[tuple[str, ...], str]]:
    rows: list[tuple[tuple[str, ...], str]] = []
    for base in COMMANDS.values():
        for seed in ("-1", "4294967296", str(2**64), "-99999999999"):
            rows.append(((*base, "--seed", seed), "--seed must be an integer from 0 to 4294967295"))
    for name in SERVER_COMMANDS:
        base = (*COMMANDS[name], "--scenario", "server")
        for qps in ("inf", "-inf", "nan"):
            rows.append(((*base, "--target-qps", qps), "--target-qps must be a finite number"))
        for qps in ("1e308", "1e9", "100001", "0", "-1", "0.001"):
            rows.append(((*base, "--target-qps", qps), "q/s is outside 0.01 to 100000"))
        if name == "run":
            continue  # run tunes the batching timeout: it takes no --batch-timeout
        for timeout in ("nan", "inf"):
            rows.append(((*base, "--target-qps", "10", "--batch-timeout", timeout), "must be a finite number"))
        for timeout in ("-1", "1e12", "60001"):
            rows.append(((*base, "--target-qps", "10", "--batch-timeout", timeout), "must be a number from 0 to 60000"))
    for name in ("run", "measure", "report", "sweep"):
        for low, high in (("5", "1"), ("20", "10"), ("3600", "2")):
            rows.append(((*COMMANDS[name], "--min-window", low, "--window", high), "is longer than --window"))
    for flag in ("--tune-boards", "--judge-boards"):
        for text, fix in (
            ("5-1", "LOW <= HIGH"),
            ("0-1000000000", "more than 10000 boards"),
            ("0-99999999999999999999", "HIGH <= 4294967295"),
            ("0-5000,6000-12000", "more than 10000 boards"),
            ("1,2,x", "cannot read board seeds"),
            ("-3", "cannot read board seeds"),
        ):
            rows.append((("bench", flag, text), fix))
    for name in ("run", "plan"):
        for url in ("sqlite:////proc/tune.db", "sqlite:////sys/kernel/tune.db", "sqlite:////dev/shm/../tune.db"):
            top = "/" + url.split("////")[1].split("/")[0]
            rows.append(((*COMMANDS[name], "--storage", url), f"{top} holds the kernel's files"))
    return rows


def value_case(args: tuple[str, ...], fix: str, folder: Path) -> Callable[[], None]:
    def check() -> None:
        os.chdir(folder)
        before = folder_state(folder)
        code, _, err = in_process(*args)
        lines = err.strip().splitlines()
        assert code == 2, f"exit {code}: {err[-300:]}"
        assert len(lines) == 1 and lines[0].startswith("error: ") and fix in lines[0], err[-300:]
        assert folder_state(folder) == before, "wrote something"

    return check


# -- URLs -----------------------------------------------------------------------------------------

MORE_URLS = [
    *(f"remote://host:{port}" for port in ("-1", "65536", "1e3", "0x10", "")),
    *(f"ptd://host?interval_ms={v}" for v in ("0", "9", "60001", "nan", "1e9", "-5")),
    *(f"ptd://host?settle_s={v}" for v in ("-1", "601", "nan", "inf")),
    *(f"ptd://host?{k}={v}" for k in ("amps", "volts") for v in ("0", "-1", "nan", "inf", "5,Go", "5\r\nGo", "x" * 30)),
    "remote://[fe80::1%eth0",
    "remote://[::1]]:4951",
    "remote://host:4951?token_file",
    "ptd://",
    "remote://",
    "remote:host",
    "ptd:///path",
]
RATE_SOURCES = [
    "http://127.0.0.1:9/metrics#q r",
    "http://127.0.0.1:9/metrics#q\nX: 1",
    "http://127.0.0.1:9/metrics\r\nX: 1#q",
    "http://user:pw@127.0.0.1:9/metrics#q",
    "http://user@127.0.0.1:9/metrics#q",
    "https://127.0.0.1:9/metrics#q",
    "http://[::1/metrics#q",
    "http://127.0.0.1:99999/metrics#q",
    "http://127.0.0.1:port/metrics#q",
    "http://127.0.0.1:9/metrics#1bad",
    "http://127.0.0.1:9/metrics#",
    "http://example.com/metrics#q",
    "http://10.0.0.1/metrics#q",
    "http://127.0.0.1.example.com/metrics#q",
    "http://127.0.0.1:9/" + "a" * 3000 + "#q",
]


def url_case(url: str) -> Callable[[], None]:
    def check() -> None:
        os.environ["TUNE_METER_TOKEN"] = TOKEN
        try:
            open_meter(url)
        except UserError as exc:
            assert "\n" not in str(exc), str(exc)
            return
        raise AssertionError("accepted")

    return check


def rate_case(spec: str) -> Callable[[], None]:
    def check() -> None:
        try:
            open_rate_source(spec)
        except UserError as exc:
            assert "\n" not in str(exc), str(exc)
            return
        raise AssertionError("accepted")

    return check


# -- the server -----------------------------------------------------------------------------------

EXTRA_PRE_LOGIN = [
    *((f"{n} nested lists", b"[" * n + b"\n") for n in (17, 1000, 10_000, 500_000)),
    *((f"{n} bytes of one line", b"a" * n + b"\n") for n in (1025, 65_536, 1 << 20)),
    ("binary", bytes(range(256)) + b"\n"),
    ("a huge integer", b'{"op": "hello", "version": 2, "nonce": ' + b"9" * 900 + b"}\n"),
    ("null bytes", b"\0" * 2000),
    ("a hello without a mac", b'{"op": "hello", "version": 2, "nonce": "' + b"a" * 32 + b'"}\n'),
    ("a mac that is a list", b'{"op": "hello", "version": 2, "nonce": "' + b"a" * 32 + b'", "mac": [1]}\n'),
    ("a version that is a string", b'{"op": "hello", "version": "2"}\n'),
    ("a stop before login", b'{"op": "stop"}\n'),
    ("a read before login", b'{"op": "read"}\n'),
    ("an empty line", b"\n"),
]


def server_case(server: MeterServer, payload: bytes) -> Callable[[], None]:
    def check() -> None:
        raw(server, payload)
        assert works(server), "the server stopped serving"

    return check


def replay_case(server: MeterServer) -> Callable[[], None]:
    def check() -> None:
        from tuner.devices.meters.remote import login_mac

        with socket.create_connection(server.address, timeout=BOUND_S) as conn:
            reader = conn.makefile("rb")
            nonce = json.loads(reader.readline())["nonce"]
            hello = {"op": "hello", "version": 2, "nonce": "f" * 32, "mac": login_mac(TOKEN.encode(), nonce, "f" * 32)}
            line = json.dumps(hello).encode() + b"\n"
            conn.sendall(line)
            assert json.loads(reader.readline())["ok"]
        for _ in range(100):
            answer = raw(server, line)
            if b"busy" not in answer:
                break
            time.sleep(0.05)
        assert b"wrong token" in answer, answer[:100]

    return check


def flood_case(server: MeterServer, count: int) -> Callable[[], None]:
    def check() -> None:
        flood = []
        try:
            for _ in range(count):
                try:
                    flood.append(socket.create_connection(server.address, timeout=BOUND_S))
                except OSError:
                    break
            assert works(server), "no service during the flood"
        finally:
            for conn in flood:
                conn.close()
        assert works(server), "no service after the flood"

    return check


def trickled_login_case(server: MeterServer) -> Callable[[], None]:
    def check() -> None:
        started = time.monotonic()
        with socket.create_connection(server.address, timeout=BOUND_S) as conn:
            conn.makefile("rb").readline()
            try:
                for _ in range(60):
                    conn.sendall(b" ")
                    time.sleep(0.25)
            except OSError:
                pass
            else:
                raise AssertionError("a trickled login was kept open for 15 s")
        assert time.monotonic() - started < BOUND_S

    return check


# -- clients --------------------------------------------------------------------------------------


def lie_case(handler: Callable[[socket.socket], None]) -> Callable[[], None]:
    def check() -> None:
        with HostilePeer(handler) as peer:
            meter = RemoteMeter("127.0.0.1", peer.port, TOKEN, timeout_s=5.0)
            started = time.monotonic()
            try:
                meter.start()
                reading = meter.stop()
            except MeterLost as exc:
                assert "\n" not in str(exc)
                assert time.monotonic() - started < BOUND_S
                return
            raise AssertionError(f"accepted {reading}")

    return check


def more_lies() -> list[tuple[str, Callable[[socket.socket], None]]]:
    good = {"energy_j": 1, "duration_s": 1, "avg_w": 1, "samples": 1}
    rows = []
    for field, value in (
        ("energy_j", -1),
        ("energy_j", 1e300),
        ("duration_s", -1),
        ("duration_s", 1e9),
        ("avg_w", 1e12),
        ("samples", -1),
        ("samples", 1.5),
        ("samples", True),
        ("warning", "x" * 1000),
        ("warning", 5),
        ("extra", {str(i): i for i in range(100)}),
        ("extra", {"k": "v\nw"}),
    ):
        rows.append(
            (f"reading {field}={str(value)[:20]}", lying(stop_reply={"ok": True, "reading": {**good, field: value}}))
        )
    for field, value in (("rails", [1, 2]), ("rails", ["x" * 500]), ("meter", "a\nb"), ("min_window_s", 1e9)):
        rows.append((f"welcome {field}={str(value)[:20]}", lying(welcome={field: value})))
    rows.append(("a different token", lying(token="not-the-token")))
    return rows


def ptd_case(handler: Callable[[socket.socket], None]) -> Callable[[], None]:
    def check() -> None:
        with HostilePeer(handler) as peer:
            meter = PtdMeter("127.0.0.1", peer.port, interval_ms=100, settle_s=0, timeout_s=2.0)
            started = time.monotonic()
            try:
                meter.start()
                meter.stop()
            except MeterLost as exc:
                assert "\n" not in str(exc)
                assert time.monotonic() - started < BOUND_S
                return
            raise AssertionError("accepted")

    return check


PTD_LIES = [
    ("10^8 samples", ptd(b"Last 100000000 samples", count=5)),
    ("10^6 samples", ptd(b"Last 1000000 samples", count=5)),
    ("an absurd count", ptd(b"Last 99999999999999999999 samples")),
    ("a negative count", ptd(b"Last -5 samples")),
    ("no header", ptd(b"Samples follow")),
    ("samples cut short", ptd(b"Last 5 samples", count=2)),
    ("NaN watts", ptd(b"Last 3 samples", sample=b"Time,1,Watts,nan\r\n", count=3)),
    ("inf watts", ptd(b"Last 3 samples", sample=b"Time,1,Watts,inf\r\n", count=3)),
    ("negative watts", ptd(b"Last 3 samples", sample=b"Time,1,Watts,-5\r\n", count=3)),
    ("no Watts field", ptd(b"Last 3 samples", sample=b"Time,1,Volts,5\r\n", count=3)),
    ("a 2 MiB sample line", ptd(b"Last 1 samples", sample=b"W" * (2 << 20) + b"\r\n", count=1)),
    ("silent", silent),
    ("trickling", trickle(b"Hello, PTDaemon here!\r\n", 0.5)),
]


def prometheus_case(answer: bytes) -> Callable[[], None]:
    def check() -> None:
        with HostilePeer(http(answer)) as peer:
            try:
                value = PrometheusRate(f"http://127.0.0.1:{peer.port}/metrics", "q").read()
            except RateUnavailable as exc:
                assert "\n" not in str(exc)
                return
            raise AssertionError(f"took {value} as a rate")

    return check


MORE_PROMETHEUS = [
    b"HTTP/1.0 301 Moved\r\nLocation: http://127.0.0.1:1/\r\n\r\n",
    b"HTTP/1.0 307 Temporary\r\nLocation: http://10.0.0.1/\r\n\r\n",
    b"HTTP/1.0 308 Permanent\r\nLocation: http://example.com/\r\n\r\n",
    b"HTTP/1.0 200 OK\r\nContent-Length: abc\r\n\r\nq 1\n",
    b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nq 1\n",
    b"HTTP/1.0 200 OK\r\n\r\nq -1\n",
    b"HTTP/1.0 200 OK\r\n\r\nq 1e999\n",
    b"HTTP/1.0 200 OK\r\n\r\nother 1\n",
    b"HTTP/1.0 200 OK\r\n\r\n",
    b"HTTP/1.0 404 Not Found\r\n\r\n",
    b"",
    b"HTTP/1.0 200 OK\r\n" + b"X: y\r\n" * 10 + b"\r\nq 1",
]


def slow_case(handler: Callable[[socket.socket], None], kind: str, sig: int | None) -> Callable[[], None]:
    """A silent or trickling peer: the client ends by its deadline, or at once at a signal (``sig``)."""

    def attempt(port: int) -> None:
        if kind == "remote":
            RemoteMeter("127.0.0.1", port, TOKEN, timeout_s=2.0 if sig is None else 60.0).start()
        elif kind == "ptd":
            PtdMeter("127.0.0.1", port, timeout_s=2.0 if sig is None else 60.0).start()
        else:
            PrometheusRate(f"http://127.0.0.1:{port}/metrics", "q").read()

    def check() -> None:
        with HostilePeer(handler) as peer:
            started = time.monotonic()
            if sig is None:
                try:
                    attempt(peer.port)
                except (MeterLost, RateUnavailable):
                    assert time.monotonic() - started < BOUND_S
                    return
                raise AssertionError("a slow peer was taken")
            timer = _signal_after(0.3, sig)
            try:
                with interrupts.held():
                    try:
                        attempt(peer.port)
                    except (MeterLost, RateUnavailable):
                        pass
            except Terminated:
                assert time.monotonic() - started < BOUND_S, "outlived the signal"
                return
            finally:
                timer.join()
            raise AssertionError("the signal was lost")

    return check


def _signal_after(seconds: float, sig: int):
    import threading

    timer = threading.Timer(seconds, lambda: os.kill(os.getpid(), sig))
    timer.start()
    return timer


# -- signals on a fake board ----------------------------------------------------------------------


def signal_case(board_root: Path, kind: str, sig: int) -> Callable[[], None]:
    def check() -> None:
        board = make_fake_board(board_root / f"{kind}-{sig}", "orin-nano", "l4t36", seed=1)
        original = board.snapshot()
        dev = JetsonDevice("orin-nano", name="orin-nano", sysfs_root=board.root, nvpmodel=str(board.nvpmodel))
        default = dev.space().default_config(8)
        config = Config(knobs={**default.knobs, "nvpmodel": "7W", "gpu_mhz": 318.75}, batch_size=8)
        hold = hardware_session if kind == "session" else deployment
        try:
            with hold(dev):
                dev.apply(config)
                os.kill(os.getpid(), sig)
                interrupts.check()
        except Terminated as exc:
            assert exc.signum == sig
        else:
            raise AssertionError("the signal was lost")
        assert board.snapshot() == original, "the board was not restored"
        assert "restored (orin-nano)" in left_behind(), left_behind()

    return check


def applied_case(board_root: Path, sig: int) -> Callable[[], None]:
    """A signal after apply's writes (the deployment ended): the message says the mode stays."""

    def check() -> None:
        board = make_fake_board(board_root / f"applied-{sig}", "orin-nano", "l4t36", seed=1)
        original = board.snapshot()
        dev = JetsonDevice("orin-nano", name="orin-nano", sysfs_root=board.root, nvpmodel=str(board.nvpmodel))
        default = dev.space().default_config(8)
        config = Config(knobs={**default.knobs, "nvpmodel": "7W", "gpu_mhz": 318.75}, batch_size=8)
        try:
            with interrupts.held():
                with deployment(dev):
                    dev.apply(config)
                os.kill(os.getpid(), sig)
        except Terminated:
            pass
        assert board.snapshot() != original
        said = left_behind()
        assert "keeps the mode applied" in said and "no hardware was changed" not in said, said
        from tuner.devices.hardware_session import restore_device

        restore_device(dev)
        assert board.snapshot() == original

    return check


# -- plugins (a process each) ---------------------------------------------------------------------

PLUGINS = [
    ("raises at import", "raise RuntimeError('x')\n"),
    ("sys.exit at import", "import sys\nsys.exit(3)\n"),
    ("os._exit at import", "import os\nos._exit(0)\n"),
    ("sys.exit in the factory", "import sys\ndef M(spec):\n    sys.exit(0)\n"),
    ("os._exit in the factory", "import os\ndef M(spec):\n    os._exit(7)\n"),
    ("KeyboardInterrupt-free recursion", "def M(spec):\n    return M(spec)\n"),
    ("a syntax error", "def (:\n"),
    ("returns no meter", "def M(spec):\n    return 5\n"),
]


def plugin_case(folder: Path, name: str, source: str) -> Callable[[], None]:
    def check() -> None:
        where = folder / name.replace(" ", "_").replace(".", "_")
        where.mkdir(parents=True, exist_ok=True)
        (where / "plug.py").write_text(source)
        env = {**os.environ, "PYTHONPATH": f"{where}{os.pathsep}{REPO}", "TUNE_METER_TOKEN": TOKEN}
        command = [sys.executable, "-m", "tuner", "meter-serve", "--meter", "py:plug:M", "--listen", "127.0.0.1:0"]
        r = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2, f"exit {r.returncode}: {r.stderr[-300:]}"
        assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr[-300:]

    return check


# -- the probe ------------------------------------------------------------------------------------


def cases(work: Path, server: MeterServer, quick: bool) -> list[Case]:
    found: list[Case] = []
    values = work / "values"
    values.mkdir()
    for args, fix in value_rows():
        found.append(("values", " ".join(args[-4:]), value_case(args, fix, values)))
    for url in [*BAD_URLS, *MORE_URLS]:
        found.append(("urls", url[:60], url_case(url)))
    for spec in RATE_SOURCES:
        found.append(("urls", spec[:60], rate_case(spec)))
    for name, payload, _ in PRE_LOGIN:
        found.append(("server", name, server_case(server, payload)))
    for name, payload in EXTRA_PRE_LOGIN:
        found.append(("server", name, server_case(server, payload)))
    found.append(("server", "a replayed login", replay_case(server)))
    found.append(("server", "a trickled login", trickled_login_case(server)))
    for count in (50, 300) if not quick else (50,):
        found.append(("server", f"{count} idle connections", flood_case(server, count)))
    for name, handler in [*LIES, *more_lies()]:
        found.append(("clients", f"remote: {name}", lie_case(handler)))
    for name, handler in PTD_LIES:
        found.append(("clients", f"ptd: {name}", ptd_case(handler)))
    for name, answer, _ in PROMETHEUS:
        found.append(("clients", f"prometheus: {name}", prometheus_case(answer)))
    for answer in MORE_PROMETHEUS:
        found.append(("clients", f"prometheus: {answer[:30]!r}", prometheus_case(answer)))
    slow = {"silent": silent, "trickling": trickle(b"x" * 200, 0.2)}
    for kind in ("remote", "ptd", "prometheus"):
        for name, handler in slow.items():
            for sig in (None, signal.SIGTERM, signal.SIGHUP):
                label = "deadline" if sig is None else signal.Signals(sig).name
                found.append(("clients", f"{kind} {name}: {label}", slow_case(handler, kind, sig)))
    boards = work / "boards"
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        for kind in ("session", "apply"):
            found.append(("signals", f"{signal.Signals(sig).name} mid-{kind}", signal_case(boards, kind, sig)))
        found.append(("signals", f"{signal.Signals(sig).name} after apply", applied_case(boards, sig)))
    if not quick:
        for name, source in PLUGINS:
            found.append(("plugins", name, plugin_case(work / "plugins", name, source)))
    return found


def _commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    except OSError:
        return "unknown"
    return out.stdout.strip() or "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, help="write the summary (markdown) here")
    parser.add_argument("--quick", action="store_true", help="leave out the 300-connection flood and the plugins")
    args = parser.parse_args()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="probe-peers-") as tmp:
        work = Path(tmp)
        os.environ["TUNE_STATE_DIR"] = str(work / "state")
        os.environ.pop("TUNE_SYSFS_ROOT", None)
        server = MeterServer(ConstantMeter, TOKEN, login_s=1.0)
        server.start_background()
        results: dict[str, list[int]] = {}
        failures: list[str] = []
        here = os.getcwd()
        try:
            for cls, name, check in cases(work, server, args.quick):
                counts = results.setdefault(cls, [0, 0])
                try:
                    check()
                    counts[0] += 1
                except BaseException as exc:  # a probe case must never end the probe (signals included)
                    counts[1] += 1
                    detail = str(exc) if isinstance(exc, AssertionError) else traceback.format_exc(limit=3)
                    failures.append(f"{cls}: {name}: {' '.join(detail.split())[:300]}")
                finally:
                    os.chdir(here)
                    for (
                        sig
                    ) in interrupts.SIGNALS:  # the in-process CLI installs its own handlers; a late one is ignored
                        signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_IGN)
        finally:
            server.close()
    seconds = time.monotonic() - started
    total_pass = sum(c[0] for c in results.values())
    total_fail = sum(c[1] for c in results.values())
    lines = [
        "# Probe: signals, peers and values (scripts/probe_peers.py)",
        "",
        f"- date: {dt.datetime.now(dt.timezone.utc).isoformat(timespec='seconds')}",
        f"- machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, no GPU",
        f"- command: python scripts/probe_peers.py{' --quick' if args.quick else ''}"
        + (f" --out {args.out}" if args.out is not None else ""),
        f"- code: commit {_commit()}",
        f"- user: uid {os.getuid()}; peers on loopback only; {seconds:.0f} s",
        "",
        "| class | pass | fail |",
        "|---|---:|---:|",
        *(f"| {cls} | {p} | {f} |" for cls, (p, f) in results.items()),
        f"| **all** | **{total_pass}** | **{total_fail}** |",
        "",
    ]
    if failures:
        lines += ["## Failures", "", *(f"- {line}" for line in failures), ""]
    text = "\n".join(lines)
    print(text)
    if args.out is not None:
        args.out.write_text(text)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
