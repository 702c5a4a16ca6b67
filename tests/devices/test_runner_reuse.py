"""Spend nothing twice: the runner a device holds, and what it prepared, outlive one study of the same model."""

import pytest

import runners
from tuner.devices.runner_cache import RunnerCache
from tuner.space import Config, Knob, SearchSpace


class CountingRunner:
    """A runner that counts how often it is built and asked to prepare a configuration."""

    built = 0

    def __init__(self) -> None:
        CountingRunner.built += 1
        self.prepared: list[tuple] = []
        self.closed = False

    def prepare(self, batch_size: int, precision: str, options: dict) -> None:
        self.prepared.append((batch_size, precision, tuple(sorted(options.items()))))

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def cache(monkeypatch: pytest.MonkeyPatch) -> RunnerCache:
    CountingRunner.built = 0
    monkeypatch.setattr(runners, "make_runner", lambda model, device, runtime="auto": CountingRunner())
    return RunnerCache("cpu")


SPACE = SearchSpace(
    kind="k",
    knobs={
        "clock": Knob(values=[1, 2], default=2),
        "precision": Knob(values=["fp32", "bf16"], default="fp32", ordered=False, group="runner"),
    },
    batch_sizes=[1, 8],
)


def config(clock: int, precision: str, batch: int) -> Config:
    return Config(knobs={"clock": clock, "precision": precision}, batch_size=batch)


def test_a_second_study_of_the_same_model_loads_nothing_and_a_clock_change_prepares_nothing(cache):
    """tune plan runs one study per rate on one device (tuner.serve.plan): the runner is the first study's."""
    first = cache.get("resnet50", config(1, "bf16", 8), SPACE)
    assert cache.last_load_s >= 0 and CountingRunner.built == 1
    again = cache.get("resnet50", config(2, "bf16", 8), SPACE)  # the next study's first trial: another clock
    assert again is first and CountingRunner.built == 1
    assert first.prepared == [(8, "bf16", ())]  # a device knob never re-prepares the model
    assert cache.last_load_s == 0.0 and cache.last_prepare_s == 0.0


def test_another_model_or_runtime_builds_its_own_runner_and_frees_the_last(cache):
    first = cache.get("resnet50", config(1, "fp32", 1), SPACE)
    other = cache.get("bert-base", config(1, "fp32", 1), SPACE)
    assert other is not first and first.closed and CountingRunner.built == 2
    cache.get("bert-base", config(1, "fp32", 1), SPACE, runtime="onnxruntime")
    assert CountingRunner.built == 3


def test_a_window_after_one_of_the_same_prepared_configuration_skips_its_warm_up(cache):
    cache.get("resnet50", config(1, "fp32", 8), SPACE)
    assert cache.warm_qps() is None
    cache.ran(120.0)
    cache.get("resnet50", config(2, "fp32", 8), SPACE)
    assert cache.warm_qps() == pytest.approx(120.0)
    cache.get("resnet50", config(2, "bf16", 8), SPACE)
    assert cache.warm_qps() is None
