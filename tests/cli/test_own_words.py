"""A user's first hour, in the tool's own words: what the answer saved, exports that say what was measured,
one twin name per kind, a hand-chosen mode applied and undone. Each test drives the CLI as a user would."""

from __future__ import annotations

import re
from pathlib import Path

import optuna
import pytest
import yaml
from clirun import in_process, run_cli
from fakeboard import make_fake_board
from test_profile_onnx import tiny_cnn_onnx

from tuner import baseline
from tuner.deploy import load_export, write_export
from tuner.devices.jetson.nvpconf import read_conf

SAVED = re.compile(
    r"saved: (\d+\.\d)% less energy per query than the default mode MAXN \(batch (\d+)\) at p99 <= 50 ms"
)


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> Path:
    """A short twin study of resnet50 on sim:orin at 50 ms, its baseline measured once at the end."""
    out = tmp_path_factory.mktemp("own-words")
    code, stdout, err = in_process(
        "run", "-m", "resnet50", "-d", "sim:orin", "-l", "50ms", "--trials", "6", "--seed", "2", "--out", str(out)
    )
    assert code == 0, err
    (out / "run.txt").write_text(stdout)
    return out


def _study(out: Path) -> optuna.Study:
    return optuna.load_study(study_name="resnet50|sim-orin|offline|50ms", storage=f"sqlite:///{out / 'tune.db'}")


def _one_line(text: str) -> str:
    return " ".join(text.split())


def test_run_pareto_export_and_report_say_what_the_answer_saved_against_the_default(study, tmp_path):
    ran = SAVED.search(_one_line((study / "run.txt").read_text()))
    assert ran, (study / "run.txt").read_text()
    pct, batch = float(ran.group(1)), int(ran.group(2))
    stored = _study(study)
    best = stored.best_trial
    assert batch == best.user_attrs["batch_size"]
    [record] = stored.user_attrs[baseline.BASELINES_ATTR]  # one baseline, stored beside the trials, never a trial
    assert record["spec"] == "default" and record["config"]["nvpmodel"] == "MAXN" and record["twin"]
    assert len(stored.trials) == 6
    assert pct == pytest.approx((1 - best.value / record["figures"]["j_per_query"]) * 100, abs=0.06)

    code, out, err = in_process("pareto", "-m", "resnet50", "-d", "sim:orin", "-l", "50ms", "--out", str(study))
    assert code == 0, err
    assert SAVED.search(_one_line(out)).group(1) == ran.group(1)

    code, out, err = in_process(*["export", "-m", "resnet50", "-d", "sim:orin", "-l", "50ms", "--out", str(study),
                                  "-o", str(tmp_path / "best.yaml")])  # fmt: skip
    assert code == 0, err
    assert SAVED.search(_one_line(out)).group(1) == ran.group(1)
    exported = load_export(tmp_path / "best.yaml")
    assert exported.version == 2 and exported.saved is not None
    assert exported.saved.less_energy_pct == pytest.approx(pct, abs=0.06) and exported.saved.baseline_meets_bound

    code, out, err = in_process(*["report", "-m", "resnet50", "-d", "sim:orin", "-l", "50ms", "--from-study",
                                  str(study), "--modes", "MAXN", "--batch-sizes", str(batch), "--out",
                                  str(tmp_path / "report")])  # fmt: skip
    assert code == 0, err
    assert SAVED.search(_one_line(out)).group(1) == ran.group(1)
    assert f"What it saves: {ran.group(1)}% less energy per query" in (tmp_path / "report" / "report.md").read_text()


def test_a_resumed_run_says_so_and_reads_its_baseline_back_without_measuring_it_again(tmp_path, monkeypatch):
    args = ("run", "-m", "mobilenet_v2", "-d", "sim:orin", "-l", "30ms", "--seed", "5", "--out", str(tmp_path))
    code, out, err = in_process(*args, "--trials", "5")
    assert code == 0 and "resuming" not in err, err
    first = _one_line(out)
    calls = []
    measure = baseline.measure
    monkeypatch.setattr(baseline, "measure", lambda *a, **k: calls.append(a) or measure(*a, **k))
    code, out, err = in_process(*args, "--trials", "3", "--no-early-stop")
    assert code == 0, err
    assert re.search(r"resuming: \d+ trials in storage \(study mobilenet_v2\|sim-orin\|offline\|30ms\)", err), err
    batch = re.compile(r"than the default mode MAXN \(batch (\d+)\)")
    before, after = batch.search(first).group(1), batch.search(_one_line(out)).group(1)
    assert len(calls) == (before != after)  # measured again only for an answer at another batch size
    stored = optuna.load_study(study_name="mobilenet_v2|sim-orin|offline|30ms", storage=f"sqlite:///{tmp_path}/tune.db")
    assert len(stored.user_attrs[baseline.BASELINES_ATTR]) == 1 + (before != after)


def test_a_named_baseline_that_misses_the_bound_is_said_so(tmp_path):
    args = ("run", "-m", "resnet50", "-d", "sim:orin", "-l", "50ms", "--trials", "6", "--seed", "2")
    code, out, err = in_process(*args, "--baseline", "15W", "--out", str(tmp_path))
    assert code == 0, err
    line = _one_line(out)
    assert re.search(r"saved: \d+\.\d% less energy per query than mode 15W \(batch \d+\) at p99 <= 50 ms; "
                     r"the baseline ran p99 \d+(\.\d+)? ms, over the bound", line), line  # fmt: skip


@pytest.mark.parametrize(
    ("spec", "said"),
    [("gpux=1", "unknown knob 'gpux'"), ("10W", "nvpmodel=10W is not supported"), ("gpu_mhz=611", "gpu_mhz=611")],
)
def test_a_bad_baseline_is_one_line_exit_2_before_anything_is_written(tmp_path, spec, said):
    out = tmp_path / "studies"
    r = run_cli("run", "-m", "resnet50", "-d", "sim:orin", "-l", "50ms", "--baseline", spec, "--out", str(out))
    assert r.returncode == 2 and said in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not out.exists()


def test_an_export_written_before_saved_was_recorded_still_applies(study, tmp_path):
    assert in_process(*["export", "-m", "resnet50", "-d", "sim:orin", "-l", "50ms", "--out", str(study),
                        "-o", str(tmp_path / "new.yaml")])[0] == 0  # fmt: skip
    old = load_export(tmp_path / "new.yaml").model_copy(update={"version": 1, "saved": None, "digest": None})
    write_export(old, tmp_path / "old.yaml")
    assert "saved" not in yaml.safe_load((tmp_path / "old.yaml").read_text())
    code, _, err = in_process("apply", str(tmp_path / "old.yaml"), "--dry-run")
    assert code == 0, err
    (tmp_path / "future.yaml").write_text((tmp_path / "old.yaml").read_text().replace("version: 1", "version: 3"))
    code, _, err = in_process("apply", str(tmp_path / "future.yaml"), "--dry-run")
    assert code == 2 and "reads versions 1 to 2" in err


def test_the_nvpmodel_export_of_a_twin_study_is_the_twins_model_of_nvidias_conf(study, tmp_path):
    code, _, err = in_process(*["export", "-m", "resnet50", "-d", "sim:orin", "-l", "50ms", "--out", str(study),
                                "-f", "nvpmodel", "-o", str(tmp_path / "mode.conf")])  # fmt: skip
    assert code == 0, err
    text = (tmp_path / "mode.conf").read_text()
    assert "a digital twin, not hardware" in text and "digital twin's model of NVIDIA's nvpmodel.conf" in text
    assert "no Jetson board" not in text + err
    [mode] = read_conf(text + "< PM_CONFIG DEFAULT=0 >\n").modes
    knobs = load_export_knobs(study, tmp_path)
    gpu_hz = str(round(float(knobs["gpu_mhz"]) * 1e6))
    assert mode.name.startswith("POWERTUNE_RESNET50_")
    assert mode.value("GPU", "MIN_FREQ") == mode.value("GPU", "MAX_FREQ") == gpu_hz
    online = [v for p, a, v in mode.lines if p == "CPU_ONLINE"]
    assert online.count("1") == knobs["cpu_cores"] and len(online) == 12


def load_export_knobs(study: Path, tmp_path: Path) -> dict:
    assert in_process(*["export", "-m", "resnet50", "-d", "sim:orin", "-l", "50ms", "--out", str(study),
                        "-o", str(tmp_path / "k.yaml")])[0] == 0  # fmt: skip
    return load_export(tmp_path / "k.yaml").knobs


def test_one_twin_name_per_kind(study, tmp_path):
    code, out, err = in_process("pareto", "-m", "resnet50", "-d", "sim:orin-agx", "-l", "50ms", "--out", str(study))
    assert code == 0, err  # the other name finds the study of sim:orin
    code, out, err = in_process(*["run", "-m", "resnet50", "-d", "sim:orin-agx", "-l", "50ms", "--trials", "2",
                                  "--out", str(tmp_path)])  # fmt: skip
    assert code == 0, err
    assert "study resnet50|sim-orin|offline|50ms" in _one_line(out)
    assert [p.name for p in tmp_path.iterdir() if p.is_dir()] == ["sim-orin"]
    for board in ("orin-agx", "orin"):
        code, _, err = in_process("run", "-m", "resnet50", "-d", board, "-l", "50ms", "--sysfs-root", str(tmp_path))
        assert code != 0 and err.rstrip().endswith("or try its digital twin: --device sim:orin"), err


def test_triton_prefers_only_the_measured_batch_and_trtexec_names_the_models_inputs(study, tmp_path):
    code, _, err = in_process(*["export", "-m", "resnet50", "-d", "sim:orin", "-l", "50ms", "--out", str(study),
                                "-f", "triton,trtexec", "-o", str(tmp_path / "best.yaml")])  # fmt: skip
    assert code == 0, err
    batch = _study(study).best_trial.user_attrs["batch_size"]
    triton = (tmp_path / "best.pbtxt").read_text()
    assert f"max_batch_size: {batch}\n" in triton and f"preferred_batch_size: [ {batch} ]" in triton
    script = (tmp_path / "best.sh").read_text()
    assert f"--optShapes=x:{batch}x3x224x224" in script and f"--maxShapes=x:{batch}x3x224x224" in script
    assert "input:" not in script


def test_trtexec_takes_an_onnx_files_own_input_names(tmp_path):
    model = tiny_cnn_onnx(tmp_path / "mine.onnx", batch="batch")
    args = ("-m", str(model), "-d", "sim:h200", "-l", "20ms")
    assert run_cli("run", *args, "--trials", "3", cwd=tmp_path).returncode == 0
    r = run_cli("export", *args, "-f", "trtexec", "-o", "mine.sh", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    script = (tmp_path / "mine.sh").read_text()
    assert f"--onnx={model}" in script and "--minShapes=x:1x3x16x16" in script, script
    assert "# export" not in script  # a study of the file builds from it as it is


def test_bert_trtexec_shapes_are_its_token_ids(tmp_path):
    args = ("-m", "bert-base", "-d", "sim:h200", "-l", "50ms")
    assert in_process("run", *args, "--trials", "3", "--out", str(tmp_path))[0] == 0
    code, _, err = in_process("export", *args, "--out", str(tmp_path), "-f", "trtexec", "-o", str(tmp_path / "b.sh"))
    assert code == 0, err
    assert re.search(r"--optShapes=ids:\d+x128 ", (tmp_path / "b.sh").read_text())


def test_apply_set_is_journaled_restorable_and_checked_like_an_export(tmp_path, monkeypatch):
    fake = make_fake_board(tmp_path / "board", "orin-agx", "l4t36", seed=4, grid="jp6", start="MAXN").install(
        monkeypatch
    )
    before = fake.snapshot()
    code, _, err = in_process("apply", "--set", "gpu_mhz=611", "--device", "orin-agx")
    assert code == 2 and "gpu_mhz=611 is not supported" in err and len(err.strip().splitlines()) == 1
    code, _, err = in_process("apply", "--set", "gpux=1", "--device", "orin-agx")
    assert code == 2 and "unknown knob 'gpux'" in err and len(err.strip().splitlines()) == 1
    assert fake.snapshot() == before  # nothing written

    code, out, err = in_process("apply", "--set", "gpu_mhz=612", "--set", "cpu_cores=4", "--device", "orin-agx")
    assert code == 0, err
    assert "undo with: tune restore --device orin-agx" in _one_line(out)
    gpu = fake.gpu_dir.relative_to(fake.root)
    assert fake.read(f"{gpu}/max_freq") == fake.read(f"{gpu}/min_freq") == "612000000"
    assert [fake.read(f"sys/devices/system/cpu/cpu{c}/online") for c in range(1, 12)].count("1") == 3
    code, out, err = in_process("restore")
    assert code == 0 and "restored: orin-agx" in out, err
    assert fake.snapshot() == before


def test_apply_set_on_a_twin_writes_nothing_and_says_there_is_nothing_to_restore():
    code, out, err = in_process("apply", "--set", "nvpmodel=50W", "--device", "sim:orin")
    assert code == 0, err
    assert "would write: nvpmodel=50W" in out and "nothing to restore" in _one_line(out)
    code, _, err = in_process("apply", "--set", "nvpmodel=MAXN")
    assert code == 2 and "add --device" in err


def test_the_dashboard_names_the_objective_j_per_query(study):
    assert _study(study).metric_names == ["J/query"]


TOKENS = """
import torch
from torch import nn


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


def test_trtexec_of_a_py_model_names_its_forward_arguments_and_shapes(tmp_path):
    pytest.importorskip("torch", reason="needs torch (pip install torch==2.13.0)")
    (tmp_path / "mymodels.py").write_text(TOKENS)
    args = ("-m", "py:mymodels:tokens", "-d", "sim:h200", "-l", "20ms")
    assert run_cli("run", *args, "--trials", "3", cwd=tmp_path).returncode == 0
    r = run_cli("export", *args, "-f", "trtexec", "-o", "mine.sh", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    script = (tmp_path / "mine.sh").read_text()
    assert "--minShapes=ids:1x12" in script and "--onnx=mymodels.tokens.onnx" in script, script
    assert "# export py:mymodels:tokens to mymodels.tokens.onnx first" in script


def test_a_server_studys_triton_config_prefers_the_sizes_its_windows_executed(tmp_path):
    args = ("-m", "resnet50", "-d", "sim:orin", "-l", "50ms", "--scenario", "server", "--out", str(tmp_path))
    assert in_process("run", *args, "--target-qps", "100", "--trials", "4", "--seed", "1")[0] == 0
    code, _, err = in_process("export", *args, "-f", "triton", "-o", str(tmp_path / "s.pbtxt"))
    assert code == 0, err
    study = optuna.load_study(
        study_name="resnet50|sim-orin|server@100qps|50ms", storage=f"sqlite:///{tmp_path}/tune.db"
    )
    best = study.best_trial
    executed = sorted({int(item.split(":")[0]) for item in best.user_attrs["extra"]["batch_sizes_executed"].split()})
    text = (tmp_path / "s.pbtxt").read_text()
    assert f"max_batch_size: {best.user_attrs['batch_size']}\n" in text
    assert f"preferred_batch_size: [ {', '.join(map(str, executed))} ]" in text
