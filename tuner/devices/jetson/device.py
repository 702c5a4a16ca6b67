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
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tuner.devices.jetson import sysfs
from tuner.devices.jetson.apply import ConfigApplier
from tuner.devices.jetson.board import MODEL_NAMES, Board, detect_kind, discover
from tuner.devices.jetson.clocks import ClockMonitor
from tuner.devices.jetson.errors import (
    ApplyError,
    JetsonError,
    JournalRefused,
    MaskChangeRefused,
    ModeNeedsReboot,
    RestoreIncomplete,
    ThermalLimitError,
)
from tuner.devices.jetson.meters import JtopMeter, RailMeter
from tuner.devices.jetson.nvpmodel import _find_nvpmodel
from tuner.devices.jetson.persist import unpersist
from tuner.devices.jetson.restore import plan_restore
from tuner.devices.jetson.spaces import board_space
from tuner.devices.jetson.thermal import DEFAULT_THERMAL_LIMIT_C, thermal_caps
from tuner.devices.jetson.writes import Write, _pair, _try_int, _try_read
from tuner.devices.meters.registry import device_meter
from tuner.devices.runner_cache import RunnerCache
from tuner.errors import DeviceError, UserError
from tuner.measure.settings import WindowSettings
from tuner.measurement import Measurement
from tuner.space import Config, SearchSpace, load_space

__all__ = [
    "DEVICE_KINDS",
    "ApplyError",
    "JetsonDevice",
    "JetsonError",
    "JournalRefused",
    "MaskChangeRefused",
    "ModeNeedsReboot",
    "RestoreIncomplete",
    "ThermalLimitError",
    "Write",
    "jetson_device",
]

STATE_VERSION = 1

# What a user may type for a Jetson device, and the search space each names.
DEVICE_KINDS = {
    "orin": "orin-agx",
    "orin-agx": "orin-agx",
    "orin-nano": "orin-nano",
    "orin-nano-super": "orin-nano-super",
    "orin-nx": "orin-nx",
    "xavier": "xavier-agx",
    "xavier-agx": "xavier-agx",
    "tx2": "tx2",
}


def _writable(path: Path) -> bool:
    return sysfs.can_write(path)


class JetsonDevice(ConfigApplier):
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
        per_core = {hz for m in self.board.modes for hz in m.dla_caps_hz}  # a mode may cap each DLA differently
        return sorted({round(float(v) * 1e6) for v in [*space.knobs["dla_mhz"].values, *caps]} | per_core)

    def read_state(self) -> dict[str, Any]:
        """Everything apply may change, plus what jetson_clocks changes, as read from the board.

        A cluster whose limits cannot be read (newer kernels answer EBUSY for a
        policy whose CPUs are all offline) is left out: nothing of it changes.
        """
        b = self.board
        capped = thermal_caps(self.root)
        if capped:
            raise DeviceError(
                f"a thermal cap is in force ({'; '.join(capped)}): the clock limits read back lowered by it, not as "
                "they were set, so the board's state cannot be saved; let the board cool until the cooling device's "
                "cur_state is 0, then run the command again (nothing was changed)"
            )
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
        capped = bool(thermal_caps(self.root))  # a limit's read-back is the cap's: write every limit (.thermal)

        def put(path: Path, value: str, limit: bool = False) -> bool:
            try:
                if (limit and capped) or sysfs.read(path) != value:
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
                steps = _pair(policy.min_path, policy.max_path, (saved.min_khz, saved.max_khz), cur, capped)
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
                    put(Path(step.path), step.value, limit=True)
            finally:
                if woken is not None:
                    put(woken, "0")
        if plan.gpu_min is not None and plan.gpu_max is not None:
            cur = (_try_int(b.gpu / "min_freq"), _try_int(b.gpu / "max_freq"))
            for step in _pair(b.gpu / "min_freq", b.gpu / "max_freq", (plan.gpu_min, plan.gpu_max), cur, capped):
                put(Path(step.path), step.value, limit=True)
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

    def make_meter(self, kind: str | None = None) -> RailMeter | JtopMeter:
        """The board's meter: INA3221 rails (default) or ``jtop`` through jetson-stats."""
        if kind in (None, "", "rails", "ina3221"):
            if not self.board.rails:
                raise UserError(
                    f"no INA3221 power rails under {self.root / 'sys/bus/i2c/drivers'} (ina3221, ina3221x): "
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


def jetson_device(name: str, **kwargs: Any) -> JetsonDevice:
    """The device a user named (``orin``, ``orin-nano``, ``orin-nano-super``, ``orin-nx``, ``xavier``, ``tx2``, or a
    space's kind)."""
    if name not in DEVICE_KINDS:
        raise UserError(f"unknown Jetson device {name!r}: choose from {', '.join(DEVICE_KINDS)}")
    return JetsonDevice(DEVICE_KINDS[name], name=name, **kwargs)
