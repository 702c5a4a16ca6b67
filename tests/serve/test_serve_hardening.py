"""tune govern and tune plan on a fake AGX Orin under hostile conditions, and device plugins that misbehave.

A journal folder another user owns, a second governor on the same socket, an
over-long datagram, a server that trickles its answer, a long interval cut
by SIGTERM, kill -9 and the state file, a plan's device lock, a plan over a
study of another space; plugins that raise, exit or return NaN. Every
refusal is one line with exit 2 and leaves the board byte-identical. Hangs
are bounded generously (20 s after the first signal): nothing here is timed.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from clirun import in_process, run_cli, wait_while_running
from fakeboard import make_fake_board
from test_govern_fake_orin import board_policy

from tuner.errors import UserError
from tuner.serve import rates
from tuner.serve.governor import read_state
from tuner.serve.rates import PrometheusRate, RateUnavailable, SocketRate

SIGNAL_BOUND_S = 20.0


@pytest.fixture
def board(tmp_path, monkeypatch):
    # MAXN: the policies' two modes (MAXN, 50W) share its TPC mask, so switching needs no reboot
    return make_fake_board(tmp_path / "board", "orin-agx", "l4t36", seed=1, start="MAXN").install(monkeypatch)


def one_error(r: subprocess.CompletedProcess) -> str:
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = [line for line in r.stderr.strip().splitlines() if not line.startswith("note: ")]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in r.stderr, r.stderr
    return lines[0]


def in_cli(*args: str) -> subprocess.CompletedProcess:
    """``tune ARGS`` in this process, as a CompletedProcess for one_error: where the message is the point."""
    return subprocess.CompletedProcess(args, *in_process(*args))


def govern(tmp_path: Path, policy: Path, source: str, *extra: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "tuner", "govern", str(policy), "--device", "orin", "--rate-source", source]
    cmd += ["--interval", "0.05", "--min-dwell", "0", *extra]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def stop(proc: subprocess.Popen, sig: int = signal.SIGTERM) -> tuple[str, str]:
    """Send one signal; the command must end within the bound (it is never sent a second)."""
    os.kill(proc.pid, sig)
    try:
        return proc.communicate(timeout=SIGNAL_BOUND_S)
    finally:
        if proc.poll() is None:
            proc.kill()


# -- the state folder -------------------------------------------------------------------


@pytest.mark.skipif(os.geteuid() != 0, reason="planting a journal as another user needs root (chown)")
def test_a_journal_folder_another_user_owns_is_refused_and_the_board_untouched(board, tmp_path):
    original = board.snapshot()
    policy, rate = tmp_path / "policy.yaml", tmp_path / "rate"
    board_policy(policy)
    rate.write_text("250\n")
    folder = Path(os.environ["TUNE_STATE_DIR"]) / "journal"
    folder.mkdir(parents=True)
    folder.chmod(0o777)
    os.chown(folder, 65534, 65534)
    planted = folder / "orin.json"
    entry = {"version": 1, "device": "orin", "kind": "orin-agx", "pid": 1, "written_at": 0.0, "state": {}}
    planted.write_text(json.dumps({**entry, "state": {"nvpmodel_id": 1}}))
    os.chown(planted, 65534, 65534)
    line = one_error(run_cli("govern", str(policy), "-d", "orin", "--rate-source", str(rate), "--duration", "1"))
    assert "refusing the state folder" in line and "owned by another user" in line
    assert "cannot be trusted" in one_error(in_cli("restore"))  # never "nothing to restore"
    assert "refusing the state folder" in one_error(in_cli("restore", "-d", "orin"))
    assert board.snapshot() == original
    os.chown(folder, 0, 0)  # the folder is root's again, but the journal in it is not
    assert "cannot be trusted" in one_error(in_cli("restore"))
    assert board.snapshot() == original


# -- the unix socket --------------------------------------------------------------------


def send(path: Path, data: bytes) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.sendto(data, str(path))


def test_a_refused_second_governor_never_deafens_the_first(board, tmp_path):
    original = board.snapshot()
    policy = tmp_path / "policy.yaml"
    board_policy(policy)
    sock, state = tmp_path / "rate.sock", tmp_path / "state.json"
    first = govern(tmp_path, policy, f"unix:{sock}", "--state-file", str(state))
    try:
        wait_while_running(sock.exists, first)
        send(sock, b"50")
        wait_while_running(lambda: state.exists() and json.loads(state.read_text())["band"] == 0, first)
        identity = os.stat(sock).st_ino
        second = run_cli("govern", str(policy), "-d", "orin", "--rate-source", f"unix:{sock}")
        line = one_error(second)
        assert f"PID {first.pid}" in line and "governing" not in second.stderr and second.stdout == ""
        observer = run_cli("govern", str(policy), "-d", "orin", "--rate-source", f"unix:{sock}", "--observe-only")
        assert "something exists there" in one_error(observer)
        assert os.stat(sock).st_ino == identity
        send(sock, b"250")  # the first still hears its socket
        wait_while_running(lambda: json.loads(state.read_text())["band"] == 1, first)
    finally:
        stop(first)
    assert first.returncode != 0 and board.snapshot() == original
    assert not sock.exists()  # the first removed its own socket


def test_an_over_long_datagram_is_refused_and_the_last_good_rate_kept(tmp_path):
    warnings: list[str] = []
    source = SocketRate(tmp_path / "r.sock", warn=warnings.append)
    try:
        send(source.path, b"150")
        assert source.read() == 150.0
        send(source.path, b"0" * 300 + b"150")
        send(source.path, b"\xff\xfe")
        assert source.read() == 150.0
        assert (
            len(warnings) == 2 and "more than 256 bytes" in warnings[0] and "keeping the last good rate" in warnings[0]
        )
    finally:
        source.close()
    assert not (tmp_path / "r.sock").exists()


def test_a_socket_path_that_is_not_ours_is_never_removed(tmp_path):
    source = SocketRate(tmp_path / "r.sock")
    os.unlink(source.path)
    (tmp_path / "r.sock").write_text("someone else's file\n")
    source.close()
    assert (tmp_path / "r.sock").read_text() == "someone else's file\n"


# -- Prometheus: bounded in time and size, parsed without tracebacks -------------------


class _Endpoint(BaseHTTPRequestHandler):
    body = b""
    trickle = False

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.end_headers()
        if not self.trickle:
            self.wfile.write(self.body)
            return
        for _ in range(60):
            try:
                self.wfile.write(b"#")
                self.wfile.flush()
            except OSError:
                return
            time.sleep(0.5)

    def log_message(self, *args):
        pass


@pytest.fixture
def endpoint():
    handler = type("Handler", (_Endpoint,), {})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield handler, f"http://127.0.0.1:{server.server_port}/metrics"
    server.shutdown()
    server.server_close()


def test_prometheus_lines_that_are_not_samples_are_one_line_not_a_traceback(endpoint):
    handler, url = endpoint
    handler.body = b'# TYPE q gauge\nq{a="b"} 100\nq{a="c"} 50 1700000000\nother 3\n'
    assert PrometheusRate(url, "q").read() == 150.0
    for body in (b"q\n", b'{a="b"} 1\nq\n', b'q{a="b"}\n'):
        handler.body = body
        with pytest.raises(RateUnavailable):
            PrometheusRate(url, "q").read()
    handler.body = b'{a="b"} 1\n'
    with pytest.raises(RateUnavailable, match="has no metric q"):
        PrometheusRate(url, "q").read()


def test_a_trickling_endpoint_is_cut_at_the_deadline(endpoint, monkeypatch):
    handler, url = endpoint
    handler.trickle = True
    monkeypatch.setattr(rates, "HTTP_TIMEOUT_S", 1.0)
    started = time.monotonic()
    with pytest.raises(RateUnavailable, match="did not answer within"):
        PrometheusRate(url, "q").read()
    assert time.monotonic() - started < SIGNAL_BOUND_S


def test_an_oversized_answer_is_refused_by_its_size(endpoint, monkeypatch):
    handler, url = endpoint
    handler.body = b"q 1\n" * 4096
    monkeypatch.setattr(rates, "MAX_HTTP_BYTES", 1024)
    with pytest.raises(RateUnavailable, match="answered more than"):
        PrometheusRate(url, "q").read()


def test_a_rate_file_that_only_grows_is_read_by_its_tail(tmp_path):
    path = tmp_path / "rate"
    with open(path, "w") as fh:
        fh.write("1\n" * 500_000 + "250\n")
    assert rates.FileRate(path).read() == 250.0


# -- signals and the state file ---------------------------------------------------------


@pytest.mark.slow  # SIGTERM delivered to a tune govern subprocess
def test_the_first_sigterm_ends_a_long_interval_and_restores_the_board(board, tmp_path):
    original = board.snapshot()
    policy, rate, state = tmp_path / "policy.yaml", tmp_path / "rate", tmp_path / "state.json"
    board_policy(policy)
    rate.write_text("250\n")
    proc = govern(tmp_path, policy, f"file:{rate}", "--interval", "3600", "--state-file", str(state))
    wait_while_running(lambda: state.exists() and board.snapshot() != original, proc)
    assert read_state(state)["stale"] is False
    stop(proc)
    assert proc.returncode != 0 and board.snapshot() == original
    after = read_state(state)
    assert after["running"] is False and after["stale"] is True


@pytest.mark.slow  # SIGKILL delivered to a tune govern subprocess
def test_after_kill_9_the_state_file_is_stale(board, tmp_path):
    policy, rate, state = tmp_path / "policy.yaml", tmp_path / "rate", tmp_path / "state.json"
    board_policy(policy)
    rate.write_text("250\n")
    proc = govern(tmp_path, policy, f"file:{rate}", "--state-file", str(state))
    wait_while_running(lambda: state.exists() and read_state(state)["band"] == 1, proc)
    stop(proc, signal.SIGKILL)
    left = read_state(state)
    assert left["running"] is True and left["pid"] == proc.pid and left["stale"] is True
    r = run_cli("govern", str(policy), "-d", "orin", "--rate-source", str(rate), "--state-file", str(state),
                "--observe-only", "--duration", "0.2", "--interval", "0.05")  # fmt: skip
    assert r.returncode == 0 and f"left by governor PID {proc.pid}" in r.stderr and "(stale)" in r.stderr
    assert run_cli("restore").returncode == 0


def test_a_named_pipe_as_the_rate_file_never_hangs_the_governor(board, tmp_path):
    original = board.snapshot()
    policy, fifo = tmp_path / "policy.yaml", tmp_path / "rate.fifo"
    board_policy(policy)
    os.mkfifo(fifo)
    line = one_error(run_cli("govern", str(policy), "-d", "orin", "--rate-source", f"file:{fifo}", timeout=60))
    assert "not a regular file" in line
    assert board.snapshot() == original


# -- tune plan --------------------------------------------------------------------------


def test_plan_holds_the_device_lock_for_the_whole_plan(board, tmp_path, monkeypatch):
    from tuner.cli import main, serve
    from tuner.devices import lock
    from tuner.devices.journal import device_key, lock_path

    seen: list[bool] = []

    def fake_plan(device, options, on_rate=None, on_start=None):
        seen.append(str(lock_path(device_key(device))) in lock._held)
        raise UserError("stop here")

    monkeypatch.setattr(serve, "plan_rates", fake_plan)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as info:
        main(["plan", "-m", "resnet50", "-d", "orin", "-l", "50ms", "--rates", "50,100"])
    assert info.value.code == 2 and seen == [True]


def test_plan_refuses_to_reuse_a_study_tuned_over_another_space(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    base = ("plan", "-m", "resnet50", "-d", "sim:orin", "-l", "50ms", "--rates", "30", "--trials", "2", "--seed", "0")
    code, _, err = in_process(*base, "--knobs", "gpu_mhz", "--batch-sizes", "2", "--refine", "0")
    assert code == 0, err
    policy = (tmp_path / "policy.yaml").read_bytes()
    line = one_error(in_cli(*base, "--knobs", "emc_mhz", "--batch-sizes", "1"))
    assert "tuned over another space" in line and "--knobs gpu_mhz" in line
    assert (tmp_path / "policy.yaml").read_bytes() == policy


# -- device plugins ---------------------------------------------------------------------

PLUGINS = {
    "raises.py": "raise RuntimeError('no board here')\n",
    "syntax.py": "def broken(:\n",
    "exits.py": "import sys\nsys.exit(3)\n",
    "hard_exit.py": "import os\nos._exit(7)\n",
    "bad_space.py": textwrap.dedent(
        """
        from tuner.measurement import Measurement
        from tuner.space import Knob, SearchSpace


        class Board:
            simulated = True
            kind = "plug-board"
            slug = "plug-board"

            def __init__(self, name):
                self.name = name

            def space(self):
                return SearchSpace(kind="plug-board", knobs={"mhz": Knob(values=[1.0, 2.0], default=2.0)},
                                   batch_sizes=[1, 2])

            def read_state(self):
                return {}

            def apply(self, config):
                pass

            def restore(self, state):
                pass

            def describe(self):
                return {"name": self.name}

            def measure(self, model, config, settings):
                nan = float("nan")
                return Measurement(j_per_query=nan, p50_ms=1.0, p90_ms=1.0, p99_ms=1.0, qps=1.0, avg_w=1.0,
                                   energy_j=1.0, queries=1, duration_s=1.0, meter="t", rails=["t"], twin=True)


        class NoSpace(Board):
            def space(self):
                raise KeyError("mhz")


        class Unsaved(Board):
            simulated = False

            def read_state(self):
                return {"handle": object()}
        """
    ),
}


@pytest.fixture
def plugins(tmp_path):
    folder = tmp_path / "plugins"
    folder.mkdir()
    for name, text in PLUGINS.items():
        (folder / name).write_text(text)
    return {"PYTHONPATH": f"{folder}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


@pytest.mark.parametrize(
    ("device", "message"),
    [
        ("py:raises:Board", "RuntimeError: no board here"),
        ("py:syntax:Board", "SyntaxError"),
        ("py:exits:Board", "called sys.exit(3)"),
        ("py:hard_exit:Board", "called os._exit(7)"),
        ("py:bad_space:NoSpace", "its space() failed: KeyError"),
        ("py:bad_space:Board", "measure() returned j_per_query=nan"),
        ("py:bad_space:Unsaved", "state cannot be saved"),
    ],
)
def test_a_misbehaving_plugin_ends_in_one_line(plugins, tmp_path, monkeypatch, device, message):
    args = ("run", "-m", "resnet50", "-d", device, "-l", "50ms", "-n", "1", "--json", "--out", str(tmp_path / "s"))
    module = device.split(":")[1]
    if module in ("exits", "hard_exit"):  # ending the process is the point: a real one
        assert message in one_error(run_cli(*args, env=plugins))
        return
    monkeypatch.syspath_prepend(str(tmp_path / "plugins"))
    try:
        code, out, err = in_process(*args)
    finally:
        sys.modules.pop(module, None)
    assert message in one_error(subprocess.CompletedProcess(args, code, out, err))


USER_MODELS = textwrap.dedent(
    """
    import torch


    class Broken(torch.nn.Module):
        def forward(self, x):
            raise RuntimeError("boom in forward")


    def broken():
        return Broken(), (4,)


    def huge():
        return torch.nn.Identity(), (1 << 40,)
    """
)


@pytest.mark.torch
def test_a_users_model_whose_forward_or_input_fails_ends_in_one_line(rapl_at_15w, tmp_path, monkeypatch, capsys):
    from tuner.cli import main

    (tmp_path / "bad_models.py").write_text(USER_MODELS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    monkeypatch.delitem(sys.modules, "bad_models", raising=False)
    for factory, message in (("broken", "its forward failed: RuntimeError: boom in forward"), ("huge", "its input")):
        args = ["run", "-m", f"py:bad_models:{factory}", "-d", "cpu", "-l", "500ms", "-n", "2", "--window", "0.5"]
        args += ["--min-window", "0.3", "--batch-sizes", "1", "--json", "--out", f"s-{factory}"]
        with pytest.raises(SystemExit) as info:
            main(args)
        err = capsys.readouterr().err.strip().splitlines()
        assert info.value.code == 2 and len(err) == 1 and message in err[0], err
        assert not list((tmp_path / f"s-{factory}").rglob("pareto.json"))  # no result recorded
