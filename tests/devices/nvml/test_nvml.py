"""The NVML device against a fake NVML: observe-only never writes, changes are undone."""

from __future__ import annotations

import time

import pytest
from fakenvml import FakeNVML, FakeNVMLError

import runners
from tuner.devices.nvml.device import NvmlDevice
from tuner.devices.nvml.meters import NvmlEnergyMeter
from tuner.devices.nvml.space import kind_of
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
    """A runner that sleeps per batch; ``gpu_uuid`` is the card it runs on, as torch's runner reports it."""

    instances = 0
    gpu_uuid: str | None = None

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
    FakeRunner.gpu_uuid = None
    monkeypatch.setattr(runners, "make_runner", FakeRunner, raising=False)


@pytest.mark.loadgen
def test_measure_marks_a_throttled_window(fake_runners, tmp_path):
    nvml = FakeNVML()
    nvml.reasons = HW_SLOWDOWN
    device = NvmlDevice(0, nvml=nvml)
    settings = WindowSettings(window_s=1.0, warmup_s=0.05, log_dir=str(tmp_path))
    result = device.measure("resnet50", _observed(batch=4), settings)
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
    again = device.measure("resnet50", _observed(batch=4), settings)
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


def _window(tmp_path) -> WindowSettings:
    return WindowSettings(window_s=1.0, warmup_s=0.05, log_dir=str(tmp_path))


@pytest.mark.loadgen
def test_under_cuda_visible_devices_the_card_changed_and_metered_is_the_one_torch_ran_on(
    fake_runners, tmp_path, monkeypatch
):
    nvml = FakeNVML(gpus=2)
    first, second = nvml.gpus
    first.energy_counter = False  # metering the first card would fall back to nvml-power
    first.set_watts(30.0)
    second.set_watts(450.0)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    FakeRunner.gpu_uuid = second.uuid  # torch's cuda:0 is the machine's second card
    device = NvmlDevice(0, allow_clock_changes=True, nvml=nvml)
    assert device.uuid == second.uuid and device.describe()["pci_bus_id"] == second.bus_id
    device.apply(_config(sm=1500, mem=3201, power=400))
    assert second.locked_sm == (1500, 1500) and second.power_limit_mw == 400_000
    assert first.writes == [] and first.locked_sm is None and first.power_limit_mw == 700_000
    result = device.measure("resnet50", _config(sm=1500, mem=3201, power=400, batch=4), _window(tmp_path))
    assert result.valid, result.reason
    assert result.meter == "nvml-energy"  # the second card's counter: the first has none
    assert result.avg_w > 200  # 450 W, not the first card's 30 W (loose: the counter's timing varies with load)
    assert result.extra["sm_mhz_mean"] == 1500 and result.extra["sm_clock"] == "locked at 1500 MHz"
    device.restore(device.read_state() | {"power_limit_mw": 700_000})
    assert second.locked_sm is None and first.writes == []


def test_a_runner_on_another_card_than_the_metered_one_is_refused(fake_runners, tmp_path, monkeypatch):
    nvml = FakeNVML(gpus=2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    FakeRunner.gpu_uuid = nvml.gpus[0].uuid
    device = NvmlDevice(0, nvml=nvml)
    with pytest.raises(UserError, match=f"CUDA_VISIBLE_DEVICES={nvml.gpus[1].uuid}"):
        device.measure("resnet50", _observed(batch=4), _window(tmp_path))


@pytest.mark.parametrize(
    ("visible", "ordinal", "card"),
    [
        (None, 1, 1),
        ("1,0", 0, 1),
        ("1,0", 1, 0),
        ("GPU-00000001", 0, 1),  # a UUID prefix that names one card (CUDA accepts abbreviated UUIDs)
        ("gpu-00000000-AAAA-bbbb-cccc-000000000000", 0, 0),
        ("0,-1,1", 0, 0),
    ],
)
def test_cuda_ordinals_follow_cuda_visible_devices(visible, ordinal, card, monkeypatch):
    nvml = FakeNVML(gpus=2)
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert NvmlDevice(ordinal, nvml=nvml).uuid == nvml.gpus[card].uuid


@pytest.mark.parametrize(
    ("visible", "ordinal", "message"),
    [
        ("0,-1,1", 1, "1 NVIDIA GPU.s. visible under CUDA_VISIBLE_DEVICES='0,-1,1'"),  # an invalid entry ends the list
        ("GPU-0000000", 0, "no NVIDIA GPU is visible"),  # a prefix of both UUIDs names neither
        ("", 0, "no NVIDIA GPU is visible"),
        ("0,0", 1, "1 NVIDIA GPU"),
        ("MIG-0a1b2c3d-0000-0000-0000-000000000000", 0, "MIG instance"),
    ],
)
def test_cuda_ordinals_that_name_no_whole_card_are_one_line_errors(visible, ordinal, message, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    with pytest.raises(UserError, match=message):
        NvmlDevice(ordinal, nvml=FakeNVML(gpus=2))


def test_mixed_gpus_need_pci_bus_order_or_uuids(monkeypatch):
    nvml = FakeNVML(gpus=2)
    nvml.gpus[0].name = "NVIDIA A30"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    with pytest.raises(UserError, match="CUDA_DEVICE_ORDER=PCI_BUS_ID"):
        NvmlDevice(0, nvml=nvml)
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    assert NvmlDevice(0, nvml=nvml).gpu_name == "NVIDIA H200"
    monkeypatch.delenv("CUDA_DEVICE_ORDER")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", nvml.gpus[0].uuid)
    assert NvmlDevice(0, nvml=nvml).gpu_name == "NVIDIA A30"


def test_a_gpu_in_mig_mode_is_refused():
    nvml = FakeNVML()
    nvml.gpus[0].mig = 1
    with pytest.raises(UserError, match="MIG mode"):
        NvmlDevice(0, nvml=nvml)


def test_restore_refuses_a_journal_written_for_another_card(monkeypatch):
    nvml = FakeNVML(gpus=2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    state = NvmlDevice(0, allow_clock_changes=True, nvml=nvml).read_state()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    with pytest.raises(UserError, match=f"CUDA_VISIBLE_DEVICES={nvml.gpus[1].uuid}"):
        NvmlDevice(0, allow_clock_changes=True, nvml=nvml).restore(state)
    assert nvml.write_attempts == []


@pytest.mark.loadgen
def test_observe_only_records_the_clocks_that_ran_not_the_applications_clock(fake_runners, tmp_path):
    nvml = FakeNVML()
    nvml.gpus[0].busy = True  # under load the unlocked card boosts: 1410-1980 MHz in the fake
    device = NvmlDevice(0, nvml=nvml)
    # a window of 2 s, not the meter's 1 s minimum: a window as long as the minimum can end a few ms short of it
    window = WindowSettings(window_s=2.0, warmup_s=0.05, log_dir=str(tmp_path))
    result = device.measure("resnet50", _observed(batch=4), window)
    assert result.valid, result.reason
    extra = result.extra
    # at least two samples (window start and end), whatever the load: consecutive reads of the boost differ
    assert {extra["sm_mhz_min"], extra["sm_mhz_max"]} <= {1410, 1755, 1980}
    assert extra["sm_mhz_min"] < extra["sm_mhz_max"] and extra["sm_mhz_min"] <= extra["sm_mhz_mean"] <= 1980
    assert extra["mem_mhz_mean"] == 3201
    assert extra["sm_clock"] == "driver boost (not locked)"
    assert nvml.write_attempts == []


@pytest.mark.loadgen
def test_a_memory_lock_the_driver_accepts_but_does_not_honour_marks_the_window(fake_runners, tmp_path):
    nvml = FakeNVML()
    nvml.gpus[0].honour_mem_lock = False
    device = NvmlDevice(0, allow_clock_changes=True, nvml=nvml)
    device.apply(_config(sm=1500, mem=2201, power=700))
    result = device.measure("resnet50", _config(sm=1500, mem=2201, power=700, batch=4), _window(tmp_path))
    assert not result.valid
    assert "settings did not hold: mem_mhz locked at 2201 MHz ran 3201-3201 MHz" in result.reason
    assert "sm_mhz" not in result.reason.split("did not hold")[1]


@pytest.mark.loadgen
def test_an_sm_clock_below_its_lock_is_excused_only_by_a_cap(fake_runners, tmp_path):
    nvml = FakeNVML()
    gpu = nvml.gpus[0]
    device = NvmlDevice(0, allow_clock_changes=True, nvml=nvml)
    device.apply(_config(sm=1500, mem=3201, power=700))
    gpu.locked_sm = (1200, 1200)  # the card runs another clock than the one locked, with nothing pulling it down
    result = device.measure("resnet50", _config(sm=1500, mem=3201, power=700, batch=4), _window(tmp_path))
    assert not result.valid and "sm_mhz locked at 1500 MHz ran 1200-1200 MHz" in result.reason
    gpu.reasons = 0x4  # the power cap pulls it down: the configuration doing its job
    again = device.measure("resnet50", _config(sm=1500, mem=3201, power=700, batch=4), _window(tmp_path))
    assert again.valid, again.reason


@pytest.mark.loadgen
def test_a_power_limit_the_card_enforces_lower_is_not_held(fake_runners, tmp_path):
    nvml = FakeNVML()
    nvml.gpus[0].other_limit_mw = 300_000  # another limiter (nvmlDeviceGetEnforcedPowerLimit) is lower
    device = NvmlDevice(0, allow_clock_changes=True, nvml=nvml)
    device.apply(_config(sm=1500, mem=3201, power=400))
    assert device.settings_not_held() == ["power_limit_w 400 W is enforced as 300 W"]
    result = device.measure("resnet50", _config(sm=1500, mem=3201, power=400, batch=4), _window(tmp_path))
    assert not result.valid and "power_limit_w 400 W is enforced as 300 W" in result.reason


def test_set_calls_the_card_refuses_name_the_knob_to_drop():
    nvml = FakeNVML()
    nvml.gpus[0].not_supported = {"nvmlDeviceSetMemoryLockedClocks"}
    device = NvmlDevice(0, allow_clock_changes=True, nvml=nvml)
    with pytest.raises(UserError) as caught:
        device.apply(_config(sm=1500, mem=2201, power=400))
    text = str(caught.value)
    assert "cannot set mem_mhz" in text and "--knobs sm_mhz,power_limit_w,precision" in text
    assert "mem_mhz" not in text.split("--knobs")[1] and "\n" not in text
    assert nvml.locked_sm is None  # the SM lock made before it was undone

    device.space()
    nvml.gpus[0].graphics = [1980]  # the driver now refuses 1500 MHz
    nvml.gpus[0].not_supported = set()
    with pytest.raises(UserError, match=r"refuses sm_mhz=1500 .*invalid argument.*leave sm_mhz out with --knobs"):
        device.apply(_config(sm=1500, mem=2201, power=400))
    assert (nvml.locked_sm, nvml.locked_mem, nvml.power_limit_mw) == (None, None, 700_000)


def test_without_root_every_set_call_is_refused_and_the_advice_is_root_not_acp():
    nvml = FakeNVML(root=False)
    device = NvmlDevice(0, allow_clock_changes=True, nvml=nvml)
    with pytest.raises(UserError) as caught:
        device.apply(_config(sm=1500, mem=2201, power=400))
    text = str(caught.value)
    assert "needs root" in text and "root-only" in text and "only for applications clocks" in text
    assert (nvml.locked_sm, nvml.locked_mem, nvml.power_limit_mw) == (None, None, 700_000)


def test_the_power_meter_reads_the_instant_field_where_the_card_has_it():
    nvml = FakeNVML(energy_counter=False)
    device = NvmlDevice(0, nvml=nvml)
    nvml.gpus[0].set_watts(500.0)
    meter = device.make_meter("nvml-power")
    assert meter.rails == ["cuda:0 board power, instantaneous (NVML_FI_DEV_POWER_INSTANT)"]
    assert device.read_power_w() == 500.0  # the power now; nvmlDeviceGetPowerUsage still averages the last second
    nvml.gpus[0].instant_field = False
    meter = device.make_meter("nvml-power")
    assert meter.rails == ["cuda:0 board power, nvmlDeviceGetPowerUsage (a 1 s average on Ampere and newer)"]


@pytest.mark.loadgen
def test_an_observe_only_study_from_the_cli_records_clocks_and_exports_no_lock(fake_runners, tmp_path, monkeypatch):
    import sys

    import yaml
    from clirun import in_process

    nvml = FakeNVML()
    nvml.gpus[0].busy = True
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    out = tmp_path / "out"
    code, _, err = in_process(
        "run", "-m", "resnet50", "-d", "cuda:0", "-l", "500ms", "--trials", "2", "--batch-sizes", "4,8",
        "--knobs", "precision", "--window", "1", "--min-window", "1", "--out", str(out),
    )  # fmt: skip
    assert code == 0, err
    assert nvml.write_attempts == []
    best = tmp_path / "best.yaml"
    code, _, err = in_process("export", "-m", "resnet50", "-d", "cuda:0", "--out", str(out), "-o", str(best))
    assert code == 0, err
    exported = yaml.safe_load(best.read_text())
    assert "sm_mhz" not in exported["knobs"] and "mem_mhz" not in exported["knobs"]
    ran = exported["metrics"]["clocks_ran"]
    assert ran["sm_clock"] == "driver boost (not locked)" and 1410 <= ran["sm_mhz_min"] < ran["sm_mhz_max"] <= 1980
    measured = exported["provenance"]["measured_on"]
    assert measured["gpu_uuid"] == nvml.gpus[0].uuid and measured["observe_only"] is True
    assert measured["pci_bus_id"] == nvml.gpus[0].bus_id

    code, text, err = in_process("apply", str(best), "--device", "cuda:0", "--dry-run")
    assert code == 0, err
    text = " ".join(text.split())
    assert "already as tuned" in text and "sm_mhz" not in text and "clocks: not locked, as measured" in text, text
    code, text, err = in_process("apply", str(best), "--device", "cuda:0", "--allow-clock-changes")
    assert code == 0, err
    assert nvml.locked_sm is None and nvml.locked_mem is None
    assert [fn for fn, _ in nvml.write_attempts] == ["nvmlDeviceSetPowerManagementLimit"]
    assert in_process("restore", "--device", "cuda:0")[0] == 0


def test_tune_devices_lists_cuda_ordinals_as_torch_numbers_them(monkeypatch):
    import json
    import sys

    from clirun import in_process

    nvml = FakeNVML(gpus=2)
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    code, out, err = in_process("devices", "--json")
    assert code == 0, err
    gpus = [d for d in json.loads(out)["devices"] if d["name"].startswith("cuda:")]
    assert [(d["name"], d["usable"]) for d in gpus] == [("cuda:0", True)]
    assert nvml.gpus[1].uuid in gpus[0]["title"] and nvml.gpus[1].bus_id in gpus[0]["title"]


def test_the_torch_runner_names_its_gpu_as_nvml_does(monkeypatch):
    from types import SimpleNamespace

    torch = pytest.importorskip("torch")
    from runners.torch_runner import gpu_uuid

    props = SimpleNamespace(uuid="00000001-aaaa-bbbb-cccc-000000000001")  # str(props.uuid) has no GPU- prefix
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: props)
    assert gpu_uuid(torch.device("cuda", 0)) == "GPU-00000001-aaaa-bbbb-cccc-000000000001"
    assert gpu_uuid(torch.device("cpu")) is None


def test_one_card_has_one_physical_key_whatever_cuda_ordinal_names_it(monkeypatch):
    nvml = FakeNVML(gpus=2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0")
    as_first = NvmlDevice(0, nvml=nvml).physical_key()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert NvmlDevice(1, nvml=nvml).physical_key() == as_first == f"nvml-{nvml.gpus[1].uuid}"
    assert NvmlDevice(0, nvml=nvml).physical_key() != as_first
