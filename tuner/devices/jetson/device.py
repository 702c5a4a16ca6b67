"""Driving a Jetson board: apply a configuration in the kernel's order, and put the board back.

A configuration is applied in a fixed order (mode, cores, CPU clocks, GPU
clock, EMC rate, DLA clock caps) because each step constrains the next: ``nvpmodel -m`` moves
the caps, cores and TPC mask and resets clocks, and a cluster's limits can only
be written while one of its cores is online (the kernel refuses the limits of a
policy whose CPUs are all offline). Every value is read back; a board that did
not take a value fails the trial (:class:`ApplyError`) instead of producing a
measurement of some other configuration.

Restore undoes this in reverse: the saved mode first (nvpmodel puts back the
cores, caps and TPC mask it owns), then the saved online cores, then each
cluster's limits (a cluster the saved mode keeps offline is brought online just
long enough to write them, as nvpmodel itself had it online when it changed
them), then GPU, EMC and the DLA clock caps. Every value comes from the journal only after it was
checked against the board's own tables (:mod:`restore`), every failure is
collected rather than stopping the restore, and what remains is reported with
how to finish it. The sysfs root and the ``nvpmodel`` executable can be
pointed elsewhere (TUNE_SYSFS_ROOT, TUNE_NVPMODEL) for containers and tests.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from tuner.devices.jetson import sysfs
from tuner.devices.jetson.board import MODEL_NAMES, Board, board_space, detect_kind, discover, mode_label
from tuner.devices.jetson.clocks import ClockMonitor
from tuner.devices.jetson.meters import JtopMeter, RailMeter
from tuner.devices.jetson.persist import unpersist
from tuner.devices.jetson.restore import plan_restore
from tuner.devices.meters.registry import device_meter
from tuner.devices.runner_cache import RunnerCache
from tuner.errors import ConfigurationError, DeviceError, DeviceRefused, NeedsReboot, UserError
from tuner.measure.settings import WindowSettings
from tuner.measurement import Measurement
from tuner.space import Config, SearchSpace, load_space

STATE_VERSION = 1
DEFAULT_THERMAL_LIMIT_C = 90.0
# What nvpmodel prints when a mode needs a reboot (before its YES/yes question).
REBOOT_MARKERS = ("Reboot required for changing to this power mode", "DO YOU WANT TO REBOOT NOW")
# Zones whose sensor is off read -256 C on Orin (CV0/CV1/CV2-therm without the DLA/PVA powered).
NO_SENSOR_C = -200.0

# What a user may type for a Jetson device, and the search space each names.
DEVICE_KINDS = {
    "orin": "orin-agx",
    "orin-agx": "orin-agx",
    "orin-nano": "orin-nano",
    "xavier": "xavier-agx",
    "xavier-agx": "xavier-agx",
    "tx2": "tx2",
}


class JetsonError(DeviceRefused):
    """A trial that must fail: the board did not take a configuration, or it ran too hot.

    The run stops there with one line naming the file and the rule (exit code 1, not 2: the
    input was fine, the board refused), after the hardware session has restored the board.
    """


class ApplyError(JetsonError):
    """The board did not take a value: read back differs, nvpmodel did not switch, write failed."""


class ModeNeedsReboot(ApplyError, NeedsReboot):
    """nvpmodel asked for a reboot to enter a mode: it was answered no, and the board is as it was."""


class MaskChangeRefused(NeedsReboot, ConfigurationError):
    """A mode whose TPC mask differs from the board's, not asked for by name: refused before any write.

    Once a GPU context exists nvpmodel can enter such a mode, or come back from
    it, only through a reboot; the tool never reboots, so it never goes there
    unless the user named the mode (see :meth:`JetsonDevice.offer_modes`).
    Bad input for ``tune apply`` (exit 2); a study never proposes such a mode.
    """

    exit_code = 2


class ThermalLimitError(JetsonError):
    """A thermal zone is above the limit: the trial is aborted and the board restored."""


class RestoreIncomplete(DeviceRefused):
    """Some saved values could not be put back: the journal stays, and the message says what remains."""


class JournalRefused(RestoreIncomplete, ConfigurationError):
    """A restore whose only failures are the journal's own values, refused against the board: bad input (exit 2)."""


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


def _floor(table: list[int], value: int) -> int:
    """The highest table entry not above ``value``: what a cap lets the board run."""
    below = [f for f in table if f <= value]
    return max(below) if below else min(table)


def _writable(path: Path) -> bool:
    return sysfs.can_write(path)


def _try_read(path: Path) -> str | None:
    try:
        return sysfs.read(path)
    except OSError:
        return None


def _try_int(path: Path) -> int | None:
    try:
        return int(sysfs.read(path))
    except (OSError, ValueError):
        return None


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
        writable: Callable[[Path], bool] | None = None,
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
        self._writable = writable or _writable
        self.runners = RunnerCache(os.environ.get("TUNE_TORCH_DEVICE", "cuda:0"))
        self._runtime = "auto"
        self._runner_factory = runner_factory or (
            lambda model, config: self.runners.get(model, config, self.space(), self._runtime)
        )
        self._measure_fn = measure_fn
        self._base_space = load_space(kind, "tensorrt")
        if self._base_space.mode_knob is None:
            raise UserError(f"search space {kind} has no nvpmodel modes: it is not a Jetson space")
        detected = detect_kind(self.root)
        if detected is not None and detected != kind:
            raise UserError(
                f"this board is a Jetson {MODEL_NAMES[detected]} ({detected}), not {kind}: use --device {detected}"
            )
        self.board: Board = discover(self.root)
        self.nvpmodel = _find_nvpmodel(nvpmodel or os.environ.get("TUNE_NVPMODEL") or "nvpmodel")
        self._named: tuple[int, ...] = ()
        self.start_mode = self.query_mode() if self.board.modes else None
        self._space, note = self._board_space(None)
        self.notes = [note] if note else []
        unsampled = self.board.clocks.note() if self.board.clocks is not None else None
        if unsampled:
            self.notes.append(unsampled)
        self.last_switch_s: float | None = None
        self._asked: dict[str, Any] = {}

    # -- discovery ---------------------------------------------------------

    @property
    def physical_key(self) -> str:
        """The board itself, for its one lock and one journal (tuner.devices.journal.device_key).

        The space kind (``orin`` and ``orin-agx`` are one AGX Orin) and the module's
        serial number from the device tree, ``/proc/device-tree/serial-number``
        (NUL-terminated; /proc/device-tree links to /sys/firmware/devicetree/base, where jetson-stats
        reads it in jtop/core/jetson_variables.py),
        where the board has one; a host carries one Jetson module.
        """
        path = self.root / "proc/device-tree/serial-number"
        serial = sysfs.read(path) if sysfs.is_file(path) else ""
        serial = "".join(c for c in serial if c.isalnum())
        return f"{self.kind}-{serial}" if serial else self.kind

    def space(self) -> SearchSpace:
        return self._space

    def use_runtime(self, runtime: str) -> None:
        """The runtime the study runs the model with: only TensorRT can put work on the DLAs, so only it gets
        the DLA knobs (and only on a board that has DLAs) and its precision knob."""
        self._runtime = runtime
        self._space, _ = self._board_space(runtime)

    # -- modes that need a reboot --------------------------------------------

    def _board_space(self, runtime: str | None) -> tuple[SearchSpace, str | None]:
        """The board's space from the mode it is in: the modes of its TPC mask, and those the user named."""
        self._space_runtime = runtime
        return board_space(self._base_space, self.board, runtime, self.start_mode, self._named)

    def _mask(self, mode_id: int | None) -> int | None:
        return next((m.tpc_pg_mask for m in self.board.modes if m.id == mode_id), None)

    def offer_modes(self, names: list[str]) -> list[str]:
        """Let a study tune the modes the user named, other TPC masks included; the lines to say before any write.

        A named mode with another mask than the board's is entered (nvpmodel allows
        it while no GPU context exists yet), but the tool's own first window makes
        the context, so coming back to the board's mode needs a reboot: the returned
        line says so, and the restore at the end refuses, before its first write,
        with how to finish.
        """
        every = {mode_label(m.name): m for m in self.board.modes}
        unknown = [n for n in names if n not in every]
        if unknown:
            raise UserError(
                f"unknown nvpmodel mode(s) {', '.join(unknown)} for this board: choose from {', '.join(every)}"
            )
        start = self._mask(self.start_mode)
        self._named = tuple(every[n].id for n in names)
        self._space, _ = self._board_space(self._space_runtime)
        other = [n for n in names if every[n].tpc_pg_mask != start]
        if not other:
            return []
        line = (
            f"nvpmodel mode(s) {', '.join(other)} gate other GPU TPCs than the board's mode "
            f"{self._mode_name(self.start_mode)} (TPC_PG_MASK {', '.join(str(every[n].tpc_pg_mask) for n in other)} "
            f"vs {start}): once the GPU has run, nvpmodel changes the mask only through a reboot, so restoring "
            f"the board will need one (afterwards: sudo nvpmodel -m {self.start_mode}, answer yes, then "
            f"tune restore --device {self.name})"
        )
        if line not in self.notes:
            self.notes.append(line)
        return [line]

    def _mode_name(self, mode_id: int | None) -> str:
        return next((mode_label(m.name) for m in self.board.modes if m.id == mode_id), str(mode_id))

    def check_config_reachable(self, config: Config) -> None:
        """:meth:`check_reachable` for a configuration's mode, named as the space names it (``tune apply``)."""
        knob = self._space.mode_knob
        mode = next((m for m in self.board.modes if knob and mode_label(m.name) == config.knobs.get(knob)), None)
        if mode is not None:
            self.check_reachable(mode.id)

    def check_reachable(self, mode_id: int) -> None:
        """Refuse, before any write, a switch to a mode of another TPC mask that the user did not name.

        The check jetson-stats makes before it calls nvpmodel (jtop/core/nvpmodel.py,
        NVPModelService.set_nvpmodel_id: "The new nvpmodel N has a different mask M,
        is not compatible"), against the mode the board is in now.
        """
        current = self.query_mode()
        if mode_id == current or mode_id in self._named:
            return
        now, then = self._mask(current), self._mask(mode_id)
        if now == then:
            return
        raise MaskChangeRefused(
            f"nvpmodel mode {self._mode_name(mode_id)} has TPC_PG_MASK {then}, the board's mode "
            f"{self._mode_name(current)} has {now}: the masks are not compatible without a reboot (once the GPU "
            "has run, nvpmodel asks to reboot, and coming back needs another); nothing was written. To use it: "
            f"sudo nvpmodel -m {mode_id}, answer yes to reboot, then run the command again in that mode"
        )

    def describe(self) -> dict[str, Any]:
        b = self.board
        return {
            "name": self.name,
            "kind": self.kind,
            "backend": "jetson",
            "board": b.model,
            "release": b.release,
            "title": b.title,
            "sysfs_root": str(self.root),
            "layout": b.layout,
            "nvpmodel": self.nvpmodel,
            "gpu_devfreq": str(b.gpu),
            "gpu_mhz": self._space.knobs["gpu_mhz"].values if "gpu_mhz" in self._space.knobs else [],
            "modes": {name: mode.id for name, mode in self._space.modes.items()},
            "cpu_policies": {f"cpu{p.cpu}": p.cpus for p in b.policies},
            "cpus": b.cpus,
            "emc_settable": b.emc_rate is not None,
            "tpc_mask": str(b.tpc_mask) if b.tpc_mask else None,
            "dla_caps": [str(p) for p in b.dla_caps],
            "rails": [r.name for r in b.rails],
            "thermal_zones": list(b.zones),
            "thermal_limit_c": self.thermal_limit_c,
            "notes": [*b.notes, *self.notes],
        }

    def _mode_ids(self) -> list[int]:
        return [m.id for m in self._space.modes.values()]

    def _dla_hz(self) -> list[int]:
        """The DLA clocks this board's space offers and its modes cap at, in Hz (what a journal may hold)."""
        space, _ = board_space(self._base_space, self.board, "tensorrt")
        if "dla_mhz" not in space.knobs:
            return []
        caps = [m.caps["dla_mhz"] for m in space.modes.values() if "dla_mhz" in m.caps]
        return sorted({round(float(v) * 1e6) for v in [*space.knobs["dla_mhz"].values, *caps]})

    # -- state ----------------------------------------------------------------

    def query_mode(self) -> int:
        """The nvpmodel mode id the board is in (``nvpmodel -q``)."""
        out = self._run_nvpmodel(["-q"]).stdout
        ids = [line.strip() for line in out.splitlines() if line.strip().isdigit()]
        if not ids:
            raise ApplyError(f"cannot read the power mode from '{self.nvpmodel} -q': {out.strip()!r}")
        return int(ids[-1])

    def read_state(self) -> dict[str, Any]:
        """Everything apply may change, plus what jetson_clocks changes, as read from the board.

        A cluster whose limits cannot be read (newer kernels answer EBUSY for a
        policy whose CPUs are all offline) is left out: nothing of it changes.
        """
        b = self.board
        self.check_readable(
            [
                b.gpu / "min_freq",
                b.gpu / "max_freq",
                *b.online.values(),
                *[f for f in (b.emc_cap, b.emc_rate, b.emc_locked, b.tpc_mask, b.railgate) if f is not None],
                *b.dla_caps,
            ]
        )
        cpufreq: dict[str, dict[str, str]] = {}
        for p in b.policies:
            try:
                saved = {"min": sysfs.read(p.min_path), "max": sysfs.read(p.max_path)}
                if sysfs.is_file(p.folder / "scaling_governor"):
                    saved["governor"] = sysfs.read(p.folder / "scaling_governor")
            except OSError:
                continue
            cpufreq[str(p.cpu)] = saved
        gpu = {"min": sysfs.read(b.gpu / "min_freq"), "max": sysfs.read(b.gpu / "max_freq")}
        if sysfs.is_file(b.gpu / "governor"):
            gpu["governor"] = sysfs.read(b.gpu / "governor")
        if b.railgate is not None:
            gpu["railgate_enable"] = sysfs.read(b.railgate)
        state: dict[str, Any] = {
            "version": STATE_VERSION,
            "kind": self.kind,
            "sysfs_root": str(self.root),
            "nvpmodel_id": self.query_mode(),
            "online": {str(cpu): sysfs.read(path) for cpu, path in b.online.items()},
            "cpufreq": cpufreq,
            "gpu": gpu,
            "emc": {},
        }
        if b.emc_rate is not None and b.emc_locked is not None:
            state["emc"] = {"rate": sysfs.read(b.emc_rate), "locked": sysfs.read(b.emc_locked)}
        if b.emc_cap is not None:
            state["emc"]["cap"] = sysfs.read(b.emc_cap)
        if b.tpc_mask is not None:
            state["tpc_pg_mask"] = sysfs.read(b.tpc_mask)
        if b.dla_caps:
            state["dla"] = {str(core): sysfs.read(path) for core, path in enumerate(b.dla_caps)}
        return state

    def _online_now(self) -> set[int]:
        return {0} | {cpu for cpu, path in self.board.online.items() if sysfs.read(path) == "1"}

    # -- apply ------------------------------------------------------------------

    def targets(self, config: Config) -> dict[str, Any]:
        """What a configuration asks of the board after the mode's caps: mode id, cores, kHz, Hz."""
        space = self._space
        mode_knob = space.mode_knob
        outside = mode_knob is not None and config.knobs.get(mode_knob) not in space.knobs[mode_knob].values
        if set(config.knobs) - set(space.knobs):
            # A configuration a TensorRT study exported (DLA knobs) applied by a command that runs no model.
            space, _ = board_space(self._base_space, self.board, "tensorrt")
        elif outside:
            # A mode of another TPC mask: check_reachable refuses it before any write unless the user named it.
            space, _ = board_space(self._base_space, self.board, self._space_runtime)
        space.validate_config(config)
        mode = space.mode_of(config)
        assert mode is not None
        eff = space.effective(config).knobs
        b = self.board
        out: dict[str, Any] = {"mode": mode.id}
        if "cpu_cores" in eff:
            out["cores"] = int(eff["cpu_cores"])
        if "cpu_mhz" in eff:
            out["cpu_khz"] = _floor(b.cpu_khz, round(float(eff["cpu_mhz"]) * 1000))
        if "gpu_mhz" in eff:
            out["gpu_hz"] = _floor(b.gpu_hz, round(float(eff["gpu_mhz"]) * 1e6))
        if "emc_mhz" in eff and b.emc_rate is not None:
            want = round(float(eff["emc_mhz"]) * 1e6)
            out["emc_hz"] = _floor(b.emc_hz, want) if b.emc_hz else want
        if "dla_mhz" in eff and b.dla_caps:
            out["dla_hz"] = round(float(eff["dla_mhz"]) * 1e6)
        return out

    def plan_writes(self, config: Config) -> list[Write]:
        """Every step apply() would take from the current state, in order (for ``--dry-run``).

        Steps already in effect are left out, which is what makes apply()
        idempotent; after a mode change every later step is listed, since
        nvpmodel resets the clocks.
        """
        t = self.targets(config)
        self.check_reachable(t["mode"])
        return self._plan(t, mode_change=self.query_mode() != t["mode"])

    def _plan(self, t: dict[str, Any], mode_change: bool) -> list[Write]:
        current = self._current(assume_mode=t["mode"] if mode_change else None)
        return self._steps(t, current, include_all=mode_change)

    def apply(self, config: Config) -> None:
        """Apply in the fixed order and read every value back; ApplyError if the board refused.

        ``last_switch_s`` is how long it took, from the mode check to the last
        value read back: seconds when nvpmodel changes the mode, milliseconds
        for clock writes alone (a trial's setup includes it).
        """
        started = time.monotonic()
        self.last_switch_s = None
        self._asked = {}
        t = self.targets(config)
        self.check_reachable(t["mode"])
        self.check_thermal()
        mode_change = self.query_mode() != t["mode"]
        planned = self._plan(t, mode_change)
        self.check_privilege([Path(w.path) for w in planned if not w.value.startswith("-m ")])
        if mode_change:
            self.set_mode(t["mode"])
        # Re-plan against the board as it is after the mode change: min/max order depends on it.
        for step in self._steps(t, self._current(), include_all=False):
            self._write(Path(step.path), step.value)
        self._verify(t)
        self._asked = t
        self.last_switch_s = time.monotonic() - started

    def _current(self, assume_mode: int | None = None) -> dict[str, Any]:
        """Current values; with ``assume_mode``, what nvpmodel will leave after switching to it."""
        b = self.board
        cur: dict[str, Any] = {
            "online": {cpu: sysfs.read(p) for cpu, p in b.online.items()},
            "cpu": {p.cpu: (_try_int(p.min_path), _try_int(p.max_path)) for p in b.policies},
            "gpu": (int(sysfs.read(b.gpu / "min_freq")), int(sysfs.read(b.gpu / "max_freq"))),
            "emc": (sysfs.read(b.emc_locked), int(sysfs.read(b.emc_rate)))
            if b.emc_rate is not None and b.emc_locked is not None
            else None,
            "dla": [_try_int(p) for p in b.dla_caps],
        }
        if assume_mode is not None:
            every, _ = board_space(self._base_space, self.board, "tensorrt")
            mode = next(m for m in every.modes.values() if m.id == assume_mode)
            cpu_cap = round(mode.caps.get("cpu_mhz", 1e9) * 1000)
            gpu_cap = _floor(b.gpu_hz, round(mode.caps.get("gpu_mhz", 1e9) * 1e6))
            cur["cpu"] = {
                c: (lo, _floor(next(p.available_khz for p in b.policies if p.cpu == c), cpu_cap))
                for c, (lo, _hi) in cur["cpu"].items()
            }
            cur["gpu"] = (min(b.gpu_hz), gpu_cap)
            if "dla_mhz" in mode.caps:
                cur["dla"] = [round(mode.caps["dla_mhz"] * 1e6)] * len(b.dla_caps)
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
                    continue  # the kernel refuses the limits of a cluster with every core offline
                steps += _pair(p.min_path, p.max_path, t["cpu_khz"], cur["cpu"][p.cpu], include_all)
        if "gpu_hz" in t:
            steps += _pair(b.gpu / "min_freq", b.gpu / "max_freq", t["gpu_hz"], cur["gpu"], include_all)
        if "emc_hz" in t and b.emc_rate is not None and b.emc_locked is not None:
            locked, rate = cur["emc"]
            if include_all or locked != "1":
                steps.append(Write(str(b.emc_locked), "1"))
            if include_all or rate != t["emc_hz"]:
                steps.append(Write(str(b.emc_rate), str(t["emc_hz"])))
        if "dla_hz" in t:
            for path, now in zip(b.dla_caps, cur["dla"], strict=True):
                if include_all or now != t["dla_hz"]:
                    steps.append(Write(str(path), str(t["dla_hz"])))
        return steps

    def _verify(self, t: dict[str, Any]) -> None:
        b = self.board
        wrong: list[str] = []
        if self.query_mode() != t["mode"]:
            wrong.append(f"nvpmodel mode {self.query_mode()} (wanted {t['mode']})")
        online = self._online_now()
        if "cores" in t:
            for cpu, path in b.online.items():
                want = "1" if cpu < t["cores"] else "0"
                if sysfs.read(path) != want:
                    wrong.append(f"cpu{cpu}/online={sysfs.read(path)} (wanted {want})")
        if "cpu_khz" in t:
            for p in b.policies:
                if online.intersection(p.cpus):
                    for path in (p.min_path, p.max_path):
                        if _try_int(path) != t["cpu_khz"]:
                            wrong.append(f"{path}={_try_int(path)} (wanted {t['cpu_khz']})")
        if "gpu_hz" in t:
            for path in (b.gpu / "min_freq", b.gpu / "max_freq"):
                if int(sysfs.read(path)) != t["gpu_hz"]:
                    wrong.append(f"{path}={sysfs.read(path)} (wanted {t['gpu_hz']})")
        if "emc_hz" in t and b.emc_rate is not None and int(sysfs.read(b.emc_rate)) != t["emc_hz"]:
            wrong.append(f"{b.emc_rate}={sysfs.read(b.emc_rate)} (wanted {t['emc_hz']})")
        if "dla_hz" in t:
            for path in b.dla_caps:
                if _try_int(path) != t["dla_hz"]:
                    wrong.append(f"{path}={_try_read(path)} (wanted {t['dla_hz']})")
        if wrong:
            raise ApplyError("the board did not take the configuration: " + "; ".join(wrong))

    def set_mode(self, mode_id: int) -> None:
        """``nvpmodel -m ID``, then poll ``-q`` until the board reports it.

        Some switches need a reboot (on Orin, one that changes the GPU's TPC
        mask once the GPU has run: "Golden image context is already created";
        nvpmodel then asks "DO YOU WANT TO REBOOT NOW? enter YES/yes to
        confirm"). nvpmodel runs with no input, so the question is answered
        no and the board stays in its mode; :class:`ModeNeedsReboot` says so.
        """
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
        """Run nvpmodel with no input: a question it asks is answered by the end of input, that is no.

        A mode it will only enter after a reboot raises :class:`ModeNeedsReboot`
        whatever its exit status (boards differ), before any other failure.
        """
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
        if args[:1] == ["-m"] and any(marker in f"{proc.stdout}\n{proc.stderr}" for marker in REBOOT_MARKERS):
            raise ModeNeedsReboot(
                f"switching from nvpmodel mode {self.query_mode()} to mode {args[1]} needs a reboot: not applied, "
                f"tune never reboots a board (to tune in mode {args[1]}: sudo nvpmodel -m {args[1]}, answer yes, "
                "and run again after the reboot)"
            )
        if proc.returncode != 0:
            msg = (proc.stderr or proc.stdout).strip().splitlines()
            raise ApplyError(
                f"'{self.nvpmodel} {' '.join(args)}' exited {proc.returncode}: {msg[-1] if msg else 'no output'}"
            )
        return proc

    def _write(self, path: Path, value: str) -> None:
        try:
            sysfs.write(self.root, path, value)
        except sysfs.BoardWriteError as exc:
            raise ApplyError(f"writing {value} to {path} failed: {exc.strerror} ({exc.rule})") from None

    def check_readable(self, paths: list[Path]) -> None:
        """Refuse, before the first read that would raise, where this user may not read a file the tool must save.

        On a Jetson the nvpmodel EMC cap, BPMP debugfs and (AGX Xavier on L4T 32) the
        rails are root-only: the state a run must put back cannot even be read without root.
        """
        denied = [p for p in paths if sysfs.is_file(p) and not sysfs.can_read(p)]
        if denied:
            raise DeviceError(
                f"reading {denied[0]}{f' and {len(denied) - 1} more' if len(denied) > 1 else ''} needs root: "
                f"the board's state cannot be saved without it; run the command with sudo (sudo -E tune ...; "
                "nothing was changed)"
            )

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
        """Put back a state from read_state(), in the order the module docstring gives.

        Only values that passed the checks against this board are written, and
        only what differs. Nothing stops the restore half-way: every refused
        value or failed write is collected, and :class:`RestoreIncomplete`
        lists them with how to finish (the journal is kept by the caller).
        """
        b = self.board
        plan = plan_restore(state, b, self._mode_ids(), self.kind, self._dla_hz())
        problems = [f"journal: {p}" for p in plan.problems]

        def put(path: Path, value: str) -> bool:
            try:
                if sysfs.read(path) != value:
                    sysfs.write(self.root, path, value)
                return True
            except sysfs.BoardWriteError as exc:
                problems.append(f"{path}={value}: {exc.strerror} ({exc.rule})")
            except OSError as exc:
                problems.append(f"{path}: {exc.strerror}")
            return False

        if plan.mode is not None:
            try:
                if self.query_mode() != plan.mode:
                    self.set_mode(plan.mode)
            except ModeNeedsReboot:
                # nvpmodel declined and wrote nothing; the rest of the saved state belongs to that mode,
                # so nothing else is written either: the board stays exactly as it is.
                raise RestoreIncomplete(
                    f"restore of {self.name} refused before any write: nvpmodel enters mode "
                    f"{self._mode_name(plan.mode)} (TPC_PG_MASK {self._mask(plan.mode)}) again only through a "
                    f"reboot, the board is in {self._mode_name(self.query_mode())} as the run left it; "
                    f"run sudo nvpmodel -m {plan.mode}, answer yes to reboot, then tune restore --device {self.name} "
                    "(the journal is kept)"
                ) from None
            except ApplyError as exc:
                problems.append(str(exc))
        if isinstance(state, dict) and "persist" in state:
            # After the mode switch: the conf nvpmodel reads must hold the mode it is in until then.
            saved = state["persist"]
            problems += unpersist(self, saved) if isinstance(saved, dict) else ["journal: persist is not a mapping"]
        for cpu in sorted(plan.online):
            put(b.online[cpu], plan.online[cpu])
        policies = {p.cpu: p for p in b.policies}
        for saved in plan.policies:
            policy = policies[saved.cpu]
            steps: list[Write] = []
            if saved.min_khz is not None and saved.max_khz is not None:
                cur = (_try_int(policy.min_path), _try_int(policy.max_path))
                steps = _pair(policy.min_path, policy.max_path, (saved.min_khz, saved.max_khz), cur, False)
            governor = policy.folder / "scaling_governor"
            if saved.governor is not None and _try_read(governor) != saved.governor:
                steps.append(Write(str(governor), saved.governor))
            if not steps:
                continue
            # A cluster whose cores are all offline takes no limits: wake one core for the writes.
            woken = None
            if not self._online_now().intersection(policy.cpus):
                woken = next((b.online[c] for c in sorted(policy.cpus) if c in b.online), None)
                if woken is None or not put(woken, "1"):
                    problems.append(f"policy{policy.cpu}: no core of the cluster could be brought online")
                    continue
            try:
                for step in steps:
                    put(Path(step.path), step.value)
            finally:
                if woken is not None:
                    put(woken, "0")
        if plan.gpu_min is not None and plan.gpu_max is not None:
            cur = (_try_int(b.gpu / "min_freq"), _try_int(b.gpu / "max_freq"))
            for step in _pair(b.gpu / "min_freq", b.gpu / "max_freq", (plan.gpu_min, plan.gpu_max), cur, False):
                put(Path(step.path), step.value)
        if plan.gpu_governor is not None:
            put(b.gpu / "governor", plan.gpu_governor)
        if plan.railgate is not None and b.railgate is not None:
            put(b.railgate, plan.railgate)
        if plan.emc_rate is not None and b.emc_rate is not None and b.emc_locked is not None:
            put(b.emc_rate, str(plan.emc_rate))
            if plan.emc_locked is not None:
                put(b.emc_locked, plan.emc_locked)
        for core, hz in sorted(plan.dla.items()):
            put(b.dla_caps[core], str(hz))
        if problems:
            incomplete = JournalRefused if len(problems) == len(plan.problems) else RestoreIncomplete
            raise incomplete(
                f"restore of {self.name} incomplete, {len(problems)} item(s) remain: "
                + "; ".join(problems)
                + f"; the journal is kept: fix the cause, then run: tune restore --device {self.name}"
            )

    # -- thermal and metering -----------------------------------------------

    def temperatures(self) -> dict[str, float]:
        temps: dict[str, float] = {}
        for zone, path in self.board.zones.items():
            try:
                celsius = int(sysfs.read(path)) / 1000
            except (OSError, ValueError):
                continue  # some zones refuse reads while their sensor is off
            if celsius > NO_SENSOR_C:
                temps[zone] = celsius
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
            unreadable = [r.name for r in self.board.rails if not all(sysfs.can_read(f) for f in r.files())]
            if unreadable:
                raise DeviceError(
                    f"reading the INA3221 rails ({', '.join(unreadable)}) needs root on this board: run the command "
                    "with sudo, or pick --meter jtop (its service reads them as root)"
                )
            return RailMeter(self.board.rails, period_s=self.meter_period_s, temperatures=self.temperatures)
        if kind == "jtop":
            return JtopMeter()
        raise UserError(f"unknown Jetson meter {kind!r}: choose rails or jtop")

    def measure(self, model: str, config: Config, settings: WindowSettings) -> Measurement:
        """Run the real runner in a LoadGen window under the board's meter; abort when too hot.

        The clocks that ran are sampled through the window (:mod:`.clocks`) and kept in its extras
        (``gpu_mhz_mean`` ...); a window whose clocks fell below what the last apply set, or in which
        an over-current counter rose, is marked throttled and does not count, as the NVML backend
        does with its throttle reasons.
        """
        from tuner.measure.session import mark_invalid

        self.check_thermal()
        clocks = ClockMonitor(self.board.clocks) if self.board.clocks is not None else None
        measurement = self._window(model, config, settings, [clocks] if clocks is not None else [])
        self.check_thermal(measurement.temps_c)
        if clocks is None:
            return measurement
        measurement = measurement.model_copy(update={"extra": {**measurement.extra, **clocks.extras()}})
        throttled = clocks.throttles(self._asked)
        if throttled:
            measurement = mark_invalid(measurement, f"throttled: {'; '.join(throttled)}", throttled=True)
        return measurement

    def _window(self, model: str, config: Config, settings: WindowSettings, monitors: list[Any]) -> Measurement:
        """One window of the model under the board's meter with ``monitors`` sampled through it; its temperatures."""
        from tuner.measure.session import measure_with

        meter = device_meter(settings.meter, self.make_meter)
        self._runtime = settings.runtime
        runner = self._runner_factory(model, config)
        if self._measure_fn is None:
            measurement = measure_with(runner, meter, config.batch_size, settings, settings.percentile, monitors)
        else:
            for monitor in monitors:
                monitor.start()
            try:
                measurement = self._measure_fn(runner, meter, config.batch_size, settings, settings.percentile)
            finally:
                for monitor in monitors:
                    monitor.stop()
        temps = meter.max_temps_c if isinstance(meter, RailMeter) else self.temperatures()
        return measurement.model_copy(update={"temps_c": temps})


def _pair(
    min_path: Path,
    max_path: Path,
    target: int | tuple[int, int],
    cur: tuple[int | None, int | None],
    include_all: bool,
) -> list[Write]:
    """Writes that move a (min, max) pair to ``target`` without ever having min above max."""
    lo, hi = (target, target) if isinstance(target, int) else target
    cur_lo, cur_hi = cur
    min_w = Write(str(min_path), str(lo)) if include_all or cur_lo != lo else None
    max_w = Write(str(max_path), str(hi)) if include_all or cur_hi != hi else None
    order = [max_w, min_w] if cur_hi is None or lo > cur_hi else [min_w, max_w]
    return [w for w in order if w is not None]


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
