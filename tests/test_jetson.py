"""Jetson backend on a fake sysfs tree (AGX Orin and Orin Nano, L4T 35 and 36 layouts)."""

from __future__ import annotations

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
from fakeboard import FakeBoard, make_fake_board

from tuner.devices.base import Device, WindowSettings
from tuner.devices.jetson import (
    ApplyError,
    JetsonDevice,
    RailMeter,
    ThermalLimitError,
    jetson_device,
)
from tuner.devices.journal import pending_journals, restore_pending
from tuner.errors import UserError
from tuner.measurement import Measurement
from tuner.space import Config, load_space

REPO = Path(__file__).resolve().parents[1]
BOARDS = [
    ("orin-agx", "l4t35"),
    ("orin-agx", "l4t36"),
    ("orin-nano", "l4t35"),
    ("orin-nano", "l4t36"),
]

# A configuration that changes every knob away from each board's default state.
CONFIGS = {
    "orin-agx": {
        "nvpmodel": "50W",
        "gpu_mhz": 612,
        "emc_mhz": 2133,
        "cpu_cores": 6,
        "cpu_mhz": 1344.0,
    },
    "orin-nano": {
        "nvpmodel": "7W",
        "gpu_mhz": 318.75,
        "emc_mhz": 665.6,
        "cpu_cores": 2,
        "cpu_mhz": 883.2,
    },
}


@pytest.fixture(params=BOARDS, ids=["-".join(b) for b in BOARDS])
def board(request: pytest.FixtureRequest, tmp_path: Path) -> FakeBoard:
    model, layout = request.param
    return make_fake_board(tmp_path / "board", model, layout, seed=len(tmp_path.name))


@pytest.fixture(autouse=True)
def _state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TUNE_STATE_DIR", str(tmp_path / "state"))


def device(board: FakeBoard, **kw: object) -> JetsonDevice:
    return JetsonDevice(board.model, sysfs_root=board.root, nvpmodel=str(board.nvpmodel), **kw)  # type: ignore[arg-type]


def config(board: FakeBoard, **knobs: object) -> Config:
    return Config(knobs={**CONFIGS[board.model], **knobs}, batch_size=8)


# -- discovery ---------------------------------------------------------------


def test_discovery_finds_every_part_of_the_board(board: FakeBoard) -> None:
    dev = device(board)
    assert isinstance(dev, Device) and not dev.simulated
    info = dev.describe()
    assert info["layout"] == board.layout
    assert Path(info["gpu_devfreq"]) == board.gpu_dir
    if board.model == "orin-agx":
        assert info["cpu_policies"] == {
            "cpu0": [0, 1, 2, 3],
            "cpu4": [4, 5, 6, 7],
            "cpu8": [8, 9, 10, 11],
        }
        assert info["rails"] == ["VDD_GPU_SOC", "VDD_CPU_CV", "VIN_SYS_5V0", "VDDQ_VDD2_1V8AO"]
    else:
        assert info["cpu_policies"] == {"cpu0": [0, 1, 2, 3], "cpu4": [4, 5]}
        assert info["rails"] == ["VDD_IN", "VDD_CPU_GPU_CV", "VDD_SOC"]
    assert info["emc_settable"] and info["tpc_mask"]
    assert "PMIC-Die" not in info["thermal_zones"] and "CPU-therm" in info["thermal_zones"]


def test_rails_are_found_whatever_the_hwmon_number(tmp_path: Path) -> None:
    names = set()
    for seed in range(4):
        fake = make_fake_board(tmp_path / str(seed), "orin-agx", "l4t35", seed=seed)
        names.add(fake.hwmon_dirs["1-0040"].name)
        assert device(fake).describe()["rails"][0] == "VDD_GPU_SOC"
    assert len(names) > 1


def test_space_is_the_board_table_intersected_with_the_search_space(board: FakeBoard) -> None:
    space = device(board).space()
    base = load_space(board.model)
    missing = 1224 if board.model == "orin-agx" else 522.75
    assert missing in base.knobs["gpu_mhz"].values
    assert missing not in space.knobs["gpu_mhz"].values
    assert set(space.knobs["gpu_mhz"].values) == set(base.knobs["gpu_mhz"].values) - {missing}
    assert space.knobs["cpu_mhz"].values == base.knobs["cpu_mhz"].values
    assert space.knobs["gpu_mhz"].default == base.knobs["gpu_mhz"].default


def test_missing_board_is_a_one_line_user_error(tmp_path: Path, board: FakeBoard) -> None:
    with pytest.raises(UserError, match="no Jetson board found") as err:
        JetsonDevice("orin-agx", sysfs_root=tmp_path / "empty", nvpmodel=str(board.nvpmodel))
    assert "\n" not in str(err.value)
    with pytest.raises(UserError, match="nvpmodel not found"):
        JetsonDevice(board.model, sysfs_root=board.root, nvpmodel=str(tmp_path / "no-such-nvpmodel"))


def test_environment_points_at_the_board(board: FakeBoard, monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in board.env().items():
        monkeypatch.setenv(key, value)
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
    assert int((board.gpu_dir / "max_freq").read_text()) == round(CONFIGS[board.model]["gpu_mhz"] * 1e6)
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
            knobs={
                "nvpmodel": "15W",
                "gpu_mhz": 1300.5,
                "emc_mhz": 3199,
                "cpu_cores": 12,
                "cpu_mhz": 2201.6,
            },
            batch_size=1,
        )
    )
    assert fake.read("sys/devices/gpu.0/tpc_pg_mask") == "248"
    assert int((fake.gpu_dir / "max_freq").read_text()) == 408000000  # the 15W cap, on the 102 MHz grid
    assert fake.read("sys/devices/system/cpu/cpu0/cpufreq/scaling_max_freq") == "1036800"  # under the 1113.6 MHz cap
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
    missing = 1224 if board.model == "orin-agx" else 522.75
    with pytest.raises(UserError, match="gpu_mhz"):
        device(board).apply(config(board, gpu_mhz=missing))
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


def _child(board: FakeBoard, tmp_path: Path) -> subprocess.Popen[str]:
    script = tmp_path / "child.py"
    script.write_text(
        textwrap.dedent(f"""
        import time
        from tuner.devices.jetson import JetsonDevice
        from tuner.devices.journal import hardware_session
        from tuner.space import Config
        dev = JetsonDevice(
            {board.model!r}, sysfs_root={str(board.root)!r}, nvpmodel={str(board.nvpmodel)!r}
        )
        with hardware_session(dev):
            dev.apply(Config(knobs={CONFIGS[board.model]!r}, batch_size=8))
            print("applied", flush=True)
            time.sleep(60)
    """)
    )
    env = {**os.environ, "PYTHONPATH": str(REPO), "TUNE_STATE_DIR": os.environ["TUNE_STATE_DIR"]}
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "applied"
    return proc


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


def test_sigterm_mid_trial_restores_by_itself(board: FakeBoard, tmp_path: Path) -> None:
    before = board.snapshot()
    proc = _child(board, tmp_path)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) != 0
    assert board.snapshot() == before
    assert pending_journals() == []


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
        pytest.skip("jetson-stats is installed here")
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


@pytest.mark.parametrize("kind", ["orin-nano", "xavier-agx", "tx2"])
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
    with pytest.raises(ApplyError, match="restore incomplete: nvpmodel did not switch"):
        dev.restore(state)
    after = board.snapshot()
    for rel in before:
        if rel.endswith(("/online", "scaling_min_freq", "scaling_max_freq", "clk/emc/rate")):
            assert after[rel] == before[rel], rel


def test_live_board_moves_its_rails_after_direct_writes(tmp_path: Path) -> None:
    fake = make_fake_board(tmp_path, "orin-agx", "l4t35")
    dev = device(fake)
    dev.apply(config(fake))
    settled = fake.rail_watts()
    with fake.live():
        dev.apply(config(fake, gpu_mhz=306))
        deadline = time.monotonic() + 10
        while fake.rail_watts() == settled and time.monotonic() < deadline:
            time.sleep(0.02)
    assert fake.rail_watts()["VDD_GPU_SOC"] < settled["VDD_GPU_SOC"]
