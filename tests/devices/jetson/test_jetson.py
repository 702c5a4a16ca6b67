"""Jetson backend on the strict fake board (AGX Orin on L4T 35, 36.3 and 36.4 and both GPU grids; Orin Nano)."""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from fakeboard import GRIDS, FakeBoard, every_mode, make_fake_board
from journals import pending_journals
from locations import REPO

from tuner.devices.base import Device
from tuner.devices.hardware_session import restore_pending
from tuner.devices.jetson import (
    ApplyError,
    JetsonDevice,
    RailMeter,
    RestoreIncomplete,
    ThermalLimitError,
    jetson_device,
    parse_nvpmodel_conf,
    sysfs,
)
from tuner.devices.journal import write_journal
from tuner.errors import UserError
from tuner.measure.settings import WindowSettings
from tuner.measurement import Measurement
from tuner.space import Config, load_space

BOARDS = [
    ("orin-agx", "l4t35", "jp5"),
    ("orin-agx", "l4t36.3", "jp6"),
    ("orin-agx", "l4t36.4", "jp5"),
    ("orin-nano", "l4t36.4", "jp5"),
]

# A configuration that changes every knob away from each board's default state.
CONFIGS = {
    "orin-agx": {"nvpmodel": "50W", "emc_mhz": 2133, "cpu_cores": 6, "cpu_mhz": 1344},
    "orin-nano": {"nvpmodel": "7W", "emc_mhz": 665.6, "cpu_cores": 2, "cpu_mhz": 883.2},
}


@pytest.fixture(params=BOARDS, ids=["-".join(b) for b in BOARDS])
def board(request: pytest.FixtureRequest, tmp_path: Path) -> FakeBoard:
    model, layout, grid = request.param
    return make_fake_board(tmp_path / "board", model, layout, seed=len(tmp_path.name), grid=grid)


@pytest.fixture(autouse=True)
def _state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TUNE_STATE_DIR", str(tmp_path / "state"))


def device(board: FakeBoard, **kw: object) -> JetsonDevice:
    dev = JetsonDevice(board.model, sysfs_root=board.root, nvpmodel=str(board.nvpmodel), **kw)  # type: ignore[arg-type]
    return every_mode(dev)  # these tests switch between every mode of the board


def low_gpu_mhz(board: FakeBoard) -> float:
    """The second-lowest GPU step this board reports: under every mode's cap on every grid."""
    return device(board).space().knobs["gpu_mhz"].values[1]  # type: ignore[return-value]


def config(board: FakeBoard, **knobs: object) -> Config:
    return Config(knobs={**CONFIGS[board.model], "gpu_mhz": low_gpu_mhz(board), **knobs}, batch_size=8)


# -- discovery ---------------------------------------------------------------


def test_discovery_finds_every_part_of_the_board(board: FakeBoard) -> None:
    dev = device(board)
    assert isinstance(dev, Device) and not dev.simulated
    info = dev.describe()
    assert info["layout"] == board.layout
    assert info["release"] == {"l4t35": "L4T 35.4.1", "l4t36.3": "L4T 36.3.0", "l4t36.4": "L4T 36.4.0"}[board.layout]
    assert info["title"].startswith("NVIDIA Jetson ") and info["release"] in info["title"]
    # The GPU is found by its device-tree name although VIC and NVDEC sort before it.
    assert Path(info["gpu_devfreq"]) == Path(os.path.realpath(board.gpu_dir))
    assert Path(info["tpc_mask"]) == Path(os.path.realpath(board.gpu_device)) / "tpc_pg_mask"
    if board.model == "orin-agx":
        assert info["cpu_policies"] == {"cpu0": [0, 1, 2, 3], "cpu4": [4, 5, 6, 7], "cpu8": [8, 9, 10, 11]}
        assert info["rails"] == ["VDD_GPU_SOC", "VDD_CPU_CV", "VIN_SYS_5V0", "VDDQ_VDD2_1V8AO"]
        assert info["modes"] == {"MAXN": 0, "15W": 1, "30W": 2, "50W": 3}
    else:
        assert info["cpu_policies"] == {"cpu0": [0, 1, 2, 3], "cpu4": [4, 5]}
        assert info["rails"] == ["VDD_IN", "VDD_CPU_GPU_CV", "VDD_SOC"]
    assert info["emc_settable"]
    assert "PMIC-Die" not in info["thermal_zones"] and "CPU-therm" in info["thermal_zones"]
    temps = dev.temperatures()
    assert all(t > -200 for t in temps.values()) and "CPU-therm" in temps  # -256 C zones have no sensor


def test_rails_are_found_whatever_the_hwmon_number(tmp_path: Path) -> None:
    names = set()
    for seed in range(4):
        fake = make_fake_board(tmp_path / str(seed), "orin-agx", "l4t35", seed=seed)
        names.add(fake.hwmon_dirs["1-0040"].name)
        assert device(fake).describe()["rails"][0] == "VDD_GPU_SOC"
    assert len(names) > 1


@pytest.mark.parametrize("grid", ["jp5", "jp6"])
def test_the_gpu_clock_is_tuned_over_every_value_the_board_reports(tmp_path: Path, grid: str) -> None:
    fake = make_fake_board(tmp_path / "b", "orin-agx", "l4t36.4", grid=grid)
    dev = device(fake)
    space = dev.space()
    values = [f / 1e6 if f % 1_000_000 else f // 1_000_000 for f in GRIDS[grid]]
    assert space.knobs["gpu_mhz"].values == values
    assert "gpu_mhz" in space.tuned_knobs
    # Every value applies and reads back on the board.
    for mhz in space.knobs["gpu_mhz"].values:
        knobs = {**space.default_config().knobs, "nvpmodel": "MAXN", "gpu_mhz": mhz}
        dev.apply(Config(knobs=knobs, batch_size=1))
        assert int(fake.read(f"{fake.gpu_dir.relative_to(fake.root)}/max_freq")) == round(float(mhz) * 1e6)
    # Where the committed YAML has the other grid, the run says so in one line.
    differs = [float(v) for v in load_space("orin-agx").knobs["gpu_mhz"].values] != [float(v) for v in values]
    first, last = values[0], values[-1]
    assert (f"gpu_mhz {first}..{last} ({len(values)} values)" in " ".join(dev.notes)) == differs
    assert all("\n" not in note for note in dev.notes)


def test_space_takes_cores_caps_and_tpc_masks_from_the_boards_conf(board: FakeBoard) -> None:
    space = device(board).space()
    base = load_space(board.model)
    assert set(space.modes) == set(base.modes)
    for name, mode in space.modes.items():
        assert mode.id == base.modes[name].id
        assert mode.caps["cpu_cores"] == base.modes[name].caps["cpu_cores"]
    if board.model == "orin-agx":
        assert space.modes["30W"].properties["tpc_pg_mask"] == 240
        assert space.modes["30W"].caps["gpu_mhz"] == 612
        assert space.knobs["nvpmodel"].default == "30W"  # the conf's PM_CONFIG DEFAULT


def test_conf_parser_reads_nvidias_format() -> None:
    """Modes of NVIDIA's AGX Xavier conf (as published in mlcommons inference_results_v1.0), abridged."""
    text = textwrap.dedent("""
        < PARAM TYPE=FILE NAME=CPU_ONLINE >
        CORE_0 /sys/devices/system/cpu/cpu0/online
        CORE_1 /sys/devices/system/cpu/cpu1/online
        CORE_2 /sys/devices/system/cpu/cpu2/online
        < PARAM TYPE=FILE NAME=TPC_POWER_GATING >
        TPC_PG_MASK /sys/devices/gpu.0/tpc_pg_mask
        < PARAM TYPE=CLOCK NAME=CPU_DENVER_0 >
        FREQ_TABLE /sys/devices/system/cpu/cpu0/cpufreq/scaling_available_frequencies
        MAX_FREQ /sys/devices/system/cpu/cpu0/cpufreq/scaling_max_freq
        < PARAM TYPE=CLOCK NAME=GPU >
        MAX_FREQ /sys/devices/17000000.gv11b/devfreq/17000000.gv11b/max_freq
        < PARAM TYPE=CLOCK NAME=EMC >
        MAX_FREQ /sys/kernel/nvpmodel_emc_cap/emc_iso_cap
        # MAXN is the NONE power model to release all constraints
        < POWER_MODEL ID=0 NAME=MAXN >
        CPU_ONLINE CORE_0 1
        CPU_ONLINE CORE_1 1
        CPU_ONLINE CORE_2 1
        TPC_POWER_GATING TPC_PG_MASK 0
        CPU_DENVER_0 MAX_FREQ -1
        GPU MAX_FREQ -1
        EMC MAX_FREQ 0
        < POWER_MODEL ID=1 NAME=MODE_10W >
        CPU_ONLINE CORE_0 1
        CPU_ONLINE CORE_1 1
        CPU_ONLINE CORE_2 0
        TPC_POWER_GATING TPC_PG_MASK 5
        CPU_DENVER_0 MIN_FREQ 1200000
        CPU_DENVER_0 MAX_FREQ 1200000
        GPU MAX_FREQ 520000000
        EMC MAX_FREQ 1065600000
        < PM_CONFIG DEFAULT=1 >
    """)
    modes, default = parse_nvpmodel_conf(text)
    assert default == 1
    maxn, ten = modes
    assert (maxn.id, maxn.name, maxn.cores, maxn.cpu_max_khz, maxn.gpu_max_hz, maxn.emc_max_hz) == (
        0, "MAXN", 3, None, None, None,
    )  # fmt: skip
    assert (ten.cores, ten.cpu_max_khz, ten.gpu_max_hz, ten.emc_max_hz, ten.tpc_pg_mask) == (
        2, 1200000, 520000000, 1065600000, 5,
    )  # fmt: skip


def test_missing_board_is_a_one_line_user_error(tmp_path: Path, board: FakeBoard) -> None:
    with pytest.raises(UserError, match="no Jetson board found") as err:
        JetsonDevice("orin-agx", sysfs_root=tmp_path / "empty", nvpmodel=str(board.nvpmodel))
    assert "\n" not in str(err.value)
    with pytest.raises(UserError, match="nvpmodel not found"):
        JetsonDevice(board.model, sysfs_root=board.root, nvpmodel=str(tmp_path / "no-such-nvpmodel"))


def test_environment_points_at_the_board(board: FakeBoard, monkeypatch: pytest.MonkeyPatch) -> None:
    board.install(monkeypatch)
    dev = JetsonDevice(board.model)
    assert dev.root == board.root and dev.nvpmodel == str(board.nvpmodel)


# -- apply -------------------------------------------------------------------


def test_apply_in_fixed_order_and_values_read_back(board: FakeBoard, monkeypatch: pytest.MonkeyPatch) -> None:
    dev = device(board)
    steps: list[str] = []
    real_write, real_run = dev._write, dev._run_nvpmodel
    monkeypatch.setattr(dev, "_write", lambda p, v: (steps.append(str(p)), real_write(p, v)))
    monkeypatch.setattr(
        dev,
        "_run_nvpmodel",
        lambda a: (steps.append("nvpmodel -m") if a[0] == "-m" else None, real_run(a))[1],
    )
    cfg = config(board)
    dev.apply(cfg)

    def stage(step: str) -> int:
        for rank, marker in enumerate(["nvpmodel -m", "/online", "cpufreq/", "17000000", "clk/emc"]):
            if marker in step:
                return rank
        raise AssertionError(step)

    ranks = [stage(s) for s in steps]
    assert ranks == sorted(ranks) and set(ranks) == {0, 1, 2, 3, 4}

    t = dev.targets(cfg)
    mode = load_space(board.model).modes[CONFIGS[board.model]["nvpmodel"]]
    assert board.mode_id() == mode.id
    cores = CONFIGS[board.model]["cpu_cores"]
    for cpu, path in dev.board.online.items():
        assert path.read_text().strip() == ("1" if cpu < cores else "0")
    policy = dev.board.policies[0]
    assert policy.max_path.read_text().strip() == policy.min_path.read_text().strip()
    assert policy.max_path.read_text().strip() == str(t["cpu_khz"])
    assert (board.gpu_dir / "min_freq").read_text().strip() == (board.gpu_dir / "max_freq").read_text().strip()
    assert int((board.gpu_dir / "max_freq").read_text()) == round(float(cfg.knobs["gpu_mhz"]) * 1e6)
    assert board.read("sys/kernel/debug/bpmp/debug/clk/emc/rate") == str(round(CONFIGS[board.model]["emc_mhz"] * 1e6))
    assert board.read("sys/kernel/debug/bpmp/debug/clk/emc/mrq_rate_locked") == "1"

    steps.clear()
    before = board.snapshot()
    assert dev.plan_writes(cfg) == []
    dev.apply(cfg)
    assert steps == [] and board.snapshot() == before


def test_mode_caps_clamp_the_clocks(tmp_path: Path) -> None:
    fake = make_fake_board(tmp_path, "orin-agx", "l4t35")
    dev = device(fake)
    dev.apply(
        Config(
            knobs={"nvpmodel": "15W", "gpu_mhz": 1300.5, "emc_mhz": 3199, "cpu_cores": 12, "cpu_mhz": 2201.6},
            batch_size=1,
        )
    )
    assert fake.read("sys/devices/gpu.0/tpc_pg_mask") == "248"  # nvpmodel set the mode's TPC mask
    assert int((fake.gpu_dir / "max_freq").read_text()) == 318750000  # highest step under 408 MHz
    assert fake.read("sys/devices/system/cpu/cpu0/cpufreq/scaling_max_freq") == "1113600"  # the cap is a step
    assert fake.read("sys/devices/system/cpu/cpu4/online") == "0"
    assert fake.read("sys/kernel/debug/bpmp/debug/clk/emc/rate") == "2133000000"


def test_plan_writes_lists_every_step_of_a_mode_change(board: FakeBoard) -> None:
    before = board.snapshot()
    plan = device(board).plan_writes(config(board))
    assert plan[0].shell().endswith(f"nvpmodel -m {load_space(board.model).modes[CONFIGS[board.model]['nvpmodel']].id}")
    assert all(w.shell().startswith("echo ") for w in plan[1:])
    assert any(w.path.endswith("clk/emc/rate") for w in plan)
    assert board.snapshot() == before


def test_board_that_does_not_take_a_value_fails_the_trial(board: FakeBoard, monkeypatch: pytest.MonkeyPatch) -> None:
    dev = device(board)
    real = dev._write

    def stuck_gpu(path: Path, value: str) -> None:
        real(path, "114750000" if path.name == "max_freq" else value)

    monkeypatch.setattr(dev, "_write", stuck_gpu)
    with pytest.raises(ApplyError, match="max_freq"):
        dev.apply(config(board))


def test_mode_that_does_not_switch_fails_the_trial(board: FakeBoard) -> None:
    board.set_nvpmodel_ignores_m()
    with pytest.raises(ApplyError, match="did not switch"):
        device(board, mode_timeout_s=0.3).apply(config(board))


def test_unsupported_frequency_writes_nothing(board: FakeBoard) -> None:
    before = board.snapshot()
    with pytest.raises(UserError, match="gpu_mhz"):
        device(board).apply(config(board, gpu_mhz=1234.5))
    with pytest.raises(UserError, match="cpu_mhz"):
        device(board).apply(config(board, cpu_mhz=1234.5))
    assert board.snapshot() == before


def test_without_privilege_nothing_is_written(board: FakeBoard) -> None:
    before = board.snapshot()
    with pytest.raises(UserError, match="sudo"):
        device(board, writable=lambda p: False).apply(config(board))
    target = board.gpu_dir / "max_freq"
    target.chmod(0o444)
    with pytest.raises(UserError, match=re.escape(str(target))):
        device(board, writable=lambda p: bool(p.stat().st_mode & 0o200)).apply(config(board))
    target.chmod(0o644)
    assert board.snapshot() == before


# -- restore and the journal ---------------------------------------------------


def test_restore_brings_every_file_back_byte_for_byte(board: FakeBoard) -> None:
    before = board.snapshot()
    dev = device(board)
    state = dev.read_state()
    json.dumps(state)  # journaled as JSON
    dev.apply(config(board))
    assert board.snapshot() != before
    dev.restore(state)
    assert board.snapshot() == before


def _child(board: FakeBoard, tmp_path: Path, knobs: dict | None = None) -> subprocess.Popen[str]:
    """A tuner applying a configuration in a hardware session, then running a long trial; ``knobs`` add
    to the board's test configuration (DLA knobs: the TensorRT runtime is selected for them)."""
    runtime = "tensorrt" if knobs else "auto"
    script = tmp_path / "child.py"
    script.write_text(
        textwrap.dedent(f"""
        import time
        from tuner.plumbing import interrupts
        from fakeboard import every_mode
        from tuner.devices.jetson import JetsonDevice
        from tuner.devices.hardware_session import hardware_session
        from tuner.space import Config
        dev = JetsonDevice(
            {board.model!r}, sysfs_root={str(board.root)!r}, nvpmodel={str(board.nvpmodel)!r}
        )
        dev.use_runtime({runtime!r})
        every_mode(dev)
        with hardware_session(dev):
            dev.apply(Config(knobs={config(board, **(knobs or {})).knobs!r}, batch_size=8))
            print("applied", flush=True)
            for _ in range(600):  # a trial: signals are acted on at safe points, at least once per batch
                time.sleep(0.1)
                interrupts.check()
    """)
    )
    env = {**os.environ, **board.env(), "TUNE_STATE_DIR": os.environ["TUNE_STATE_DIR"]}
    env["PYTHONPATH"] += os.pathsep + str(REPO)
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "applied"
    return proc


@pytest.mark.slow  # SIGKILL delivered to a tune subprocess, per board layout (the DLA case below stays fast)
def test_kill_9_mid_trial_then_restore_pending_restores_byte_for_byte(board: FakeBoard, tmp_path: Path) -> None:
    before = board.snapshot()
    proc = _child(board, tmp_path)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert board.snapshot() != before
    assert [j.device for j in pending_journals()] == [board.model]
    assert restore_pending(device(board))
    assert board.snapshot() == before
    assert pending_journals() == []


@pytest.mark.slow  # SIGTERM delivered to a tune subprocess, per board layout
def test_sigterm_mid_trial_restores_by_itself(board: FakeBoard, tmp_path: Path) -> None:
    before = board.snapshot()
    proc = _child(board, tmp_path)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) != 0
    assert board.snapshot() == before
    assert pending_journals() == []


# -- DLAs ---------------------------------------------------------------------

DLA_KNOBS = {"dla_cores": 2, "dla_mhz": 883.2, "dla_batch_size": 8, "precision": "int8"}
DLA_BOARDS = [b for b in BOARDS if b[0] == "orin-agx"]


def _dla_files(board: FakeBoard) -> list[str]:
    return [board.read(rel) for rel in board.conf["dla_caps"]]


def test_dla_knobs_appear_only_with_dlas_and_tensorrt(board: FakeBoard) -> None:
    dev = device(board)
    assert not {"dla_cores", "dla_mhz", "dla_batch_size", "precision"} & set(dev.space().knobs)  # eager PyTorch
    dev.use_runtime("tensorrt")
    knobs = dev.space().knobs
    if board.model == "orin-nano":  # no DLA on the board: nothing to offer, whatever the runtime
        assert not {"dla_cores", "dla_mhz", "dla_batch_size"} & set(knobs)
        with pytest.raises(UserError, match="unknown knob 'dla_mhz'"):
            dev.apply(config(board, dla_mhz=883.2))
        return
    assert knobs["dla_cores"].values == [0, 1, 2] and knobs["dla_cores"].group == "runner"
    assert knobs["precision"].values == ["int8"]  # TensorRT's own precision knob: a DLA runs no fp32
    assert knobs["dla_mhz"].values == [614.4, 883.2, 1369.6, 1600] and knobs["dla_mhz"].group == "device"
    caps = {name: mode.caps["dla_mhz"] for name, mode in dev.space().modes.items()}
    assert caps == {"MAXN": 1600, "15W": 614.4, "30W": 1369.6, "50W": 1369.6}  # the conf's DLA0_CORE caps
    assert [Path(p) for p in dev.describe()["dla_caps"]] == [board.path(rel) for rel in board.conf["dla_caps"]]


def test_an_agx_orin_whose_dla_nodes_are_missing_offers_no_dla_knob(tmp_path: Path) -> None:
    fake = make_fake_board(tmp_path / "b", "orin-agx", "l4t36.4")
    for rel in fake.conf["dla_caps"]:
        fake.path(rel).unlink()
    dev = device(fake)
    dev.use_runtime("tensorrt")
    assert not {"dla_cores", "dla_mhz", "dla_batch_size"} & set(dev.space().knobs)
    assert "dla" not in dev.read_state()


@pytest.mark.parametrize(("model", "layout", "grid"), DLA_BOARDS, ids=["-".join(b) for b in DLA_BOARDS])
def test_the_dla_clock_is_journaled_applied_after_the_mode_and_restored(
    tmp_path: Path, model: str, layout: str, grid: str
) -> None:
    fake = make_fake_board(tmp_path / "b", model, layout, grid=grid)
    before = fake.snapshot()
    dev = device(fake)
    dev.use_runtime("tensorrt")
    state = dev.read_state()
    assert state["dla"] == {"0": "1369600000", "1": "1369600000"}  # MODE_30W's cap, saved before any write
    steps = dev.plan_writes(config(fake, nvpmodel="MAXN", **DLA_KNOBS))
    assert [w.value for w in steps[-2:]] == ["883200000", "883200000"]  # after nvpmodel, which resets the caps
    assert all(w.path.endswith(("dla0_core", "dla1_core")) for w in steps[-2:])
    dev.apply(config(fake, nvpmodel="MAXN", **DLA_KNOBS))
    assert _dla_files(fake) == ["883200000", "883200000"]
    dev.apply(config(fake, nvpmodel="15W", **{**DLA_KNOBS, "dla_mhz": 1600}))
    assert _dla_files(fake) == ["614400000", "614400000"]  # MODE_15W caps the DLAs at 614.4 MHz
    dev.restore(state)
    assert fake.snapshot() == before


def test_an_exported_dla_configuration_applies_without_naming_the_runtime(tmp_path: Path) -> None:
    fake = make_fake_board(tmp_path / "b", "orin-agx", "l4t36.4")
    before = fake.snapshot()
    dev = device(fake)  # as ``tune apply`` opens it: no model, no runtime
    state = dev.read_state()
    dev.apply(config(fake, nvpmodel="MAXN", **DLA_KNOBS))
    assert _dla_files(fake) == ["883200000", "883200000"]
    dev.restore(state)
    assert fake.snapshot() == before


def test_a_dla_cap_the_board_did_not_take_fails_the_trial(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = make_fake_board(tmp_path / "b", "orin-agx", "l4t35", start="MAXN")
    dev = device(fake)
    dev.use_runtime("tensorrt")
    real_write = sysfs.write

    def ignore_dla(root: Path, path: Path, value: str) -> None:
        if not path.name.startswith("dla"):
            real_write(root, path, value)

    monkeypatch.setattr(sysfs, "write", ignore_dla)
    with pytest.raises(ApplyError, match="dla0_core=1600000000 \\(wanted 883200000\\)"):
        dev.apply(config(fake, nvpmodel="MAXN", **DLA_KNOBS))


def test_kill_9_after_a_dla_write_then_restore_pending_puts_the_dla_clock_back(tmp_path: Path) -> None:
    fake = make_fake_board(tmp_path / "b", "orin-agx", "l4t36.3")
    before = fake.snapshot()
    proc = _child(fake, tmp_path, {"nvpmodel": "30W", **DLA_KNOBS})
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert _dla_files(fake) == ["883200000", "883200000"]
    assert restore_pending(device(fake))
    assert fake.snapshot() == before and _dla_files(fake) == ["1369600000", "1369600000"]


@pytest.mark.slow  # SIGTERM delivered to a tune subprocess
def test_sigterm_after_a_dla_write_restores_the_dla_clock_by_itself(tmp_path: Path) -> None:
    fake = make_fake_board(tmp_path / "b", "orin-agx", "l4t35", start="MAXN")
    before = fake.snapshot()
    proc = _child(fake, tmp_path, {"nvpmodel": "MAXN", **DLA_KNOBS})
    assert _dla_files(fake) == ["883200000", "883200000"]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) != 0
    assert fake.snapshot() == before and _dla_files(fake) == ["1600000000", "1600000000"]
    assert pending_journals() == []


@pytest.mark.parametrize(
    ("dla", "reported"),
    [
        ({"0": "99999999999"}, "dla0_core clk_cap=99999999999 is outside"),
        ({"7": "883200000"}, "dla: core 7 is not a DLA of this board"),
        ({"0": "fast"}, "dla0_core clk_cap='fast' is not a number"),
        ("883200000", "dla: not a mapping"),
    ],
)
def test_a_hostile_dla_journal_value_is_refused(tmp_path: Path, dla: object, reported: str) -> None:
    fake = make_fake_board(tmp_path / "b", "orin-agx", "l4t36.4")
    dev = device(fake)
    dev.use_runtime("tensorrt")
    state = {**dev.read_state(), "dla": dla}
    dev.apply(config(fake, nvpmodel="MAXN", **DLA_KNOBS))
    with pytest.raises(RestoreIncomplete, match=re.escape(reported)):
        dev.restore(state)
    assert fake.mode_id() == 2


# -- thermal guard -------------------------------------------------------------


def test_thermal_guard_aborts_before_any_write(board: FakeBoard) -> None:
    board.set_temp("GPU-therm", 96.0)
    before = board.snapshot()
    with pytest.raises(ThermalLimitError, match=r"GPU-therm 96\.0 C"):
        device(board).apply(config(board))
    assert board.snapshot() == before
    device(board, thermal_limit_c=100.0).apply(config(board))


def test_pmic_die_at_100_c_is_not_a_temperature(tmp_path: Path) -> None:
    fake = make_fake_board(tmp_path, "orin-agx", "l4t35")
    assert "PMIC-Die" not in device(fake).check_thermal()


# -- meters and measure ----------------------------------------------------------


def test_rail_meter_integrates_a_known_constant_power(tmp_path: Path) -> None:
    fake = make_fake_board(tmp_path, "orin-agx", "l4t35")
    fake.set_rail("VDD_GPU_SOC", 5000, 2000)  # 10 W
    fake.set_rail("VDD_CPU_CV", 5000, 600)  # 3 W
    fake.set_rail("VIN_SYS_5V0", 5000, 400)  # 2 W
    fake.set_rail("VDDQ_VDD2_1V8AO", 1800, 500)  # 0.9 W
    ticks = iter(range(1000))
    meter = RailMeter(device(fake).board.rails, period_s=0.05, clock=lambda: next(ticks) * 0.05)
    meter.start()
    time.sleep(0.2)
    reading = meter.stop()
    assert reading.avg_w == pytest.approx(15.9)
    assert reading.energy_j == pytest.approx(15.9 * reading.duration_s)
    assert reading.extra["rail_j:VDD_GPU_SOC"] == pytest.approx(10.0 * reading.duration_s)
    assert reading.rails == ["VDD_GPU_SOC", "VDD_CPU_CV", "VIN_SYS_5V0", "VDDQ_VDD2_1V8AO"]
    assert "not wall power" in reading.warning
    assert reading.samples >= 2


def test_orin_nano_meter_takes_vdd_in_alone(tmp_path: Path) -> None:
    fake = make_fake_board(tmp_path, "orin-nano", "l4t36")
    meter = device(fake).make_meter()
    assert meter.rails == ["VDD_IN"]
    meter.start()
    reading = meter.stop()
    assert reading.avg_w == pytest.approx(fake.rail_watts()["VDD_IN"], rel=1e-3)


def test_rails_follow_the_configuration(board: FakeBoard) -> None:
    dev = device(board)
    rails = dev.make_meter().rails
    high = sum(board.rail_watts()[r] for r in rails)
    dev.apply(config(board))
    board.refresh()
    low = sum(board.rail_watts()[r] for r in rails)
    assert 0 < low < high


def test_jtop_meter_without_jetson_stats_names_the_extra(board: FakeBoard) -> None:
    if "jtop" in sys.modules or _importable("jtop"):
        pytest.skip("needs jetson-stats absent: it checks the message when the [jetson] extra is missing")
    with pytest.raises(UserError, match=r"powertune\[jetson\]"):
        device(board).make_meter("jtop")


def _importable(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def _fake_window(hot: FakeBoard | None = None):  # type: ignore[no-untyped-def]
    def measure_fn(runner, meter, batch_size, settings, percentile):  # type: ignore[no-untyped-def]
        meter.start()
        if hot is not None:
            hot.set_temp("CPU-therm", 99.0)
        time.sleep(0.12)
        r = meter.stop()
        queries = 40 * batch_size
        return Measurement(
            j_per_query=r.energy_j / queries,
            p50_ms=5,
            p90_ms=6,
            p99_ms=7,
            qps=queries / r.duration_s,
            avg_w=r.avg_w,
            energy_j=r.energy_j,
            queries=queries,
            duration_s=r.duration_s,
            meter=r.meter,
            rails=r.rails,
        )

    return measure_fn


def test_measure_runs_the_window_under_the_rail_meter(board: FakeBoard) -> None:
    dev = device(
        board,
        runner_factory=lambda m, c: object(),
        measure_fn=_fake_window(),
        meter_period_s=0.05,
    )
    m = dev.measure("resnet50", config(board), WindowSettings(window_s=0.1))
    assert m.avg_w > 0 and m.meter == "ina3221" and m.rails
    assert "CPU-therm" in m.temps_c and not m.twin


def test_measure_aborts_when_a_zone_gets_too_hot(board: FakeBoard) -> None:
    dev = device(board, runner_factory=lambda m, c: object(), measure_fn=_fake_window(hot=board))
    with pytest.raises(ThermalLimitError, match="CPU-therm"):
        dev.measure("resnet50", config(board), WindowSettings(window_s=0.1))


def test_meter_period_below_50_ms_is_refused(board: FakeBoard) -> None:
    with pytest.raises(UserError, match=r"0\.05"):
        device(board, meter_period_s=0.01)


@pytest.mark.parametrize("kind", ["orin-nano", "orin-nx", "xavier-agx", "tx2"])
def test_published_spaces_load_with_distinct_mode_ids(kind: str) -> None:
    space = load_space(kind)
    assert space.mode_knob == "nvpmodel" and "nvpmodel" in space.source
    ids = [m.id for m in space.modes.values()]
    assert len(set(ids)) == len(ids)
    assert space.default_config().knobs["nvpmodel"] in space.modes


def test_every_mode_applies_at_its_caps_and_restores(board: FakeBoard) -> None:
    before = board.snapshot()
    dev = device(board)
    state = dev.read_state()
    space = dev.space()
    for mode in space.knobs["nvpmodel"].values:
        dev.apply(
            space.default_config().model_copy(update={"knobs": {**space.default_config().knobs, "nvpmodel": mode}})
        )
        assert board.mode_id() == space.modes[str(mode)].id
    dev.restore(state)
    assert board.snapshot() == before


def test_device_names_map_to_spaces_and_the_board_is_checked(board: FakeBoard) -> None:
    kw = {"sysfs_root": board.root, "nvpmodel": str(board.nvpmodel)}
    name = "orin" if board.model == "orin-agx" else "orin-nano"
    dev = jetson_device(name, **kw)
    assert dev.name == name and dev.kind == board.model
    other = "orin-nano" if board.model == "orin-agx" else "orin"
    with pytest.raises(UserError, match=f"use --device {board.model}"):
        jetson_device(other, **kw)
    with pytest.raises(UserError, match="unknown Jetson device"):
        jetson_device("nano-2gb", **kw)


def test_without_debugfs_emc_is_pinned_and_the_rest_still_applies(tmp_path: Path) -> None:
    fake = make_fake_board(tmp_path, "orin-agx", "l4t36")
    shutil.rmtree(fake.root / "sys/kernel/debug")
    dev = device(fake)
    assert dev.space().knobs["emc_mhz"].values == [3199]
    assert any("EMC" in note for note in dev.describe()["notes"])
    before = fake.snapshot()
    state = dev.read_state()
    dev.apply(config(fake, emc_mhz=3199))
    assert fake.mode_id() == 3
    dev.restore(state)
    assert fake.snapshot() == before


def test_restore_goes_on_past_a_failure_and_reports_it(board: FakeBoard) -> None:
    before = board.snapshot()
    dev = device(board, mode_timeout_s=0.3)
    state = dev.read_state()
    dev.apply(config(board))
    board.set_nvpmodel_ignores_m()
    with pytest.raises(RestoreIncomplete, match="nvpmodel did not switch") as err:
        dev.restore(state)
    assert "tune restore --device" in str(err.value) and "\n" not in str(err.value)
    after = board.snapshot()
    for rel in before:
        if rel.endswith(("/governor", "clk/emc/rate", "max_freq")) and "devfreq" in rel and "vic" not in rel:
            assert after[rel] == before[rel], rel


# -- kernel rules, and the backend under them ------------------------------------------


def _policy8_offline_board(tmp_path: Path) -> FakeBoard:
    return make_fake_board(tmp_path / "b", "orin-agx", "l4t36.4", start="MODE_30W")


def test_the_fake_kernel_refuses_what_a_real_one_refuses(tmp_path: Path) -> None:
    fake = _policy8_offline_board(tmp_path)
    root = fake.root
    policy8 = fake.policy(8)
    assert fake.read("sys/devices/system/cpu/cpu8/online") == "0"
    cases = [
        (policy8 / "scaling_max_freq", "729600", errno.EPERM),  # a cluster with every core offline
        (fake.gpu_dir / "available_frequencies", "1", errno.EACCES),  # read-only attribute
        (fake.gpu_dir / "new_file", "1", errno.ENOENT),  # nothing can be created
        (root / "sys/devices/system/cpu/cpu4/online", "2", errno.EINVAL),  # online takes 0 or 1
        (fake.policy(0) / "scaling_governor", "fast", errno.EINVAL),  # not an available governor
    ]
    for path, value, code in cases:
        before = path.read_bytes() if path.exists() else None
        with pytest.raises(sysfs.BoardWriteError) as err:
            sysfs.write(root, path, value)
        assert err.value.errno == code, path
        assert (path.read_bytes() if path.exists() else None) == before
    assert "offline" in _rule_of(root, policy8 / "scaling_min_freq")
    sysfs.write(root, fake.policy(0) / "scaling_max_freq", "1728000")  # an online cluster takes it


def test_a_writer_killed_mid_store_leaves_the_old_value_not_an_empty_one(tmp_path: Path, monkeypatch) -> None:
    """A sysfs store is atomic to readers; a fake that truncated then wrote once showed an empty attribute.

    The writer is cut off at the last step before the new value lands (as a SIGKILL could): the
    attribute must still read its old value, and nothing is left inside the board's tree.
    """
    fake = _policy8_offline_board(tmp_path)
    target = fake.policy(0) / "scaling_max_freq"
    before = target.read_bytes()
    snapshot = fake.snapshot()

    def killed(src, dst):  # type: ignore[no-untyped-def]
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        sysfs.write(fake.root, target, "1728000")
    assert target.read_bytes() == before and before.strip()
    assert fake.snapshot() == snapshot
    monkeypatch.undo()
    sysfs.write(fake.root, target, "1728000")
    assert fake.read("sys/devices/system/cpu/cpufreq/policy0/scaling_max_freq") == "1728000"


def _rule_of(root: Path, path: Path) -> str:
    with pytest.raises(sysfs.BoardWriteError) as err:
        sysfs.write(root, path, "729600")
    return err.value.rule


def test_from_mode_30w_a_maxn_configuration_applies_and_restores(tmp_path: Path) -> None:
    """Issue 9: restore used to write policy8's limits after nvpmodel took cluster 2 offline again."""
    fake = _policy8_offline_board(tmp_path)
    before = fake.snapshot()
    dev = device(fake)
    state = dev.read_state()
    dev.apply(
        Config(
            knobs={"nvpmodel": "MAXN", "gpu_mhz": 1300.5, "emc_mhz": 3199, "cpu_cores": 12, "cpu_mhz": 1344},
            batch_size=1,
        )
    )
    assert fake.read("sys/devices/system/cpu/cpufreq/policy8/scaling_max_freq") == "1344000"
    dev.restore(state)
    assert fake.snapshot() == before
    # MAXN with 8 cores: cluster 2 goes offline by our hand, and its limits are never written.
    dev.apply(
        Config(
            knobs={"nvpmodel": "MAXN", "gpu_mhz": 1300.5, "emc_mhz": 3199, "cpu_cores": 8, "cpu_mhz": 1344},
            batch_size=1,
        )
    )
    dev.restore(state)
    assert fake.snapshot() == before


def test_board_writes_never_follow_a_planted_symlink(tmp_path: Path) -> None:
    fake = make_fake_board(tmp_path / "b", "orin-agx", "l4t35")
    dev = device(fake)
    outside = tmp_path / "victim"
    outside.write_text("untouched\n")
    target = fake.gpu_dir / "max_freq"
    target.unlink()
    target.symlink_to(outside)
    with pytest.raises(ApplyError, match=r"outside the sysfs root|symlink"):
        dev._write(target, "318750000")
    assert outside.read_text() == "untouched\n"
    inside_link = fake.gpu_dir / "min_freq"
    inside_link.unlink()
    inside_link.symlink_to(fake.gpu_dir / "governor")
    with pytest.raises(ApplyError, match="symlink"):
        dev._write(inside_link, "114750000")


HOSTILE = [
    ({"nvpmodel_id": 99}, "nvpmodel_id=99 is not a mode"),
    ({"online": {"8": "7"}}, "cpu8/online='7'"),
    ({"online": {"../../etc": "1"}}, "cpu../../etc is not a CPU"),
    ({"gpu": {"min": "114750000", "max": "99999999999", "governor": "nvhost_podgov"}}, "outside the board's range"),
    ({"gpu": {"min": "1", "max": "2", "governor": "../../../bin/sh"}}, "not a governor this board offers"),
    ({"cpufreq": {"0": {"min": "x", "max": "2201600"}}}, "'x' is not a number"),
    ({"emc": {"rate": "3199000000", "locked": "yes"}}, "mrq_rate_locked='yes'"),
    ({"kind": "tx2"}, "of a 'tx2' board, not this orin-agx"),
]


@pytest.mark.parametrize(("change", "reported"), HOSTILE, ids=[h[1][:24] for h in HOSTILE])
def test_a_hostile_journal_value_is_refused_and_the_rest_is_restored(
    tmp_path: Path, change: dict, reported: str
) -> None:
    fake = make_fake_board(tmp_path / "b", "orin-agx", "l4t36.3", start="MAXN")
    before = fake.snapshot()
    dev = device(fake)
    state = dev.read_state()
    write_journal(dev, {**state, **change})
    dev.apply(config(fake))
    with pytest.raises(RestoreIncomplete, match=re.escape(reported)):
        restore_pending(dev)
    assert [j.device for j in pending_journals()] == ["orin-agx"]  # kept, to finish with tune restore
    after = fake.snapshot()
    # What the refused key covers may stay changed; everything else is back. A refused mode leaves
    # what only nvpmodel sets (status, caps, TPC mask) as the applied mode set it.
    spoiled = {
        "nvpmodel_id": ("var/lib", "nvpmodel_", "tpc_pg_mask", "power/control"),
        "online": ("/online",),
        "gpu": ("devfreq/",),
        "cpufreq": ("policy",),
        "emc": ("emc",),
        "kind": ("",),  # nothing at all is restored from another board's state
    }[next(iter(change))]
    for rel in before:
        if not any(marker in rel for marker in spoiled):
            assert after[rel] == before[rel], rel


def test_a_journal_missing_keys_still_restores_what_it_has(board: FakeBoard) -> None:
    dev = device(board)
    state = dev.read_state()
    dev.apply(config(board))
    partial = {k: v for k, v in state.items() if k != "gpu"}
    with pytest.raises(RestoreIncomplete, match="gpu: missing"):
        dev.restore(partial)
    assert board.mode_id() == state["nvpmodel_id"]
    for cpu, value in state["online"].items():
        assert board.read(f"sys/devices/system/cpu/cpu{cpu}/online") == value


def test_layout_is_named_from_the_path_under_the_root_not_the_root_itself(tmp_path: Path) -> None:
    fake = make_fake_board(tmp_path / "platform" / "b", "orin-agx", "l4t35")
    assert device(fake).describe()["layout"] == "l4t35"


def test_live_board_moves_its_rails_after_direct_writes(tmp_path: Path) -> None:
    fake = make_fake_board(tmp_path, "orin-agx", "l4t35")
    dev = device(fake)
    dev.apply(config(fake))
    settled = fake.rail_watts()
    with fake.live():
        dev.apply(config(fake, gpu_mhz=114.75))
        deadline = time.monotonic() + 10
        while fake.rail_watts() == settled and time.monotonic() < deadline:
            time.sleep(0.02)
    assert fake.rail_watts()["VDD_GPU_SOC"] < settled["VDD_GPU_SOC"]


def test_a_mode_the_space_file_does_not_know_comes_from_the_boards_conf(tmp_path: Path) -> None:
    """A conf with other modes (as the 32 GB module's MODE_40W): the board's modes are the knob, with their caps.

    The numbers of this mode are made up for the test; what is checked is that they come from the conf.
    """
    fake = make_fake_board(tmp_path / "b", "orin-agx", "l4t35", start="MAXN")
    conf = next((fake.root / "etc/nvpmodel").glob("*.conf"))
    text = (
        conf.read_text().replace("NAME=MODE_50W", "NAME=MODE_40W").replace("MAX_FREQ 816000000", "MAX_FREQ 714000000")
    )
    conf.write_text(text)
    dev = device(fake)
    space = dev.space()
    assert space.knobs["nvpmodel"].values == ["MAXN", "15W", "30W", "40W"]
    assert space.modes["40W"].caps["gpu_mhz"] == 714 and space.modes["40W"].id == 3
    assert any("nvpmodel modes MAXN, 15W, 30W, 40W" in note for note in dev.notes)
    before = fake.snapshot()
    state = dev.read_state()
    dev.apply(Config(knobs={**space.default_config().knobs, "nvpmodel": "40W"}, batch_size=1))
    assert fake.mode_id() == 3
    dev.restore(state)
    assert fake.snapshot() == before


def test_an_offline_cluster_is_woken_only_when_its_saved_limits_differ(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = _policy8_offline_board(tmp_path)
    dev = device(fake)
    state = dev.read_state()
    written: list[str] = []
    real = sysfs.write
    monkeypatch.setattr(sysfs, "write", lambda root, path, value: (written.append(path.name), real(root, path, value)))
    dev.apply(Config(knobs={**dev.space().default_config().knobs, "cpu_mhz": 1344}, batch_size=1))  # stays 30W
    dev.restore(state)
    assert "online" not in written  # policy8 was never touched, so cpu8 never came online
    maxn = {"nvpmodel": "MAXN", "gpu_mhz": 1300.5, "emc_mhz": 3199, "cpu_cores": 12, "cpu_mhz": 1344}
    dev.apply(Config(knobs=maxn, batch_size=1))
    written.clear()
    dev.restore(state)
    assert written.count("online") == 2  # cpu8 up for policy8's limits, then down again
