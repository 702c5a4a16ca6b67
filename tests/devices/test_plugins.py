"""Devices from outside the repository: ``py:module:Class`` and the powertune.devices entry point group."""

import json
import os
import textwrap
from pathlib import Path

import pytest
from clirun import in_process, run_cli

from tuner.devices.registry import open_device
from tuner.errors import UserError
from tuner.measure.settings import WindowSettings
from tuner.space import Config
from tuner.study import MEMORY_STORAGE, RunOptions, run_study

PLUGIN = textwrap.dedent(
    '''
    """A recorded table of measurements, replayed: what a third-party plugin looks like."""
    import numpy as np

    from tuner.measurement import Measurement
    from tuner.space import Knob, SearchSpace

    TABLE = {  # gpu_mhz -> (seconds per sample, board watts), as if recorded on a small board
        300.0: (0.0040, 6.0),
        600.0: (0.0022, 9.0),
        900.0: (0.0016, 14.0),
    }


    class TableDevice:
        simulated = True
        kind = "table-board"

        def __init__(self, name):
            self.name = name
            self.slug = "table-board"
            self.applied = []

        def space(self):
            return SearchSpace(
                kind="table-board",
                knobs={"gpu_mhz": Knob(values=[300.0, 600.0, 900.0], default=900.0, unit="MHz")},
                batch_sizes=[1, 2, 4, 8, 16],
            )

        def read_state(self):
            return {}

        def apply(self, config):
            self.applied.append(config)

        def restore(self, state):
            pass

        def measure(self, model, config, settings):
            per_sample, watts = TABLE[float(config.knobs["gpu_mhz"])]
            t = 0.003 + per_sample * config.batch_size ** 0.8
            if settings.noise and settings.seed is not None:
                rng = np.random.default_rng(settings.seed)
                t *= float(rng.lognormal(0, 0.01))
                watts *= float(rng.lognormal(0, 0.01))
            batches = max(1, int(settings.window_s / t))
            queries = batches * config.batch_size
            return Measurement(
                j_per_query=watts * t / config.batch_size,
                p50_ms=t * 1000,
                p90_ms=t * 1010,
                p99_ms=t * 1030,
                qps=config.batch_size / t,
                avg_w=watts,
                energy_j=watts * t * batches,
                queries=queries,
                duration_s=t * batches,
                meter="table",
                rails=["table"],
                twin=True,
            )

        def describe(self):
            return {"name": self.name, "kind": self.kind, "twin": True, "title": "recorded table"}


    def not_a_device(name):
        return object()
    '''
)


OWN_MODELS = textwrap.dedent(
    '''
    """A board with a CPU stage the roofline does not model, and two models of its own."""
    from runners.profile import LayerProfile, ModelProfile
    from tuner.measurement import Measurement
    from tuner.space import Knob, SearchSpace

    WORK = {"my-net": 2.0e9, "blackbox": 5.0e8}  # FLOPs per sample


    class OwnBoard:
        simulated = True
        kind = "own-board"
        slug = "own-board"

        def __init__(self, name):
            self.name = name

        def space(self):
            return SearchSpace(
                kind="own-board",
                knobs={
                    "accel_level": Knob(values=[1, 2, 3, 4, 5, 6], default=6),
                    "host_threads": Knob(values=[1, 2, 3, 4], default=4),
                },
                batch_sizes=[1, 2, 4, 8, 16],
            )

        def models(self):
            return list(WORK)

        def profile(self, model):
            if model == "blackbox":
                return None
            return ModelProfile(
                model=model,
                task="own",
                input_shape=[16],
                generated_by="the plugin",
                layers=[LayerProfile(name="mm", op="matmul", flops=WORK[model], weight_bytes=4e6, act_bytes=1e5,
                                     matmul=True)],
            )

        def read_state(self):
            return {}

        def apply(self, config):
            pass

        def restore(self, state):
            pass

        def measure(self, model, config, settings):
            level, threads, b = config.knobs["accel_level"], config.knobs["host_threads"], config.batch_size
            accel = WORK[model] * b / (level * 2.5e11) + 0.001
            host = b * 0.004 / (1 + 0.8 * (threads - 1))
            period = max(accel, host) + 0.1 * min(accel, host)
            watts = 3.0 + 0.9 * threads + 1.2 * level ** 1.6
            return Measurement(
                j_per_query=watts * period / b, p50_ms=(accel + host) * 1000, p90_ms=(accel + host) * 1010,
                p99_ms=(accel + host) * 1030, qps=b / period, avg_w=watts, energy_j=watts * period, queries=b,
                duration_s=period, meter="own", twin=True,
            )

        def describe(self):
            return {"name": self.name, "kind": self.kind, "twin": True, "title": "a board with its own models"}
    '''
)


@pytest.fixture
def plugin_path(tmp_path, monkeypatch):
    """The plugin lives in a folder outside the repo, with an installed-distribution entry point."""
    folder = tmp_path / "plugins"
    folder.mkdir()
    (folder / "tableplug.py").write_text(PLUGIN)
    (folder / "ownplug.py").write_text(OWN_MODELS)
    dist = folder / "tableplug-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: tableplug\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[powertune.devices]\ntable = tableplug:TableDevice\n")
    monkeypatch.syspath_prepend(str(folder))
    return folder


def _env(folder: Path) -> dict:
    return {"PYTHONPATH": os.pathsep.join([str(folder), os.environ.get("PYTHONPATH", "")])}


def test_py_and_entry_point_devices_open(plugin_path):
    dev = open_device("py:tableplug:TableDevice")
    assert dev.kind == "table-board" and dev.name == "py:tableplug:TableDevice"
    assert open_device("table").name == "table"


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("py:tableplug", "py:package.module:Class"),
        ("py:nosuchmodule:X", "cannot import nosuchmodule"),
        ("py:tableplug:Missing", "no 'Missing'"),
        ("py:tableplug:not_a_device", "did not return a Device"),
    ],
)
def test_bad_plugins_are_user_errors(plugin_path, name, message):
    with pytest.raises(UserError, match=message):
        open_device(name)


def test_tune_run_on_plugin_device(plugin_path, tmp_path):
    r = run_cli(
        "run",
        "--model",
        "resnet50",
        "--device",
        "py:tableplug:TableDevice",
        "--max-latency",
        "15ms",
        "--trials",
        "6",
        "--seed",
        "1",
        "--out",
        str(tmp_path / "out"),
        "--json",
        env=_env(plugin_path),
    )
    assert r.returncode == 0, r.stderr
    payload = json.loads(r.stdout)
    assert payload["best"]["p99_ms"] <= 15
    assert payload["measured"] >= 6


def test_tune_run_on_entry_point_device(plugin_path, tmp_path):
    r = run_cli(
        "run",
        "--model",
        "resnet50",
        "--device",
        "table",
        "--max-latency",
        "15ms",
        "--trials",
        "4",
        "--sampler",
        "random",
        "--seed",
        "2",
        "--out",
        str(tmp_path / "out"),
        "--json",
        env=_env(plugin_path),
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["best"] is not None


def test_tune_bench_on_plugin_device(plugin_path, tmp_path):
    r = run_cli(
        "bench",
        "--devices",
        "py:tableplug:TableDevice",
        "--models",
        "resnet50",
        "--bounds",
        "medium",
        "--strategies",
        "random,learned",
        "--seeds",
        "1",
        "--trials",
        "6",
        "--random-trials",
        "6",
        "--jobs",
        "1",
        "--out",
        str(tmp_path / "out"),
        "--json",
        env=_env(plugin_path),
    )
    assert r.returncode == 0, r.stderr
    payload = json.loads(r.stdout)
    assert payload["landscapes"] == 1 and payload["runs"] == 2
    assert {row["strategy"] for row in payload["summary"]} == {"random", "learned"}
    assert (tmp_path / "out" / "bench" / "search.json").is_file()


def test_unknown_plugin_names_the_forms(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, _, err = in_process("run", "--model", "resnet50", "--device", "py:nowhere:Dev", "--max-latency", "5ms")
    assert code == 2
    assert "cannot import nowhere" in err and "Traceback" not in err


def test_plugin_model_of_its_own_through_the_default_strategy(plugin_path):
    """A board defined outside the repository, a model only it knows: the learned strategy fits its profile."""
    dev = open_device("py:ownplug:OwnBoard")
    options = RunOptions(model="my-net", max_latency_ms=40, trials=14, seed=0, storage=MEMORY_STORAGE)
    study, summary = run_study(dev, options)
    truth = {
        (level, threads, b): dev.measure(
            "my-net",
            Config(knobs={"accel_level": level, "host_threads": threads}, batch_size=b),
            WindowSettings(noise=False),
        )
        for level in range(1, 7)
        for threads in range(1, 5)
        for b in (1, 2, 4, 8, 16)
    }
    best = min(m.j_per_query for m in truth.values() if m.p99_ms <= 40)
    baseline = truth[(6, 4, 16)].j_per_query
    assert summary.best is not None and summary.best["j_per_query"] <= min(best * 1.1, baseline)
    notes = study.user_attrs["strategy_notes"]
    assert any("declared by the device" in n for n in notes)
    proposers = {t.user_attrs.get("proposed_by") for t in study.trials}
    assert "baseline" in proposers and any(p and p.startswith(("gp", "local")) for p in proposers)
    assert all(t.user_attrs.get("why") for t in study.trials)


def test_a_model_without_profile_is_said_in_the_run_output(plugin_path, tmp_path):
    """In-process (the plugin is on sys.path): test_tune_run_on_plugin_device runs a py: plugin as a process."""
    code, out, err = in_process(
        "run",
        "--model",
        "blackbox",
        "--device",
        "py:ownplug:OwnBoard",
        "--max-latency",
        "40ms",
        "--trials",
        "6",
        "--seed",
        "1",
        "--out",
        str(tmp_path / "out"),
    )
    assert code == 0, err
    assert "declares blackbox without a per-layer profile" in out and "roofline prior is off" in out
    assert "proposed by: baseline 2" in out
    csv_text = (tmp_path / "out" / "own-board" / "blackbox" / "trials.csv").read_text()
    assert "proposed_by,why" in csv_text.splitlines()[0]


def test_unknown_model_of_a_plugin_lists_its_own(plugin_path):
    from tuner.models import check_model

    with pytest.raises(UserError, match="my-net, blackbox"):
        check_model("nosuch", device=open_device("py:ownplug:OwnBoard"))
