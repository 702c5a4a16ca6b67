"""The cpu device end to end: real LoadGen, a fake runner, RAPL from a fake powercap tree."""

from __future__ import annotations

import time
from typing import ClassVar

import pytest

import runners
from tuner.devices.host.device import HostDevice
from tuner.errors import UserError
from tuner.measure.settings import WindowSettings
from tuner.space import Config


class TinyRunner:
    made: ClassVar[list[TinyRunner]] = []

    def __init__(self, model: str, device: str, runtime: str = "auto") -> None:
        self.model, self.device = model, device
        self.prepared = None
        TinyRunner.made.append(self)

    def prepare(self, batch_size, precision, options) -> None:
        self.prepared = (batch_size, precision, options)

    def infer(self, size: int | None = None) -> int:
        time.sleep(0.001)
        return size or 1

    def close(self) -> None: ...


@pytest.mark.slow  # a LoadGen window on this CPU
def test_cpu_device_measures_through_loadgen_with_rapl(rapl_at_15w, monkeypatch, tmp_path):
    TinyRunner.made = []
    monkeypatch.setattr(runners, "make_runner", TinyRunner, raising=False)
    device = HostDevice()
    space = device.space()
    assert space.tuned_knobs == ["precision"]
    config = Config(knobs={"precision": "bf16"}, batch_size=4)
    device.apply(config)
    settings = WindowSettings(window_s=0.5, warmup_s=0.05, log_dir=str(tmp_path / "logs"))
    m = device.measure("tiny-cnn", config, settings)
    assert m.meter == "rapl" and m.rails == ["package-0"]
    # The fake counter is advanced by a thread that a busy machine can hold back: the meter's
    # plumbing is what is checked here, not the counter's timing.
    assert m.avg_w == pytest.approx(15.0, rel=0.5)
    assert m.queries > 0 and m.j_per_query == pytest.approx(m.energy_j / m.queries)
    assert m.valid, m.reason
    assert TinyRunner.made[0].device == "cpu" and TinyRunner.made[0].prepared == (4, "bf16", {})
    device.measure("tiny-cnn", config, settings)
    assert len(TinyRunner.made) == 1


def test_cpu_device_refuses_gpu_meters():
    with pytest.raises(UserError, match="rapl"):
        HostDevice().make_meter("nvml-energy")
