"""Deploy formats and persistence: one study's answer on fake AGX Orins (L4T 35 and 36), and an observe-only GPU.

The study is a digital twin's (sim:orin, kind orin-agx); its export is
applied to fake boards laid out as the real releases are (tests/fakes/fakeboard.py).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from clirun import in_process
from fakeboard import make_fake_board
from fakenvml import FakeNVML
from locations import REPO

from tuner.deploy import apply_export, load_export
from tuner.deploy.formats import FORMATS, LIMITS
from tuner.devices.jetson.modes import parse_nvpmodel_conf
from tuner.devices.jetson.nvpconf import read_conf, render_mode, with_mode
from tuner.devices.nvml.device import NvmlDevice
from tuner.devices.virtual.twin import TwinDevice
from tuner.errors import UserError

LAYOUTS = ["l4t35", "l4t36"]


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> Path:
    """A short twin study of resnet50 on sim:orin (the fake boards run the twin's 102 MHz GPU grid)."""
    out = tmp_path_factory.mktemp("study")
    code, _, err = in_process(
        "run", "-m", "resnet50", "-d", "sim:orin", "-l", "50ms", "--trials", "8", "--seed", "3", "--out", str(out)
    )
    assert code == 0, err
    return out


def board(tmp_path: Path, layout: str, monkeypatch):
    """A board in MAXN: the twin study's answer is a mode of MAXN's TPC mask (another would need a reboot)."""
    fake = make_fake_board(tmp_path / "board", "orin-agx", layout, seed=4, grid="jp6", start="MAXN")
    return fake.install(monkeypatch)


def export(study: Path, output: Path, *formats: str) -> tuple[int, str, str]:
    return in_process(
        "export", "-m", "resnet50", "-d", "sim:orin", "-l", "50ms", "--out", str(study), "-o", str(output),
        "-f", ",".join(formats),
    )  # fmt: skip


@pytest.mark.parametrize("layout", [*LAYOUTS, "l4t36.3"])
def test_every_format_from_one_answer_and_the_nvpmodel_block_is_the_boards(study, tmp_path, monkeypatch, layout):
    fake = board(tmp_path, layout, monkeypatch)
    code, _out, err = export(study, tmp_path / "best.yaml", *FORMATS)
    assert code == 0, err
    files = {fmt: tmp_path / f"best{suffix}" for fmt, suffix in (
        ("yaml", ".yaml"), ("nvpmodel", ".conf"), ("triton", ".pbtxt"), ("trtexec", ".sh"), ("env", ".env"),
        ("json", ".json"),
    )}  # fmt: skip
    exported = load_export(files["yaml"], sealed=True)
    for fmt, path in files.items():
        assert LIMITS[fmt] in path.read_text(), fmt  # each says what it cannot express
    triton = files["triton"].read_text()
    assert f"max_batch_size: {exported.batch_size}" in triton
    assert f"preferred_batch_size: [ {exported.batch_size} ]" in triton and "max_queue_delay_microseconds: " in triton
    trt = files["trtexec"].read_text()
    assert f"--maxShapes=x:{exported.batch_size}x3x224x224" in trt and "--minShapes=x:1x3x224x224" in trt
    assert f"POWERTUNE_BATCH_SIZE={exported.batch_size}" in files["env"].read_text()

    # The block reads back with the board's own reader, beside the board's modes, with a fresh ID.
    conf_text = (fake.root / "etc/nvpmodel/nvpmodel_p3701_0005.conf").read_text()
    block = files["nvpmodel"].read_text()
    mode = read_conf(block).modes[0]
    assert mode.id not in [m.id for m in read_conf(conf_text).modes]
    modes, _default = parse_nvpmodel_conf(with_mode(conf_text, mode, default=False))
    tuned = next(m for m in modes if m.id == mode.id)
    knobs = exported.knobs
    assert tuned.cores == knobs["cpu_cores"]
    assert tuned.gpu_max_hz == round(float(knobs["gpu_mhz"]) * 1e6)
    assert tuned.cpu_max_khz == round(float(knobs["cpu_mhz"]) * 1000)
    assert render_mode(mode) in block

    # The fake board's nvpmodel takes a conf holding it (nvpmodel -f) and sets the tuned clocks.
    (fake.root / "etc/nvpmodel/trial.conf").write_text(with_mode(conf_text, mode, default=False))
    proc = subprocess.run(
        [str(fake.nvpmodel), "-f", "/etc/nvpmodel/trial.conf", "-m", str(mode.id)], capture_output=True, text=True,
        env={**fake.env(), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert fake.read(f"{fake.gpu_dir.relative_to(fake.root)}/max_freq") == str(round(float(knobs["gpu_mhz"]) * 1e6))
    online = [fake.read(f"sys/devices/system/cpu/cpu{c}/online") for c in range(1, 12)]
    assert online.count("1") + 1 == knobs["cpu_cores"]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_persist_survives_a_reboot_and_restore_puts_the_board_back_byte_for_byte(study, tmp_path, monkeypatch, layout):
    fake = board(tmp_path, layout, monkeypatch)
    assert in_process(*["export", "-m", "resnet50", "-d", "sim:orin", "-l", "50ms", "--out", str(study),
                        "-o", str(tmp_path / "best.yaml")])[0] == 0  # fmt: skip
    exported = load_export(tmp_path / "best.yaml")
    before = fake.snapshot()
    start_mode = fake.mode_id()

    code, out, err = in_process("apply", str(tmp_path / "best.yaml"), "--device", "orin-agx", "--persist")
    assert code == 0, err
    assert "stays after a" in out
    after = fake.snapshot()
    changed = {k for k in before.keys() | after.keys() if before.get(k) != after.get(k) and not k.startswith("sys/")}
    conf = "etc/nvpmodel/nvpmodel_p3701_0005.conf"
    assert changed == {conf, "var/lib/nvpmodel/status"}  # the conf and nvpmodel's own record, nothing else
    tuned_id = fake.mode_id()
    assert tuned_id != start_mode
    assert read_conf(after[conf].decode()).default == tuned_id

    fake.reboot()  # sysfs as the kernel boots it, then nvpmodel at boot
    assert fake.mode_id() == tuned_id
    gpu_hz = str(round(float(exported.knobs["gpu_mhz"]) * 1e6))
    gpu = fake.gpu_dir.relative_to(fake.root)
    assert (fake.read(f"{gpu}/min_freq"), fake.read(f"{gpu}/max_freq")) == (gpu_hz, gpu_hz)
    online = [fake.read(f"sys/devices/system/cpu/cpu{c}/online") for c in range(1, 12)]
    assert online.count("1") + 1 == exported.knobs["cpu_cores"]
    cpu_khz = str(round(float(exported.knobs["cpu_mhz"]) * 1000))
    assert fake.read("sys/devices/system/cpu/cpufreq/policy0/scaling_max_freq") == cpu_khz

    code, _, err = in_process("restore")  # a persisted mode is removed only when asked
    assert code == 2 and "--persist" in err and len(err.strip().splitlines()) == 1
    code, out, err = in_process("restore", "--persist")
    assert code == 0, err
    assert fake.snapshot() == before
    assert fake.mode_id() == start_mode


def test_persist_is_refused_where_it_cannot_be_kept(study, tmp_path, monkeypatch):
    board(tmp_path, "l4t36", monkeypatch)
    assert export(study, tmp_path / "best.yaml", "yaml")[0] == 0
    with pytest.raises(UserError, match="not a Jetson board"):  # the export's own device: a twin
        apply_export(load_export(tmp_path / "best.yaml"), TwinDevice("sim:orin"), persist=True)
    assert in_process("apply", str(tmp_path / "best.yaml"), "--device", "orin-agx")[0] == 0
    code, _, err = in_process("apply", str(tmp_path / "best.yaml"), "--device", "orin-agx", "--persist")
    assert code == 2 and "tune restore" in err  # a plain apply is in force: restore first
    assert in_process("restore")[0] == 0


def test_tampered_export_is_refused_in_one_line(study, tmp_path, monkeypatch):
    board(tmp_path, "l4t36", monkeypatch)
    assert export(study, tmp_path / "best.yaml", "yaml")[0] == 0
    path = tmp_path / "best.yaml"
    text = path.read_text()
    path.write_text(text.replace("batch_size: ", "batch_size: 1", 1))
    code, _out, err = in_process("apply", str(path), "--device", "orin-agx", "--dry-run")
    assert code == 2 and "changed after export" in err and len(err.strip().splitlines()) == 1


def test_observe_only_gpu_dry_run_says_what_it_cannot_apply_and_what_the_runtime_needs():
    exported = load_export(REPO / "studies/h200/resnet50/best.yaml")  # a real H200 study's answer
    nvml = FakeNVML()
    device = NvmlDevice(0, nvml=nvml)
    plan = apply_export(exported, device, dry_run=True)
    assert plan.writes == []
    # the file's sm_mhz/mem_mhz are the applications clocks the old tool pinned, not clocks that ran: never applied
    assert {k for k, _tuned, _now in plan.cannot_apply} == {"power_limit_w"}
    assert plan.unlocked == ["sm_mhz", "mem_mhz"]
    assert plan.runtime["batch_size"] == exported.batch_size and plan.runtime["precision"] == "fp16"
    assert "sm_mhz" not in plan.runtime
    assert nvml.write_attempts == []


def test_an_observe_only_export_applied_with_clock_changes_locks_no_clock():
    old = load_export(REPO / "studies/h200/resnet50/best.yaml")  # observe-only: sm_mhz 1980 never ran locked
    # the runner knobs the H200 space has gained since that study, at their defaults
    exported = old.model_copy(update={"knobs": {**old.knobs, "channels_last": True, "graph": "eager"}})
    nvml = FakeNVML()
    device = NvmlDevice(0, allow_clock_changes=True, nvml=nvml)
    plan = apply_export(exported, device)
    assert plan.unlocked == ["sm_mhz", "mem_mhz"]
    assert [fn for fn, _ in nvml.write_attempts] == ["nvmlDeviceSetPowerManagementLimit"]
    assert nvml.locked_sm is None and nvml.locked_mem is None
