"""What a new user reads: device listings, refusals before a study starts, tables at 80 columns, labels, units.

Commands run in-process (``tuner.cli.main``) at a console 80 columns wide;
each test would fail if the behaviour it names broke.
"""

from __future__ import annotations

import io
import json
from contextlib import redirect_stderr, redirect_stdout

import pytest

from tuner.cli import common, main


@pytest.fixture(autouse=True)
def eighty_columns(monkeypatch):
    """The consoles the commands print to, 80 columns wide as a default terminal."""
    monkeypatch.setattr(common.out_console, "_width", 80)
    monkeypatch.setattr(common.err_console, "_width", 80)


def cli(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            main(list(args))
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
    return code, out.getvalue(), err.getvalue()


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
