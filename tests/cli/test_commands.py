import csv
import importlib.util
import json
import shutil
from pathlib import Path

import pytest
import yaml
from clirun import in_process, run_cli

from tuner.deploy import EXPORT_VERSION, ExportedConfig


def test_quick_start_on_the_orin_twin_then_pareto_and_export(tmp_path):
    out = tmp_path / "studies"
    r = run_cli(
        "run",
        "--model",
        "resnet50",
        "--device",
        "sim:orin",
        "--max-latency",
        "50ms",
        "--trials",
        "8",
        "--seed",
        "3",
        "--out",
        str(out),
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    assert "digital twin" in r.stdout
    assert "recommended for resnet50 on sim:orin" in r.stdout
    assert "finished (8/8)" in r.stderr  # a line per trial: stderr is not a terminal here
    folder = out / "sim-orin" / "resnet50"
    for name in ("pareto.json", "pareto.csv", "pareto.png", "trials.csv"):
        assert (folder / name).exists()
    assert (out / "tune.db").exists()

    r = run_cli("pareto", "--model", "resnet50", "--device", "sim:orin", "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert "recommended: resnet50 on sim:orin" in r.stdout and "digital twin" in r.stdout

    best = tmp_path / "best.yaml"
    r = run_cli(
        "export",
        "--model",
        "resnet50",
        "--device",
        "sim:orin",
        "--max-latency",
        "50 ms",
        "-o",
        str(best),
        "--out",
        str(out),
    )
    assert r.returncode == 0, r.stderr
    exported = ExportedConfig.model_validate(yaml.safe_load(best.read_text()))
    assert exported.twin and exported.device_kind == "orin-agx" and exported.version == EXPORT_VERSION
    assert exported.metrics["p99_ms"] <= 50
    assert set(exported.knobs) == {"nvpmodel", "gpu_mhz", "emc_mhz", "cpu_cores", "cpu_mhz"}
    assert best.read_text().startswith("# powertune best-mode configuration (digital twin: simulated, not measured")


def test_json_output_is_one_object_and_resume_adds_trials(tmp_path):
    args = (
        "run",
        "--model",
        "mobilenet_v2",
        "--device",
        "sim:h200",
        "--max-latency",
        "0.005s",
        "--trials",
        "3",
        "--seed",
        "1",
        "--sampler",
        "random",
        "--out",
        str(tmp_path),
        "--json",
    )
    first = json.loads(run_cli(*args).stdout)  # a process: stdout is the one object a shell sees
    second = json.loads(in_process(*args)[1])  # the resume, in-process
    assert first["twin"] is True and first["measured"] == 3
    assert second["study"] == first["study"]
    assert second["total_trials"] >= first["total_trials"] + 3


def test_sweep_reports_the_ground_truth(tmp_path):
    r = run_cli(
        "sweep",
        "--model",
        "resnet50",
        "--device",
        "sim:orin",
        "--max-latency",
        "50ms",
        "--knobs",
        "nvpmodel,gpu_mhz",
        "--batch-sizes",
        "1,8",
        "--out",
        str(tmp_path),
        "--json",
    )
    assert r.returncode == 0, r.stderr
    payload = json.loads(r.stdout)
    assert payload["twin"] and payload["optimum"]["p99_ms"] <= 50
    lines = (tmp_path / "sim-orin" / "resnet50" / "sweep.csv").read_text().splitlines()
    assert len(lines) == payload["configurations"] + 1
    assert (tmp_path / "sim-orin" / "resnet50" / "sweep.png").exists()


def test_measure_noise_free_unless_seeded():
    args = (
        "measure",
        "--model",
        "bert-base",
        "--device",
        "sim:h200",
        "--batch-size",
        "8",
        "--set",
        "precision=bf16",
        "--repeat",
        "2",
        "--json",
    )
    exact = json.loads(run_cli(*args).stdout)["measurements"]
    assert exact[0]["j_per_query"] == exact[1]["j_per_query"]
    noisy = json.loads(in_process(*args, "--seed", "5")[1])["measurements"]
    assert noisy[0]["j_per_query"] != noisy[1]["j_per_query"]
    assert all(m["twin"] for m in noisy)


@pytest.mark.parametrize(
    "args, message",
    [
        (("run", "--model", "alexnet", "--device", "sim:orin", "--max-latency", "50ms"), "unknown model"),
        (("run", "--model", "resnet50", "--device", "sim:gameboy", "--max-latency", "50ms"), "unknown twin"),
        (("run", "--model", "resnet50", "--device", "tpu:0", "--max-latency", "50ms"), "unknown device"),
        (("run", "--model", "resnet50", "--device", "sim:orin", "--max-latency", "50"), "50ms"),
        (
            ("run", "--model", "resnet50", "--device", "sim:orin", "--max-latency", "50ms", "--knobs", "warp"),
            "unknown knob",
        ),
        (
            (
                "run",
                "--model",
                "resnet50",
                "--device",
                "sim:orin",
                "--max-latency",
                "50ms",
                "--knobs",
                "",
                "--batch-sizes",
                "8",
            ),
            "single configuration",
        ),
        (
            ("run", "--model", "resnet50", "--device", "sim:orin", "--max-latency", "50ms", "--sampler", "magic"),
            "unknown sampler",
        ),
        (
            ("run", "--model", "resnet50", "--device", "sim:orin", "--max-latency", "50ms", "--allow-clock-changes"),
            "does not apply",
        ),
        (
            ("measure", "--model", "resnet50", "--device", "sim:orin", "--batch-size", "1", "--set", "gpu_mhz=999"),
            "not supported",
        ),
        (
            ("export", "--model", "resnet50", "--device", "sim:orin", "--max-latency", "50ms", "--out", "nowhere"),
            "no study",
        ),
    ],
)
def test_bad_input_is_one_line_exit_2(tmp_path, monkeypatch, args, message):
    """In-process: the exit code and stderr a shell sees are proven by test_bad_input.py's subprocess rows."""
    monkeypatch.chdir(tmp_path)
    code, out, err = in_process(*args)
    assert code == 2, (out, err)
    assert message in err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_corrupt_space_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    bad = tmp_path / "orin.yaml"
    bad.write_text("version: 1\nkind: orin-agx\nknobs: {gpu_mhz: {values: [1], default: 1}\n")
    code, _, err = in_process(
        "run", "--model", "resnet50", "--device", "sim:orin", "--max-latency", "50ms", "--space", str(bad)
    )
    assert code == 2 and "not valid YAML" in err and "Traceback" not in err


def test_narrower_space_file_is_used(tmp_path):
    """Every trial draws from the file's batch sizes (seeded: four unseeded random trials may find nothing feasible)."""
    narrow = tmp_path / "orin.yaml"
    text = shutil.os.path.dirname(__import__("search_spaces").__file__) + "/orin-agx.yaml"
    data = yaml.safe_load(Path(text).read_text())
    data["batch_sizes"] = [2, 4]
    narrow.write_text(yaml.safe_dump(data))
    code, text, err = in_process(
        "run",
        "--model",
        "resnet50",
        "--device",
        "sim:orin",
        "--max-latency",
        "80ms",
        "--space",
        str(narrow),
        "--trials",
        "4",
        "--out",
        str(tmp_path),
        "--json",
        "--sampler",
        "random",
        "--seed",
        "0",
    )
    assert code == 0, err
    out = json.loads(text)
    assert out["best"]["batch_size"] in (2, 4)
    with open(Path(out["results"]) / "trials.csv") as f:
        assert {int(row["batch_size"]) for row in csv.DictReader(f)} <= {2, 4}


def test_help_for_every_command():
    """In-process; test_startup.py runs ``tune --help`` as a process."""
    for command in ("run", "sweep", "measure", "pareto", "export", "devices", "dashboard"):
        code, out, _ = in_process(command, "--help")
        assert code == 0 and "Usage" in out


def test_devices_lists_twins():
    r = run_cli("devices", "--json")
    names = [d["name"] for d in json.loads(r.stdout)["devices"]]
    assert {"sim:orin", "sim:h200", "cpu"} <= set(names)


def test_dashboard_without_extra_says_how_to_install():
    if importlib.util.find_spec("optuna_dashboard") is not None:
        pytest.skip("needs optuna-dashboard absent: it checks what tune says when the [dashboard] extra is missing")
    r = run_cli("dashboard")
    assert r.returncode == 2 and "powertune[dashboard]" in r.stderr
