"""What a new user reads: device listings, refusals before a study starts, tables at 80 columns, labels, units.

Commands run in-process (``tuner.cli.main``) at a console 80 columns wide;
each test would fail if the behaviour it names broke.
"""

from __future__ import annotations

import json

import pytest
from clirun import in_process

from tuner.cli import common


@pytest.fixture(autouse=True)
def eighty_columns(monkeypatch):
    """The consoles the commands print to, 80 columns wide as a default terminal."""
    monkeypatch.setattr(common.out_console, "_width", 80)
    monkeypatch.setattr(common.err_console, "_width", 80)


cli = in_process


def fits(text: str, width: int = 80) -> bool:
    return all(len(line) <= width for line in text.splitlines())


# -- tune devices ------------------------------------------------------------------------------------------------


def test_devices_lists_every_board_and_gpu_and_says_why_each_cannot_measure_here(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNE_POWERCAP_ROOT", str(tmp_path))  # no RAPL zones
    monkeypatch.setenv("TUNE_SYSFS_ROOT", str(tmp_path))  # no device tree: not a Jetson
    code, out, _ = cli("devices", "--json")
    assert code == 0
    found = {d["name"]: d for d in json.loads(out)["devices"]}
    for name in ("orin", "orin-nano", "xavier", "tx2", "cpu"):
        assert found[name]["usable"] is False and found[name]["why"], name
    assert "not a Jetson board" in found["tx2"]["why"] and "sim:orin" in found["orin"]["why"]
    gpus = [d for d in found.values() if d["kind"] == "nvml"]
    assert gpus and all(d["usable"] or d["why"] for d in gpus)
    assert found["sim:orin-trt"]["title"] != found["sim:orin"]["title"]
    assert "TensorRT INT8" in found["sim:orin-trt"]["title"]


def test_devices_table_fits_80_columns_and_keeps_every_reason_whole(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNE_POWERCAP_ROOT", str(tmp_path))
    monkeypatch.setenv("TUNE_SYSFS_ROOT", str(tmp_path))
    code, out, _ = cli("devices")
    assert code == 0 and fits(out)
    flat = "".join(out.split())  # wrapped lines joined back (rich may break a long path after a slash)
    _, js, _ = cli("devices", "--json")
    for d in json.loads(js)["devices"]:
        assert d["name"] in out
        if d["why"]:
            assert "".join(f"{d['name']}: {d['why']}".split()) in flat
    assert "TensorRT INT8" in out


# -- a device that cannot measure is refused before the study starts ---------------------------------------------


@pytest.mark.parametrize("meter", [[], ["--meter", "rapl"], ["--meter", "nvml-energy"]])
def test_cpu_without_rapl_is_refused_before_the_study_starts(tmp_path, monkeypatch, meter):
    monkeypatch.setenv("TUNE_POWERCAP_ROOT", str(tmp_path / "none"))
    out = tmp_path / "studies"
    code, stdout, err = cli("run", "-m", "tiny-cnn", "-d", "cpu", "-l", "50ms", "--out", str(out), *meter)
    assert code == 2 and stdout == ""
    assert len(err.strip().splitlines()) == 1 and "no RAPL energy counters" in err and "--meter" not in err
    assert not out.exists()


def test_cpu_with_rapl_refuses_another_meter_before_the_study_starts(tmp_path, rapl_at_15w):
    out = tmp_path / "studies"
    code, _, err = cli("run", "-m", "tiny-cnn", "-d", "cpu", "-l", "50ms", "--out", str(out), "--meter", "nvml-power")
    assert code == 2 and "metered by RAPL" in err and not out.exists()


# -- tune sweep: progress that moves, a warning before a huge sweep, J/query first --------------------------------


def test_sweep_progress_advances_chunk_by_chunk_and_scores_the_same(monkeypatch):
    from tuner import sweep
    from tuner.devices.virtual.twin import TwinDevice
    from tuner.measure.settings import WindowSettings
    from tuner.study import narrowed_space

    dev = TwinDevice("sim:orin")
    space = narrowed_space(dev, ["gpu_mhz", "cpu_cores"], [1, 8])
    monkeypatch.setattr(sweep, "PROGRESS_CHUNK", 7)
    calls: list[tuple[int, int]] = []
    rows = sweep.run_sweep(dev, space, "resnet50", WindowSettings(noise=False), progress=lambda *a: calls.append(a))
    total = space.size()
    assert total > 14 and len(calls) == -(-total // 7) and calls[-1] == (total, total)
    assert [done for done, _ in calls] == sorted({done for done, _ in calls})
    whole = dev.measure_many("resnet50", space.grid(), WindowSettings(noise=False))
    assert [r.measurement.j_per_query for r in rows] == [m.j_per_query for m in whole]


def test_a_large_sweep_warns_up_front_with_its_size_the_time_and_how_to_narrow_it(tmp_path, monkeypatch):
    from tuner import sweep
    from tuner.cli import tuning

    monkeypatch.setattr(sweep, "LARGE_SWEEP", 10)
    monkeypatch.setattr(tuning, "LARGE_SWEEP", 10)
    args = ("sweep", "-m", "resnet50", "-d", "sim:orin", "--knobs", "gpu_mhz", "--batch-sizes", "1,8")
    code, out, err = cli(*args, "--out", str(tmp_path))
    assert code == 0
    warning = " ".join(err.split("warning: ", 1)[1].split())
    assert "22 configurations" in warning and "--knobs" in warning and "--batch-sizes" in warning
    assert " here;" in warning
    header = next(line for line in out.splitlines() if "J/query" in line)
    assert header.index("J/query") < header.index("queries/J")
    assert fits(out) and "True" not in out and "False" not in out


def test_a_small_sweep_starts_without_a_warning(tmp_path):
    args = ("sweep", "-m", "resnet50", "-d", "sim:orin", "--knobs", "gpu_mhz", "--batch-sizes", "1,8")
    code, _, err = cli(*args, "--out", str(tmp_path))
    assert code == 0 and "warning" not in err


def test_the_size_warning_of_the_bert_h200_space_names_its_size_and_narrowing(monkeypatch):
    from tuner.devices.virtual.twin import TwinDevice
    from tuner.sweep import size_warning

    space = TwinDevice("sim:h200").space()
    text = size_warning(space, 420.0)
    assert text is not None and f"{space.size():,} configurations" in text and "about 7 min" in text
    assert size_warning(space, 10.0, floor=True).count("at least") == 1


# -- tune measure --repeat: mean and spread; --set in the space files' spellings ----------------------------------


def test_measure_repeat_prints_mean_and_sd_rows_and_accepts_yaml_booleans():
    args = ("measure", "-m", "resnet50", "-d", "sim:h200", "-b", "8", "--repeat", "3", "--seed", "1")
    code, out, err = cli(*args, "--set", "channels_last=true", "--set", "power_limit_w=500.0")
    assert code == 0, err
    assert fits(out) and "True" not in out
    _, js, _ = cli(*args, "--set", "channels_last=yes", "--set", "power_limit_w=500", "--json")
    payload = json.loads(js)
    energies = [m["j_per_query"] for m in payload["measurements"]]
    assert payload["config"]["channels_last"] is True and payload["config"]["power_limit_w"] == 500
    assert payload["summary"]["mean"]["j_per_query"] == pytest.approx(sum(energies) / 3)
    assert payload["summary"]["sd"]["j_per_query"] > 0
    mean_row = next(line for line in out.splitlines() if "mean" in line and "│" in line)
    assert common.fmt(payload["summary"]["mean"]["j_per_query"]) in mean_row
    assert any("sd" in line and "│" in line for line in out.splitlines())


@pytest.mark.parametrize(
    ("raw", "value"), [("true", True), ("True", True), ("yes", True), ("no", False), ("FALSE", False)]
)
def test_set_reads_booleans_as_the_space_files_write_them(raw, value):
    from tuner.space import load_space, parse_assignments

    assert parse_assignments([f"channels_last={raw}"], load_space("h200")) == {"channels_last": value}


def test_set_refuses_a_non_boolean_listing_the_yaml_spellings():
    from tuner.errors import UserError
    from tuner.space import load_space, parse_assignments

    with pytest.raises(UserError, match="choose one of true, false"):
        parse_assignments(["channels_last=maybe"], load_space("h200"))


# -- tune roofline at 80 columns --------------------------------------------------------------------------------


def test_roofline_rows_are_named_by_mode_and_fit_80_columns(tmp_path):
    code, out, err = cli("roofline", "-m", "resnet50", "-d", "sim:orin", "--points", "4", "--out", str(tmp_path))
    assert code == 0, err
    assert fits(out)
    for mode in ("MAXN", "50W", "30W", "15W"):
        assert any(line.startswith(f"│ {mode} ") for line in out.splitlines()), mode
        assert any(line.startswith(f"  {mode}: nvpmodel={mode} gpu_mhz=") for line in out.splitlines()), mode


# -- labels: a twin says "digital twin" once, and is never "measured" -------------------------------------------


@pytest.mark.parametrize("name", ["sim:orin", "sim:orin-nano", "sim:orin-trt", "sim:h200"])
def test_twin_provenance_says_digital_twin_once(name):
    from tuner.devices.virtual.twin import TwinDevice
    from tuner.provenance import device_provenance

    hardware = device_provenance(TwinDevice(name))["hardware"]
    assert hardware.startswith("digital twin of ") and hardware.count("digital twin") == 1
    assert "not hardware" in hardware


def test_table_cells_never_print_python_booleans_or_none():
    assert [common.fmt(v) for v in (True, False, None)] == ["yes", "no", "-"]
    assert common.fmt({"channels_last": True, "graph": None}) == "channels_last=yes graph=-"


# -- --out is the results folder in every command ------------------------------------------------------------------


@pytest.mark.parametrize(
    "command",
    [
        ("export", "-m", "resnet50", "-d", "sim:orin", "-l", "50ms"),
        ("pareto", "-m", "resnet50", "-d", "sim:orin"),
        ("run", "-m", "resnet50", "-d", "sim:orin", "-l", "50ms", "-n", "2"),
        ("sweep", "-m", "resnet50", "-d", "sim:orin", "--batch-sizes", "1"),
    ],
)
def test_an_out_that_names_a_yaml_file_points_to_o(tmp_path, monkeypatch, command):
    monkeypatch.chdir(tmp_path)
    code, _, err = cli(*command, "--out", "mybest.yaml")
    assert code == 2 and "use -o mybest.yaml" in err and "--out is the results folder" in err
    assert len(err.strip().splitlines()) == 1 and list(tmp_path.iterdir()) == []


def test_out_ending_with_the_device_folder_is_not_nested_again(tmp_path):
    from tuner.pareto import results_dir

    assert results_dir(tmp_path / "studies" / "h200", "h200", "resnet50") == tmp_path / "studies/h200/resnet50"
    assert results_dir(tmp_path / "studies", "h200", "resnet50") == tmp_path / "studies/h200/resnet50"
    out = tmp_path / "sim-orin"
    code, _, err = cli(
        "run", "-m", "resnet50", "-d", "sim:orin", "-l", "50ms", "-n", "2", "--seed", "1", "--out", str(out)
    )
    assert code == 0, err
    assert (out / "tune.db").is_file() and (out / "resnet50" / "pareto.json").is_file()
    assert not (out / "sim-orin").exists()
    code, _, err = cli("pareto", "-m", "resnet50", "-d", "sim:orin", "--out", str(out))
    assert code == 0, err
    assert not (out / "sim-orin").exists()


def test_knob_values_print_exactly_as_the_space_writes_them():
    """A clock of 1300.5 MHz is never shown rounded to 1300 (tables round metrics, not knobs)."""
    from tuner.cli.common import fmt, knob_value

    assert fmt({"gpu_mhz": 1300.5, "cpu_mhz": 2201.6, "emc_mhz": 3199, "channels_last": True}) == (
        "gpu_mhz=1300.5 cpu_mhz=2201.6 emc_mhz=3199 channels_last=yes"
    )
    assert knob_value(2112.0) == "2112" and fmt(0.123456) == "0.1235"


# -- a run whose stderr is not a terminal prints a line per trial; twin trials say twin -----------------------------


def test_a_run_into_a_log_prints_a_line_per_trial_and_its_twin_trials_say_simulated(tmp_path):
    import csv

    code, _, err = cli("run", "-m", "resnet50", "-d", "sim:orin", "-l", "50ms", "--out", str(tmp_path), "-n", "3")
    assert code == 0, err
    lines = [line for line in err.splitlines() if line.startswith("trial ")]
    assert len(lines) == 3 and all(" finished (" in line and "ETA" in line for line in lines)
    assert lines[-1].split(" finished (")[1].startswith("3/3)")
    with open(tmp_path / "sim-orin" / "resnet50" / "trials.csv", newline="") as fh:
        sources = [row["source"] for row in csv.DictReader(fh)]
    assert sources and all(s.startswith(("simulated on a digital twin", "copied from")) for s in sources)
    assert not any("measured" in s for s in sources)


def test_pareto_out_naming_the_study_s_own_folder_writes_there(tmp_path):
    code, _, err = cli("run", "-m", "resnet50", "-d", "sim:orin", "-l", "50ms", "--out", str(tmp_path), "-n", "2")
    assert code == 0, err
    own = tmp_path / "sim-orin" / "resnet50"
    storage = f"sqlite:///{tmp_path}/tune.db"
    code, _, err = cli("pareto", "-m", "resnet50", "-d", "sim:orin", "--storage", storage, "--out", str(own))
    assert code == 0, err
    assert (own / "pareto.json").is_file() and not (own / "sim-orin").exists()
