"""Peers held to a protocol: tune meter-serve against hostile clients, and every client against hostile servers.

Each row is a misbehaviour seen from a loopback peer: a flood of idle
connections, 100,000 nested brackets before the login, a replayed login, a
silent or trickling server, a reply with NaN or a string for a number, a
PTDaemon announcing 10^8 samples, a Prometheus endpoint that redirects, cuts
its body or trickles its headers. The server must stay up and keep serving;
a client must end with one clear reason (MeterLost / RateUnavailable / a
one-line UserError), never a traceback, and within seconds of a signal.
Bounds on time are generous (10 s): they catch a hang, not a slow machine.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time

import pytest
from fakemeter import ConstantMeter
from hostilepeer import HostilePeer, challenge, http, replies, silent, trickle
from locations import FAKES

from tuner.devices.meters.ptd import PtdMeter
from tuner.devices.meters.registry import open_meter
from tuner.devices.meters.remote import PROTOCOL_VERSION, RemoteMeter, login_mac, welcome_mac
from tuner.devices.meters.serve import MeterServer
from tuner.errors import Terminated, UserError
from tuner.measure.meters import MeterLost
from tuner.plumbing import interrupts
from tuner.serve.rates import PrometheusRate, RateUnavailable, open_rate_source

TOKEN = "peers-token-0123456789"
BOUND_S = 10.0


@pytest.fixture
def server():
    served = MeterServer(ConstantMeter, TOKEN, login_s=1.0)
    served.start_background()
    yield served
    served.close()


def works(server: MeterServer) -> bool:
    """A real client can still log in, measure and hang up (retrying while the server sheds a flood)."""
    deadline = time.monotonic() + BOUND_S
    while True:
        meter = RemoteMeter(*server.address, TOKEN, timeout_s=5.0)
        try:
            meter.start()
            return meter.stop().avg_w == pytest.approx(42.0)
        except MeterLost:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def raw(server: MeterServer, payload: bytes) -> bytes:
    """Connect, read the challenge, send ``payload``, return what comes back before the server hangs up."""
    with socket.create_connection(server.address, timeout=BOUND_S) as conn:
        conn.makefile("rb").readline()
        got = b""
        try:
            conn.sendall(payload)
            while chunk := conn.recv(65536):
                got += chunk
        except (ConnectionResetError, BrokenPipeError):  # the server hung up with our bytes unread
            pass
        return got


# -- the server ---------------------------------------------------------------------------------

PRE_LOGIN = [
    ("nested brackets", b"[" * 100_000 + b"\n", b""),
    ("nested objects", b'{"a":' * 50 + b"1" + b"}" * 50 + b"\n", b"nested deeper"),
    ("an overlong line", b"x" * 100_000, b""),
    ("not JSON", b"hello there\n", b"not JSON"),
    ("a JSON list", b"[1, 2]\n", b"a message is a JSON object"),
    ("NaN", b'{"op": "hello", "version": 2, "nonce": NaN}\n', b"not a number"),
    (
        "a version-1 hello with the token",
        json.dumps({"op": "hello", "version": 1, "token": TOKEN}).encode() + b"\n",
        b"protocol version 2 only",
    ),
    (
        "a wrong mac",
        json.dumps({"op": "hello", "version": 2, "nonce": "c" * 32, "mac": "0" * 64}).encode() + b"\n",
        b"wrong token",
    ),
    (
        "a short nonce",
        json.dumps({"op": "hello", "version": 2, "nonce": "c", "mac": "0" * 64}).encode() + b"\n",
        b"nonce of 16-64",
    ),
    ("a start before login", b'{"op": "start"}\n', b"log in with hello"),
]


@pytest.mark.parametrize(("payload", "answer"), [r[1:] for r in PRE_LOGIN], ids=[r[0] for r in PRE_LOGIN])
def test_bad_input_before_login_is_refused_and_the_server_keeps_serving(server, payload, answer):
    assert answer in raw(server, payload)
    assert works(server)


def test_a_captured_login_cannot_be_replayed(server):
    captured: list[bytes] = []
    with socket.create_connection(server.address, timeout=BOUND_S) as conn:
        reader = conn.makefile("rb")
        nonce = json.loads(reader.readline())["nonce"]
        mine = "d" * 32
        hello = {
            "op": "hello",
            "version": PROTOCOL_VERSION,
            "nonce": mine,
            "mac": login_mac(TOKEN.encode(), nonce, mine),
        }
        captured.append(json.dumps(hello).encode() + b"\n")
        conn.sendall(captured[0])
        welcome = json.loads(reader.readline())
        assert welcome["ok"] and welcome["mac"] == welcome_mac(TOKEN.encode(), nonce, mine)
        assert TOKEN.encode() not in captured[0]  # the token never crosses the wire
    replayed = b""
    for _ in range(50):  # the first connection's hang-up frees the meter on the server's own thread
        replayed = raw(server, captured[0])
        if b"busy" not in replayed:
            break
        time.sleep(0.05)
    assert b"wrong token" in replayed


def test_an_idle_connection_is_dropped_after_the_login_time(server):
    with socket.create_connection(server.address, timeout=BOUND_S) as conn:
        conn.makefile("rb").readline()
        started = time.monotonic()
        assert conn.recv(100) == b""  # closed by the server
        assert time.monotonic() - started < BOUND_S


@pytest.mark.slow
def test_a_flood_of_300_idle_connections_leaves_the_server_up(server):
    flood = []
    for _ in range(300):
        try:
            flood.append(socket.create_connection(server.address, timeout=BOUND_S))
        except OSError:
            break
    try:
        assert works(server)
    finally:
        for conn in flood:
            conn.close()


def test_a_trickled_login_is_cut_at_the_login_time(server):
    started = time.monotonic()
    with socket.create_connection(server.address, timeout=BOUND_S) as conn:
        conn.makefile("rb").readline()
        with pytest.raises(OSError):
            for _ in range(40):
                conn.sendall(b" ")
                time.sleep(0.25)
    assert time.monotonic() - started < BOUND_S
    assert works(server)


def test_the_server_listens_on_ipv6_loopback():
    try:
        served = MeterServer(ConstantMeter, TOKEN, "::1", 0)
    except UserError as exc:
        pytest.skip(f"no IPv6 loopback here: {exc}")
    served.start_background()
    try:
        assert served.address[0] == "::1" and works(served)
    finally:
        served.close()


# -- remote:// and ptd:// clients: URLs ----------------------------------------------------------

BAD_URLS = [
    "remote://[::1",
    "remote://host:99999",
    "remote://host:",
    "remote://[::1]]:4951",
    "remote://host:0",
    "remote://host:port",
    "remote://user:pw@host:4951",
    "remote://host:4951/path",
    "remote://host:4951#frag",
    "remote://host:4951?token=abc",
    "remote://host:4951?token_file=a&token_file=b",
    "remote://ho st:4951",
    "remote://host\n:4951",
    "remote://" + "a" * 3000,
    "remote://-bad-:4951",
    "remote://h%00st:4951",
    "ptd://[::1",
    "ptd://host:70000",
    "ptd://host?interval_ms=nan",
    "ptd://host?settle_s=nan",
    "ptd://host?settle_s=inf",
    "ptd://host?amps=1e999",
    "ptd://host?amps=5%0aGo",
    "ptd://host?interval_ms=1&interval_ms=2",
    "ptd://host?bogus=1",
    "ptd://user@host",
]


@pytest.mark.parametrize("url", BAD_URLS)
def test_a_malformed_meter_url_is_one_line(url, monkeypatch):
    monkeypatch.setenv("TUNE_METER_TOKEN", TOKEN)
    with pytest.raises(UserError) as caught:
        open_meter(url)
    assert ("\n" not in str(caught.value) and "cannot read --meter" in str(caught.value)) or "--meter" in str(
        caught.value
    )


# -- remote:// client against lying servers -----------------------------------------------------


def lying(welcome: dict | None = None, time_reply: dict | None = None, stop_reply: dict | None = None, token=TOKEN):
    """A meter server that logs the client in properly, then answers with the fields given."""

    def handler(conn: socket.socket) -> None:
        reader = conn.makefile("rb")
        nonce = "e" * 32
        conn.sendall(challenge(nonce))
        hello = json.loads(reader.readline())
        mac = welcome_mac(token.encode(), nonce, hello["nonce"])
        base = {"ok": True, "version": 2, "mac": mac, "meter": "m", "rails": ["r"], "min_window_s": 0.0, "live": False}
        conn.sendall(json.dumps({**base, **(welcome or {})}).encode() + b"\n")
        while line := reader.readline():
            op = json.loads(line)["op"]
            reply = {"time": time_reply or {"ok": True, "t": 1.0}, "start": {"ok": True, "t": 1.0}}.get(op)
            if op == "stop":
                good = {"energy_j": 1.0, "duration_s": 1.0, "avg_w": 1.0, "samples": 2, "warning": "", "extra": {}}
                reply = stop_reply or {"ok": True, "reading": good}
            conn.sendall(json.dumps(reply).encode().replace(b'"__NaN__"', b"NaN") + b"\n")

    return handler


LIES = [
    ("meter is a number", lying(welcome={"meter": 5})),
    ("rails not a list", lying(welcome={"rails": "r"})),
    ("10,000 rails", lying(welcome={"rails": ["r"] * 10_000})),
    ("min_window_s NaN", lying(welcome={"min_window_s": "__NaN__"})),
    ("min_window_s negative", lying(welcome={"min_window_s": -1})),
    ("live a string", lying(welcome={"live": "yes"})),
    ("no meter", lying(welcome={"meter": None})),
    ("wrong welcome mac", lying(welcome={"mac": "0" * 64})),
    ("time a string", lying(time_reply={"ok": True, "t": "soon"})),
    ("time NaN", lying(time_reply={"ok": True, "t": "__NaN__"})),
    ("time missing", lying(time_reply={"ok": True})),
    (
        "energy NaN",
        lying(stop_reply={"ok": True, "reading": {"energy_j": "__NaN__", "duration_s": 1, "avg_w": 1, "samples": 1}}),
    ),
    (
        "energy a string",
        lying(stop_reply={"ok": True, "reading": {"energy_j": "1", "duration_s": 1, "avg_w": 1, "samples": 1}}),
    ),
    (
        "samples 1e30",
        lying(stop_reply={"ok": True, "reading": {"energy_j": 1, "duration_s": 1, "avg_w": 1, "samples": 1e30}}),
    ),
    ("reading a list", lying(stop_reply={"ok": True, "reading": []})),
    (
        "extra nested",
        lying(
            stop_reply={"ok": True, "reading": {"energy_j": 1, "duration_s": 1, "avg_w": 1, "samples": 1, "extra": [1]}}
        ),
    ),
    ("ok a string", lying(stop_reply={"ok": "yes"})),
    ("a token holder that lies about its version", replies(b'{"op": "challenge", "version": 1, "nonce": "x"}\n')),
    ("deep nesting", replies(b"[" * 100_000 + b"\n")),
    ("not JSON", replies(b"<html>\n")),
]


@pytest.mark.parametrize("handler", [r[1] for r in LIES], ids=[r[0] for r in LIES])
def test_a_lying_meter_server_is_meter_lost_never_a_traceback_or_nan(handler):
    with HostilePeer(handler) as peer:
        meter = RemoteMeter("127.0.0.1", peer.port, TOKEN, timeout_s=5.0)
        with pytest.raises(MeterLost) as caught:
            meter.start()
            meter.stop()
        assert "\n" not in str(caught.value)


SLOW = [
    ("silent", silent),
    ("trickling", trickle(b'{"op": "' + b"x" * 1000, 0.1)),
    ("trickled challenge", trickle(challenge(), 1.0)),
]


@pytest.mark.parametrize("handler", [r[1] for r in SLOW], ids=[r[0] for r in SLOW])
def test_a_slow_server_ends_at_the_total_deadline(handler):
    with HostilePeer(handler) as peer:
        started = time.monotonic()
        with pytest.raises(MeterLost, match=r"within|closed"):
            RemoteMeter("127.0.0.1", peer.port, TOKEN, timeout_s=2.0).start()
        assert time.monotonic() - started < BOUND_S


GARBAGE = [
    ("binary", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"),
    ("a banner without a newline", b"220 mail.example.com ESMTP"),
    ("NUL bytes", b"\x00" * 8),
]


@pytest.mark.parametrize("garbage", [g[1] for g in GARBAGE], ids=[g[0] for g in GARBAGE])
def test_garbage_instead_of_a_login_challenge_fails_at_once_not_at_the_deadline(garbage, rapl_at_15w, monkeypatch):
    from clirun import in_process

    monkeypatch.setenv("TUNE_METER_TOKEN", TOKEN)

    def handler(conn: socket.socket) -> None:
        conn.sendall(garbage)
        time.sleep(60)

    with HostilePeer(handler) as peer:
        started = time.monotonic()
        code, out, err = in_process(
            "measure", "--model", "tiny-cnn", "--device", "cpu", "-b", "2", "--meter", f"remote://127.0.0.1:{peer.port}"
        )
        elapsed = time.monotonic() - started
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "not this protocol" in lines[0] and out == "", err
    assert elapsed < BOUND_S


def _signal_self_after(seconds: float, sig: int = signal.SIGTERM) -> threading.Timer:
    timer = threading.Timer(seconds, lambda: os.kill(os.getpid(), sig))
    timer.start()
    return timer


@pytest.mark.parametrize("handler", [r[1] for r in SLOW], ids=[r[0] for r in SLOW])
def test_a_signal_ends_the_wait_on_a_slow_server_at_once(handler):
    with HostilePeer(handler) as peer:
        started = time.monotonic()
        timer = _signal_self_after(0.5)
        with pytest.raises(Terminated):
            with interrupts.held():
                with pytest.raises(MeterLost, match="signal"):
                    RemoteMeter("127.0.0.1", peer.port, TOKEN, timeout_s=60.0).start()
        timer.join()
        assert time.monotonic() - started < BOUND_S


# -- ptd:// --------------------------------------------------------------------------------------


def ptd(samples_line: bytes, sample: bytes = b"Time,1,Watts,100\r\n", count: int = 0):
    def handler(conn: socket.socket) -> None:
        reader = conn.makefile("rb")
        answers = {
            b"Hello": b"Hello, PTDaemon here!",
            b"Identify": b"Yokogawa,version=1.11.1",
            b"RR": b"Ranges,1,5,1,300",
            b"Stop": b"Stopping untimed measurement",
            b"RL,*,*": samples_line,
        }
        while line := reader.readline():
            command = line.strip()
            if command.startswith(b"Go,"):
                conn.sendall(b"Starting untimed measurement\r\n")
                continue
            if command.startswith(b"SR,"):
                conn.sendall(b"Range " + command[3:4] + b" changed\r\n")
                continue
            conn.sendall(answers.get(command, b"Unknown command") + b"\r\n")
            if command == b"RL,*,*":
                for _ in range(count):
                    conn.sendall(sample)

    return handler


@pytest.mark.parametrize(
    ("handler", "match"),
    [
        (ptd(b"Last 100000000 samples", count=10), "announced 100000000 samples"),
        (ptd(b"Last 99999999999999999999999 samples"), "not 'Last N samples'"),
        (ptd(b"Last 5 samples", count=2), "within|closed"),
        (ptd(b"Last 3 samples", sample=b"Time,1,Watts,nan\r\n", count=3), "no valid sample"),
        (ptd(b"Last 3 samples", sample=b"Time,1,Watts,-5\r\n", count=3), "no valid sample"),
    ],
    ids=["10^8 samples announced", "an absurd count", "samples cut short", "NaN watts", "negative watts"],
)
def test_a_lying_ptdaemon_is_meter_lost_at_once(handler, match):
    with HostilePeer(handler) as peer:
        meter = PtdMeter("127.0.0.1", peer.port, interval_ms=100, settle_s=0, timeout_s=2.0)
        started = time.monotonic()
        meter.start()
        with pytest.raises(MeterLost, match=match):
            meter.stop()
        assert time.monotonic() - started < BOUND_S


def test_the_ptd_settling_wait_ends_at_a_signal():
    with HostilePeer(ptd(b"Last 0 samples")) as peer:
        meter = PtdMeter("127.0.0.1", peer.port, amps="5", interval_ms=100, settle_s=600, timeout_s=2.0)
        started = time.monotonic()
        timer = _signal_self_after(0.5, signal.SIGHUP)
        with pytest.raises(Terminated):
            with interrupts.held():
                with pytest.raises(MeterLost):
                    meter.start()
        timer.join()
        assert time.monotonic() - started < BOUND_S


# -- the Prometheus rate source ------------------------------------------------------------------

OK = b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nq 150\n"
PROMETHEUS = [
    ("a redirect to another host", b"HTTP/1.0 302 Found\r\nLocation: http://example.com/metrics\r\n\r\n", "redirect"),
    ("a body cut before its length", b"HTTP/1.0 200 OK\r\nContent-Length: 400\r\n\r\nq 150\n", "cut reply"),
    ("a body cut mid-line", b"HTTP/1.0 200 OK\r\n\r\nq 15", "cut reply"),
    ("a cut header", b"HTTP/1.0 200 OK\r\nContent-Le", "no complete HTTP header"),
    ("chunks", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n6\r\nq 150\n\r\n0\r\n\r\n", "chunks"),
    ("not HTTP", b"SSH-2.0-OpenSSH\r\n\r\n", "did not answer HTTP"),
    ("a server error", b"HTTP/1.0 500 Oops\r\n\r\n", "HTTP 500"),
    ("NaN", b"HTTP/1.0 200 OK\r\n\r\nq NaN\n", "not a rate"),
    ("Inf", b"HTTP/1.0 200 OK\r\n\r\nq +Inf\n", "not a rate"),
]


@pytest.mark.parametrize(("answer", "match"), [r[1:] for r in PROMETHEUS], ids=[r[0] for r in PROMETHEUS])
def test_a_prometheus_endpoint_that_misbehaves_is_no_rate(answer, match):
    with HostilePeer(http(answer)) as peer:
        with pytest.raises(RateUnavailable, match=match):
            PrometheusRate(f"http://127.0.0.1:{peer.port}/metrics", "q").read()


def test_a_proxy_in_the_environment_is_not_used_for_loopback(monkeypatch):
    for name in ("http_proxy", "HTTP_PROXY", "all_proxy", "no_proxy"):
        monkeypatch.setenv(name, "http://127.0.0.1:9" if "proxy" in name and name != "no_proxy" else "")
    with HostilePeer(http(OK)) as peer:
        assert PrometheusRate(f"http://127.0.0.1:{peer.port}/metrics", "q").read() == 150.0


def test_headers_trickled_a_byte_at_a_time_end_at_the_deadline_and_at_a_signal():
    with HostilePeer(trickle(OK, 0.5)) as peer:
        url = f"http://127.0.0.1:{peer.port}/metrics"
        started = time.monotonic()
        with pytest.raises(RateUnavailable, match="did not answer within"):
            PrometheusRate(url, "q").read()
        assert time.monotonic() - started < BOUND_S
        timer = _signal_self_after(0.3)
        with pytest.raises(Terminated):
            with interrupts.held():
                with pytest.raises(RateUnavailable):
                    PrometheusRate(url, "q").read()
        timer.join()
        assert time.monotonic() - started < BOUND_S


@pytest.mark.parametrize(
    "spec",
    [
        "http://127.0.0.1:9/metrics#q r",
        "http://127.0.0.1:9/metrics#q\nX-Injected: 1",
        "http://user:pw@127.0.0.1:9/metrics#q",
        "https://127.0.0.1:9/metrics#q",
        "http://[::1/metrics#q",
        "http://127.0.0.1:99999/metrics#q",
        "http://127.0.0.1:9/metrics#1bad",
        "http://example.com/metrics#q",
    ],
)
def test_a_bad_rate_source_url_is_one_line(spec):
    with pytest.raises(UserError) as caught:
        open_rate_source(spec)
    assert "\n" not in str(caught.value)


# -- tune meter-serve from the command line -------------------------------------------------------

_METER = (
    "from tuner.measure.meters import EnergyReading\n"
    "class M:\n"
    "    def __init__(self, spec):\n"
    "        self.name, self.rails, self.min_window_s = 'm', ['r'], 0.0\n"
    "    def start(self):\n"
    "        pass\n"
    "    def stop(self):\n"
    "        return EnergyReading(1.0, 1.0, 1.0, 'm', ['r'], 2)\n"
)
PLUGINS = [
    ("raises at import", "raise RuntimeError('broken at import')\n", "py:plug:M", "RuntimeError: broken at import"),
    ("sys.exit at import", "import sys\nsys.exit(3)\n", "py:plug:M", "called sys.exit(3)"),
    ("os._exit at import", "import os\nos._exit(0)\n", "py:plug:M", "called os._exit(0)"),
    ("sys.exit in the factory", "import sys\ndef M(spec):\n    sys.exit(0)\n", "py:plug:M", "called sys.exit(0)"),
    ("os._exit in the factory", "import os\ndef M(spec):\n    os._exit(0)\n", "py:plug:M", "called os._exit(0)"),
    ("a syntax error", "def (:\n", "py:plug:M", "SyntaxError"),
    ("returns a number", "def M(spec):\n    return 5\n", "py:plug:M", "not a Meter instance"),
    ("returns its class", _METER + "def F(spec):\n    return M\n", "py:plug:F", "not a Meter instance"),
    ("rails not a list", _METER + "def F(spec):\n    m = M(spec)\n    m.rails = None\n    return m\n", "py:plug:F",
     "its rails are not a list"),
    ("a NaN min_window_s", _METER + "def F(spec):\n    m = M(spec)\n    m.min_window_s = float('nan')\n    return m\n",
     "py:plug:F", "min_window_s nan"),
    ("NaN readings", _METER.replace("1.0, 1.0, 1.0", "float('nan'), 1.0, float('nan')"), "py:plug:M",
     "read energy_j nan"),
    ("a stop that raises", _METER.replace("return EnergyReading(", "raise OSError('sensor gone')  # "),
     "py:plug:M", "OSError: sensor gone"),
]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize(("source", "spec", "fix"), [r[1:] for r in PLUGINS], ids=[r[0] for r in PLUGINS])
def test_meter_serve_with_a_broken_plugin_is_one_line_exit_2(tmp_path, source, spec, fix):
    from clirun import run_cli

    (tmp_path / "plug.py").write_text(source)
    r = run_cli(
        "meter-serve",
        "--meter",
        spec,
        "--listen",
        "127.0.0.1:0",
        env={"PYTHONPATH": str(tmp_path), "TUNE_METER_TOKEN": TOKEN},
        timeout=60,
    )
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: ") and fix in lines[0], r.stderr
    assert r.stdout == ""


@pytest.mark.slow
def test_meter_serve_listens_on_ipv6_loopback_from_the_cli_and_ends_on_sigterm(tmp_path, monkeypatch):
    import subprocess
    import sys

    if not socket.has_ipv6:
        pytest.skip("no IPv6 here")
    env = {**os.environ, "TUNE_METER_TOKEN": TOKEN, "PYTHONPATH": str(FAKES)}
    command = [sys.executable, "-m", "tuner", "meter-serve", "--meter", "py:fakemeter:ConstantMeter"]
    proc = subprocess.Popen(
        [*command, "--listen", "[::1]:0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        line = proc.stdout.readline()
        assert line.startswith("serving constant on remote://[::1]:"), line + proc.stderr.read()
        monkeypatch.setenv("TUNE_METER_TOKEN", TOKEN)
        meter = open_meter(line.split()[3])
        meter.start()
        assert meter.stop().avg_w == pytest.approx(42.0)
        proc.terminate()
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    finally:
        proc.kill()
        proc.wait()
