"""Meters outside the device: PTDaemon (MLPerf's power director), tune meter-serve, plugins, paired readings."""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
import time

import pytest
from clirun import run_cli
from fakemeter import ConstantMeter, ManualClock
from fakeptd import FakePtd
from locations import FAKES
from test_window import SleepyRunner

from tuner.devices.meters.paired import PairedMeter
from tuner.devices.meters.ptd import PtdMeter
from tuner.devices.meters.registry import check_external, device_meter, is_external, open_meter
from tuner.devices.meters.remote import RemoteMeter
from tuner.devices.meters.serve import MeterServer
from tuner.errors import UserError
from tuner.measure.meters import MeterLost
from tuner.measure.session import measure_with
from tuner.measure.settings import WindowSettings

TOKEN = "s3cret-token"


def ptd_url(fake: FakePtd, query: str = "interval_ms=100&settle_s=0") -> str:
    return f"ptd://127.0.0.1:{fake.port}?{query}"


def test_ptd_window_is_go_to_stop_and_records_the_analyzer_and_ranges():
    fake = FakePtd(watts=230.0)
    meter = PtdMeter.from_url(ptd_url(fake, "interval_ms=100&settle_s=0&amps=10"))
    meter.start()
    reading = meter.stop()
    assert reading.meter == "ptd" and reading.energy_j == pytest.approx(230.0 * reading.duration_s)
    assert reading.extra["analyzer"] == "YokogawaWT310" and reading.extra["ptd_version"] == "1.11.1"
    assert reading.extra["amps_range"] == "10" and reading.extra["volts_range"] == "Auto"
    go = next(c for c in fake.commands if c.startswith("Go,"))
    assert go == f"Go,100,0,{reading.extra['mark']}"
    order = [c.split(",")[0] if not c.startswith("SR") else c for c in fake.commands]
    assert order == ["Hello", "Identify", "RR", "SR,A,10", "Go", "Stop", "RL", "RL", "SR,A,5.0"]
    assert fake.amps_range == "5.0"  # the analyzer's own range is back


def test_a_ptdaemon_that_dies_mid_window_fails_the_window():
    fake = FakePtd()
    meter = PtdMeter.from_url(ptd_url(fake))
    meter.start()
    fake.kill()
    with pytest.raises(MeterLost, match=r"PTDaemon at 127\.0\.0\.1"):
        meter.stop()


def test_ptd_urls_and_unreachable_directors_are_user_errors():
    with pytest.raises(UserError, match="ptd://HOST:PORT"):
        open_meter("ptd://127.0.0.1:8888?amp=5")
    with pytest.raises(UserError, match="interval_ms"):
        open_meter("ptd://127.0.0.1:8888?interval_ms=0")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(UserError, match="cannot reach PTDaemon"):
        check_external(f"ptd://127.0.0.1:{port}", "cpu")
    with pytest.raises(UserError, match="digital twin"):
        check_external(ptd_url(FakePtd()), "sim:orin")
    other = FakePtd()
    other._reply = lambda command: ["HTTP/1.1 400 Bad Request"]
    with pytest.raises(UserError, match="is not PTDaemon"):
        check_external(ptd_url(other), "cpu")


def served(clock=None, watts: float = 42.0) -> MeterServer:
    """A meter server on loopback whose meter and clock are ``clock`` (the server's own, unlike ours)."""
    server = MeterServer(lambda: ConstantMeter(watts=watts, clock=clock), TOKEN, clock=clock or time.monotonic)
    server.start_background()
    return server


def test_a_window_metered_remotely_matches_the_same_meter_read_locally():
    clock = ManualClock()
    local = ConstantMeter(clock=clock)
    local.start()
    clock.now += 2.0
    here = local.stop()
    server = served(clock)
    remote = RemoteMeter(*server.address, TOKEN)
    remote.start()
    clock.now += 2.0
    there = remote.stop()
    server.close()
    assert there.energy_j == pytest.approx(here.energy_j, rel=0.01)
    assert there.meter == f"constant@127.0.0.1:{server.address[1]}" and there.rails == ["test rail"]


def test_the_clock_offset_is_measured_and_server_times_are_moved_onto_ours():
    server = served(clock=lambda: time.monotonic() + 500.0)
    remote = RemoteMeter(*server.address, TOKEN)
    remote.start()
    assert abs(remote.offset_s - 500.0) <= remote.rtt_s / 2 + 1e-3
    before = time.monotonic()
    t, _ = remote.energy_now()
    after = time.monotonic()
    assert before - remote.rtt_s - 1e-3 <= t <= after + 1e-3
    reading = remote.stop()
    server.close()
    assert reading.extra["clock_offset_s"] == remote.offset_s


@pytest.mark.loadgen
def test_a_killed_server_fails_the_trial_with_a_clear_reason():
    server = served()
    remote = RemoteMeter(*server.address, TOKEN)
    remote.start()
    server.close()
    with pytest.raises(MeterLost, match=r"meter server 127\.0\.0\.1"):
        remote.stop()
    # Through a real LoadGen window: the trial is invalid, with no energy at all.
    server = served()
    remote = RemoteMeter(*server.address, TOKEN)
    runner = SleepyRunner()
    infer, start, windows = runner.infer, remote.start, []

    def start_window():
        start()
        windows.append(len(runner.calls))

    def infer_then_kill(size: int | None = None) -> int:
        if windows and len(runner.calls) == windows[0] + 3:
            server.close()
        return infer(size)

    remote.start, runner.infer = start_window, infer_then_kill
    m = measure_with(runner, remote, 4, WindowSettings(window_s=1.0, warmup_s=0.1))
    assert not m.valid and "no energy for this window" in m.reason and "meter server" in m.reason
    assert math.isnan(m.energy_j) and math.isnan(m.j_per_query)


def test_a_wrong_token_is_refused_and_a_second_tuner_is_told_busy():
    server = served()
    with pytest.raises(MeterLost, match="wrong token"):
        RemoteMeter(*server.address, "guess").start()
    first = RemoteMeter(*server.address, TOKEN)
    first.start()
    with pytest.raises(MeterLost, match="busy"):
        RemoteMeter(*server.address, TOKEN).start()
    first.close()  # gone mid-window, without stop: the server throws the window away and frees the meter
    second = RemoteMeter(*server.address, TOKEN)
    for _ in range(100):  # the server notices the hang-up on its own thread
        try:
            second.start()
            break
        except MeterLost:
            time.sleep(0.05)
    assert second.stop().avg_w == pytest.approx(42.0)
    server.close()


def test_the_server_listens_on_loopback_unless_told_otherwise():
    server = MeterServer(ConstantMeter, TOKEN)
    assert server.address[0] == "127.0.0.1"
    server.close()
    shown = run_cli("meter-serve", "--help").stdout
    assert "[default: 127.0.0.1:4951]" in " ".join(shown.split())


def test_meter_serve_cli_serves_a_plugin_meter_on_loopback(tmp_path):
    env = {**os.environ, "TUNE_METER_TOKEN": TOKEN, "PYTHONPATH": str(FAKES)}
    command = ["meter-serve", "--meter", "py:fakemeter:ConstantMeter", "--listen", "127.0.0.1:0"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "tuner", *command], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        line = proc.stdout.readline()
        assert line.startswith("serving constant on remote://127.0.0.1:"), line + proc.stderr.read()
        url = line.split()[3]
        remote = open_meter(f"{url}?token_file={_token_file(tmp_path)}")
        remote.start()
        reading = remote.stop()
        assert reading.meter.startswith("constant@127.0.0.1:") and reading.avg_w == pytest.approx(42.0)
        proc.terminate()
        proc.wait(timeout=60)
        with pytest.raises(MeterLost, match="cannot reach"):
            remote.start()
    finally:
        proc.kill()
        proc.wait()


def _token_file(tmp_path):
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    path.chmod(0o600)  # a token file others can read is refused, as ssh refuses such a key
    return path


def test_plugins_by_py_target_and_bad_plugins():
    assert is_external("py:fakemeter:ConstantMeter") and not is_external("nvml-energy") and not is_external(None)
    assert isinstance(open_meter("py:fakemeter:ConstantMeter"), ConstantMeter)
    with pytest.raises(UserError, match="did not return a Meter"):
        open_meter("py:fakemeter:not_a_meter")
    with pytest.raises(UserError, match="cannot import"):
        open_meter("py:no_such_module_here:Meter")


def test_rails_and_wall_together_the_named_meter_is_the_objective():
    clock = ManualClock()
    paired = PairedMeter(ConstantMeter(watts=300.0, clock=clock), ConstantMeter(watts=120.0, clock=clock))
    paired.start()
    clock.now += 2.0
    r = paired.stop()
    assert r.energy_j == pytest.approx(600.0) and r.extra["objective"] == "constant"
    assert r.extra["also_energy_j"] == pytest.approx(240.0) and r.extra["also_avg_w"] == pytest.approx(120.0)
    own = ConstantMeter()
    assert device_meter(None, lambda choice: own) is own
    both = device_meter("py:fakemeter:ConstantMeter", lambda choice: own)
    assert isinstance(both, PairedMeter) and both.secondary is own


@pytest.mark.slow  # a LoadGen window of the tiny CNN on this CPU
def test_tune_measure_on_the_cpu_with_wall_power_from_ptd(rapl_at_15w, tmp_path):
    fake = FakePtd(watts=95.0)
    result = run_cli(
        "measure", "--model", "tiny-cnn", "--device", "cpu", "--window", "1", "--batch-size", "2", "--json",
        "--meter", ptd_url(fake, "interval_ms=50&settle_s=0"),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    m = json.loads(result.stdout)["measurements"][0]
    assert m["meter"] == "ptd" and m["avg_w"] == pytest.approx(95.0)
    assert m["extra"]["meter_objective"] == "ptd" and m["extra"]["meter_also"] == "rapl"
    assert m["extra"]["meter_analyzer"] == "YokogawaWT310"
    assert m["extra"]["meter_also_avg_w"] == pytest.approx(15.0, rel=0.2)


def test_an_installed_powertune_meters_entry_point_is_found_by_name(monkeypatch):
    from tuner.devices.meters import registry

    class Entry:
        name, value = "usb", "fakemeter:ConstantMeter"

        def load(self):
            return ConstantMeter

    monkeypatch.setattr(registry, "_entry_point", lambda name: Entry() if name == "usb" else None)
    assert is_external("usb:/dev/ttyUSB0") and not is_external("rails")
    meter = open_meter("usb:/dev/ttyUSB0")
    assert isinstance(meter, ConstantMeter)


@pytest.mark.slow  # a LoadGen window of the tiny CNN on this CPU
@pytest.mark.parametrize("watts", [float("nan"), -5.0])
def test_tune_measure_through_a_ptdaemon_logging_no_valid_watts_is_one_line_exit_2(rapl_at_15w, watts):
    fake = FakePtd(watts=watts)
    result = run_cli(
        "measure", "--model", "tiny-cnn", "--device", "cpu", "--window", "1", "--batch-size", "2", "--repeat", "2",
        "--meter", ptd_url(fake, "interval_ms=50&settle_s=0"),
    )  # fmt: skip
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and "no window got energy" in lines[0], result.stderr
    assert "check the analyzer" in lines[0] and result.stdout == ""
