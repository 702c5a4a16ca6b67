"""A user's own model, as a new user brings it: on every twin, with a space that follows the model, and an answer
even when no configuration meets the bound. Each test drives the CLI in a process of its own."""

import csv
import json
import os
import re
from pathlib import Path

import optuna
import pytest
from clirun import run_cli
from locations import FAKES, REPO
from test_profile_onnx import tiny_cnn_onnx

FACTORY = """
from pathlib import Path

import torch
from torch import nn


def build():
    with open(Path(__file__).with_name("calls.txt"), "a") as fh:
        fh.write("built\\n")
    head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4))
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), head), (3, 32, 32)


def tokens():
    class Bag(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(100, 16)
            self.head = nn.Linear(16, 2)

        def forward(self, ids):
            return self.head(torch.relu(self.embed(ids)).mean(1))

    return Bag(), {"shape": [12], "dtype": "int64", "high": 100}
"""


@pytest.fixture
def mymodels(tmp_path) -> Path:
    pytest.importorskip("torch", reason="needs torch (pip install torch==2.13.0)")
    (tmp_path / "mymodels.py").write_text(FACTORY)
    return tmp_path


def _trials(out: Path, device: str, model: str) -> list[dict]:
    with open(out / device / model / "trials.csv") as fh:
        return list(csv.DictReader(fh))


def test_a_py_model_runs_on_every_twin_profiled_once_per_process(mymodels):
    for twin in ("sim:orin", "sim:h200"):
        r = run_cli("run", "-m", "py:mymodels:build", "-d", twin, "-l", "20ms", "--trials", "3", cwd=mymodels)
        assert r.returncode == 0, r.stderr
        assert "digital twin" in r.stdout and "recommended for py:mymodels:build" in r.stdout
        assert "profiled from one CPU forward of py:mymodels:build" in r.stdout + r.stderr
    # each process built the model once: checking it, the twin's windows and the strategy share one profile
    assert (mymodels / "calls.txt").read_text().splitlines() == ["built", "built"]
    assert len(_trials(mymodels / "studies", "sim-orin", "mymodels.build")) >= 3


def test_a_model_with_no_convolution_does_not_search_channels_last(mymodels):
    r = run_cli("run", "-m", "py:mymodels:tokens", "-d", "sim:h200", "-l", "20ms", "--trials", "4", cwd=mymodels)
    assert r.returncode == 0, r.stderr
    notes = [line for line in r.stderr.splitlines() if line.startswith("note: pinned")]
    assert notes == [
        "note: pinned for py:mymodels:tokens: channels_last=False (py:mymodels:tokens has no 2-D convolution, "
        "the only work channels_last changes)"
    ]
    study = optuna.load_study(
        study_name="py:mymodels:tokens|sim-h200|offline|20ms", storage=f"sqlite:///{mymodels / 'studies/tune.db'}"
    )
    assert study.trials and all("channels_last" not in t.params for t in study.trials)
    assert "channels_last" not in study.user_attrs["tuned_knobs"]


def test_bert_is_tuned_without_channels_last_and_resnet_with_it(tmp_path):
    bert = run_cli("run", "-m", "bert-base", "-d", "sim:h200", "-l", "20ms", "--trials", "2", cwd=tmp_path)
    assert bert.returncode == 0, bert.stderr
    assert "note: pinned for bert-base: channels_last=False" in bert.stderr
    resnet = run_cli("run", "-m", "resnet50", "-d", "sim:h200", "-l", "20ms", "--trials", "2", cwd=tmp_path)
    assert resnet.returncode == 0 and "pinned" not in resnet.stderr


def test_an_onnx_file_with_a_dynamic_batch_axis_runs_on_a_twin_in_the_files_own_precision(tmp_path):
    model = tiny_cnn_onnx(tmp_path / "dyn.onnx", batch="batch")
    args = ("run", "-m", str(model), "-d", "sim:h200", "-l", "20ms", "--trials", "4", "--sampler", "tpe")
    r = run_cli(*args, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr and "digital twin" in r.stdout
    pinned = next(line for line in r.stderr.splitlines() if line.startswith("note: pinned"))
    assert "precision=fp32 (dyn.onnx takes fp32 inputs, so the file fixes the precision)" in pinned
    assert "channels_last=False" in pinned and "graph=eager" in pinned
    rows = _trials(tmp_path / "studies", "sim-h200", "dyn")
    assert len(rows) >= 4 and {row["precision"] for row in rows} == {"fp32"}


def test_an_fp16_onnx_file_on_a_space_without_fp16_is_refused_before_anything_is_written(tmp_path):
    model = tiny_cnn_onnx(tmp_path / "half.onnx", batch="batch", elem=10)
    space = tmp_path / "h200-no-fp16.yaml"
    text = (REPO / "search_spaces" / "h200.yaml").read_text()
    space.write_text(
        text.replace("values: [fp32, fp16, bf16]\n    default: fp16", "values: [fp32, bf16]\n    default: fp32")
    )
    assert "values: [fp32, bf16]" in space.read_text()
    r = run_cli("run", "-m", str(model), "-d", "sim:h200", "-l", "20ms", "--space", str(space), cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert "half.onnx takes fp16 inputs" in r.stderr and "export the model to match" in r.stderr
    assert not (tmp_path / "studies").exists()


def test_the_cpu_without_rapl_names_the_twin_that_runs_the_model(mymodels):
    env = {"TUNE_POWERCAP_ROOT": str(mymodels / "no-rapl")}
    r = run_cli("run", "-m", "py:mymodels:build", "-d", "cpu", "-l", "20ms", cwd=mymodels, env=env)
    assert r.returncode == 2
    assert "--device sim:orin runs py:mymodels:build from its FLOP/byte profile" in r.stderr
    assert not (mymodels / "studies").exists()


def test_an_impossible_bound_exits_3_naming_the_fastest_configuration_and_the_bound_that_admits_it(tmp_path):
    r = run_cli("run", "-m", "resnet50", "-d", "sim:orin", "-l", "2ms", "--trials", "6", "--seed", "1", cwd=tmp_path)
    assert r.returncode == 3, r.stderr
    said = " ".join(r.stdout.split())
    found = re.search(r"the fastest measured, trial (\d+) \(batch (\d+), .*?\), ran p99 ([\d.]+) ms", said)
    admits = re.search(r"--max-latency ([\d.]+)ms", said)
    assert found and admits and "no configuration met p99 <= 2 ms in 6 completed trials" in said, said
    rows = _trials(tmp_path / "studies", "sim-orin", "resnet50")
    fastest = min((row for row in rows if row["p99_ms"]), key=lambda row: float(row["p99_ms"]))
    assert found.group(1) == fastest["trial"] and found.group(2) == fastest["batch_size"]
    assert float(admits.group(1)) >= float(found.group(3)) >= 2
    assert "results: studies/sim-orin/resnet50/" in said  # the study's files are written all the same
    export = run_cli("export", "-m", "resnet50", "-d", "sim:orin", "-l", "2ms", "-o", "best.yaml", cwd=tmp_path)
    assert export.returncode == 3 and "run more trials" not in export.stderr
    assert f"the fastest measured, trial {found.group(1)}" in export.stderr and admits.group(0) in export.stderr
    assert not (tmp_path / "best.yaml").exists()
    as_json = run_cli("run", "-m", "resnet50", "-d", "sim:orin", "-l", "2ms", "--trials", "1", "--json", cwd=tmp_path)
    assert as_json.returncode == 3 and json.loads(as_json.stdout)["unmet"].startswith("no configuration met p99")


def test_a_bound_met_still_exits_0(tmp_path):
    r = run_cli("run", "-m", "resnet50", "-d", "sim:orin", "-l", "50ms", "--trials", "2", cwd=tmp_path)
    assert r.returncode == 0 and "recommended for resnet50" in r.stdout


@pytest.mark.slow
def test_a_torch_exported_onnx_file_tunes_on_the_cpu_with_tpe(tmp_path):
    """The user's path literally: torch.onnx.export with a dynamic batch axis, LoadGen on the CPU, TPE."""
    torch = pytest.importorskip("torch", reason="needs torch (pip install torch==2.13.0)")
    pytest.importorskip("onnx", reason="torch's ONNX exporter needs onnx (pip install onnx)")
    pytest.importorskip("onnxruntime", reason="needs onnxruntime (pip install 'powertune[onnx]')")
    pytest.importorskip("mlperf_loadgen", reason="needs LoadGen (pip install mlcommons-loadgen)")
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1))
    path = tmp_path / "tinyconv.onnx"
    sample = torch.randn(1, 3, 32, 32)
    torch.onnx.export(net.eval(), sample, str(path), input_names=["x"], dynamic_axes={"x": {0: "batch"}}, dynamo=False)
    env = {
        "PYTHONPATH": os.pathsep.join([str(FAKES), *filter(None, [os.environ.get("PYTHONPATH")])]),
        "TUNE_POWERCAP_ROOT": str(tmp_path / "no-rapl"),
    }
    meter = ("--meter", "py:fakemeter:ConstantMeter", "--window", "1", "--batch-sizes", "1,4")
    args = ("run", "-m", "tinyconv.onnx", "-d", "cpu", *meter, "-l", "200ms", "--sampler", "tpe", "--trials", "3")
    r = run_cli(*args, cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    assert "note: pinned for tinyconv.onnx: precision=fp32" in r.stderr
    assert {row["precision"] for row in _trials(tmp_path / "studies", "cpu", "tinyconv")} == {"fp32"}


@pytest.mark.parametrize("model", ["tiny-cnn", "mobilenet_v2", "bert-base"])
def test_a_module_profiled_per_aten_operator_matches_the_zoos_committed_profile(model):
    """The rules a user's module is counted by are the zoo's: the same FLOPs, bytes and kernel families."""
    pytest.importorskip("torch", reason="needs torch (pip install torch==2.13.0)")
    from collections import Counter

    from runners import zoo
    from runners.profile import load_profile
    from runners.profiling import profile_module

    counted = profile_module(
        model, zoo.build_model(model).eval(), lambda b, d: (zoo.input_for(model, b, "cpu", d),), "t"
    )
    committed = load_profile(model)
    assert counted.flops_per_sample == pytest.approx(committed.flops_per_sample, rel=1e-3)
    assert counted.weight_bytes == pytest.approx(committed.weight_bytes, rel=0.02)  # + BatchNorm's running stats
    assert counted.act_bytes_per_sample == pytest.approx(committed.act_bytes_per_sample, rel=0.01)
    kernels = ("conv_dense", "conv_pointwise", "conv_depthwise", "gemm", "attention", "layout_copy")

    def families(profile):
        return Counter(layer.op_class for layer in profile.layers if layer.op_class in kernels)

    assert families(counted) == families(committed)
