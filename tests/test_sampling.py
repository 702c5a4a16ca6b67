import importlib.util

import optuna
import pytest

from tuner import sampling
from tuner.errors import UserError
from tuner.strategies import RooflineSampler


def hide_torch(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        sampling.importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a)
    )


def test_auto_is_the_roofline_guided_strategy():
    assert isinstance(sampling.make_sampler("auto", 0), RooflineSampler)


def test_without_pytorch_the_guided_strategy_refines_with_tpe_and_gp_says_what_to_install(monkeypatch):
    hide_torch(monkeypatch)
    assert isinstance(sampling.make_sampler("auto", 0).inner, optuna.samplers.TPESampler)
    with pytest.raises(UserError, match=r"powertune\[torch\]"):
        sampling.make_sampler("gp", 0)


def test_with_pytorch_the_guided_strategy_refines_with_gp():
    pytest.importorskip("torch")
    assert isinstance(sampling.make_sampler("ours", 0).inner, optuna.samplers.GPSampler)


def test_unknown_sampler():
    with pytest.raises(UserError, match="choose one of"):
        sampling.make_sampler("annealing", 0)
