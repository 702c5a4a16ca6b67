"""The engine a user deploys, driven over its OpenAI-compatible API: a real ``transformers serve`` on loopback."""

from __future__ import annotations

import http.server
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from clirun import run_cli
from engine_serve import alive, build_tiny_model, free_port, serve_binary, serve_command, start, stop
from fakemeter import ConstantMeter
from locations import FAKES, REPO

from runners import make_runner
from runners.engine_server import EngineServer, load_engine
from runners.openai_engine import EngineClient, EngineRunner, parse_target
from tuner.errors import ConfigurationError, MeasurementError
from tuner.measure.session import measure_with
from tuner.measure.settings import WindowSettings

# Real servers (transformers serve), LoadGen windows and signals to subprocesses.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def binary():
    return serve_binary()


@pytest.fixture(scope="module")
def tiny(binary, tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny-llm"))


@pytest.fixture(scope="module")
def port(binary, tiny):
    process, port = start(binary, tiny)
    yield port
    stop(process)


def url(port: int, name: str, query: str = "") -> str:
    return f"openai://127.0.0.1:{port}/v1{query}#{name}"


def test_engine_urls_parse_and_a_malformed_one_is_one_line():
    target = parse_target("openai://10.1.2.3:8000/v1?api=chat&ignore_eos=true#meta-llama/Llama-3.2-1B")
    assert (target.host, target.port, target.base, target.name) == ("10.1.2.3", 8000, "/v1", "meta-llama/Llama-3.2-1B")
    assert target.api == "chat" and target.ignore_eos and target.path == "/v1/chat/completions"
    assert parse_target("openai://localhost:9/v1#m").path == "/v1/completions"
    for bad, said in (
        ("openai://localhost/v1#m", "host, a port"),
        ("openai://localhost:8000/v1", "#MODEL_NAME"),
        ("openai://localhost:x/v1#m", "a port"),
        ("openai://localhost:8000/v1?api=grpc#m", "api=completions"),
        ("openai://localhost:8000/v1?temperature=1#m", "unknown engine option"),
    ):
        with pytest.raises(ConfigurationError, match=said) as caught:
            parse_target(bad)
        assert "\n" not in str(caught.value)


def test_a_streamed_completion_times_its_first_token_and_counts_its_tokens(port, tiny):
    client = EngineClient(parse_target(url(port, str(tiny))))
    assert str(tiny) in client.models()
    client.check()
    for api in ("completions", "chat"):
        client = EngineClient(parse_target(url(port, str(tiny), f"?api={api}")))
        firsts: list[float] = []
        streamed = client.stream("the quick brown fox", 6, on_first=lambda seen=firsts: seen.append(time.monotonic()))
        assert len(firsts) == 1 and streamed.first == pytest.approx(firsts[0], abs=0.05)
        assert streamed.sent <= streamed.first <= streamed.done
        assert 1 <= streamed.tokens <= 6


def test_the_engine_runs_a_loadgen_token_window(port, tiny, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "the lazy dog", "max_tokens": 6}\n{"input_tokens": 12, "output_tokens": 4}\n')
    runner = make_runner(url(port, str(tiny)))
    assert isinstance(runner, EngineRunner) and runner.generates_tokens
    runner.prepare(2, "fp32", {})
    settings = WindowSettings(window_s=1.0, min_window_s=1.0, warmup_s=0.1, prompts=str(prompts), log_dir=str(tmp_path))
    try:
        m = measure_with(runner, ConstantMeter(), 2, settings)
    finally:
        runner.close()
    assert m.valid, m.reason
    assert m.tokens is not None and m.tokens.output_tokens > 0 and m.tokens.j_per_token > 0
    assert m.tokens.ttft_p50_ms <= m.p50_ms
    assert (tmp_path / "mlperf_log_detail.txt").is_file() or any(tmp_path.rglob("mlperf_log_detail.txt"))


def test_a_model_the_server_lacks_is_named_with_what_it_serves(port, tiny):
    with pytest.raises(ConfigurationError, match="does not serve 'llama-70b'") as caught:
        make_runner(url(port, "llama-70b"))
    assert str(tiny) in str(caught.value) and "\n" not in str(caught.value)


def test_an_unreachable_engine_is_one_line_at_once():
    started = time.monotonic()
    with pytest.raises(MeasurementError, match=r"cannot reach the engine at http://127\.0\.0\.1:") as caught:
        make_runner(url(free_port(), "m"))
    assert time.monotonic() - started < 10 and "\n" not in str(caught.value)


class _Garbage(http.server.BaseHTTPRequestHandler):
    """A web server that is not an engine: HTML for /v1/models, a JSON object that is no event stream otherwise."""

    def do_GET(self) -> None:
        listing = self.server.listing  # type: ignore[attr-defined]
        body = json.dumps({"data": [{"id": "m"}]}).encode() if listing else b"<html>hello</html>"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        body = b'{"answer": 42}\n'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def garbage():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Garbage)
    server.listing = False  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_a_server_that_answers_garbage_is_one_line(garbage):
    port = garbage.server_address[1]
    with pytest.raises(MeasurementError, match="not an OpenAI-compatible server") as caught:
        make_runner(url(port, "m"))
    assert "\n" not in str(caught.value)
    garbage.listing = True
    runner = make_runner(url(port, "m"))
    with pytest.raises(MeasurementError, match="not server-sent events"):
        runner.client.stream("hello", 4)


def write_engine(tmp_path: Path, command: str, **extra) -> Path:
    body = {"version": 1, "command": command, **extra}
    path = tmp_path / "engine.yaml"
    path.write_text(json.dumps(body))
    return path


def test_bad_engine_files_and_commands_are_one_line_and_leave_nothing_running(tmp_path):
    port = free_port()
    bad = write_engine(tmp_path, "serve --port {port} --seqs {max_seqs}")
    with pytest.raises(ConfigurationError, match=r"\{max_seqs\}, which is neither built in"):
        make_runner(url(port, "m", f"?engine={bad}"))
    runner = make_runner(url(port, "m", f"?engine={write_engine(tmp_path, 'false --port {port}')}"))
    runner.prepare(1, "fp32", {})
    with pytest.raises(MeasurementError, match=r"exited \(1\) before it served"):
        runner.configure({})
    slow = write_engine(tmp_path, "sleep 60 {port}", ready_timeout_s=1.5, stop_timeout_s=5)
    runner = make_runner(url(port, "m", f"?engine={slow}"))
    server = runner.server
    assert isinstance(server, EngineServer)
    runner.prepare(1, "fp32", {})
    started = time.monotonic()
    with pytest.raises(MeasurementError, match=r"did not answer .* within 1\.5 s"):
        runner.configure({})
    assert time.monotonic() - started < 15 and not server.running
    with pytest.raises(ConfigurationError, match="engine file"):
        load_engine(tmp_path / "missing.yaml")


def test_an_engine_file_over_a_running_server_is_refused(port, tiny, tmp_path):
    engine = write_engine(tmp_path, "true {port}")
    with pytest.raises(ConfigurationError, match="something already serves at"):
        make_runner(url(port, str(tiny), f"?engine={engine}"))


DRIVER = textwrap.dedent(
    """
    import sys, time
    from runners import make_runner
    from tuner.plumbing import interrupts
    with interrupts.held():
        runner = make_runner(sys.argv[1])
        runner.prepare(1, "fp32", {})
        runner.configure({"engine:seed": 1})
        first = runner.server.pid
        runner.prepare(2, "fp32", {})
        runner.configure({"engine:seed": 1})
        same = runner.server.pid
        runner.configure({"engine:seed": 2})
        print(first, same, runner.server.pid, runner.describe()["engine_command"], flush=True)
        while True:
            interrupts.check()
            time.sleep(0.05)
    """
)


def test_the_engine_restarts_with_each_setting_and_a_signal_stops_it(binary, tiny, tmp_path):
    """The tool starts the server, restarts it when a knob changes, and a SIGTERM to the tool stops it."""
    port = free_port()
    command = " ".join(serve_command(binary, tiny)) + " --default-seed {seed}"
    engine = write_engine(tmp_path, command, knobs={"seed": [1, 2]}, ready_timeout_s=240)
    assert load_engine(engine).knobs == {"seed": [1, 2]}
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    tool = subprocess.Popen(
        [sys.executable, "-c", DRIVER, url(port, str(tiny), f"?engine={engine}")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        line = tool.stdout.readline()
        assert line, tool.stderr.read()
        first, same, second, *shown = line.split()
        assert first == same != second
        assert not alive(int(first)) and alive(int(second))
        assert "--default-seed 2" in " ".join(shown) and f"--port {port}" in " ".join(shown)
        tool.send_signal(signal.SIGTERM)
        assert tool.wait(timeout=60) != 0 and "Terminated" in tool.stderr.read()
        deadline = time.monotonic() + 30
        while alive(int(second)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not alive(int(second))
    finally:
        if tool.poll() is None:
            tool.kill()
            tool.wait()


def test_tune_run_tunes_the_engine_and_exports_its_vllm_command(port, tiny, tmp_path):
    """The CLI end to end on a real server: two trials of requests in flight, then the export's command line."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "the lazy dog", "max_tokens": 4}\n')
    out = tmp_path / "studies"
    model = url(port, str(tiny))
    common = ("-m", model, "-d", "cpu", "--max-ttft", "60s", "--out", str(out))
    env = {
        "PYTHONPATH": os.pathsep.join([str(FAKES), *filter(None, [os.environ.get("PYTHONPATH")])]),
        "TUNE_POWERCAP_ROOT": str(tmp_path / "no-rapl"),
    }
    run = run_cli(
        "run", *common, "--meter", "py:fakemeter:ConstantMeter", "--prompts", str(prompts), "--trials", "2",
        "--seed", "0", "--window", "1", "--batch-sizes", "1,2", env=env,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    script = tmp_path / "serve.sh"
    export = run_cli("export", *common[:4], "--out", str(out), "-o", str(script), "-f", "vllm", env=env)
    assert export.returncode == 0, export.stderr
    text = script.read_text()
    assert f"exec vllm serve {tiny} --port {port} --max-num-seqs " in text


def test_bad_engine_input_on_the_command_line_is_one_line_and_exit_2(port, tmp_path):
    env = {
        "PYTHONPATH": os.pathsep.join([str(FAKES), *filter(None, [os.environ.get("PYTHONPATH")])]),
        "TUNE_POWERCAP_ROOT": str(tmp_path / "no-rapl"),
    }
    common = ("-d", "cpu", "--meter", "py:fakemeter:ConstantMeter", "--max-ttft", "1s", "--out", str(tmp_path))
    for model, said in (
        (url(free_port(), "m"), "cannot reach the engine"),
        (url(port, "no-such-model"), "does not serve 'no-such-model'"),
        ("openai://127.0.0.1/v1#m", "needs a host, a port"),
    ):
        started = time.monotonic()
        r = run_cli("run", "-m", model, *common, "--trials", "1", env=env, timeout=120)
        assert r.returncode == 2, (model, r.stderr)
        assert said in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert time.monotonic() - started < 60
        assert not (tmp_path / "tune.db").exists()


def test_cancel_and_stop_cut_the_requests_in_flight_and_drop_the_queued(port, tiny):
    runner = make_runner(url(port, str(tiny)))
    runner.prepare(1, "fp32", {})
    firsts, done = [], []
    first = threading.Event()
    runner.start(lambda key: (firsts.append(key), first.set()), lambda key, tokens: done.append(key))
    try:
        runner.submit(1, "the quick brown fox", 480)
        runner.submit(2, "the lazy dog", 4)  # queued behind 1 (one request in flight at a time)
        runner.cancel(2)  # at once, while 1 is still being sent: 2 is never sent
        assert first.wait(timeout=120), runner.error
        # A random tiny model may end 1 early (the server honours EOS): then it answered before the cut.
        answered_before_cut = 1 in done
        runner.cancel(1)
        runner.submit(3, "the lazy dog", 480)
        deadline = time.monotonic() + 120
        while 3 not in firsts and time.monotonic() < deadline:
            time.sleep(0.05)
        assert firsts == [1, 3], runner.error
    finally:
        runner.stop()
    # 3 is cut by the stop unless the random model ended it first (EOS); nothing is delivered after the stop.
    delivered = list(done)
    assert delivered in (([1] if answered_before_cut else []), ([1, 3] if answered_before_cut else [3]))
    assert runner.error == "" and runner._workers == []
    time.sleep(0.5)
    assert done == delivered
