import ast
import importlib.util
import json
import subprocess
import sys

import numpy as np
import optuna
import pytest
from locations import REPO

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
    assert isinstance(sampling.make_sampler("auto", 0).inner.inner, optuna.samplers.TPESampler)
    assert "gp" not in sampling.available_samplers() and "tpe" in sampling.available_samplers()
    with pytest.raises(UserError, match=r"powertune\[torch\]"):
        sampling.make_sampler("gp", 0)


@pytest.mark.skipif(not sampling.has_torch(), reason="needs PyTorch")
def test_gp_samplers_import_pytorch_when_built_the_learned_one_never():
    """gp and two-phase import PyTorch when built, not inside their first GP proposal (a trial a signal waits for);
    the default learned sampler leaves it out (a quick start never loads it)."""
    loaded = {}
    for name in ("learned", "gp", "two-phase"):
        code = f"import sys, tuner.sampling\ntuner.sampling.make_sampler({name!r}, 0)\nprint('torch' in sys.modules)"
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        loaded[name] = done.stdout.strip()
    assert loaded == {"learned": "False", "gp": "True", "two-phase": "True"}


def test_unknown_sampler():
    with pytest.raises(UserError, match="choose one of"):
        sampling.make_sampler("annealing", 0)


def test_sampling_imports_strategies_never_the_reverse():
    imported = {
        node.module
        for source in (REPO / "tuner" / "strategies").glob("*.py")
        for node in ast.walk(ast.parse(source.read_text()))
        if isinstance(node, ast.ImportFrom) and node.module
    }
    assert "tuner.strategies.base" in imported and "tuner.sampling" not in imported


def test_the_old_name_of_the_learned_strategy_still_builds_it():
    assert isinstance(sampling.make_sampler("ours", 0), LearnedSampler)
    assert "learned" in sampling.available_samplers() and "ours" not in sampling.available_samplers()


def test_the_learned_strategy_takes_its_settings_in_the_constructor():
    default, probing = LearnedSampler(seed=0), LearnedSampler(seed=0, probe=False, pf_margin=1.0)
    assert default.probe and default.pf_margin == 2.0
    assert not probing.probe and probing.pf_margin == 1.0 and not hasattr(LearnedSampler, "pf_margin")


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
    relevance = np.exp(-gp.log_scales)  # inverse length scale per input
    assert relevance[0] > 3 * relevance[1]


def test_grid_encoding_from_tables_matches_encoding_each_configuration():
    from tuner.space import Grid, Mode
    from tuner.surrogate import encode_grid

    space = SearchSpace(
        kind="k",
        knobs={
            "mode": Knob(values=["A", "B"], default="A", ordered=False),
            "clock": Knob(values=[100, 200, 300], default=300),
            "lanes": Knob(values=[1, 2], default=2),
        },
        batch_sizes=[1, 2, 4],
        mode_knob="mode",
        modes={"A": Mode(id=0), "B": Mode(id=1, caps={"clock": 200})},
    )
    grid = Grid(space)
    x, _ = encode(space, space.grid())
    assert len(grid) == 3 * (6 + 4)
    assert np.array_equal(encode_grid(space, grid), x)


def test_the_learned_strategy_never_materialises_the_grid(monkeypatch):
    """Scoring every configuration per trial cost most of a quick start: it scores a candidate set instead."""
    from tuner.devices.virtual.twin import TwinDevice
    from tuner.study import MEMORY_STORAGE, RunOptions, run_study

    def refuse(self):
        raise AssertionError("the strategy built the whole grid")

    monkeypatch.setattr(SearchSpace, "grid", refuse)
    options = RunOptions(model="resnet50", max_latency_ms=50, trials=6, seed=0, storage=MEMORY_STORAGE)
    study, summary = run_study(TwinDevice("sim:orin"), options)
    proposers = [t.user_attrs.get("proposed_by") for t in study.trials]
    assert proposers[:2] == ["baseline", "baseline"]
    assert proposers[2] == "design"
    assert all(p and p.split("(")[0] in {"gp", "gp+roofline", "local"} for p in proposers[3:])
    assert summary.best is not None


def test_tune_run_accepts_the_old_name_of_the_learned_strategy(tmp_path):
    """In-process: what is checked is the option's spelling, not the process."""
    from clirun import in_process

    code, out, err = in_process(
        *("run", "--model", "resnet50", "--device", "sim:orin", "--max-latency", "50ms", "--trials", "3"),
        *("--sampler", "ours", "--seed", "0", "--out", str(tmp_path), "--json"),
    )
    assert code == 0, err
    assert "baseline" in json.loads(out)["proposed_by"]
