"""L4T 32 boards (JetPack 4): the ina3221x IIO rails, AGX Xavier's one DLA_CORE cap, the 4.9 kernel's limits.

The fake AGX Xavier and TX2 of tests/fakes/fakeboard.py lay out what jetson-stats (jtop/core/power.py) and Zeus
(zeus/device/soc/jetson.py) read on these boards: ``rail_name_N`` and ``in_powerN_input`` (mW) under
/sys/bus/i2c/drivers/ina3221x/*/iio:device*. The TX2's VDD_IN feeds the module, so the other rails are part
of it and only VDD_IN is the total; AGX Xavier's six rails are parallel and are summed.
"""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest
from clirun import in_process
from fakeboard import FakeBoard, as_user, make_fake_board, quick_window

from tuner.devices.jetson import JetsonDevice, sysfs
from tuner.devices.jetson.clocks import ClockMonitor
from tuner.space import Config


@pytest.fixture(autouse=True)
def _state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TUNE_STATE_DIR", str(tmp_path / "state"))


def _installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, model: str) -> FakeBoard:
    fake = make_fake_board(tmp_path / "board", model, "l4t32", seed=4).install(monkeypatch)
    monkeypatch.setattr(JetsonDevice, "_window", quick_window)
    return fake


def test_a_tx2_meters_its_input_rail_alone_not_it_and_its_parts(tmp_path: Path, monkeypatch) -> None:
    board = _installed(tmp_path, monkeypatch, "tx2")
    before = board.snapshot()
    watts = board.rail_watts()  # the rails hold still: no window here moves the fake's sensors
    out = tmp_path / "studies"
    run = ("run", "-m", "tiny-cnn", "-d", "tx2", "--max-latency", "500ms", "--knobs", "gpu_mhz", "--batch-sizes", "1")
    code, stdout, stderr = in_process(*run, "--trials", "1", "--seed", "0", "--out", str(out), "--json")
    assert code == 0, stderr
    best = json.loads(stdout)["best"]
    assert best["meter"] == "ina3221"
    assert best["avg_w"] == pytest.approx(watts["VDD_IN"], rel=1e-6)  # not VDD_IN plus the rails inside it
    assert sum(watts.values()) > 1.5 * watts["VDD_IN"]
    assert board.snapshot() == before


def test_an_agx_xavier_sums_its_parallel_rails_and_they_need_root(tmp_path: Path, monkeypatch) -> None:
    board = _installed(tmp_path, monkeypatch, "xavier-agx")
    dev = JetsonDevice("xavier-agx", sysfs_root=board.root, nvpmodel=str(board.nvpmodel))
    meter = dev.make_meter()
    assert meter.rails == ["GPU", "CPU", "SOC", "CV", "VDDRQ", "SYS5V"] and "not wall power" in meter.warning
    meter.start()
    reading = meter.stop()
    assert reading.avg_w == pytest.approx(sum(board.rail_watts().values()), rel=1e-6)
    as_user(monkeypatch)
    code, _stdout, stderr = in_process(
        "run", "-m", "tiny-cnn", "-d", "xavier", "--max-latency", "500ms", "--knobs", "gpu_mhz", "--trials", "1"
    )
    assert code == 2 and "Traceback" not in stderr
    assert "sudo" in next(line for line in stderr.splitlines() if "needs root" in line)


def test_agx_xavier_caps_both_dlas_through_one_dla_core_section(tmp_path: Path, monkeypatch) -> None:
    """nvpmodel_t194's L4T 32 DLA_CORE section (/sys/kernel/nvpmodel_emc_cap/nafll_dla); BPMP's nafll_dla ran."""
    board = _installed(tmp_path, monkeypatch, "xavier-agx")
    dev = JetsonDevice("xavier-agx", sysfs_root=board.root, nvpmodel=str(board.nvpmodel))
    assert [p.name for p in dev.board.dla_caps] == ["nafll_dla"]
    assert {m.name: m.dla_max_hz for m in dev.board.modes}["MODE_15W"] == 750000000
    dev.use_runtime("tensorrt")
    assert "dla_mhz" in dev.space().knobs
    state = dev.read_state()
    before = board.snapshot()
    dev.apply(Config(knobs={**dev.space().default_config().knobs, "dla_mhz": 550}, batch_size=1))
    assert board.read("sys/kernel/nvpmodel_emc_cap/nafll_dla") == "550000000"
    monitor = ClockMonitor(dev.board.clocks)  # type: ignore[arg-type]
    monitor.start()
    assert monitor.stop().extras()["dla_mhz_max"] == 550
    dev.restore(state)
    assert board.snapshot() == before


def test_a_crossing_write_is_refused_on_l4t32(tmp_path: Path) -> None:
    """L4T 32's 4.9 kernel: a max below the min is EINVAL (devfreq max_freq_store), nothing changes."""
    fake = make_fake_board(tmp_path / "board", "xavier-agx", "l4t32", seed=2, start="MAXN")
    gpu = fake.gpu_dir
    sysfs.write(fake.root, gpu / "min_freq", "675750000")
    with pytest.raises(sysfs.BoardWriteError) as refused:
        sysfs.write(fake.root, gpu / "max_freq", "318750000")
    assert refused.value.errno == errno.EINVAL
    assert fake.read(f"{gpu.relative_to(fake.root)}/min_freq") == "675750000"
