"""What a Jetson board is, read from the board: its sysfs files, its tables, its nvpmodel modes.

Nothing here is assumed from a table written in advance:

- The GPU is the devfreq device whose device-tree node is named ``gpu``,
  ``ga10b``, ``gv11b`` or ``gp10b`` (``/sys/class/devfreq/*/device/of_node/name``,
  NUL-terminated as device-tree strings are); other devfreq devices (VIC,
  NVDEC, ...) sort before it and are skipped. Its device folder (the
  ``device`` link) holds ``tpc_pg_mask`` and ``railgate_enable`` on every
  release, so those are found beside the GPU rather than at a fixed path.
  Known node paths are the fallback where /sys/class/devfreq is missing.
- The L4T release comes from ``/etc/nv_tegra_release`` and the board's name
  from ``/proc/device-tree/model``; the GPU node's layout is named from its
  path relative to the sysfs root (never from the root itself).
- The power modes, with the cores, CPU/GPU/EMC caps and TPC mask each one
  sets, come from ``/etc/nvpmodel.conf`` (usually an absolute link into
  ``/etc/nvpmodel/``, followed inside the sysfs root).
- Frequency tables: GPU ``available_frequencies``, each cpufreq policy's
  ``scaling_available_frequencies``, the EMC's debugfs ``possible_rates``.
- The DLA clock caps nvpmodel writes (:mod:`.dla`); a board without them has
  no DLA knobs.

:func:`tuner.devices.jetson.spaces.board_space` turns these into the search space, keeping the committed
YAML only for what the board does not say (batch sizes, core counts worth
trying) and saying in one line where the two disagree; :mod:`.modes` reads the
nvpmodel modes.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from tuner.devices.jetson.clocks import ClockFiles, find_clock_files
from tuner.devices.jetson.dla import find_caps
from tuner.devices.jetson.modes import NVPMODEL_CONF, BoardMode, conf_path, read_modes
from tuner.devices.jetson.sysfs import can_read, denied, inside, ints, is_file, read
from tuner.errors import UserError

GPU_NODE_NAMES = ("gpu", "ga10b", "gv11b", "gp10b")
# Where the GPU devfreq node sits when /sys/class/devfreq cannot be listed,
# relative to the sysfs root, newest releases first.
GPU_DEVFREQ_CANDIDATES = (
    "sys/devices/platform/17000000.gpu/devfreq_dev",
    "sys/devices/platform/bus@0/17000000.gpu/devfreq/17000000.gpu",
    "sys/devices/17000000.ga10b/devfreq/17000000.ga10b",
    "sys/devices/17000000.gv11b/devfreq/17000000.gv11b",
    "sys/devices/17000000.gp10b/devfreq/17000000.gp10b",
)
EMC_CAP_CANDIDATES = ("sys/kernel/nvpmodel_clk_cap/emc", "sys/kernel/nvpmodel_emc_cap/emc_iso_cap")
EMC_CLK = "sys/kernel/debug/bpmp/debug/clk/emc"
EMC_RATES = "sys/kernel/debug/bpmp/debug/emc/possible_rates"
CPU_BASE = "sys/devices/system/cpu"
INA3221_GLOB = "sys/bus/i2c/drivers/ina3221/*/hwmon/hwmon*"
INA3221X_GLOB = "sys/bus/i2c/drivers/ina3221x/*/iio:device*"
THERMAL_BASE = "sys/class/thermal"
# PMIC-Die reports a fixed 100 C on several Jetsons; it is not a temperature.
IGNORED_ZONES = re.compile(r"pmic", re.IGNORECASE)
COMPATIBLE = "proc/device-tree/compatible"
MODEL = "proc/device-tree/model"
RELEASE = "etc/nv_tegra_release"

# Module part numbers in the device tree's compatible string, per space.
MODULES = {
    "p3701": "orin-agx",
    "p3767-0000": "orin-nx",
    "p3767-0001": "orin-nx",
    "p3767": "orin-nano",
    "p2888": "xavier-agx",
    "p2972": "xavier-agx",
    "p3310": "tx2",
    "p3489": "tx2",
    "p2771": "tx2",
}
# Checked in this order, so the Orin NX SKUs of p3767 (0000: 16 GB, 0001: 8 GB; NVIDIA's
# nvpmodel_p3767_0000.conf) come before the Orin Nano ones (0003-0005). p2972 and p2771 are the
# AGX Xavier and TX2 developer kits' carrier boards, the compatible strings of mainline's
# tegra194-p2972-0000.dts and tegra186-p2771-0000.dts.
MODEL_NAMES = {
    "orin-agx": "AGX Orin",
    "orin-nano": "Orin Nano",
    "orin-nano-super": "Orin Nano Super",
    "orin-nx": "Orin NX",
    "xavier-agx": "AGX Xavier",
    "tx2": "TX2",
}


@dataclass
class Policy:
    """One cpufreq policy (a CPU cluster): the CPUs it covers and its frequency files."""

    cpu: int
    cpus: list[int]
    folder: Path
    available_khz: list[int]

    @property
    def min_path(self) -> Path:
        return self.folder / "scaling_min_freq"

    @property
    def max_path(self) -> Path:
        return self.folder / "scaling_max_freq"


@dataclass
class Rail:
    """One INA3221 channel, found by its label: bus voltage (mV) and current (mA), or the driver's power (mW).

    L4T 32's ``ina3221x`` IIO driver computes ``in_powerN_input`` itself, which is
    what jetson-stats (jtop/core/power.py) and Zeus (zeus/device/soc/jetson.py,
    DirectPower before VoltageCurrentProduct) read there.
    """

    name: str
    voltage: Path
    current: Path
    power: Path | None = None

    def files(self) -> list[Path]:
        return [self.power] if self.power is not None else [self.voltage, self.current]

    def watts(self) -> float:
        if self.power is not None:
            return int(read(self.power)) / 1e3
        return int(read(self.voltage)) * int(read(self.current)) / 1e6


@dataclass
class Board:
    """What discovery found under a sysfs root."""

    root: Path
    layout: str
    release: str
    model: str
    gpu: Path
    gpu_device: Path
    gpu_hz: list[int]
    policies: list[Policy]
    online: dict[int, Path]
    emc_cap: Path | None
    emc_rate: Path | None
    emc_locked: Path | None
    emc_hz: list[int]
    tpc_mask: Path | None
    railgate: Path | None
    rails: list[Rail]
    zones: dict[str, Path]
    modes: list[BoardMode]
    default_mode: int | None
    dla_caps: list[Path] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    clocks: ClockFiles | None = None
    root_only: dict[str, Path] = field(default_factory=dict)

    @property
    def cpus(self) -> int:
        return 1 + len(self.online)

    @property
    def cpu_khz(self) -> list[int]:
        """The frequencies every cluster offers (the CPU knob sets all clusters alike)."""
        return sorted(set.intersection(*(set(p.available_khz) for p in self.policies)))

    @property
    def title(self) -> str:
        """How a user recognises the board: its device-tree model and L4T release."""
        return f"{self.model or 'Jetson board'} ({self.release})"


def _rel(root: Path, path: Path) -> str:
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        return path.as_posix()


def _find_gpu(root: Path) -> tuple[Path, Path] | None:
    """The GPU's devfreq folder and its device folder (see the module docstring)."""
    classes = root / "sys/class/devfreq"
    if classes.is_dir():
        for entry in sorted(classes.iterdir()):
            name_file = entry / "device" / "of_node" / "name"
            if not is_file(name_file) or read(name_file) not in GPU_NODE_NAMES:
                continue
            if is_file(entry / "max_freq") and inside(root, entry) and inside(root, entry / "device"):
                return Path(os.path.realpath(entry)), Path(os.path.realpath(entry / "device"))
    for rel in GPU_DEVFREQ_CANDIDATES:
        node = root / rel
        if is_file(node / "max_freq") and inside(root, node):
            device = root / rel.split("/devfreq")[0]
            return Path(os.path.realpath(node)), Path(os.path.realpath(device))
    return None


def _layout(root: Path, gpu_device: Path) -> str:
    """The GPU node's layout, named from its path under the root (L4T 35, 36.3 bus@0, 36.4+)."""
    rel = _rel(Path(os.path.realpath(root)), gpu_device)
    if rel.startswith("sys/devices/platform/bus@0/"):
        return "l4t36.3"
    if rel.startswith("sys/devices/platform/"):
        return "l4t36.4"
    return "l4t35"


def read_release(root: Path) -> str:
    """``L4T 36.4.0`` from /etc/nv_tegra_release (``# R36 (release), REVISION: 4.0, ...``)."""
    path = root / RELEASE
    if not is_file(path):
        return "L4T release unknown"
    match = re.search(r"R(\d+)\s*\(release\),\s*REVISION:\s*([\d.]+)", read(path))
    return f"L4T {match.group(1)}.{match.group(2)}" if match else "L4T release unknown"


def detect_kind(root: Path) -> str | None:
    """The search space of the module the device tree names, or None where it says nothing known.

    An Orin Nano is a Super (:func:`is_super`) by its board identity or its nvpmodel conf.
    """
    path = root / COMPATIBLE
    if not is_file(path):
        return None
    text = path.read_bytes().decode(errors="replace")
    for part, kind in MODULES.items():
        if part in text:
            return "orin-nano-super" if kind == "orin-nano" and is_super(root, text) else kind
    return None


def is_super(root: Path, compatible: str) -> bool:
    """Whether an Orin Nano runs JetPack 6.2's Super modes (the same module: a firmware and conf unlock).

    Any of three signs: the device tree flashed from the ``-super`` board config names the module
    ``p3767-000N-super`` first in its compatible string (``nvidia,p3768-0000+p3767-0005-super`` on a
    devkit moved to the Super identity, a public write-up of NVIDIA forum thread "25w and MAXN SUPER
    not seen in jetpack 7.2"); /etc/nvpmodel.conf, which the boot re-links from that identity,
    resolves to ``nvpmodel_p3767_000N_super.conf`` (the conf that carries 25W and MAXN_SUPER;
    LineageOS android_device_nvidia_concord ships it beside the stock one); or the conf nvpmodel reads
    has a MAXN_SUPER mode (public setup notes copy the Super conf over /etc/nvpmodel.conf instead).
    """
    if re.search(r"p3767-000[345]-super", compatible):
        return True
    conf = conf_path(root)
    if conf is None:
        return False
    if re.fullmatch(r"nvpmodel_p3767_000[345]_super\.conf", conf.name):
        return True
    modes, _default, _path = read_modes(root)
    return any(m.name == "MAXN_SUPER" for m in modes)


def board_title(root: Path) -> str:
    """The device-tree model and L4T release, for ``tune devices`` (no discovery needed)."""
    model = read(root / MODEL) if is_file(root / MODEL) else ""
    return f"{model or 'Jetson board'} ({read_release(root)})"


def find_rails(root: Path) -> list[Rail]:
    """The board's INA3221 channels by label, in either driver's layout.

    L4T 35/36 (mainline hwmon ``ina3221``): ``in[123]_label``, ``in[123]_input``
    (mV) and ``curr[123]_input`` (mA); in4-in6 are shunt voltages, in7 and curr4
    the sums of the three channels (kernel Documentation/hwmon/ina3221.rst), so
    only channels 1-3 are rails, as jetson-stats skips in7 ("sum of shunt
    voltages"). L4T 32 (``ina3221x`` IIO): ``rail_name_N``, ``in_powerN_input``
    (mW), ``in_voltageN_input``, ``in_currentN_input``, channels from 0. Unused
    channels are labelled NC.
    """
    rails: list[Rail] = []
    for hwmon in sorted(root.glob(INA3221_GLOB)):
        for channel in ("1", "2", "3"):
            label = hwmon / f"in{channel}_label"
            name = read(label) if is_file(label) else ""
            voltage, current = hwmon / f"in{channel}_input", hwmon / f"curr{channel}_input"
            if name and name != "NC" and is_file(voltage) and is_file(current):
                rails.append(Rail(name, voltage, current))
    for iio in sorted(root.glob(INA3221X_GLOB)):
        for label in sorted(iio.glob("rail_name_[0-9]")):
            channel = label.name[len("rail_name_") :]
            name = read(label)
            power = iio / f"in_power{channel}_input"
            voltage, current = iio / f"in_voltage{channel}_input", iio / f"in_current{channel}_input"
            if name and name != "NC" and is_file(power):
                rails.append(Rail(name, voltage, current, power))
    return rails


def discover(root: Path) -> Board:
    """Find every file the backend needs; no GPU devfreq node means no Jetson board here."""
    found = _find_gpu(root)
    if found is None:
        raise UserError(
            f"no Jetson board found under {root}: no GPU devfreq node "
            f"(e.g. {GPU_DEVFREQ_CANDIDATES[0]}); "
            "run on the board, or point --sysfs-root / TUNE_SYSFS_ROOT at its sysfs tree"
        )
    gpu, gpu_device = found
    notes: list[str] = []
    gpu_hz = ints(read(gpu / "available_frequencies"))

    cpu_base = root / CPU_BASE
    policies: list[Policy] = []
    covered: set[int] = set()
    online: dict[int, Path] = {}
    cpu_dirs = sorted(
        (p for p in cpu_base.glob("cpu[0-9]*") if p.name[3:].isdigit()),
        key=lambda p: int(p.name[3:]),
    )
    # A policy's own folder (cpufreq/policyN) outlives its CPUs going offline;
    # the cpuN/cpufreq links lead to it too, so the policy folder is preferred.
    policy_dirs = sorted(
        (p for p in (cpu_base / "cpufreq").glob("policy[0-9]*") if p.name[6:].isdigit()),
        key=lambda p: int(p.name[6:]),
    )
    candidates = [(int(p.name[6:]), p) for p in policy_dirs]
    candidates += [(int(folder.name[3:]), folder / "cpufreq") for folder in cpu_dirs]
    for folder in cpu_dirs:
        cpu = int(folder.name[3:])
        if is_file(folder / "online") and cpu != 0:
            online[cpu] = folder / "online"
    for cpu, freq in candidates:
        if cpu in covered or not is_file(freq / "scaling_available_frequencies"):
            continue
        related = freq / "related_cpus"
        cpus = ints(read(related)) if is_file(related) else [cpu]
        covered.update(cpus)
        folder = Path(os.path.realpath(freq)) if inside(root, freq) else freq
        policies.append(Policy(cpu, cpus, folder, ints(read(freq / "scaling_available_frequencies"))))
    if not policies:
        raise UserError(f"no cpufreq policy found under {cpu_base}: is the sysfs root ({root}) a Jetson's?")

    emc_cap = next((root / c for c in EMC_CAP_CANDIDATES if is_file(root / c)), None)
    emc_rate: Path | None = root / EMC_CLK / "rate"
    emc_locked: Path | None = root / EMC_CLK / "mrq_rate_locked"
    emc_hz: list[int] = []
    root_only: dict[str, Path] = {}
    if emc_rate is not None and emc_locked is not None and can_read(emc_rate) and can_read(emc_locked):
        rates = root / EMC_RATES
        emc_hz = [k * 1000 for k in ints(read(rates))] if can_read(rates) else []
    elif denied(root / EMC_CLK / "rate"):
        root_only["emc_mhz"] = root / EMC_CLK / "rate"
        emc_rate = emc_locked = None
        notes.append(f"EMC rate is not settable: {root / EMC_CLK} (BPMP debugfs) is readable by root only")
    else:
        emc_rate = emc_locked = None
        notes.append(f"EMC rate is not settable: {root / EMC_CLK} is missing (debugfs not mounted)")

    rails = find_rails(root)

    zones: dict[str, Path] = {}
    for zone in sorted((root / THERMAL_BASE).glob("thermal_zone*")):
        if is_file(zone / "type") and is_file(zone / "temp"):
            kind = read(zone / "type")
            if not IGNORED_ZONES.search(kind):
                zones[kind] = zone / "temp"

    modes, default_mode, conf = read_modes(root)
    dla_caps = find_caps(root, Path(conf).read_text(errors="replace") if conf else None)
    if conf is None:
        notes.append(f"no {NVPMODEL_CONF} under {root}: power modes are taken from the search space file")
    tpc, railgate = gpu_device / "tpc_pg_mask", gpu_device / "railgate_enable"
    cpufreq_dirs = {int(f.name[3:]): f / "cpufreq" for f in cpu_dirs if (f / "cpufreq").is_dir()}
    clocks = find_clock_files(root, gpu, cpufreq_dirs, online)
    return Board(
        root=root,
        layout="l4t32" if read_release(root).startswith("L4T 32.") else _layout(root, gpu_device),
        release=read_release(root),
        model=read(root / MODEL) if is_file(root / MODEL) else "",
        gpu=gpu,
        gpu_device=gpu_device,
        gpu_hz=gpu_hz,
        policies=policies,
        online=online,
        emc_cap=emc_cap,
        emc_rate=emc_rate,
        emc_locked=emc_locked,
        emc_hz=emc_hz,
        tpc_mask=tpc if is_file(tpc) else None,
        railgate=railgate if is_file(railgate) else None,
        rails=rails,
        zones=zones,
        modes=modes,
        default_mode=default_mode,
        dla_caps=dla_caps,
        notes=notes,
        clocks=clocks,
        root_only=root_only,
    )
