"""NVIDIA Jetson backend: nvpmodel modes, CPU/GPU/EMC clocks, INA3221 rails, thermal guard.

Everything is found on the board rather than assumed: the GPU devfreq node
(L4T 35 and L4T 36 layouts), one cpufreq policy per cluster, the CPU online
files, the EMC cap and debugfs rate, the TPC mask, INA3221 channels by their
label (hwmonN changes between boots) and the thermal zones. The board's own
frequency tables are intersected with the search space, so the tuner never
asks for a clock the board does not have.

A configuration is applied in a fixed order (mode, cores, CPU clocks, GPU
clock, EMC rate) because each step constrains the next: ``nvpmodel -m`` moves
the caps and resets clocks, cores must be online before their cluster's clocks
are written. Every value is read back; a board that did not take a value fails
the trial (:class:`ApplyError`) instead of producing a measurement of some other
configuration. The sysfs root and the ``nvpmodel`` executable can be pointed
elsewhere (TUNE_SYSFS_ROOT, TUNE_NVPMODEL) for containers and the fake board
used by the tests.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from tuner.devices.base import WindowSettings
from tuner.devices.runner_cache import RunnerCache
from tuner.errors import UserError
from tuner.measure.meters import EnergyReading
from tuner.measurement import Measurement
from tuner.space import Config, Knob, SearchSpace, load_space

STATE_VERSION = 1

# GPU devfreq node, newest layouts first. L4T 35 (JetPack 5) exposes the
# ga10b device directly; L4T 36 (JetPack 6) moved it under platform/.
GPU_DEVFREQ_CANDIDATES = (
    "sys/devices/platform/17000000.gpu/devfreq_dev",
    "sys/devices/platform/bus@0/17000000.gpu/devfreq/17000000.gpu",
    "sys/devices/17000000.ga10b/devfreq/17000000.ga10b",
    "sys/devices/17000000.gv11b/devfreq/17000000.gv11b",
    "sys/devices/17000000.gp10b/devfreq/17000000.gp10b",
)
EMC_CAP_CANDIDATES = ("sys/kernel/nvpmodel_emc_cap/emc_iso_cap", "sys/kernel/nvpmodel_clk_cap/emc")
EMC_CLK = "sys/kernel/debug/bpmp/debug/clk/emc"
EMC_RATES = "sys/kernel/debug/bpmp/debug/emc/possible_rates"
TPC_MASK = "sys/devices/gpu.0/tpc_pg_mask"
CPU_BASE = "sys/devices/system/cpu"
INA3221_GLOB = "sys/bus/i2c/drivers/ina3221/*/hwmon/hwmon*"
THERMAL_BASE = "sys/class/thermal"
# PMIC-Die reports a fixed 100 C on several Jetsons; it is not a temperature.
IGNORED_ZONES = re.compile(r"pmic", re.IGNORECASE)
DEFAULT_THERMAL_LIMIT_C = 90.0
COMPATIBLE = "proc/device-tree/compatible"

# What a user may type for a Jetson device, and the search space each names.
DEVICE_KINDS = {
    "orin": "orin-agx",
    "orin-agx": "orin-agx",
    "orin-nano": "orin-nano",
    "xavier": "xavier-agx",
    "xavier-agx": "xavier-agx",
    "tx2": "tx2",
}
# Module part numbers in the device tree's compatible string, per space.
MODULES = {
    "p3701": "orin-agx",
    "p3767": "orin-nano",
    "p2888": "xavier-agx",
    "p3310": "tx2",
    "p3489": "tx2",
}
MODEL_NAMES = {
    "orin-agx": "AGX Orin",
    "orin-nano": "Orin Nano",
    "xavier-agx": "AGX Xavier",
    "tx2": "TX2",
}
JTOP_PERIOD_S = 0.5


class JetsonError(Exception):
    """A trial that must fail: the board did not take a configuration, or it ran too hot."""


class ApplyError(JetsonError):
    """The board did not take a value: read back differs, nvpmodel did not switch, write failed."""


class ThermalLimitError(JetsonError):
    """A thermal zone is above the limit: the trial is aborted and the board restored."""


class Write(NamedTuple):
    """One step of applying a configuration: a sysfs write, or the nvpmodel mode change.

    For the mode change ``path`` is the nvpmodel executable and ``value`` its
    arguments, so a dry run can print every step as the shell line it stands for.
    """

    path: str
    value: str

    def shell(self) -> str:
        if self.value.startswith("-m "):
            return f"{self.path} {self.value}"
        return f"echo {self.value} > {self.path}"


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
    """One INA3221 channel, found by its label."""

    name: str
    voltage: Path
    current: Path

    def watts(self) -> float:
        return int(_read(self.voltage)) * int(_read(self.current)) / 1e6


@dataclass
class Board:
    """What discovery found under a sysfs root."""

    root: Path
    layout: str
    gpu: Path
    gpu_hz: list[int]
    policies: list[Policy]
    online: dict[int, Path]
    emc_cap: Path | None
    emc_rate: Path | None
    emc_locked: Path | None
    emc_hz: list[int]
    tpc_mask: Path | None
    rails: list[Rail]
    zones: dict[str, Path]
    notes: list[str]


def _is_file(path: Path) -> bool:
    """Like Path.is_file, but False where a non-root user may not look (debugfs is root-only)."""
    try:
        return path.is_file()
    except OSError:
        return False


def _read(path: Path) -> str:
    return path.read_text().strip()


def _ints(text: str) -> list[int]:
    return sorted({int(tok) for tok in text.split() if tok.isdigit()})


def _floor(table: list[int], value: int) -> int:
    """The highest table entry not above ``value``: what a cap lets the board run."""
    below = [f for f in table if f <= value]
    return max(below) if below else min(table)


def discover(root: Path) -> Board:
    """Find every file the backend needs; no GPU devfreq node means no Jetson board here."""
    gpu = next((root / c for c in GPU_DEVFREQ_CANDIDATES if _is_file(root / c / "max_freq")), None)
    if gpu is None:
        raise UserError(
            f"no Jetson board found under {root}: no GPU devfreq node "
            f"(e.g. {GPU_DEVFREQ_CANDIDATES[0]}); "
            "run on the board, or point --sysfs-root / TUNE_SYSFS_ROOT at its sysfs tree"
        )
    layout = "l4t36" if "platform" in gpu.as_posix() else "l4t35"
    notes: list[str] = []
    gpu_hz = _ints(_read(gpu / "available_frequencies"))

    cpu_base = root / CPU_BASE
    policies: list[Policy] = []
    covered: set[int] = set()
    online: dict[int, Path] = {}
    cpu_dirs = sorted(
        (p for p in cpu_base.glob("cpu[0-9]*") if p.name[3:].isdigit()),
        key=lambda p: int(p.name[3:]),
    )
    # A policy's own folder (cpufreq/policyN) outlives its first CPU going
    # offline, unlike the cpuN/cpufreq link, so prefer it where the kernel has it.
    policy_dirs = sorted(
        (p for p in (cpu_base / "cpufreq").glob("policy[0-9]*") if p.name[6:].isdigit()),
        key=lambda p: int(p.name[6:]),
    )
    candidates = [(int(p.name[6:]), p) for p in policy_dirs]
    candidates += [(int(folder.name[3:]), folder / "cpufreq") for folder in cpu_dirs]
    for folder in cpu_dirs:
        cpu = int(folder.name[3:])
        if _is_file(folder / "online") and cpu != 0:
            online[cpu] = folder / "online"
    for cpu, freq in candidates:
        if cpu in covered or not _is_file(freq / "scaling_available_frequencies"):
            continue
        related = freq / "related_cpus"
        cpus = _ints(_read(related)) if _is_file(related) else [cpu]
        covered.update(cpus)
        policies.append(Policy(cpu, cpus, freq, _ints(_read(freq / "scaling_available_frequencies"))))
    if not policies:
        raise UserError(f"no cpufreq policy found under {cpu_base}: is the sysfs root ({root}) a Jetson's?")

    emc_cap = next((root / c for c in EMC_CAP_CANDIDATES if _is_file(root / c)), None)
    emc_rate = root / EMC_CLK / "rate"
    emc_locked = root / EMC_CLK / "mrq_rate_locked"
    emc_hz: list[int] = []
    if _is_file(emc_rate) and _is_file(emc_locked):
        rates = root / EMC_RATES
        emc_hz = [k * 1000 for k in _ints(_read(rates))] if _is_file(rates) else []
    else:
        emc_rate = emc_locked = None
        notes.append(f"EMC rate is not settable: {root / EMC_CLK} is missing (debugfs not mounted, or not root)")

    tpc = root / TPC_MASK
    rails: list[Rail] = []
    for hwmon in sorted(root.glob(INA3221_GLOB)):
        for label in sorted(hwmon.glob("in*_label")):
            channel = label.name[2 : -len("_label")]
            name = _read(label)
            voltage, current = hwmon / f"in{channel}_input", hwmon / f"curr{channel}_input"
            if name and name != "NC" and _is_file(voltage) and _is_file(current):
                rails.append(Rail(name, voltage, current))

    zones: dict[str, Path] = {}
    for zone in sorted((root / THERMAL_BASE).glob("thermal_zone*")):
        if _is_file(zone / "type") and _is_file(zone / "temp"):
            kind = _read(zone / "type")
            if not IGNORED_ZONES.search(kind):
                zones[kind] = zone / "temp"

    return Board(
        root,
        layout,
        gpu,
        gpu_hz,
        policies,
        online,
        emc_cap,
        emc_rate,
        emc_locked,
        emc_hz,
        tpc if _is_file(tpc) else None,
        rails,
        zones,
        notes,
    )


def _intersect(knob: Knob, available_mhz: list[float]) -> list[float | int | str]:
    return [v for v in knob.values if any(abs(float(v) - a) < 1e-3 for a in available_mhz)]


def narrow_to_board(space: SearchSpace, board: Board) -> SearchSpace:
    """Keep only the values the board reports; a knob left empty means the space does not fit."""
    tables = {
        "gpu_mhz": [f / 1e6 for f in board.gpu_hz],
        "cpu_mhz": sorted(set.intersection(*(set(p.available_khz) for p in board.policies))),
        "emc_mhz": [f / 1e6 for f in board.emc_hz],
    }
    tables["cpu_mhz"] = [f / 1e3 for f in tables["cpu_mhz"]]
    cpus = 1 + len(board.online)
    knobs = dict(space.knobs)
    for name, table in tables.items():
        if name not in knobs or not table:
            continue
        kept = _intersect(knobs[name], table)
        if not kept:
            raise UserError(
                f"the board reports none of {space.kind}'s {name} values "
                f"({', '.join(map(str, knobs[name].values))}): "
                "pick the search space of this board's model"
            )
        knobs[name] = _narrowed(knobs[name], kept)
    if "cpu_cores" in knobs:
        kept = [v for v in knobs["cpu_cores"].values if int(v) <= cpus]
        if not kept:
            raise UserError(f"the board has {cpus} CPUs, fewer than any cpu_cores value of {space.kind}")
        knobs["cpu_cores"] = _narrowed(knobs["cpu_cores"], kept)
    if "emc_mhz" in knobs and board.emc_rate is None:
        knobs["emc_mhz"] = _narrowed(knobs["emc_mhz"], [knobs["emc_mhz"].default])
    return space.model_copy(update={"knobs": knobs})


def _narrowed(knob: Knob, kept: list[Any]) -> Knob:
    default = knob.default if knob.default in kept else max(kept)
    return Knob(**{**knob.model_dump(), "values": kept, "default": default})


def _writable(path: Path) -> bool:
    return os.access(path, os.W_OK)


class JetsonDevice:
    """A Jetson board driven through sysfs and nvpmodel (see the module docstring)."""

    simulated = False

    def __init__(
        self,
        kind: str = "orin-agx",
        sysfs_root: str | Path | None = None,
        nvpmodel: str | None = None,
        meter_period_s: float = 0.05,
        thermal_limit_c: float = DEFAULT_THERMAL_LIMIT_C,
        name: str | None = None,
        writable: Callable[[Path], bool] = _writable,
        mode_timeout_s: float = 10.0,
        runner_factory: Callable[[str, Config], Any] | None = None,
        measure_fn: Callable[..., Measurement] | None = None,
    ) -> None:
        self.kind = kind
        self.name = name or kind
        self.slug = kind
        self.root = Path(sysfs_root or os.environ.get("TUNE_SYSFS_ROOT") or "/")
        if meter_period_s < 0.05:
            raise UserError(f"meter period {meter_period_s}s is too short: INA3221 rails need at least 0.05 s")
        self.meter_period_s = meter_period_s
        self.thermal_limit_c = thermal_limit_c
        self.mode_timeout_s = mode_timeout_s
        self._writable = writable
        self._runners = RunnerCache(os.environ.get("TUNE_TORCH_DEVICE", "cuda:0"))
        self._runtime = "auto"
        self._runner_factory = runner_factory or (
            lambda model, config: self._runners.get(model, config, self.space(), self._runtime)
        )
        self._measure_fn = measure_fn
        self._base_space = load_space(kind)
        if self._base_space.mode_knob is None:
            raise UserError(f"search space {kind} has no nvpmodel modes: it is not a Jetson space")
        detected = detect_kind(self.root)
        if detected is not None and detected != kind:
            raise UserError(
                f"this board is a Jetson {MODEL_NAMES[detected]} ({detected}), not {kind}: use --device {detected}"
            )
        self.board = discover(self.root)
        self._space = narrow_to_board(self._base_space, self.board)
        self.nvpmodel = _find_nvpmodel(nvpmodel or os.environ.get("TUNE_NVPMODEL") or "nvpmodel")

    # -- discovery ---------------------------------------------------------

    def space(self) -> SearchSpace:
        return self._space

    def describe(self) -> dict[str, Any]:
        b = self.board
        return {
            "name": self.name,
            "kind": self.kind,
            "backend": "jetson",
            "sysfs_root": str(self.root),
            "layout": b.layout,
            "nvpmodel": self.nvpmodel,
            "gpu_devfreq": str(b.gpu),
            "cpu_policies": {f"cpu{p.cpu}": p.cpus for p in b.policies},
            "cpus": 1 + len(b.online),
            "emc_settable": b.emc_rate is not None,
            "tpc_mask": str(b.tpc_mask) if b.tpc_mask else None,
            "rails": [r.name for r in b.rails],
            "thermal_zones": list(b.zones),
            "thermal_limit_c": self.thermal_limit_c,
            "notes": list(b.notes),
        }

    # -- state ----------------------------------------------------------------

    def query_mode(self) -> int:
        """The nvpmodel mode id the board is in (``nvpmodel -q``)."""
        out = self._run_nvpmodel(["-q"]).stdout
        ids = [line.strip() for line in out.splitlines() if line.strip().isdigit()]
        if not ids:
            raise ApplyError(f"cannot read the power mode from '{self.nvpmodel} -q': {out.strip()!r}")
        return int(ids[-1])

    def read_state(self) -> dict[str, Any]:
        """Everything apply may change, plus what jetson_clocks changes, as read from the board."""
        b = self.board
        state: dict[str, Any] = {
            "version": STATE_VERSION,
            "kind": self.kind,
            "sysfs_root": str(self.root),
            "nvpmodel_id": self.query_mode(),
            "online": {str(cpu): _read(path) for cpu, path in b.online.items()},
            "cpufreq": {
                str(p.cpu): {
                    "min": _read(p.min_path),
                    "max": _read(p.max_path),
                    **_optional(p.folder / "scaling_governor", "governor"),
                }
                for p in b.policies
            },
            "gpu": {
                "min": _read(b.gpu / "min_freq"),
                "max": _read(b.gpu / "max_freq"),
                **_optional(b.gpu / "governor", "governor"),
                **_optional(b.root / "sys/devices/gpu.0/railgate_enable", "railgate_enable"),
            },
            "emc": {},
        }
        if b.emc_rate is not None and b.emc_locked is not None:
            state["emc"] = {"rate": _read(b.emc_rate), "locked": _read(b.emc_locked)}
        if b.emc_cap is not None:
            state["emc"]["cap"] = _read(b.emc_cap)
        if b.tpc_mask is not None:
            state["tpc_pg_mask"] = _read(b.tpc_mask)
        return state

    # -- apply ------------------------------------------------------------------

    def targets(self, config: Config) -> dict[str, Any]:
        """What a configuration asks of the board after the mode's caps: mode id, cores, kHz, Hz."""
        space = self._space
        space.validate_config(config)
        mode = space.mode_of(config)
        assert mode is not None
        eff = space.effective(config).knobs
        b = self.board
        cpu_khz = sorted(set.intersection(*(set(p.available_khz) for p in b.policies)))
        out: dict[str, Any] = {"mode": mode.id}
        if "cpu_cores" in eff:
            out["cores"] = int(eff["cpu_cores"])
        if "cpu_mhz" in eff:
            out["cpu_khz"] = _floor(cpu_khz, round(float(eff["cpu_mhz"]) * 1000))
        if "gpu_mhz" in eff:
            out["gpu_hz"] = _floor(b.gpu_hz, round(float(eff["gpu_mhz"]) * 1e6))
        if "emc_mhz" in eff and b.emc_rate is not None:
            want = round(float(eff["emc_mhz"]) * 1e6)
            out["emc_hz"] = _floor(b.emc_hz, want) if b.emc_hz else want
        return out

    def plan_writes(self, config: Config) -> list[Write]:
        """Every step apply() would take from the current state, in order (for ``--dry-run``).

        Steps already in effect are left out, which is what makes apply()
        idempotent; after a mode change every later step is listed, since
        nvpmodel resets the clocks.
        """
        t = self.targets(config)
        return self._plan(t, mode_change=self.query_mode() != t["mode"])

    def _plan(self, t: dict[str, Any], mode_change: bool) -> list[Write]:
        current = self._current(assume_mode=t["mode"] if mode_change else None)
        return self._steps(t, current, include_all=mode_change)

    def apply(self, config: Config) -> None:
        """Apply in the fixed order and read every value back; ApplyError if the board refused."""
        t = self.targets(config)
        self.check_thermal()
        mode_change = self.query_mode() != t["mode"]
        planned = self._plan(t, mode_change)
        self.check_privilege([Path(w.path) for w in planned if not w.value.startswith("-m ")])
        if mode_change:
            self._set_mode(t["mode"])
        # Re-plan against the board as it is after the mode change: min/max order depends on it.
        for step in self._steps(t, self._current(), include_all=False):
            self._write(Path(step.path), step.value)
        self._verify(t)

    def _current(self, assume_mode: int | None = None) -> dict[str, Any]:
        """Current values; with ``assume_mode``, what nvpmodel will leave after switching to it."""
        b = self.board
        cur: dict[str, Any] = {
            "online": {cpu: _read(p) for cpu, p in b.online.items()},
            "cpu": {p.cpu: (int(_read(p.min_path)), int(_read(p.max_path))) for p in b.policies},
            "gpu": (int(_read(b.gpu / "min_freq")), int(_read(b.gpu / "max_freq"))),
            "emc": (_read(b.emc_locked), int(_read(b.emc_rate)))
            if b.emc_rate is not None and b.emc_locked is not None
            else None,
        }
        if assume_mode is not None:
            mode = next(m for m in self._space.modes.values() if m.id == assume_mode)
            cpu_cap = round(mode.caps.get("cpu_mhz", 1e9) * 1000)
            gpu_cap = _floor(b.gpu_hz, round(mode.caps.get("gpu_mhz", 1e9) * 1e6))
            cur["cpu"] = {
                c: (lo, _floor(next(p.available_khz for p in b.policies if p.cpu == c), cpu_cap))
                for c, (lo, _hi) in cur["cpu"].items()
            }
            cur["gpu"] = (min(b.gpu_hz), gpu_cap)
        return cur

    def _steps(self, t: dict[str, Any], cur: dict[str, Any], include_all: bool) -> list[Write]:
        b = self.board
        steps: list[Write] = []
        if include_all:
            steps.append(Write(self.nvpmodel, f"-m {t['mode']}"))
        online_after: set[int] = {0}
        if "cores" in t:
            for cpu, path in b.online.items():
                want = "1" if cpu < t["cores"] else "0"
                if want == "1":
                    online_after.add(cpu)
                if include_all or cur["online"][cpu] != want:
                    steps.append(Write(str(path), want))
        else:
            online_after.update(c for c, v in cur["online"].items() if v == "1")
        if "cpu_khz" in t:
            for p in b.policies:
                if not online_after.intersection(p.cpus):
                    continue  # a cluster with every core offline has no clock to set
                steps += _pair(p.min_path, p.max_path, t["cpu_khz"], cur["cpu"][p.cpu], include_all)
        if "gpu_hz" in t:
            steps += _pair(b.gpu / "min_freq", b.gpu / "max_freq", t["gpu_hz"], cur["gpu"], include_all)
        if "emc_hz" in t and b.emc_rate is not None and b.emc_locked is not None:
            locked, rate = cur["emc"]
            if include_all or locked != "1":
                steps.append(Write(str(b.emc_locked), "1"))
            if include_all or rate != t["emc_hz"]:
                steps.append(Write(str(b.emc_rate), str(t["emc_hz"])))
        return steps

    def _verify(self, t: dict[str, Any]) -> None:
        b = self.board
        wrong: list[str] = []
        if self.query_mode() != t["mode"]:
            wrong.append(f"nvpmodel mode {self.query_mode()} (wanted {t['mode']})")
        online = {0} | {c for c, p in b.online.items() if _read(p) == "1"}
        if "cores" in t:
            for cpu in b.online:
                want = "1" if cpu < t["cores"] else "0"
                if _read(b.online[cpu]) != want:
                    wrong.append(f"cpu{cpu}/online={_read(b.online[cpu])} (wanted {want})")
        if "cpu_khz" in t:
            for p in b.policies:
                if online.intersection(p.cpus):
                    for path in (p.min_path, p.max_path):
                        if int(_read(path)) != t["cpu_khz"]:
                            wrong.append(f"{path}={_read(path)} (wanted {t['cpu_khz']})")
        if "gpu_hz" in t:
            for path in (b.gpu / "min_freq", b.gpu / "max_freq"):
                if int(_read(path)) != t["gpu_hz"]:
                    wrong.append(f"{path}={_read(path)} (wanted {t['gpu_hz']})")
        if "emc_hz" in t and b.emc_rate is not None and int(_read(b.emc_rate)) != t["emc_hz"]:
            wrong.append(f"{b.emc_rate}={_read(b.emc_rate)} (wanted {t['emc_hz']})")
        if wrong:
            raise ApplyError("the board did not take the configuration: " + "; ".join(wrong))

    def _set_mode(self, mode_id: int) -> None:
        """``nvpmodel -m ID``, then poll ``-q`` until the board reports it."""
        self._run_nvpmodel(["-m", str(mode_id)])
        deadline = time.monotonic() + self.mode_timeout_s
        while self.query_mode() != mode_id:
            if time.monotonic() > deadline:
                raise ApplyError(
                    f"nvpmodel did not switch to mode {mode_id} within {self.mode_timeout_s:.0f} s "
                    "(some modes need a reboot; set that mode by hand first)"
                )
            time.sleep(0.1)

    def _run_nvpmodel(self, args: list[str]) -> subprocess.CompletedProcess[str]:
        try:
            proc = subprocess.run(
                [self.nvpmodel, *args],
                capture_output=True,
                text=True,
                stdin=subprocess.DEVNULL,
                timeout=60,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ApplyError(f"'{self.nvpmodel} {' '.join(args)}' failed: {exc}") from None
        if proc.returncode != 0:
            msg = (proc.stderr or proc.stdout).strip().splitlines()
            raise ApplyError(
                f"'{self.nvpmodel} {' '.join(args)}' exited {proc.returncode}: {msg[-1] if msg else 'no output'}"
            )
        return proc

    def _write(self, path: Path, value: str) -> None:
        try:
            path.write_text(f"{value}\n")
        except OSError as exc:
            raise ApplyError(f"writing {value} to {path} failed: {exc.strerror}") from None

    def check_privilege(self, paths: list[Path]) -> None:
        """Refuse before the first write if a file is not writable, naming the privilege needed."""
        denied = [p for p in paths if not self._writable(p)]
        if denied:
            raise UserError(
                f"cannot write {denied[0]}"
                f"{f' and {len(denied) - 1} more' if len(denied) > 1 else ''}: "
                "changing Jetson clocks needs root; run the command with sudo (nothing was changed)"
            )

    # -- restore ----------------------------------------------------------------

    def restore(self, state: dict[str, Any]) -> None:
        """Put back a state from read_state(), in a safe order, writing only what differs.

        Mode first (it resets caps and clocks), then cores online (clusters must
        be online before their clocks are written), then CPU, GPU and EMC
        clocks with min/max ordered so min never exceeds max. Every file is
        attempted even if one fails; the failures are raised together.
        """
        if state.get("version") != STATE_VERSION:
            raise UserError(f"saved Jetson state has version {state.get('version')}, expected {STATE_VERSION}")
        b = self.board
        errors: list[str] = []

        def put(path: Path, value: str) -> None:
            try:
                if _read(path) != value:
                    path.write_text(f"{value}\n")
            except OSError as exc:
                errors.append(f"{path}: {exc.strerror}")

        try:
            if self.query_mode() != int(state["nvpmodel_id"]):
                self._set_mode(int(state["nvpmodel_id"]))
        except ApplyError as exc:
            errors.append(str(exc))
        for cpu, value in state["online"].items():
            if int(cpu) in b.online:
                put(b.online[int(cpu)], value)
        for p in b.policies:
            saved = state["cpufreq"].get(str(p.cpu))
            if saved:
                for path, value in _pair(
                    p.min_path,
                    p.max_path,
                    (int(saved["min"]), int(saved["max"])),
                    (int(_read(p.min_path)), int(_read(p.max_path))),
                    False,
                ):
                    put(Path(path), value)
                if "governor" in saved:
                    put(p.folder / "scaling_governor", saved["governor"])
        gpu = state["gpu"]
        for path, value in _pair(
            b.gpu / "min_freq",
            b.gpu / "max_freq",
            (int(gpu["min"]), int(gpu["max"])),
            (int(_read(b.gpu / "min_freq")), int(_read(b.gpu / "max_freq"))),
            False,
        ):
            put(Path(path), value)
        if "governor" in gpu:
            put(b.gpu / "governor", gpu["governor"])
        if "railgate_enable" in gpu:
            put(b.root / "sys/devices/gpu.0/railgate_enable", gpu["railgate_enable"])
        emc = state.get("emc", {})
        if "rate" in emc and b.emc_rate is not None and b.emc_locked is not None:
            put(b.emc_rate, emc["rate"])
            put(b.emc_locked, emc["locked"])
        if errors:
            raise ApplyError("restore incomplete: " + "; ".join(errors))

    # -- thermal and metering -----------------------------------------------

    def temperatures(self) -> dict[str, float]:
        temps: dict[str, float] = {}
        for zone, path in self.board.zones.items():
            try:
                temps[zone] = int(_read(path)) / 1000
            except (OSError, ValueError):
                continue  # some zones refuse reads while their sensor is off
        return temps

    def check_thermal(self, temps: dict[str, float] | None = None) -> dict[str, float]:
        """Raise ThermalLimitError if any zone is above the limit; return the temperatures."""
        temps = self.temperatures() if temps is None else temps
        hot = {z: t for z, t in temps.items() if t > self.thermal_limit_c}
        if hot:
            shown = ", ".join(f"{z} {t:.1f} C" for z, t in sorted(hot.items()))
            raise ThermalLimitError(f"thermal limit {self.thermal_limit_c:.0f} C exceeded ({shown}): trial aborted")
        return temps

    def make_meter(self, kind: str | None = None) -> RailMeter | JtopMeter:
        """The board's meter: INA3221 rails (default) or ``jtop`` through jetson-stats."""
        if kind in (None, "", "rails", "ina3221"):
            if not self.board.rails:
                raise UserError(
                    f"no INA3221 power rails under {self.root / 'sys/bus/i2c/drivers/ina3221'}: "
                    "this board has no readable power sensor; pick --meter jtop or another board"
                )
            return RailMeter(self.board.rails, period_s=self.meter_period_s, temperatures=self.temperatures)
        if kind == "jtop":
            return JtopMeter()
        raise UserError(f"unknown Jetson meter {kind!r}: choose rails or jtop")

    def measure(self, model: str, config: Config, settings: WindowSettings) -> Measurement:
        """Run the real runner in a LoadGen window under the board's meter; abort when too hot."""
        self.check_thermal()
        meter = self.make_meter(settings.meter)
        self._runtime = settings.runtime
        runner = self._runner_factory(model, config)
        measure_fn = self._measure_fn
        if measure_fn is None:
            from tuner.measure.session import measure_with

            measure_fn = measure_with
        measurement = measure_fn(runner, meter, config.batch_size, settings, settings.percentile)
        temps = meter.max_temps_c if isinstance(meter, RailMeter) else self.temperatures()
        self.check_thermal(temps)
        return measurement.model_copy(update={"temps_c": temps})


def _optional(path: Path, key: str) -> dict[str, str]:
    return {key: _read(path)} if _is_file(path) else {}


def _pair(
    min_path: Path,
    max_path: Path,
    target: int | tuple[int, int],
    cur: tuple[int, int],
    include_all: bool,
) -> list[Write]:
    """Writes that move a (min, max) pair to ``target`` without ever having min above max."""
    lo, hi = (target, target) if isinstance(target, int) else target
    cur_lo, cur_hi = cur
    writes: list[Write] = []
    min_w = Write(str(min_path), str(lo)) if include_all or cur_lo != lo else None
    max_w = Write(str(max_path), str(hi)) if include_all or cur_hi != hi else None
    order = [max_w, min_w] if lo > cur_hi else [min_w, max_w]
    writes += [w for w in order if w is not None]
    return writes


def detect_kind(root: Path) -> str | None:
    """The search space of the module the device tree names, or None where it says nothing known."""
    path = root / COMPATIBLE
    if not _is_file(path):
        return None
    text = path.read_bytes().decode(errors="replace")
    for part, kind in MODULES.items():
        if part in text:
            return kind
    return None


def jetson_device(name: str, **kwargs: Any) -> JetsonDevice:
    """The device a user named (``orin``, ``orin-nano``, ``xavier``, ``tx2``, or a space's kind)."""
    if name not in DEVICE_KINDS:
        raise UserError(f"unknown Jetson device {name!r}: choose from {', '.join(DEVICE_KINDS)}")
    return JetsonDevice(DEVICE_KINDS[name], name=name, **kwargs)


def _find_nvpmodel(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise UserError(
            f"nvpmodel not found ({name}): install NVIDIA's nvidia-l4t-nvpmodel, "
            "or point --nvpmodel / "
            "TUNE_NVPMODEL at it"
        )
    return found


class RailMeter:
    """Energy from the INA3221 rails: per-rail trapezoid integration on a sampling thread.

    When the board has a VDD_IN rail (module input, e.g. Orin Nano) that alone is
    the total, since the other rails are part of it; otherwise (AGX Orin) the
    rails are summed, and the reading warns that this is not wall power: the
    module has no VDD_IN rail and the carrier board is not covered.
    """

    name = "ina3221"
    min_window_s = 1.0

    def __init__(
        self,
        rails: list[Rail],
        period_s: float = 0.05,
        temperatures: Callable[[], dict[str, float]] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._all = rails
        total = [r for r in rails if r.name == "VDD_IN"]
        self._summed = total or rails
        self.rails = [r.name for r in self._summed]
        self.warning = (
            "VDD_IN is the module's input power: carrier board and supply losses are not included"
            if total
            else f"sum of INA3221 rails {', '.join(self.rails)}: the module has no VDD_IN rail, "
            "so this is not wall power"
        )
        self.period_s = period_s
        self._temperatures = temperatures
        self._clock = clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t: list[float] = []
        self._w: dict[str, list[float]] = {}
        self.max_temps_c: dict[str, float] = {}
        self._temp_every = max(1, round(1.0 / period_s))

    def _sample(self, temps: bool = False) -> None:
        now = self._clock()
        watts = {r.name: r.watts() for r in self._all}
        self._t.append(now)
        for name, w in watts.items():
            self._w.setdefault(name, []).append(w)
        temps = temps or (len(self._t) - 1) % self._temp_every == 0
        if self._temperatures is not None and temps:
            for zone, c in self._temperatures().items():
                self.max_temps_c[zone] = max(c, self.max_temps_c.get(zone, c))

    def _loop(self) -> None:
        while not self._stop.wait(self.period_s):
            self._sample()

    def start(self) -> None:
        self._t, self._w, self.max_temps_c = [], {}, {}
        self._stop.clear()
        self._sample(temps=True)
        self._thread = threading.Thread(target=self._loop, name="ina3221-meter", daemon=True)
        self._thread.start()

    def stop(self) -> EnergyReading:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._sample(temps=True)
        per_rail = {name: _trapezoid(self._t, w) for name, w in self._w.items()}
        energy = sum(per_rail[name] for name in self.rails)
        duration = self._t[-1] - self._t[0]
        if duration > 0 and energy <= 0:
            raise UserError(
                f"INA3221 rails {', '.join(self.rails)} read no power over {duration:.2f} s: "
                "the sensor is not updating; pick another --meter"
            )
        extra = {f"rail_j:{name}": j for name, j in per_rail.items()}
        return EnergyReading(
            energy,
            duration,
            energy / duration if duration > 0 else 0.0,
            self.name,
            list(self.rails),
            len(self._t),
            self.warning,
            extra,
        )


def _trapezoid(t: list[float], w: list[float]) -> float:
    return sum((t[i + 1] - t[i]) * (w[i] + w[i + 1]) / 2 for i in range(len(t) - 1))


class JtopMeter:
    """Total power from a running jetson-stats (jtop) service, integrated like the rails.

    jetson-stats is AGPL-3.0 and optional (``pip install 'powertune[jetson]'``);
    it is imported only when this meter is chosen. jtop samples no faster
    than every 0.5 s, so short windows are refused by ``min_window_s``.
    """

    name = "jtop"
    min_window_s = 5.0

    def __init__(self, period_s: float = JTOP_PERIOD_S) -> None:
        try:
            from jtop import jtop  # type: ignore[import-not-found]
        except ImportError:
            raise UserError(
                "--meter jtop needs jetson-stats (AGPL-3.0): pip install 'powertune[jetson]' "
                "and start its service (sudo systemctl start jtop)"
            ) from None
        self._jtop_cls = jtop
        self.period_s = max(period_s, JTOP_PERIOD_S)
        self.rails = ["jtop:tot"]
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t: list[float] = []
        self._w: list[float] = []
        self._jtop: Any = None

    def _watts(self) -> float:
        power = self._jtop.power
        return float(power["tot"]["power"]) / 1000

    def _loop(self) -> None:
        while not self._stop.wait(self.period_s):
            self._t.append(time.monotonic())
            self._w.append(self._watts())

    def start(self) -> None:
        self._jtop = self._jtop_cls()
        self._jtop.start()
        self._t, self._w = [time.monotonic()], [self._watts()]
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="jtop-meter", daemon=True)
        self._thread.start()

    def stop(self) -> EnergyReading:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._t.append(time.monotonic())
        self._w.append(self._watts())
        self._jtop.close()
        energy = _trapezoid(self._t, self._w)
        duration = self._t[-1] - self._t[0]
        return EnergyReading(
            energy,
            duration,
            energy / duration if duration > 0 else 0.0,
            self.name,
            list(self.rails),
            len(self._t),
            "jtop total power (its own rail selection); not wall power",
        )
