"""tune run frees the model its device keeps prepared however the study ends (a signal included).

On the H200 an LLM study sent SIGTERM ended in SIGABRT after restoring the
card: transformers' generation thread was still in native code when the
interpreter exited, because nothing closed the device's runner.
"""

from __future__ import annotations

import pytest

import tuner.study as study_module
from tuner.devices.runner_cache import RunnerCache, releasing_runner
from tuner.run_options import RunOptions
from tuner.study_results import StudyRequest


class _Runner:
    closed = 0

    def close(self) -> None:
        type(self).closed += 1


class _Device:
    slug = "fake"
    simulated = True

    def __init__(self) -> None:
        self.runners = RunnerCache("cpu")
        self.runners._runner = _Runner()


def test_the_prepared_runner_is_closed_when_the_block_raises():
    device = _Device()
    before = _Runner.closed
    with pytest.raises(KeyboardInterrupt), releasing_runner(device):
        raise KeyboardInterrupt
    assert _Runner.closed == before + 1 and device.runners._runner is None
    with releasing_runner(object()):  # a device that keeps no runner: nothing to free
        pass


def test_tune_run_frees_the_runner_when_its_study_is_interrupted(tmp_path, monkeypatch):
    device = _Device()
    before = _Runner.closed

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(study_module, "open_checked", lambda request, on_note=None: device)
    monkeypatch.setattr(study_module, "run_study", interrupted)
    request = StudyRequest(device="sim:orin", options=RunOptions(model="resnet50", max_latency_ms=50.0, out=tmp_path))
    with pytest.raises(KeyboardInterrupt):
        study_module.tune_study(request)
    assert _Runner.closed == before + 1
