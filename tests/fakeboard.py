"""A fake Jetson sysfs tree and a fake ``nvpmodel``, faithful enough to test the Jetson backend.

No board is at hand, so the backend is tested against this tree, laid out as
on a real AGX Orin or Orin Nano (L4T 35 or L4T 36 GPU devfreq paths, cpufreq
policies per cluster, CPU online files, EMC cap and debugfs rate, TPC mask,
INA3221 hwmon folders at a random hwmonN, thermal zones). The fake
``nvpmodel`` is a Python script written into the tree: ``-m ID`` moves the
caps, clamps min/max frequencies, sets cores online and the TPC mask from the
same search space the tuner uses, and persists the mode; ``-q`` prints like
the real tool. Rails are derived from the current clocks whenever the fake
``nvpmodel`` runs or :meth:`FakeBoard.refresh` is called, so a meter reads a
plausible, configuration-dependent, non-zero power.

Usable from tests and from end-to-end CLI tests: point TUNE_SYSFS_ROOT and
TUNE_NVPMODEL at ``board.root`` and ``board.nvpmodel`` (see :meth:`FakeBoard.env`).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import random
import stat
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from tuner.space import load_space

_A78AE_KHZ = [
    115200,
    192000,
    268800,
    345600,
    422400,
    499200,
    576000,
    652800,
    729600,
    806400,
    883200,
    960000,
    1036800,
    1113600,
    1190400,
    1267200,
    1344000,
    1420800,
    1497600,
    1574400,
    1651200,
    1728000,
    1804800,
    1881600,
    1958400,
    2035200,
    2112000,
    2188800,
    2201600,
]

# Per model: CPU clusters, TPCs, the board's frequency tables, INA3221 channels,
# thermal zones. GPU tables deliberately lack one value of the search space
# (1224 MHz on AGX Orin, 522.75 MHz on Orin Nano) so that intersecting the
# board's table with the space is observable.
BOARDS: dict[str, dict[str, Any]] = {
    "orin-agx": {
        "clusters": [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]],
        "tpcs": 8,
        "gpu_hz": [
            306000000,
            408000000,
            510000000,
            612000000,
            714000000,
            816000000,
            918000000,
            1020000000,
            1122000000,
            1300500000,
        ],
        "cpu_khz": _A78AE_KHZ,
        "emc_khz": [204000, 665600, 2133000, 3199000],
        "cpu_min_khz": 729600,
        "default_mode": 2,
        "compatible": b"nvidia,p3737-0000+p3701-0005\0nvidia,p3701-0005\0nvidia,tegra234\0",
        "ina": {
            "1-0040": {1: "VDD_GPU_SOC", 2: "VDD_CPU_CV", 3: "VIN_SYS_5V0"},
            "1-0041": {2: "VDDQ_VDD2_1V8AO"},
        },
        "zones": {
            "CPU-therm": 45.5,
            "GPU-therm": 44.0,
            "CV0-therm": 43.2,
            "SOC0-therm": 44.8,
            "Tj-therm": 46.1,
            "PMIC-Die": 100.0,
        },
    },
    "orin-nano": {
        "clusters": [[0, 1, 2, 3], [4, 5]],
        "tpcs": 4,
        "gpu_hz": [114750000, 216750000, 318750000, 420750000, 624750000],
        "cpu_khz": [f for f in _A78AE_KHZ if f <= 1497600] + [1510400],
        "emc_khz": [204000, 665600, 2133000],
        "cpu_min_khz": 729600,
        "default_mode": 0,
        "compatible": b"nvidia,p3768-0000+p3767-0005\0nvidia,p3767-0005\0nvidia,tegra234\0",
        "ina": {"1-0040": {1: "VDD_IN", 2: "VDD_CPU_GPU_CV", 3: "VDD_SOC"}},
        "zones": {"CPU-therm": 41.0, "GPU-therm": 40.5, "SOC0-therm": 40.9, "tj-therm": 42.0},
    },
}

POLICY_LAYOUTS = {
    "l4t35": "sys/devices/system/cpu/cpu{cpu}/cpufreq",
    "l4t36": "sys/devices/system/cpu/cpufreq/policy{cpu}",
}

LAYOUTS = {
    "l4t35": "sys/devices/17000000.ga10b/devfreq/17000000.ga10b",
    "l4t36": "sys/devices/platform/17000000.gpu/devfreq_dev",
}

# Files the board changes by itself (sensors, the instantaneous GPU clock):
# left out of snapshots, since no restore can or should put them back.
SENSOR_SUFFIXES = ("_input", "/temp", "/cur_freq")

_SCRIPT = r'''
"""Fake nvpmodel for tests: same options and output shape as NVIDIA's tool."""
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
CONF = json.loads((HERE / "nvpmodel.json").read_text())


def _p(rel):
    return ROOT / rel


def _read(rel):
    return _p(rel).read_text().strip()


def _write(rel, value):
    _p(rel).write_text(f"{value}\n")


def _floor(table, value):
    below = [f for f in table if f <= value]
    return max(below) if below else min(table)


def status_id():
    status = _p(CONF["status"])
    if not status.exists():
        return CONF["default_mode"]
    return int(status.read_text().strip().split(":")[1])


def set_mode(mode_id):
    mode = next((m for m in CONF["modes"] if m["id"] == mode_id), None)
    if mode is None:
        print(f"NVPM ERROR: Invalid power mode ID: {mode_id}", file=sys.stderr)
        return 1
    caps = mode["caps"]
    cores = int(caps.get("cpu_cores", CONF["cpus"]))
    for cpu in range(1, CONF["cpus"]):
        _write(f"sys/devices/system/cpu/cpu{cpu}/online", 1 if cpu < cores else 0)
    cpu_max = _floor(CONF["cpu_khz"], round(caps.get("cpu_mhz", 1e9) * 1000))
    cpu_min = min(_floor(CONF["cpu_khz"], CONF["cpu_min_khz"]), cpu_max)
    for policy in CONF["policies"]:
        base = CONF["policy_dirs"][str(policy)]
        _write(f"{base}/scaling_max_freq", cpu_max)
        _write(f"{base}/scaling_min_freq", cpu_min)
    gpu_max = _floor(CONF["gpu_hz"], round(caps.get("gpu_mhz", 1e9) * 1e6))
    _write(f"{CONF['gpu']}/max_freq", gpu_max)
    _write(f"{CONF['gpu']}/min_freq", min(CONF["gpu_hz"]))
    cap = round(caps.get("emc_mhz", 1e9) * 1e6)
    _write("sys/kernel/nvpmodel_emc_cap/emc_iso_cap", cap)
    emc = "sys/kernel/debug/bpmp/debug/clk/emc/rate"
    if _p(emc).exists():
        _write(emc, min(int(_read(emc)), _floor([k * 1000 for k in CONF["emc_khz"]], cap)))
    total = CONF["tpcs"]
    on = int(mode["tpcs"])
    _write("sys/devices/gpu.0/tpc_pg_mask", ((1 << total) - 1) & ~((1 << on) - 1))
    _p(CONF["status"]).parent.mkdir(parents=True, exist_ok=True)
    _p(CONF["status"]).write_text(f"pmode:{mode_id:04d}\n")
    refresh()
    return 0


def clocks():
    """Current clocks (GHz), online cores and active TPCs, from the files."""
    online = [0] + [c for c in range(1, CONF["cpus"])
                    if _read(f"sys/devices/system/cpu/cpu{c}/online") == "1"]
    freqs = [int(_read(f"{CONF['policy_dirs'][str(p)]}/scaling_max_freq")) / 1e6
             for p in CONF["policies"]]
    mask = int(_read("sys/devices/gpu.0/tpc_pg_mask"))
    emc = "sys/kernel/debug/bpmp/debug/clk/emc/rate"
    cap_ghz = int(_read("sys/kernel/nvpmodel_emc_cap/emc_iso_cap")) / 1e9
    tpcs = CONF["tpcs"] - bin(mask).count("1")
    return {
        "gpu": int(_read(f"{CONF['gpu']}/max_freq")) / 1e9,
        "cpu": sum(freqs) / len(freqs),
        "cores": len(online),
        "emc": int(_read(emc)) / 1e9 if _p(emc).exists() else cap_ghz,
        "tpc_share": tpcs / CONF["tpcs"],
    }


def rail_watts(c):
    gpu = 1.2 + 14.0 * c["tpc_share"] * c["gpu"] ** 2
    cpu = 0.6 + 0.45 * c["cores"] * c["cpu"] ** 2
    mem = 0.4 + 0.6 * c["emc"]
    if "VDD_IN" in CONF["rails"]:
        return {"VDD_IN": 2.0 + gpu + cpu + 2 * mem, "VDD_CPU_GPU_CV": gpu + cpu,
                "VDD_SOC": 1.0 + mem}
    return {"VDD_GPU_SOC": 2.5 + gpu, "VDD_CPU_CV": cpu, "VIN_SYS_5V0": 3.0 + mem,
            "VDDQ_VDD2_1V8AO": mem}


def refresh():
    c = clocks()
    _write(f"{CONF['gpu']}/cur_freq", int(_read(f"{CONF['gpu']}/max_freq")))
    for name, watts in rail_watts(c).items():
        folder, channel, millivolts = CONF["rails"][name]
        _write(f"{folder}/in{channel}_input", millivolts)
        _write(f"{folder}/curr{channel}_input", round(watts * 1e6 / millivolts))


def main(argv):
    if argv[:1] == ["-q"]:
        mode_id = status_id()
        name = next(m["name"] for m in CONF["modes"] if m["id"] == mode_id)
        print(f"NV Power Mode: {name}")
        print(mode_id)
        return 0
    if len(argv) == 2 and argv[0] == "-m" and argv[1].isdigit():
        if CONF.get("ignore_m"):
            return 0
        return set_mode(int(argv[1]))
    print("usage: nvpmodel [-m ID] [-q]", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
'''


@dataclass
class FakeBoard:
    """A laid-out fake board: its root, ``nvpmodel`` executable and the paths tests poke."""

    root: Path
    model: str
    layout: str
    nvpmodel: Path
    gpu_dir: Path
    hwmon_dirs: dict[str, Path]
    conf: dict[str, Any]

    def env(self) -> dict[str, str]:
        """Environment that points the tuner at this board."""
        return {"TUNE_SYSFS_ROOT": str(self.root), "TUNE_NVPMODEL": str(self.nvpmodel)}

    def path(self, rel: str) -> Path:
        return self.root / rel

    def read(self, rel: str) -> str:
        return (self.root / rel).read_text().strip()

    def snapshot(self) -> dict[str, bytes]:
        """Every configuration file's bytes (not sensors or cur_freq: the board moves those)."""
        files = {}
        for path in sorted(self.root.rglob("*")):
            rel = path.relative_to(self.root).as_posix()
            if path.is_file() and not rel.startswith("etc/") and not rel.endswith(SENSOR_SUFFIXES):
                files[rel] = path.read_bytes()
        return files

    def _module(self) -> ModuleType:
        loader = importlib.machinery.SourceFileLoader("fake_nvpmodel", str(self.nvpmodel))
        module = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
        loader.exec_module(module)
        return module

    def refresh(self) -> None:
        """Recompute rails and cur_freq from the current clocks, as the sensors would show."""
        self._module().refresh()

    def rail_watts(self) -> dict[str, float]:
        """What the rails read now, in watts."""
        out = {}
        for name, (folder, channel, _mv) in self.conf["rails"].items():
            mv = int(self.read(f"{folder}/in{channel}_input"))
            ma = int(self.read(f"{folder}/curr{channel}_input"))
            out[name] = mv * ma / 1e6
        return out

    def set_rail(self, name: str, millivolts: int, milliamps: int) -> None:
        folder, channel, _mv = self.conf["rails"][name]
        (self.root / folder / f"in{channel}_input").write_text(f"{millivolts}\n")
        (self.root / folder / f"curr{channel}_input").write_text(f"{milliamps}\n")

    def set_temp(self, zone_type: str, celsius: float) -> None:
        for zone in sorted((self.root / "sys/class/thermal").glob("thermal_zone*")):
            if (zone / "type").read_text().strip() == zone_type:
                (zone / "temp").write_text(f"{round(celsius * 1000)}\n")
                return
        raise KeyError(zone_type)

    def set_nvpmodel_ignores_m(self, ignore: bool = True) -> None:
        """Make ``nvpmodel -m`` succeed without switching (a mode that needs a reboot does that)."""
        self.conf["ignore_m"] = ignore
        (self.nvpmodel.parent / "nvpmodel.json").write_text(json.dumps(self.conf))

    def mode_id(self) -> int:
        return int(self.read(self.conf["status"]).split(":")[1])

    @contextmanager
    def live(self, period_s: float = 0.02) -> Iterator[None]:
        """Refresh the sensors on a thread, so rails follow writes made by the code under test."""
        module = self._module()
        stop = threading.Event()

        def loop() -> None:
            while not stop.wait(period_s):
                module.refresh()

        thread = threading.Thread(target=loop, daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()


def _write(path: Path, value: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{value}\n")


def make_fake_board(root: Path, model: str = "orin-agx", layout: str = "l4t35", seed: int | None = None) -> FakeBoard:
    """Lay out a fake ``model`` board under ``root`` and put it in its default nvpmodel mode."""
    if model not in BOARDS:
        raise ValueError(f"unknown fake board {model!r}: choose from {', '.join(BOARDS)}")
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}: choose from {', '.join(LAYOUTS)}")
    board = BOARDS[model]
    rng = random.Random(seed)
    root = Path(root)
    space = load_space(model)
    cpus = sum(len(c) for c in board["clusters"])
    gpu = LAYOUTS[layout]

    _write(root / gpu / "available_frequencies", " ".join(map(str, board["gpu_hz"])))
    for name in ("min_freq", "max_freq", "cur_freq"):
        _write(root / gpu / name, max(board["gpu_hz"]))
    _write(root / gpu / "governor", "nvhost_podgov")

    cpu_base = root / "sys/devices/system/cpu"
    _write(cpu_base / "online", f"0-{cpus - 1}")
    for cpu in range(1, cpus):
        _write(cpu_base / f"cpu{cpu}" / "online", 1)
    policy_dirs: dict[str, str] = {}
    for cluster in board["clusters"]:
        # L4T 35 trees are laid out with cpuN/cpufreq folders (as in the reference),
        # L4T 36 ones with cpufreq/policyN folders (as the kernel's own layout).
        rel = POLICY_LAYOUTS[layout].format(cpu=cluster[0])
        policy_dirs[str(cluster[0])] = rel
        pol = root / rel
        _write(pol / "scaling_available_frequencies", " ".join(map(str, board["cpu_khz"])) + " ")
        _write(pol / "related_cpus", " ".join(map(str, cluster)))
        _write(pol / "scaling_governor", "schedutil")
        _write(pol / "scaling_min_freq", board["cpu_min_khz"])
        _write(pol / "scaling_max_freq", max(board["cpu_khz"]))

    _write(root / "sys/kernel/nvpmodel_emc_cap/emc_iso_cap", 0)
    emc = root / "sys/kernel/debug/bpmp/debug/clk/emc"
    _write(emc / "rate", max(board["emc_khz"]) * 1000)
    _write(emc / "mrq_rate_locked", 0)
    _write(
        root / "sys/kernel/debug/bpmp/debug/emc/possible_rates",
        " ".join(map(str, board["emc_khz"])),
    )
    _write(root / "sys/devices/gpu.0/tpc_pg_mask", 0)
    _write(root / "sys/devices/gpu.0/railgate_enable", 1)
    compatible = root / "proc/device-tree/compatible"
    compatible.parent.mkdir(parents=True, exist_ok=True)
    compatible.write_bytes(board["compatible"])

    rails: dict[str, list[Any]] = {}
    hwmon_dirs: dict[str, Path] = {}
    for address, channels in board["ina"].items():
        folder = f"sys/bus/i2c/drivers/ina3221/{address}/hwmon/hwmon{rng.randint(1, 9)}"
        hwmon_dirs[address] = root / folder
        _write(root / folder / "name", "ina3221")
        for channel in (1, 2, 3):
            label = channels.get(channel)
            _write(root / folder / f"in{channel}_label", label or "NC")
            _write(root / folder / f"in{channel}_input", 0)
            _write(root / folder / f"curr{channel}_input", 0)
            if label:
                rails[label] = [folder, channel, 1800 if "1V8" in label else 5000]

    for index, (zone, celsius) in enumerate(board["zones"].items()):
        folder = root / f"sys/class/thermal/thermal_zone{index}"
        _write(folder / "type", zone)
        _write(folder / "temp", round(celsius * 1000))

    modes = [
        {"id": m.id, "name": name, "caps": m.caps, "tpcs": m.properties.get("tpcs", board["tpcs"])}
        for name, m in space.modes.items()
    ]
    conf = {
        "cpus": cpus,
        "policies": [c[0] for c in board["clusters"]],
        "policy_dirs": policy_dirs,
        "cpu_khz": board["cpu_khz"],
        "gpu_hz": board["gpu_hz"],
        "emc_khz": board["emc_khz"],
        "cpu_min_khz": board["cpu_min_khz"],
        "tpcs": board["tpcs"],
        "gpu": gpu,
        "modes": modes,
        "default_mode": board["default_mode"],
        "status": "var/lib/nvpmodel/status",
        "rails": rails,
    }
    tool_dir = root / "etc" / "fake-nvpmodel"
    tool_dir.mkdir(parents=True, exist_ok=True)
    (tool_dir / "nvpmodel.json").write_text(json.dumps(conf))
    script = tool_dir / "nvpmodel"
    script.write_text(f"#!{sys.executable}\n{_SCRIPT.lstrip()}")
    script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)

    fake = FakeBoard(
        root=root,
        model=model,
        layout=layout,
        nvpmodel=script,
        gpu_dir=root / gpu,
        hwmon_dirs=hwmon_dirs,
        conf=conf,
    )
    if fake._module().set_mode(board["default_mode"]) != 0:
        raise RuntimeError("fake nvpmodel could not set the default mode")
    return fake
