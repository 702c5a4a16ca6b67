"""The NVML device against a fake NVML: observe-only never writes, changes are undone."""

from __future__ import annotations

import time

import pytest
from fakenvml import FakeNVML, FakeNVMLError

import runners
from tuner.devices.nvml.device import NvmlDevice, kind_of
from tuner.devices.nvml.meters import NvmlEnergyMeter
from tuner.errors import UserError
from tuner.measure.meters import SampledPowerMeter
from tuner.measure.settings import WindowSettings
from tuner.space import Config

HW_SLOWDOWN = 0x8


def _config(sm=1980, mem=3201, power=700, precision="fp16", batch=8) -> Config:
    return Config(
        knobs={
            "sm_mhz": sm,
            "mem_mhz": mem,
            "power_limit_w": power,
            "precision": precision,
            "channels_last": True,
            "graph": "eager",
        },
        batch_size=batch,
    )


def test_kind_from_gpu_name():
    assert kind_of("NVIDIA H200") == "h200"
    assert kind_of("NVIDIA H100 80GB HBM3") == "h100"
    assert kind_of("NVIDIA A30") == "a30"
    with pytest.raises(UserError, match="space file"):
        kind_of("NVIDIA GeForce RTX 4090")


def test_device_names_and_missing_gpu():
    device = NvmlDevice(0, nvml=FakeNVML())
    assert (device.name, device.kind, device.slug) == ("cuda:0", "h200", "h200")
    with pytest.raises(UserError, match="no GPU cuda:3"):
        NvmlDevice(3, nvml=FakeNVML())

    class NoDriver(FakeNVML):
        def nvmlInit(self) -> None:
            raise FakeNVMLError(12)

    with pytest.raises(UserError, match="NVML is not available"):
        NvmlDevice(0, nvml=NoDriver())


def _observed(precision="fp16", batch=8, power=700) -> Config:
    return Config(
        knobs={"power_limit_w": power, "precision": precision, "channels_last": True, "graph": "eager"},
        batch_size=batch,
    )


def test_observe_only_locks_no_clock_pins_the_power_limit_and_never_writes():
    nvml = FakeNVML()
    device = NvmlDevice(0, nvml=nvml)
    space = device.space()
    assert "sm_mhz" not in space.knobs and "mem_mhz" not in space.knobs  # the driver's boost runs the clocks
    assert space.knobs["power_limit_w"].values == [700]
    assert space.tuned_knobs == ["precision", "channels_last", "graph"]
    assert len(space.batch_sizes) > 1

    state = device.read_state()
    before = device.observe_only_state()
    device.apply(_observed(precision="bf16", batch=32))
    device.restore(state)
    assert nvml.write_attempts == []
    assert device.observe_only_state() == before
    assert before["power_limit_mw"] == 700_000 and before["app_clock_sm_mhz"] == 1980
    for bad in (_config(sm=1500), _observed(power=400)):
        with pytest.raises(UserError):
            device.apply(bad)
    assert nvml.write_attempts == []


def test_allowed_changes_are_applied_and_restored():
    nvml = FakeNVML()
    nvml.graphics = list(range(1980, 994, -15))  # this card cannot go below 1000 MHz
    device = NvmlDevice(0, allow_clock_changes=True, nvml=nvml)
    sm_values = device.space().knobs["sm_mhz"].values
    assert min(sm_values) >= 1000 and 1980 in sm_values
    assert device.space().knobs["mem_mhz"].values == [2201, 3201]

    state = device.read_state()
    device.apply(_config(sm=1500, mem=2201, power=400))
    assert (nvml.locked_sm, nvml.locked_mem, nvml.power_limit_mw) == (
        (1500, 1500),
        (2201, 2201),
        400_000,
    )
    device.restore(state)
    assert (nvml.locked_sm, nvml.locked_mem, nvml.power_limit_mw) == (None, None, 700_000)
    assert [a for a, _ in nvml.write_attempts[-3:]] == [
        "nvmlDeviceResetGpuLockedClocks",
        "nvmlDeviceResetMemoryLockedClocks",
        "nvmlDeviceSetPowerManagementLimit",
    ]


def test_permission_denied_is_a_user_error_and_leaves_the_card_alone():
    nvml = FakeNVML(deny=("nvmlDeviceSet",))
    device = NvmlDevice(0, allow_clock_changes=True, nvml=nvml)
    with pytest.raises(UserError, match="needs root"):
        device.apply(_config(sm=1500, mem=2201, power=400))
    assert len(nvml.write_attempts) == 1
    assert (nvml.locked_sm, nvml.locked_mem, nvml.power_limit_mw) == (None, None, 700_000)


def test_a_later_refused_write_undoes_the_earlier_ones():
    nvml = FakeNVML(deny=("nvmlDeviceSetPowerManagementLimit",))  # clock locks succeed
    device = NvmlDevice(0, allow_clock_changes=True, nvml=nvml)
    with pytest.raises(UserError, match="needs root"):
        device.apply(_config(sm=1500, mem=2201, power=400))
    assert (nvml.locked_sm, nvml.locked_mem, nvml.power_limit_mw) == (None, None, 700_000)


class FakeRunner:
    instances = 0

    def __init__(self, model: str, device: str, runtime: str = "auto") -> None:
        FakeRunner.instances += 1
        self.model, self.device, self.prepared = model, device, None
        self.closed = False

    def prepare(self, batch_size, precision, options) -> None:
        self.prepared = (batch_size, precision, options)

    def infer(self, size: int | None = None) -> int:
        time.sleep(0.002)
        return size or 1

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def fake_runners(monkeypatch):
    FakeRunner.instances = 0
    monkeypatch.setattr(runners, "make_runner", FakeRunner, raising=False)


def test_measure_marks_a_throttled_window(fake_runners, tmp_path):
    nvml = FakeNVML()
    nvml.reasons = HW_SLOWDOWN
    device = NvmlDevice(0, nvml=nvml)
    settings = WindowSettings(window_s=1.0, warmup_s=0.05, log_dir=str(tmp_path))
    result = device.measure("resnet50", _config(batch=4), settings)
    assert result.throttled and not result.valid
    assert "hardware slowdown" in result.reason
    assert result.temps_c["gpu_max"] == 41
    assert result.meter == "nvml-energy"
    assert result.avg_w == pytest.approx(300.0, rel=0.05)
    assert device.runners._runner.device == "cuda:0" and device.runners._runner.prepared == (
        4,
        "fp16",
        {"channels_last": True, "graph": "eager"},
    )
    assert nvml.write_attempts == []

    nvml.reasons = 0
    again = device.measure("resnet50", _config(batch=4), settings)
    assert again.valid and not again.throttled, again.reason
    assert FakeRunner.instances == 1  # same model, batch and precision: the runner is reused


def test_meter_choice_falls_back_to_sampled_power():
    device = NvmlDevice(0, nvml=FakeNVML(energy_counter=False))
    meter = device.make_meter(None)
    assert isinstance(meter, SampledPowerMeter) and meter.name == "nvml-power"
    assert meter.period_s == 0.05
    with pytest.raises(UserError, match="nvml-power"):
        device.make_meter("nvml-energy")
    assert isinstance(NvmlDevice(0, nvml=FakeNVML()).make_meter(None), NvmlEnergyMeter)
    with pytest.raises(UserError, match="unknown meter"):
        device.make_meter("wall-plug")


def test_the_fake_only_offers_functions_real_pynvml_has():
    import pynvml

    faked = [n for n in vars(FakeNVML) if n.startswith("nvml")]
    assert faked and all(hasattr(pynvml, n) for n in faked)
