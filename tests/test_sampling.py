import ast
import importlib.util
from pathlib import Path

import numpy as np
import optuna
import pytest

from tuner import sampling
from tuner.errors import UserError
from tuner.space import Config, Knob, SearchSpace
from tuner.strategies import LearnedSampler
from tuner.surrogate import GaussianProcess, encode


def hide_torch(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a))


def test_auto_is_the_learned_strategy():
    assert isinstance(sampling.make_sampler("auto", 0), LearnedSampler)


def test_without_pytorch_the_fallback_is_tpe_and_gp_says_what_to_install(monkeypatch):
    hide_torch(monkeypatch)
    assert isinstance(sampling.make_sampler("auto", 0).inner, optuna.samplers.TPESampler)
    assert "gp" not in sampling.available_samplers() and "tpe" in sampling.available_samplers()
    with pytest.raises(UserError, match=r"powertune\[torch\]"):
        sampling.make_sampler("gp", 0)


def test_unknown_sampler():
    with pytest.raises(UserError, match="choose one of"):
        sampling.make_sampler("annealing", 0)


def test_sampling_imports_strategies_never_the_reverse():
    source = Path(__file__).parent.parent / "tuner" / "strategies.py"
    imported = {
        node.module
        for node in ast.walk(ast.parse(source.read_text()))
        if isinstance(node, ast.ImportFrom) and node.module
    }
    assert "tuner.sampling" not in imported


def test_every_knob_is_an_input_whatever_its_name():
    space = SearchSpace(
        kind="k",
        knobs={
            "accel_level": Knob(values=[1, 2, 3], default=3),
            "flavour": Knob(values=["a", "b"], default="a", ordered=False),
        },
        batch_sizes=[1, 4, 16],
    )
    x, columns = encode(space, [Config(knobs={"accel_level": 2, "flavour": "b"}, batch_size=16)])
    assert columns == ["accel_level", "flavour=a", "flavour=b", "batch_size"]
    assert x.tolist() == [[0.5, 0.0, 1.0, 1.0]]


def test_gaussian_process_learns_a_relevant_knob_and_ignores_another():
    rng = np.random.default_rng(0)
    x = rng.random((25, 2))
    y = np.sin(4 * x[:, 0]) + 0.005 * rng.standard_normal(25)
    basis = np.ones((25, 1))
    gp = GaussianProcess.fit(x, y, basis)
    grid = rng.random((50, 2))
    mean, std = gp.predict(grid, np.ones((50, 1)))
    assert np.abs(mean - np.sin(4 * grid[:, 0])).max() < 0.1
    assert (std > 0).all()
    relevance = gp.relevance(["x0", "x1"])
    assert relevance["x0"] > 3 * relevance["x1"]
