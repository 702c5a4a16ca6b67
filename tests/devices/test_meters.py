"""Meters against fake sensors: a 10 Hz energy counter, a constant power, a powercap tree."""

from __future__ import annotations

import math
import threading
import time
from pathlib import Path

import pytest

from tuner.devices.host.meters import RaplMeter
from tuner.devices.jetson.board import Rail
from tuner.devices.jetson.meters import RailMeter
from tuner.devices.nvml.meters import EDGES_FOR_PERIOD, NvmlEnergyMeter, interpolate_counter, next_read_delay
from tuner.errors import UserError
from tuner.measure.meters import SampledPowerMeter
from tuner.measure.poller import Poller


class SteppingCounter:
    """An NVML-like total-energy counter (mJ) that only moves every ``period_s``."""

    def __init__(self, watts: float, period_s: float = 0.1, phase_s: float = 0.0) -> None:
        self.watts = watts
        self.period_s = period_s
        self.origin = time.monotonic() - 100.0 + phase_s

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: object) -> int:
        elapsed = time.monotonic() - self.origin
        steps = math.floor(elapsed / self.period_s)
        return int(steps * self.period_s * self.watts * 1000)


def test_interpolation_between_edges():
    edges = [(0.0, 0.0), (0.1, 10.0), (0.2, 30.0)]
    assert interpolate_counter(edges, 0.05) == pytest.approx(5.0)
    assert interpolate_counter(edges, 0.15) == pytest.approx(20.0)
    assert interpolate_counter(edges, 0.25) == pytest.approx(40.0)  # slope of the last interval
    assert interpolate_counter(edges, -1.0) == 0.0


@pytest.mark.parametrize("phase", [0.0, 0.037, 0.071])
def test_nvml_counter_interpolation_on_short_window(phase):
    counter = SteppingCounter(watts=250.0, phase_s=phase)
    meter = NvmlEnergyMeter(counter, handle=None, poll_s=0.002)
    meter.start()
    time.sleep(0.33)
    reading = meter.stop()
    expected = 250.0 * reading.duration_s
    # reading the counter only at the bounds would be off by up to one 25 J step (~30%)
    assert reading.energy_j == pytest.approx(expected, rel=0.05)
    assert reading.avg_w == pytest.approx(250.0, rel=0.05)
    assert reading.meter == "nvml-energy"
    assert reading.extra["counter_edge_gap_ms_p50"] > 0  # how precisely the edges were timed


def test_counter_reads_turn_fine_only_around_the_next_update_due():
    """Edges 100 ms apart: 5 ms reads between updates, 0.5 ms from 15 ms before the next is due to 15 ms after."""
    edges = [0.1 * k for k in range(EDGES_FOR_PERIOD)]
    last = edges[-1]
    assert next_read_delay(last + 0.01, edges[:2], 0.005, 0.0005) == 0.005  # period not known yet
    assert next_read_delay(last + 0.01, edges, 0.005, 0.0005) == 0.005
    assert next_read_delay(last + 0.083, edges, 0.005, 0.0005) == pytest.approx(0.002)  # up to the fine span
    assert next_read_delay(last + 0.09, edges, 0.005, 0.0005) == 0.0005
    assert next_read_delay(last + 0.114, edges, 0.005, 0.0005) == 0.0005
    assert next_read_delay(last + 0.2, edges, 0.005, 0.0005) == 0.005  # late: the rhythm changed
    fast = [0.01 * k for k in range(EDGES_FOR_PERIOD)]  # a counter as fast as the reads: nothing to aim at
    assert next_read_delay(fast[-1] + 0.009, fast, 0.005, 0.0005) == 0.005


def test_nvml_counter_that_never_moves_is_an_error():
    counter = SteppingCounter(watts=0.0)
    meter = NvmlEnergyMeter(counter, handle=None, poll_s=0.005, edge_timeout_s=0.2)
    with pytest.raises(UserError, match="nvml-power"):
        meter.start()


def test_sampled_meter_integrates_constant_power():
    meter = SampledPowerMeter(lambda: 40.0, period_s=0.05, name="fake", rails=["board"])
    meter.start()
    time.sleep(0.6)
    reading = meter.stop()
    assert reading.energy_j == pytest.approx(40.0 * reading.duration_s)
    assert reading.samples >= 3
    assert reading.rails == ["board"]
    assert reading.warning == ""


def test_sampled_meter_flags_a_short_window():
    meter = SampledPowerMeter(lambda: 40.0, period_s=0.05)
    meter.start()
    time.sleep(0.06)
    assert "shorter" in meter.stop().warning


def test_sampled_meter_refuses_fast_polling_and_zero_power():
    with pytest.raises(UserError, match="50 ms"):
        SampledPowerMeter(lambda: 1.0, period_s=0.01)
    meter = SampledPowerMeter(lambda: 0.0, period_s=0.05)
    meter.start()
    time.sleep(0.06)
    with pytest.raises(UserError, match="not updating"):
        meter.stop()


def _zone(folder: Path, name: str, energy: int, max_range: int) -> Path:
    folder.mkdir(parents=True)
    (folder / "name").write_text(name + "\n")
    (folder / "energy_uj").write_text(f"{energy}\n")
    (folder / "max_energy_range_uj").write_text(f"{max_range}\n")
    return folder / "energy_uj"


@pytest.fixture
def powercap(tmp_path, monkeypatch):
    root = tmp_path / "powercap"
    files = {
        "pkg": _zone(root / "intel-rapl:0", "package-0", 999_000_000, 1_000_000_000),
        "core": _zone(root / "intel-rapl:0" / "intel-rapl:0:0", "core", 5, 1_000_000_000),
        "dram": _zone(root / "intel-rapl:0" / "intel-rapl:0:1", "dram", 100, 1_000_000_000),
        "psys": _zone(root / "intel-rapl:1", "psys", 7, 1_000_000_000),
    }
    monkeypatch.setenv("TUNE_POWERCAP_ROOT", str(root))
    return files


def test_rapl_sums_package_and_dram_across_a_wraparound(powercap):
    meter = RaplMeter()
    assert meter.rails == ["package-0", "package-0/dram"]
    meter.start()
    powercap["pkg"].write_text("2000000\n")  # wrapped: 1_000_000 to the top, then 2_000_000
    powercap["dram"].write_text("500100\n")
    powercap["core"].write_text("900000005\n")  # inside the package: not added again
    powercap["psys"].write_text("900000007\n")
    reading = meter.stop()
    assert reading.energy_j == pytest.approx(3.0 + 0.5)
    assert reading.meter == "rapl"


def test_rapl_without_zones_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNE_POWERCAP_ROOT", str(tmp_path))
    with pytest.raises(UserError, match="no RAPL"):
        RaplMeter()


def test_rapl_unreadable_counter_names_the_fix(powercap, monkeypatch):
    original = Path.read_text

    def deny(self: Path, *args, **kwargs):
        if self.name == "energy_uj":
            raise PermissionError(13, "Permission denied")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", deny)
    with pytest.raises(UserError, match="chmod o\\+r"):
        RaplMeter()


def test_rapl_zero_energy_is_an_error(powercap):
    meter = RaplMeter()
    meter.start()
    time.sleep(0.01)
    with pytest.raises(UserError, match="not updating"):
        meter.stop()


class FailingSensor:
    """A sensor that answers once (the meter's opening sample) and then fails, as an unplugged one does."""

    def __init__(self) -> None:
        self.calls = 0
        self.failed = threading.Event()

    def read(self) -> float:
        self.calls += 1
        if self.calls > 1:
            self.failed.set()
            raise OSError(5, "Input/output error")
        return 12.0


def _rail_meter(sensor: FailingSensor) -> RailMeter:
    rail = Rail("VDD_IN", Path("/nonexistent/voltage"), Path("/nonexistent/current"))
    rail.watts = sensor.read  # type: ignore[method-assign]
    return RailMeter([rail], period_s=0.05)


@pytest.mark.parametrize(
    "make",
    [
        lambda sensor: SampledPowerMeter(sensor.read, period_s=0.05),
        _rail_meter,
    ],
    ids=["sampled-power", "ina3221"],
)
def test_a_sensor_failing_mid_window_raises_from_stop(make):
    """A meter whose thread died would integrate a shorter window than it reports; it must fail instead."""
    sensor = FailingSensor()
    meter = make(sensor)
    meter.start()
    assert sensor.failed.wait(30), "the polling thread never sampled"
    with pytest.raises(OSError, match="Input/output"):
        meter.stop()


def test_poller_raises_once_and_can_run_again():
    """After a failed window the next one starts clean: the error is not raised twice."""
    calls: list[int] = []
    failed = threading.Event()

    def sample() -> None:
        calls.append(1)
        if len(calls) == 1:
            failed.set()
            raise ValueError("sensor gone")

    poller = Poller(sample, 0.01, "test")
    poller.start()
    assert failed.wait(30)
    with pytest.raises(ValueError):
        poller.stop()
    poller.start()
    poller.stop()
