"""A new user's session against the strict fake AGX Orin, through the CLI: run, export, apply, restore, crashes.

The matrix tests start the board in MODE_30W (cluster 2 offline, the shipped default) or MAXN, on
the L4T 35, 36.3 and 36.4 layouts and both GPU grids, and check that every way a session can end
leaves the tree byte for byte as it was. Board state is what they check, so their windows are
quick_measure's 0.1 s rail readings; the first test runs the real model under LoadGen.
"""

import errno
import json
import os
import signal
import subprocess
import sys

import pytest
import yaml
from clirun import run_cli, wait_while_running
from fakeboard import board_export, make_fake_board, quick_measure, tiny_run
from journals import pending_journals
from typer.testing import CliRunner

from tuner.cli import app, main
from tuner.deploy import ExportedConfig, export_yaml
from tuner.devices.jetson import JetsonDevice, sysfs

pytest.importorskip("torch", reason="needs torch (pip install torch==2.13.0)")
pytest.importorskip("mlperf_loadgen", reason="needs LoadGen (pip install mlcommons-loadgen)")

pytestmark = pytest.mark.slow  # tune subprocesses with LoadGen windows on a fake Jetson board


@pytest.fixture
def board(tmp_path, monkeypatch):
    fake = make_fake_board(tmp_path / "board", "orin-agx", "l4t36", seed=1).install(monkeypatch)
    monkeypatch.setenv("TUNE_TORCH_DEVICE", "cpu")
    return fake


RUN = (*tiny_run("orin"), "--seed", "0")


def test_run_export_apply_restore(board, tmp_path):
    board.set_mode(0)  # MAXN: 50W has its TPC mask, so the study and apply can switch between them
    original = board.snapshot()
    out = tmp_path / "studies"
    r = run_cli(*RUN, "--trials", "2", "--out", str(out), "--json")
    assert r.returncode == 0, r.stderr
    payload = json.loads(r.stdout)
    assert payload["measured"] == 2 and payload["twin"] is False
    assert payload["best"]["meter"] == "ina3221"
    assert board.snapshot() == original  # the study restored the board

    best = tmp_path / "best.yaml"
    r = run_cli(
        "export",
        "--model",
        "tiny-cnn",
        "--device",
        "orin",
        "--max-latency",
        "500ms",
        "-o",
        str(best),
        "--out",
        str(out),
    )
    assert r.returncode == 0, r.stderr
    data = yaml.safe_load(best.read_text())
    data["knobs"].update({"nvpmodel": "50W", "gpu_mhz": 318.75})  # a mode that surely differs from the board's
    # Sealed again as tune export seals a file: with the export's own digest, an edited knob is refused (unless the
    # study's best already was this mode, which made the test pass or fail with the two trials' measured order).
    best.write_text(export_yaml(ExportedConfig.model_validate(data)))

    r = run_cli("apply", str(best), "--dry-run")
    assert r.returncode == 0, r.stderr
    assert f"would write: {board.nvpmodel} -m 3" in r.stdout
    assert board.snapshot() == original

    r = run_cli("apply", str(best))
    assert r.returncode == 0, r.stderr
    assert board.mode_id() == 3
    assert int((board.gpu_dir / "max_freq").read_text()) == 318750000
    again = run_cli("apply", str(best))
    assert again.returncode == 0 and "already runs this configuration" in again.stdout

    r = run_cli("restore", "--device", "orin")
    assert r.returncode == 0 and "restored: orin" in r.stdout
    assert board.snapshot() == original
    assert "nothing to restore" in run_cli("restore").stdout


def test_unsupported_frequency_in_an_export_writes_nothing(board, tmp_path):
    original = board.snapshot()
    best = tmp_path / "best.yaml"
    knobs = {"nvpmodel": "30W", "gpu_mhz": 1234.5, "emc_mhz": 3199, "cpu_cores": 12, "cpu_mhz": 2201.6}
    best.write_text(yaml.safe_dump(board_export(knobs)))
    r = run_cli("apply", str(best))
    assert r.returncode == 2
    assert "gpu_mhz=1234.5 is not supported" in r.stderr and "Traceback" not in r.stderr
    assert board.snapshot() == original
    best.write_text("version: 1\ndevice_kind: [broken")
    r = run_cli("apply", str(best))
    assert r.returncode == 2 and "not valid YAML" in r.stderr
    assert board.snapshot() == original


def start_run(tmp_path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "tuner", *RUN, "--trials", "2", "--window", "20", "--out", str(tmp_path / "s")]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT])
def test_killed_mid_trial_and_the_board_comes_back_byte_for_byte(board, tmp_path, sig):
    original = board.snapshot()
    proc = start_run(tmp_path)
    wait_while_running(lambda: board.snapshot() != original, proc, timeout=90)  # the first trial wrote
    os.kill(proc.pid, sig)
    proc.wait(timeout=180)  # generous: CI machines are shared; a clean exit is seconds
    if sig == signal.SIGKILL:
        assert board.snapshot() != original  # nobody restored it: the journal must
        r = run_cli("restore")
        assert r.returncode == 0 and "restored: orin" in r.stdout
    else:
        assert proc.returncode == 128 + sig  # SIGHUP and SIGQUIT end it, restored, like SIGTERM
    assert board.snapshot() == original


def test_devices_finds_the_board(board):
    r = run_cli("devices", "--json")
    boards = [d for d in json.loads(r.stdout)["devices"] if not d["twin"] and d["kind"] == "orin-agx"]
    assert [(d["name"], d["title"]) for d in boards] == [("orin", "NVIDIA Jetson AGX Orin Developer Kit (L4T 36.4.0)")]


# -- the matrix: starting state x layout x GPU grid ----------------------------------------

STARTS = ["MODE_30W", "MAXN"]
LAYOUTS = ["l4t35", "l4t36.3", "l4t36.4"]
GRIDS = ["jp5", "jp6"]
LAYOUT_REV = {"l4t35": "4.1", "l4t36.3": "3.0", "l4t36.4": "4.0"}
FULL = [(s, lay, g) for s in STARTS for lay in LAYOUTS for g in GRIDS]
# Runs and kills cost seconds each: each start on L4T 35 and on 36, each start with each grid,
# each layout once at least (apply + restore, which is cheap, runs the full matrix).
COVER = [
    ("MODE_30W", "l4t35", "jp5"),
    ("MODE_30W", "l4t36.4", "jp6"),
    ("MAXN", "l4t35", "jp6"),
    ("MAXN", "l4t36.3", "jp5"),
]


def matrix_board(tmp_path, monkeypatch, start, layout, grid):
    return make_fake_board(tmp_path / "board", "orin-agx", layout, seed=2, grid=grid, start=start).install(monkeypatch)


def invoke(*args):
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 0 and result.exception is None, (result.output, result.exception)
    return result


@pytest.mark.parametrize(("start", "layout", "grid"), COVER, ids=["-".join(c) for c in COVER])
def test_run_leaves_the_board_as_it_was(tmp_path, monkeypatch, start, layout, grid):
    fake = matrix_board(tmp_path, monkeypatch, start, layout, grid)
    monkeypatch.setattr(JetsonDevice, "measure", quick_measure)
    original = fake.snapshot()
    invoke(
        "run", "--model", "tiny-cnn", "--device", "orin", "--max-latency", "500ms",
        "--knobs", "nvpmodel,gpu_mhz,cpu_cores", "--batch-sizes", "1", "--sampler", "random", "--window", "1",
        "--seed", "3", "--trials", "2",
        "--out", str(tmp_path / "s"), "--json",
    )  # fmt: skip
    assert fake.snapshot() == original and pending_journals() == []
    pareto = json.loads(next((tmp_path / "s").rglob("pareto.json")).read_text())
    record = pareto["provenance"]
    assert record["hardware"] == "NVIDIA Jetson AGX Orin Developer Kit"
    assert f"R{layout[3:5]} (release), REVISION: {LAYOUT_REV[layout]}" in record["l4t"]


@pytest.mark.parametrize(("start", "layout", "grid"), FULL, ids=["-".join(c) for c in FULL])
def test_apply_then_restore_leaves_the_board_as_it_was(tmp_path, monkeypatch, start, layout, grid):
    fake = matrix_board(tmp_path, monkeypatch, start, layout, grid)
    original = fake.snapshot()
    gpu = sorted(int(f) for f in (fake.gpu_dir / "available_frequencies").read_text().split())[2]
    mhz = gpu / 1e6 if gpu % 1_000_000 else gpu // 1_000_000
    best = tmp_path / "best.yaml"
    mode = "MAXN" if start == "MAXN" else "30W"  # the start's own TPC mask: another would need a reboot
    knobs = {"nvpmodel": mode, "gpu_mhz": mhz, "emc_mhz": 2133, "cpu_cores": 12, "cpu_mhz": 1344}
    best.write_text(yaml.safe_dump(board_export(knobs, model="tiny-cnn", batch_size=4)))
    invoke("apply", str(best))
    assert fake.read("sys/devices/system/cpu/cpu8/online") == ("1" if mode == "MAXN" else "0")
    assert int((fake.gpu_dir / "max_freq").read_text()) == gpu
    assert "restored: orin" in invoke("restore").output
    assert fake.snapshot() == original


@pytest.mark.parametrize(("start", "layout", "grid"), COVER, ids=["-".join(c) for c in COVER])
def test_kill_9_mid_trial_then_restore_leaves_the_board_as_it_was(tmp_path, monkeypatch, start, layout, grid):
    fake = matrix_board(tmp_path, monkeypatch, start, layout, grid)
    original = fake.snapshot()
    cmd = [sys.executable, "-m", "tuner", *RUN, "--knobs", "nvpmodel,gpu_mhz,cpu_cores", "--trials", "1"]
    env = {**os.environ, "FAKE_MEASURE": "hang"}
    proc = subprocess.Popen(
        [*cmd, "--out", str(tmp_path / "s")], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    wait_while_running(lambda: fake.snapshot() != original, proc, timeout=90)  # the first trial wrote
    proc.kill()
    proc.wait(timeout=60)
    assert fake.snapshot() != original and [j.device for j in pending_journals()] == ["orin"]
    assert "restored: orin" in invoke("restore").output
    assert fake.snapshot() == original and pending_journals() == []


def tune(capsys, monkeypatch, *args):
    """The console script in this process: exit code and stderr, as a user's shell sees them."""
    monkeypatch.setattr(sys, "argv", ["tune", *args])
    with pytest.raises(SystemExit) as done:
        main()
        raise SystemExit(0)
    return done.value.code or 0, capsys.readouterr().err


def test_a_partial_restore_keeps_the_journal_and_says_how_to_finish(board, tmp_path, capsys, monkeypatch):
    board.set_mode(0)  # MAXN, so that applying 50W (the same TPC mask) switches the mode
    original = board.snapshot()
    best = tmp_path / "best.yaml"
    knobs = {"nvpmodel": "50W", "gpu_mhz": 318.75, "emc_mhz": 2133, "cpu_cores": 4, "cpu_mhz": 1113.6}
    best.write_text(yaml.safe_dump(board_export(knobs, model="tiny-cnn", batch_size=4)))
    assert tune(capsys, monkeypatch, "apply", str(best))[0] == 0
    board.set_nvpmodel_fails()  # nvpmodel -m fails, as when a release's conf names a missing devfreq node
    code, err = tune(capsys, monkeypatch, "restore")
    assert code == 1 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "restore of orin incomplete" in err and "tune restore --device orin" in err
    assert [j.device for j in pending_journals()] == ["orin"]
    code, err = tune(capsys, monkeypatch, *RUN, "--trials", "1", "--out", str(tmp_path / "s"))
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 1 and len(errors) == 1 and "restore of orin incomplete" in errors[0] and "Traceback" not in err
    board.set_nvpmodel_fails(False)
    assert tune(capsys, monkeypatch, "restore")[0] == 0
    assert board.snapshot() == original and pending_journals() == []


def test_a_value_the_kernel_refuses_mid_run_is_one_line_and_the_board_comes_back(board, tmp_path, capsys, monkeypatch):
    """A board that refuses a write (here: a cluster's limits made unwritable) ends the run in one line."""
    original = board.snapshot()
    monkeypatch.setattr(JetsonDevice, "measure", quick_measure)
    real_write = sysfs.write

    def refusing(root, path, value):
        if path.name == "scaling_max_freq":
            raise sysfs.BoardWriteError(path, errno.EPERM, sysfs._rule(path, errno.EPERM))
        return real_write(root, path, value)

    monkeypatch.setattr("tuner.devices.jetson.sysfs.write", refusing)
    knobs = RUN.index("--knobs") + 1
    args = [*RUN[:knobs], "cpu_mhz", *RUN[knobs + 1 :], "--trials", "1", "--out", str(tmp_path / "s")]
    code, err = tune(capsys, monkeypatch, *args)
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 1 and "Traceback" not in err and len(errors) == 1
    assert "scaling_max_freq" in errors[0] and "Operation not permitted" in errors[0] and "offline" in errors[0]
    monkeypatch.setattr("tuner.devices.jetson.sysfs.write", real_write)
    assert board.snapshot() == original


# -- DLAs through the CLI: TensorRT engines on the GPU and both DLAs, on the fake TensorRT ----------


@pytest.fixture
def trt_board(tmp_path, monkeypatch):
    """An AGX Orin whose TensorRT is the fake (2 DLA cores), here and in child processes; buffers on the CPU."""
    import fake_tensorrt

    from runners import tensorrt_runner

    fake = make_fake_board(tmp_path / "board", "orin-agx", "l4t36.3", seed=1, start="MAXN").install(monkeypatch)
    monkeypatch.setenv("FAKE_TENSORRT", "2")
    module = fake_tensorrt.module()
    module.Builder.num_DLA_cores = 2
    monkeypatch.setitem(sys.modules, "tensorrt", module)
    monkeypatch.setattr(tensorrt_runner, "_import_torch", fake_tensorrt.cpu_torch)
    return fake


def dla_run(model, *args):
    return (
        "run", "--model", str(model), "--device", "orin", "--runtime", "tensorrt", "--max-latency", "500ms",
        "--knobs", "nvpmodel,dla_cores,dla_mhz,dla_batch_size", "--batch-sizes", "4", "--sampler", "random",
        "--window", "1", *args,
    )  # fmt: skip


def test_dla_knobs_build_engines_run_from_one_queue_and_the_board_comes_back(trt_board, tmp_path):
    import fake_tensorrt
    from fake_tensorrt import onnx_file

    original = trt_board.snapshot()
    model = onnx_file(tmp_path / "net.onnx")
    invoke(*dla_run(model, "--seed", "1", "--trials", "4", "--out", str(tmp_path / "s"), "--json"))
    assert trt_board.snapshot() == original and pending_journals() == []
    dla = [b for b in fake_tensorrt.Builder.built if b["device"] == "DLA"]
    assert dla and all("GPU_FALLBACK" in b["flags"] and "INT8" in b["flags"] for b in dla)
    import optuna

    url = f"sqlite:///{tmp_path / 's' / 'tune.db'}"
    (summary,) = optuna.get_all_study_summaries(url)
    trials = optuna.load_study(study_name=summary.study_name, storage=url).get_trials()
    lanes = 0
    for trial in trials:
        engines = {k: v for k, v in trial.user_attrs["extra"].items() if k.startswith("engine_")}
        cores = trial.user_attrs["config"]["dla_cores"]
        if cores == 0:
            assert engines == {}  # the GPU alone: one lane, nothing per engine
            continue
        lanes += 1
        assert set(engines) == {"engine_gpu_qps", *(f"engine_dla{c}_qps" for c in range(cores))}
        assert all(v > 0 for v in engines.values())
        assert sum(engines.values()) == pytest.approx(trial.user_attrs["qps"], rel=1e-6)
    assert lanes  # seed 1 draws DLA trials


def test_kill_9_after_a_dla_write_then_tune_restore_puts_the_dla_clocks_back(trt_board, tmp_path):
    from fake_tensorrt import onnx_file

    original = trt_board.snapshot()
    model = onnx_file(tmp_path / "net.onnx")
    env = {**os.environ, "FAKE_MEASURE": "hang"}
    cmd = [sys.executable, "-m", "tuner", *dla_run(model, "--seed", "0", "--trials", "1", "--out", str(tmp_path / "s"))]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    caps = trt_board.conf["dla_caps"]
    wait_while_running(lambda: trt_board.read(caps[0]) != "1600000000", proc, timeout=90)  # a DLA write
    proc.kill()
    proc.wait(timeout=60)
    assert [j.device for j in pending_journals()] == ["orin"]
    assert "restored: orin" in invoke("restore").output
    assert trt_board.snapshot() == original and [trt_board.read(c) for c in caps] == ["1600000000"] * 2
