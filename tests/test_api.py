"""The library face (tuner.tune, tuner.measure, tuner.open_device) and the errors a caller can tell apart."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
from clirun import run_cli

import tuner
from tuner.cli.root import exit_code
from tuner.devices.jetson.device import JournalRefused, RestoreIncomplete
from tuner.errors import ConfigurationError, DeviceError, DeviceRefused, NeedsReboot, StorageError, UserError

REPO = Path(__file__).resolve().parents[1]


def _readme_python() -> str:
    """The code block of README.md's "Python" section, exactly as a reader copies it."""
    section = (REPO / "README.md").read_text().split("\n## Python\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 1, "the README's Python section holds one code block"
    return blocks[0]


def test_the_readme_python_lines_run_literally_on_a_twin(tmp_path, monkeypatch, capsys):
    code = _readme_python()
    assert len(code.strip().splitlines()) < 15
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "README.md", "exec"), {})
    said = capsys.readouterr().out
    assert "J/query" in said and "measured again" in said
    assert (tmp_path / "studies" / "tune.db").is_file()
    assert (tmp_path / "studies" / "sim-orin" / "resnet50" / "pareto.json").is_file()


def test_tune_returns_a_typed_answer_within_the_bound_and_its_front(tmp_path):
    result = tuner.tune("resnet50", "sim:orin", max_latency="50ms", trials=10, seed=3, out=tmp_path)
    assert isinstance(result, tuner.StudyResult) and result.twin
    best = result.answer
    assert isinstance(best, tuner.Answer) and isinstance(best.config, tuner.Config)
    assert best.feasible and best.p99_ms <= 50 and best.trial == result.summary.best_trial
    assert best.config.knobs == result.summary.best["config"]
    assert result.front and result.front[0].j_per_query == best.j_per_query
    assert all(point.feasible for point in result.front)
    assert result.study.best_trial.number == best.trial
    # The CLI's JSON report is what it was: the library's extras stay out of it.
    assert {"answer", "front", "study", "pareto"}.isdisjoint(result.model_dump())


def test_measure_one_configuration_on_a_twin_is_noise_free_and_says_twin():
    board = tuner.open_device("sim:orin")
    config = tuner.configuration(board, {"batch_size": 8})
    first = tuner.measure("resnet50", board, config)
    again = tuner.measure("resnet50", "sim:orin", {"batch_size": 8})
    assert isinstance(first, tuner.Measurement) and first.twin and first.valid
    assert first.j_per_query == again.j_per_query > 0


def test_tuner_measure_is_callable_whatever_was_imported_first():
    code = "import tuner.measure.settings, tuner; print(tuner.measure('resnet50', 'sim:orin', {'batch_size': 1}).twin)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "True"


def test_import_tuner_loads_no_library(tmp_path):
    code = "import sys, tuner; print(sorted(m for m in sys.modules if m.startswith(('tuner.', 'optuna', 'pydantic'))))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.stdout.strip() == "[]", proc.stdout + proc.stderr


def test_a_library_caller_catches_configuration_and_device_errors(tmp_path):
    with pytest.raises(ConfigurationError, match="unit"):
        tuner.tune("resnet50", "sim:orin", max_latency="50 parsecs", out=tmp_path)
    with pytest.raises(ConfigurationError, match="latency 'nanms'"):
        tuner.tune("resnet50", "sim:orin", max_latency=float("nan"), out=tmp_path)
    with pytest.raises(ConfigurationError, match="unknown model"):
        tuner.tune("resnet5", "sim:orin", out=tmp_path)
    with pytest.raises(ConfigurationError, match="unknown option 'trail' \\(did you mean trials\\?\\)"):
        tuner.tune("resnet50", "sim:orin", trail=5, out=tmp_path)
    with pytest.raises(ConfigurationError, match="gpu_mhz"):
        tuner.measure("resnet50", "sim:orin", {"gpu_mhz": 7, "batch_size": 8})
    with pytest.raises(DeviceError, match="unknown twin"):
        tuner.open_device("sim:orion")
    with pytest.raises(tuner.UserError):  # the base still catches every one
        tuner.open_device("sim:orion")
    assert not (tmp_path / "tune.db").exists()


def test_the_kinds_of_error_and_their_exit_codes_are_mapped_in_the_cli_alone():
    for kind in (ConfigurationError, DeviceError, StorageError, tuner.MeasurementError):
        assert issubclass(kind, UserError) and exit_code(kind("x")) == 2
    for refused in (DeviceRefused, NeedsReboot, RestoreIncomplete):
        assert issubclass(refused, DeviceError) and exit_code(refused("x")) == 1
    # a restore whose only failures are the journal's own values is bad input, though still incomplete
    assert issubclass(JournalRefused, RestoreIncomplete) and exit_code(JournalRefused("x")) == 2
    assert not any(hasattr(kind, "exit_code") for kind in (UserError, DeviceRefused, NeedsReboot, RestoreIncomplete))


def test_tune_debug_shows_the_traceback_and_otherwise_one_line(tmp_path):
    args = ("measure", "--model", "resnet5", "--device", "sim:orin", "--batch-size", "8")
    plain = run_cli(*args, cwd=tmp_path)
    assert plain.returncode == 2 and "Traceback" not in plain.stderr
    assert plain.stderr.strip().splitlines() == [plain.stderr.strip()]
    debug = run_cli(*args, cwd=tmp_path, env={"TUNE_DEBUG": "1"})
    assert debug.returncode == 2
    assert "Traceback (most recent call last)" in debug.stderr and "ConfigurationError" in debug.stderr
    assert debug.stderr.rstrip().endswith(plain.stderr.strip())


@pytest.mark.parametrize("name", ["tune", "measure", "open_device", "configuration"])
def test_each_library_function_documents_args_returns_raises_and_an_example(name):
    from tuner import api

    doc = getattr(api, name).__doc__
    for section in ("Args:", "Returns:", "Raises:", "Example:"):
        assert f"\n    {section}\n" in doc, f"tuner.{name} has no {section} section"


def test_a_board_that_refuses_a_configuration_is_a_device_error_and_is_left_as_it_was(tmp_path, monkeypatch):
    from fakeboard import make_fake_board

    from tuner.devices.jetson import JetsonDevice

    monkeypatch.setenv("TUNE_STATE_DIR", str(tmp_path / "state"))
    board = make_fake_board(tmp_path / "board", "orin-agx", "l4t36.4", start="MAXN")
    board.set_nvpmodel_ignores_m()
    before = board.snapshot()
    orin = JetsonDevice("orin-agx", sysfs_root=board.root, nvpmodel=str(board.nvpmodel), mode_timeout_s=0.3)
    with pytest.raises(tuner.DeviceError, match="did not switch") as refused:
        tuner.measure("tiny-cnn", orin, {"nvpmodel": "50W", "batch_size": 8}, window_s=1)
    assert exit_code(refused.value) == 1
    assert board.snapshot() == before


def test_tune_run_and_tuner_tune_give_the_same_answer_from_the_same_seed(tmp_path):
    import json

    from clirun import in_process

    args = ("run", "-m", "resnet50", "-d", "sim:orin", "-l", "50ms", "-n", "6", "--seed", "4", "--json")
    code, out, err = in_process(*args, "--out", str(tmp_path / "cli"))
    assert code == 0, err
    by_cli = json.loads(out)
    by_library = tuner.tune("resnet50", "sim:orin", "50ms", trials=6, seed=4, out=tmp_path / "library")
    assert by_cli["best"] == by_library.summary.best
    assert by_library.answer.config.knobs == by_cli["best"]["config"]
