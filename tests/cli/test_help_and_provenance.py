"""A newcomer's CLI: help, versions, suggestions, provenance, result files that explain themselves.

Commands run in-process (``tuner.cli.main``) on digital twins; each test
would fail if the behaviour it names broke.
"""

from __future__ import annotations

import csv
import json
import subprocess
from pathlib import Path

import optuna
import pytest
from clirun import in_process
from locations import REPO

from tuner import __version__
from tuner.deploy import load_export
from tuner.devices.virtual.twin import TwinDevice
from tuner.errors import UserError
from tuner.fleet import study_status
from tuner.records import recommended
from tuner.storage import driver_url, scrub
from tuner.study import RunOptions, run_study

cli = in_process


def small_run(out: Path, **kw) -> tuple[optuna.Study, object]:
    base = dict(model="resnet50", max_latency_ms=50.0, trials=3, seed=2, sampler="random", out=out)
    base.update(kw)
    return run_study(TwinDevice("sim:orin"), RunOptions(**base))


def gpu_run(twin_study) -> Path:
    """small_run(knobs=["gpu_mhz"])'s study, run once for every test that only reads it (twin_study's private copy)."""
    return twin_study(model="resnet50", max_latency_ms=50.0, trials=3, seed=2, sampler="random", knobs=["gpu_mhz"]).out


def test_version_and_plain_help():
    code, out, _ = cli("--version")
    assert code == 0 and out.strip() == f"powertune {__version__}"
    code, out, _ = cli("dashboard", "--help")
    assert "pip install 'powertune[dashboard]'" in " ".join(out.split())  # no markup ate [dashboard]
    code, out, _ = cli("run", "--help")
    assert "<bool>" not in out and "sim:orin-nano" in out and "py:" in out
    assert "[default: 40]" in " ".join(out.split())


def test_every_option_of_every_command_has_help():
    import typer.main

    from tuner.cli import app

    group = typer.main.get_command(app)
    missing = [f"{n} {p.name}" for n, c in group.commands.items() for p in c.params if not getattr(p, "help", None)]
    assert missing == []


def test_resuming_with_another_space_is_refused_and_the_same_flags_resume(tmp_path):
    small_run(tmp_path, knobs=["gpu_mhz"], batch_sizes=[1, 8])
    with pytest.raises(UserError, match="--knobs gpu_mhz --batch-sizes 1,8"):
        small_run(tmp_path, knobs=["gpu_mhz"], batch_sizes=[1, 4])
    with pytest.raises(UserError, match="another space"):
        small_run(tmp_path, knobs=["gpu_mhz", "emc_mhz"], batch_sizes=[1, 8])
    _, summary = small_run(tmp_path, knobs=["gpu_mhz"], batch_sizes=[1, 8])
    assert summary.total_trials >= 6


def test_provenance_in_study_results_and_export(tmp_path, twin_study):
    out = gpu_run(twin_study)
    code, _, err = cli("pareto", "-m", "resnet50", "-d", "sim:orin", "--out", str(out))
    assert code == 0, err
    pareto = json.loads((out / "sim-orin" / "resnet50" / "pareto.json").read_text())
    prov = pareto["provenance"]
    assert prov["twin"] is True and "digital twin of" in prov["hardware"] and "not hardware" in prov["hardware"]
    software = prov["software"]
    assert software["powertune"] == __version__ and "torch" in software and "loadgen" in software
    assert "onnxruntime" in software and pareto["meters"]
    best = tmp_path / "best.yaml"
    code, _, err = cli("export", "-m", "resnet50", "-d", "sim:orin", "-l", "50ms", "-o", str(best), "--out", str(out))
    assert code == 0, err
    exported = load_export(best)
    assert exported.provenance.measured_on["hardware"] == prov["hardware"]
    assert exported.provenance.software["powertune"] == __version__
    assert exported.provenance.meter == exported.metrics["meter"]


def test_trials_csv_says_where_numbers_come_from_and_why_infeasible(tmp_path):
    small_run(tmp_path, knobs=["nvpmodel"], batch_sizes=[64], trials=6, max_latency_ms=30.0)
    code, _, err = cli("pareto", "-m", "resnet50", "-d", "sim:orin", "--out", str(tmp_path))
    assert code == 0, err
    rows = list(csv.DictReader((tmp_path / "sim-orin" / "resnet50" / "trials.csv").read_text().splitlines()))
    done = [r for r in rows if r["state"] == "COMPLETE"]
    assert done and all(r["source"] for r in done)
    for r in done:
        assert r["feasibility"].startswith("meets" if r["feasible"] == "True" else "misses")
        assert "30 ms" in r["feasibility"]
        assert (r["reused_from"] != "") == r["source"].startswith("copied from trial")


def test_pareto_with_a_bound_never_shows_another_study(twin_study):
    studies = gpu_run(twin_study)
    code, _, err = cli("pareto", "-m", "resnet50", "-d", "sim:orin", "-l", "20ms", "--out", str(studies))
    assert code == 2 and "pick one with --scenario offline --max-latency 50ms" in err
    code, out, err = cli("pareto", "-m", "resnet50", "-d", "sim:orin", "-l", "50 ms", "--out", str(studies))
    assert code == 0 and "p99 <= 50 ms" in out


def test_pareto_table_shows_pinned_knobs_once(tmp_path):
    small_run(tmp_path, knobs=["gpu_mhz"], batch_sizes=[1, 8], trials=5)
    code, out, err = cli("pareto", "-m", "resnet50", "-d", "sim:orin", "--out", str(tmp_path))
    assert code == 0, err
    header, table = out.split("\n", 1)
    assert header.startswith("the same in every row:") and "emc_mhz=" in header and "nvpmodel=" in header
    assert "emc_mhz" not in table and "nvpmodel" not in table


def test_apply_dry_run_of_a_twin_export_uses_the_files_device(tmp_path, twin_study):
    studies = gpu_run(twin_study)
    best = tmp_path / "best.yaml"
    assert (
        cli("export", "-m", "resnet50", "-d", "sim:orin", "-l", "50ms", "-o", str(best), "--out", str(studies))[0] == 0
    )
    code, out, err = cli("apply", str(best), "--dry-run")
    assert code == 0, err
    assert "would write" in out and "digital twin" in err


def test_status_names_optunas_best_trial_and_each_workers_cheapest():
    """tune status reads the study's answer where Optuna does: best_trial; a worker's best is its cheapest feasible."""
    study = optuna.create_study()

    def add(worker: str, value: float, slack: float, key: str) -> None:
        user = {"worker": worker, "effective_key": key, "p99_ms": 50 + slack, "j_per_query": value}
        study.add_trial(optuna.trial.create_trial(value=value, user_attrs=user, constraints={"latency": slack}))

    add("a", 0.5, 3.0, "k0")  # cheapest, but over the bound
    add("a", 1.5, -10.0, "k1")
    add("b", 1.2, -1.0, "k2")
    status = study_status(study, "sqlite:///x.db")
    assert recommended(study).number == study.best_trial.number == 2 and status.best["trial"] == 2
    by_name = {w.worker: w for w in status.workers}
    assert by_name["a"].best_trial == 1 and by_name["b"].best_trial == 2


def test_devices_say_whether_they_can_measure_here(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNE_POWERCAP_ROOT", str(tmp_path))  # no RAPL zones here
    _, out, _ = cli("devices", "--json")
    cpu = next(d for d in json.loads(out)["devices"] if d["name"] == "cpu")
    assert cpu["usable"] is False and cpu["why"].startswith("no RAPL energy counters")
    twin = next(d for d in json.loads(out)["devices"] if d["name"] == "sim:orin")
    assert twin["usable"] is True and twin["why"] == ""


def test_read_only_commands_create_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for args in (("status",), ("status", "--out", "new"), ("pareto", "-m", "resnet50", "-d", "sim:orin")):
        code, _, err = cli(*args)
        assert code == 2 and "run tune run first" in err
    assert list(tmp_path.iterdir()) == []


def test_postgres_password_from_a_named_environment_variable(monkeypatch):
    monkeypatch.setenv("TUNER_DB_SECRET", "s3cr@t/pw")
    url = "postgresql://tuner@db.lab/tune?password_env=TUNER_DB_SECRET"
    assert driver_url(url) == "postgresql+psycopg://tuner:s3cr%40t%2Fpw@db.lab/tune"
    assert "s3cr" not in scrub("failed for tuner:s3cr%40t%2Fpw and s3cr@t/pw", url)
    monkeypatch.delenv("TUNER_DB_SECRET")
    with pytest.raises(UserError, match="TUNER_DB_SECRET is not set"):
        driver_url(url)


def test_quick_start_artifacts_are_ignored_by_git():
    names = ["studies/tune.db", "studies/tune.db.lock", "studies/tune.db-wal", "studies/bench/search.json"]
    names += ["studies/sim-orin/resnet50/pareto.json"]
    r = subprocess.run(["git", "check-ignore", *names], cwd=REPO, capture_output=True, text=True)
    if r.returncode == 128:
        pytest.skip("needs a git checkout of the repository (it asks git check-ignore)")
    assert sorted(r.stdout.split()) == sorted(names)


class _Board:
    """Just enough of a Jetson device for provenance: describe() as the real backend returns it."""

    name, kind, slug, simulated = "orin", "orin-agx", "orin", False

    def __init__(self, root: Path) -> None:
        self.root = root

    def describe(self) -> dict:
        return {"name": self.name, "kind": self.kind, "backend": "jetson", "sysfs_root": str(self.root)}


class _Gpu:
    name, kind, slug, simulated = "cuda:0", "h200", "h200", False

    def describe(self) -> dict:
        return {"name": self.name, "kind": self.kind, "gpu": "NVIDIA H200", "driver": "580.159.04"}


def test_provenance_names_the_board_and_l4t_release_or_the_gpu_and_driver(tmp_path):
    from tuner.provenance import device_provenance

    (tmp_path / "proc" / "device-tree").mkdir(parents=True)
    (tmp_path / "proc" / "device-tree" / "model").write_bytes(b"NVIDIA Jetson AGX Orin Developer Kit\x00")
    (tmp_path / "etc").mkdir()
    release = "# R36 (release), REVISION: 4.3, GCID: 38968081, BOARD: generic, EABI: aarch64"
    (tmp_path / "etc" / "nv_tegra_release").write_text(release + "\n")
    board = device_provenance(_Board(tmp_path))
    assert board["hardware"] == "NVIDIA Jetson AGX Orin Developer Kit" and board["l4t"] == release
    assert board["twin"] is False
    gpu = device_provenance(_Gpu())
    assert gpu["hardware"] == "NVIDIA H200" and gpu["driver"] == "580.159.04"


def test_unwritable_out_folder_is_refused_before_anything_is_created(tmp_path, monkeypatch):
    import tuner.cli.common as common

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(common.os, "access", lambda path, mode: False)  # as if the folder were read-only
    code, _, err = cli("run", "-m", "resnet50", "-d", "sim:orin", "-l", "50ms", "--out", "new/studies")
    assert code == 2 and "is not writable by this user" in err
    code, _, err = cli("export", "-m", "resnet50", "-d", "sim:orin", "-l", "50ms", "-o", "best.yaml")
    assert code == 2 and "not writable" in err
    assert list(tmp_path.iterdir()) == []


def test_an_onnx_path_is_checked_before_anything_is_created(tmp_path):
    from tuner.models import check_model

    text = tmp_path / "text.onnx"
    text.write_text("not a model\n")
    with pytest.raises(UserError, match="not an ONNX model"):
        check_model(str(text))
    with pytest.raises(UserError, match="is a folder"):
        (tmp_path / "dir.onnx").mkdir()
        check_model(str(tmp_path / "dir.onnx"))
    with pytest.raises(UserError, match="cannot be read"):
        check_model(str(tmp_path / "absent.onnx"))
    with pytest.raises(UserError, match="not an ONNX model"):
        check_model(str(text), simulated=True)
