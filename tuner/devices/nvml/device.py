"""NVIDIA datacenter GPUs through NVML: ``cuda:N``, torch's numbering (after CUDA_VISIBLE_DEVICES).

``cuda:N`` is mapped to the physical card by UUID (tuner.devices.nvml.visible),
so the card whose clocks are set and whose energy is read is the one torch
runs the model on; the runner's own UUID is checked against it.

Observe-only by default: the clock locks (SM, memory) are not knobs at all,
since the driver's boost runs the clocks, and the power limit is pinned to
what the card has now, so a study tunes only batch size and runner knobs
(precision, ...) and no NVML set function is ever called. Every window
records the SM and memory clocks that ran (sampled by the telemetry thread).
With ``allow_clock_changes=True`` the device locks clocks and sets the power
limit, reads them back, and ``restore`` resets the locks and puts the
original power limit back; NVML's set calls need root (NVML reference,
"Device Commands": non-admin users get NVML_ERROR_NO_PERMISSION) and that path
is exercised only against a fake NVML in the tests (docs/hardware-nvml.md).

NVML has no getter for locked clocks, so ``restore`` can only reset locks to
the driver default; clocks locked by someone else before the run are not
reinstated (read_state records the clock-event reasons that hint at them).
"""

from __future__ import annotations

import os
import time
from collections import deque
from typing import Any

from tuner.devices.host.meters import RaplMeter
from tuner.devices.meters.registry import device_meter
from tuner.devices.nvml.calls import (
    CLOCK_GRAPHICS,
    CLOCK_MEM,
    CLOCK_SM,
    FI_DEV_POWER_INSTANT,
    NVML_ERROR_INVALID_ARGUMENT,
    NVML_ERROR_NO_PERMISSION,
    NVML_ERROR_NOT_SUPPORTED,
    NVML_SUCCESS,
    POWER_SCOPE_GPU,
    USER_CLOCKS_BIT,
    as_text,
    error_code,
    is_nvml_error,
    load_nvml,
)
from tuner.devices.nvml.meters import EDGES_FOR_PERIOD, NvmlEnergyMeter
from tuner.devices.nvml.space import LOCK_KNOBS, card_space, kind_of, supported_values, without_knobs
from tuner.devices.nvml.telemetry import NvmlTelemetry
from tuner.devices.nvml.visible import PhysicalGpu, cuda_gpu
from tuner.devices.runner_cache import RunnerCache
from tuner.errors import UserError
from tuner.measure.meters import Meter, SampledPowerMeter
from tuner.measure.session import mark_invalid, measure_with
from tuner.measure.settings import WindowSettings, sizes_to_warm
from tuner.measurement import Measurement
from tuner.space import Config, SearchSpace, load_space

METERS = ("nvml-energy", "nvml-power", "rapl")
KNOB_OF_SET_CALL = {
    "nvmlDeviceSetGpuLockedClocks": "sm_mhz",
    "nvmlDeviceSetMemoryLockedClocks": "mem_mhz",
    "nvmlDeviceSetPowerManagementLimit": "power_limit_w",
}
# A power limit read back within this of the request (mW) holds.
POWER_LIMIT_TOLERANCE_MW = 1000
POWER_SAMPLE_PERIOD_S = 0.05


class NvmlDevice:
    """One NVIDIA GPU by torch's ``cuda:N``, mapped to its physical card by UUID; observe-only unless allowed."""

    simulated = False
    lock_knobs = LOCK_KNOBS

    def __init__(
        self,
        index: int,
        allow_clock_changes: bool = False,
        nvml: Any | None = None,
        space_file: str | None = None,
    ) -> None:
        self.nvml = load_nvml(nvml)
        self.index = index
        self.allow_clock_changes = allow_clock_changes
        self.name = f"cuda:{index}"
        try:
            self.nvml.nvmlInit()
        except Exception as exc:
            if not is_nvml_error(self.nvml, exc):
                raise
            raise UserError(
                f"NVML is not available ({exc}): {self.name} needs an NVIDIA GPU and driver; "
                "use --device sim:h200 to try the tool without one"
            ) from None
        self.card: PhysicalGpu = cuda_gpu(self.nvml, index)
        self.uuid = self.card.uuid
        self.handle = self.nvml.nvmlDeviceGetHandleByIndex(self.card.nvml_index)
        self.gpu_name = self.card.name
        self._refuse_mig()
        self.space_file = space_file
        self.kind = load_space(space_file).kind if space_file else kind_of(self.gpu_name)
        self.slug = self.kind
        self._space: SearchSpace | None = None
        self.runners = RunnerCache(self.name)
        self._counter_rhythm: deque[float] = deque(maxlen=EDGES_FOR_PERIOD)
        self._locks: dict[str, float] = {}
        self._not_held: list[str] = []
        self._read_power: Any | None = None

    def physical_key(self) -> str:
        """What names this card for its lock and journal, whatever ``cuda:N`` reached it: its NVML UUID."""
        return f"nvml-{self.uuid}"

    def _refuse_mig(self) -> None:
        modes = self._try("nvmlDeviceGetMigMode")
        if modes and int(modes[0]) == 1:
            raise UserError(
                f"{self.name} ({self.gpu_name}, {self.uuid}) is in MIG mode: NVML meters and sets the whole GPU, "
                "not one instance; tune a GPU with MIG off (nvidia-smi -mig 0 as root)"
            )

    def _call(self, fn: str, *args: Any) -> Any:
        return getattr(self.nvml, fn)(self.handle, *args)

    def _try(self, fn: str, *args: Any) -> Any | None:
        try:
            return self._call(fn, *args)
        except Exception as exc:
            if not is_nvml_error(self.nvml, exc):
                raise
            return None

    def current_clocks(self) -> dict[str, float]:
        """What the card runs now: the power limit, and the SM and memory clocks at this instant.

        The clocks move with the load (an idle H200 sits at 345 MHz, boosts to
        1980 under work); they are shown beside an export, never pinned as knobs.
        """
        values: dict[str, float] = {}
        for knob, clock in (("sm_mhz", CLOCK_SM), ("mem_mhz", CLOCK_MEM)):
            value = self._try("nvmlDeviceGetClockInfo", clock)
            if value:
                values[knob] = float(value)
        limit = self._try("nvmlDeviceGetPowerManagementLimit")
        if limit:
            values["power_limit_w"] = limit / 1000.0
        return values

    def space(self) -> SearchSpace:
        """The kind's space cut to what this card supports; observe-only: no clock locks, the power limit pinned."""
        if self._space is None:
            base = load_space(self.space_file or self.kind)
            supported = supported_values(self._try, self.name, self.allow_clock_changes)
            current = None if self.allow_clock_changes else self.current_clocks()
            self._space = card_space(base, supported, current, self.gpu_name, self.kind, self.name)
        return self._space

    def check_config(self, config: Config) -> None:
        """Refuse a configuration the space does not allow; a clock lock it leaves out stays with the driver."""
        space = self.space()
        free = tuple(k for k in LOCK_KNOBS if k in space.knobs and k not in config.knobs)
        without_knobs(space, free).validate_config(config)

    def read_state(self) -> dict[str, Any]:
        """Power limit, clocks and clock-event reasons as found, before any write; the card by UUID."""
        reasons = None
        getter = "nvmlDeviceGetCurrentClocksEventReasons"
        if not hasattr(self.nvml, getter):
            getter = "nvmlDeviceGetCurrentClocksThrottleReasons"
        reasons = self._try(getter)
        return {
            "device": self.name,
            "gpu": self.gpu_name,
            "gpu_uuid": self.uuid,
            "pci_bus_id": self.card.pci_bus_id,
            "allow_clock_changes": self.allow_clock_changes,
            "power_limit_mw": self._try("nvmlDeviceGetPowerManagementLimit"),
            "default_power_limit_mw": self._try("nvmlDeviceGetPowerManagementDefaultLimit"),
            "clocks": self.current_clocks(),
            "clocks_event_reasons": reasons,
            # bit 0x2: clocks held by an applications-clock or locked-clock setting
            "user_defined_clocks": bool(reasons is not None and reasons & USER_CLOCKS_BIT),
        }

    def observe_only_state(self) -> dict[str, Any]:
        """The settings observe-only mode promises to leave alone, as read now (None where NVML cannot say).

        Power limit, applications and maximum clocks, persistence and compute
        mode: unlike :meth:`read_state`'s clocks they do not move with the
        load, so the same reading before and after a run shows the card was
        not changed (the measurement scripts under benchmarks/ record both).
        """
        return {
            "power_limit_mw": self._try("nvmlDeviceGetPowerManagementLimit"),
            "app_clock_sm_mhz": self._try("nvmlDeviceGetApplicationsClock", CLOCK_GRAPHICS),
            "app_clock_mem_mhz": self._try("nvmlDeviceGetApplicationsClock", CLOCK_MEM),
            "max_clock_sm_mhz": self._try("nvmlDeviceGetMaxClockInfo", CLOCK_GRAPHICS),
            "persistence_mode": self._try("nvmlDeviceGetPersistenceMode"),
            "compute_mode": self._try("nvmlDeviceGetComputeMode"),
        }

    def apply(self, config: Config) -> None:
        """Check the configuration; lock clocks and set the power limit only if allowed, then read them back.

        Observe-only: device knobs must equal the pinned current values and no
        NVML set function is called. Otherwise, writes go SM clock, memory
        clock, power limit; if one fails, those already made are undone before
        the error is raised, so a missing privilege leaves the card untouched.
        A power limit the card does not read back (or enforces lower) is a
        setting that did not hold (:meth:`settings_not_held`); the clock locks
        are judged on the clocks each window samples.
        """
        self.check_config(config)
        self._locks, self._not_held = {}, []
        if not self.allow_clock_changes:
            return
        knobs = config.knobs
        writes: list[tuple[str, tuple[Any, ...], str, tuple[Any, ...]]] = []
        if "sm_mhz" in knobs:
            sm = int(knobs["sm_mhz"])
            writes.append(("nvmlDeviceSetGpuLockedClocks", (sm, sm), "nvmlDeviceResetGpuLockedClocks", ()))
        if "mem_mhz" in knobs:
            mem = int(knobs["mem_mhz"])
            writes.append(
                (
                    "nvmlDeviceSetMemoryLockedClocks",
                    (mem, mem),
                    "nvmlDeviceResetMemoryLockedClocks",
                    (),
                )
            )
        if "power_limit_w" in knobs:
            original = self._try("nvmlDeviceGetPowerManagementLimit")
            writes.append(
                (
                    "nvmlDeviceSetPowerManagementLimit",
                    (round(float(knobs["power_limit_w"]) * 1000),),
                    "nvmlDeviceSetPowerManagementLimit",
                    (original,) if original else (),
                )
            )
        done: list[tuple[str, tuple[Any, ...]]] = []
        for fn, args, undo, undo_args in writes:
            try:
                self._call(fn, *args)
            except Exception as exc:
                if not is_nvml_error(self.nvml, exc):
                    raise
                for undo_fn, undo_with in reversed(done):
                    if undo_fn != "nvmlDeviceSetPowerManagementLimit" or undo_with:
                        self._try(undo_fn, *undo_with)
                raise self._write_error(fn, args, exc) from None
            done.append((undo, undo_args))
        self._locks = {k: float(knobs[k]) for k in LOCK_KNOBS if k in knobs}
        if "power_limit_w" in knobs:
            self._not_held = self._power_limit_misses(round(float(knobs["power_limit_w"]) * 1000))

    def _power_limit_misses(self, requested_mw: int) -> list[str]:
        """Read back the power limit just set, and the limit the card enforces (another cap may be lower)."""
        misses = []
        now = self._try("nvmlDeviceGetPowerManagementLimit")
        if now is None or abs(int(now) - requested_mw) > POWER_LIMIT_TOLERANCE_MW:
            shown = "unreadable" if now is None else f"{int(now) / 1000:g} W"
            misses.append(f"power_limit_w set to {requested_mw / 1000:g} W reads back {shown}")
        enforced = self._try("nvmlDeviceGetEnforcedPowerLimit")
        if enforced is not None and int(enforced) < requested_mw - POWER_LIMIT_TOLERANCE_MW:
            misses.append(f"power_limit_w {requested_mw / 1000:g} W is enforced as {int(enforced) / 1000:g} W")
        return misses

    def settings_not_held(self) -> list[str]:
        """What the last apply set that the card did not take, read back right after the writes."""
        return list(self._not_held)

    def _write_error(self, fn: str, args: tuple[Any, ...], exc: BaseException) -> UserError:
        knob = KNOB_OF_SET_CALL.get(fn, fn)
        others = [k for k in self.space().tuned_knobs if k != knob]
        drop = f"--knobs {','.join(others)}" if others else f"a --space file without {knob}"
        code = error_code(exc)
        if code == NVML_ERROR_NO_PERMISSION:
            return UserError(
                f"{fn} on {self.name} needs root (NVML's set calls are root-only; `nvidia-smi -acp UNRESTRICTED` "
                "lifts that only for applications clocks and auto boost): run as root, "
                "or drop --allow-clock-changes to tune batch size and precision only"
            )
        if code == NVML_ERROR_NOT_SUPPORTED:
            return UserError(
                f"{self.gpu_name} ({self.name}) cannot set {knob} ({fn}: not supported): leave it out with {drop}"
            )
        if code == NVML_ERROR_INVALID_ARGUMENT:
            value = args[-1] / 1000 if knob == "power_limit_w" else args[-1]
            return UserError(
                f"{self.gpu_name} ({self.name}) refuses {knob}={value:g} ({fn}: invalid argument): leave {knob} "
                f"out with {drop}, or give a --space file without that value"
            )
        return UserError(f"{fn} on {self.name} failed ({exc}): the card refused the setting; nothing was kept")

    def restore(self, state: dict[str, Any]) -> None:
        """Reset clock locks and put back the original power limit; nothing if nothing could change.

        A state journaled by an earlier run that was allowed to change clocks
        is restored even by an observe-only device: it is the card's original.
        A state journaled for another card (``cuda:N`` numbers cards by
        CUDA_VISIBLE_DEVICES, which may differ now) is refused before any write.
        """
        if not (self.allow_clock_changes or state.get("allow_clock_changes")):
            return
        journaled = state.get("gpu_uuid")
        if journaled is not None and journaled != self.uuid:
            raise UserError(
                f"the journal for {self.name} is for GPU {journaled}, but {self.name} is {self.uuid} here: "
                f"run tune restore with CUDA_VISIBLE_DEVICES={journaled} --device cuda:0"
            )
        failures: list[str] = []
        for fn, args in (
            ("nvmlDeviceResetGpuLockedClocks", ()),
            ("nvmlDeviceResetMemoryLockedClocks", ()),
            (
                "nvmlDeviceSetPowerManagementLimit",
                (state["power_limit_mw"],) if state.get("power_limit_mw") else None,
            ),
        ):
            if args is None:
                continue
            try:
                self._call(fn, *args)
            except Exception as exc:
                if not is_nvml_error(self.nvml, exc):
                    raise
                if error_code(exc) != NVML_ERROR_NOT_SUPPORTED:
                    failures.append(f"{fn}: {exc}")
        if failures:
            raise UserError(f"could not restore {self.name} ({'; '.join(failures)}): run `tune restore` as root")
        self._locks, self._not_held = {}, []

    def _instant_power_mw(self) -> int | None:
        """NVML_FI_DEV_POWER_INSTANT at GPU scope, or None where the card does not report it."""
        try:
            value = self._call("nvmlDeviceGetFieldValues", [(FI_DEV_POWER_INSTANT, POWER_SCOPE_GPU)])[0]
        except Exception as exc:
            if not is_nvml_error(self.nvml, exc):
                raise
            return None
        if int(value.nvmlReturn) != NVML_SUCCESS:
            return None
        return int(value.value.uiVal)

    def power_reader(self) -> tuple[Any, str]:
        """How board power is read: the instant field where the card has it, else the 1 s average; and its label."""
        if self._instant_power_mw() is not None:

            def instant() -> float:
                mw = self._instant_power_mw()
                if mw is None:
                    raise UserError(f"{self.name} stopped reporting NVML_FI_DEV_POWER_INSTANT: use --meter nvml-energy")
                return mw / 1000.0

            return instant, f"{self.name} board power, instantaneous (NVML_FI_DEV_POWER_INSTANT)"
        if self._try("nvmlDeviceGetPowerUsage") is None:
            raise UserError(f"{self.name} reports no power reading through NVML: no sensor to measure energy")
        return (
            lambda: self._call("nvmlDeviceGetPowerUsage") / 1000.0,
            f"{self.name} board power, nvmlDeviceGetPowerUsage (a 1 s average on Ampere and newer)",
        )

    def make_meter(self, choice: str | None) -> Meter:
        """nvml-energy where the counter works (default), nvml-power at 50 ms, or rapl."""
        if choice not in (None, *METERS):
            raise UserError(f"unknown meter {choice!r} for {self.name}: choose one of {', '.join(METERS)}")
        if choice in (None, "nvml-energy"):
            if self._try("nvmlDeviceGetTotalEnergyConsumption") is not None:
                return NvmlEnergyMeter(
                    self.nvml, self.handle, rails=[f"{self.name} total energy counter"], rhythm=self._counter_rhythm
                )
            if choice == "nvml-energy":
                raise UserError(f"{self.gpu_name} has no NVML energy counter (Volta or newer): use --meter nvml-power")
        if choice in (None, "nvml-power"):
            read, rail = self.power_reader()
            return SampledPowerMeter(read, POWER_SAMPLE_PERIOD_S, "nvml-power", [rail])
        return RaplMeter()

    def read_power_w(self) -> float:
        """Board power now as NVML reports it, in watts (the report samples it for its power-over-time figure)."""
        if self._read_power is None:
            self._read_power = self.power_reader()[0]
        return self._read_power()

    def close_runner(self) -> None:
        self.runners.close()

    def _check_runner_card(self, runner: Any) -> None:
        """Refuse a runner whose GPU is not this card (a runtime that numbers GPUs otherwise than CUDA does)."""
        uuid = getattr(runner, "gpu_uuid", None)
        if uuid is not None and str(uuid) != self.uuid:
            raise UserError(
                f"the model runs on GPU {uuid} but NVML meters {self.uuid} for {self.name}: name the GPU by UUID "
                f"(CUDA_VISIBLE_DEVICES={self.uuid}) and use --device cuda:0"
            )

    def clock_state(self, telemetry: NvmlTelemetry) -> str:
        """How the SM clock was governed in a window: locked by this tool, held by another setting, or boosting."""
        if "sm_mhz" in self._locks:
            return f"locked at {self._locks['sm_mhz']:g} MHz"
        if telemetry.reasons & USER_CLOCKS_BIT:
            return "held by an applications-clock or locked-clock setting made outside this tool"
        return "driver boost (not locked)"

    def measure(self, model: str, config: Config, settings: WindowSettings) -> Measurement:
        """One LoadGen window on this GPU, metered and watched for throttling and for settings that did not hold."""
        meter = device_meter(settings.meter, self.make_meter)
        warm = sizes_to_warm(settings, config.batch_size)
        runner = self.runners.get(model, config, self.space(), settings.runtime, warm)
        self._check_runner_card(runner)
        telemetry = NvmlTelemetry(self.nvml, self.handle)
        started = time.monotonic()
        result = measure_with(
            runner, meter, config.batch_size, settings, monitors=[telemetry], warm_qps=self.runners.warm_qps()
        )
        measured_s = time.monotonic() - started
        if result.valid and settings.scenario == "offline" and result.qps > 0:
            self.runners.ran(result.qps)
        temps = telemetry.temps_c
        update: dict[str, Any] = {}
        if temps:
            update["temps_c"] = {"gpu_max": max(temps), "gpu_mean": sum(temps) / len(temps)}
        extra = dict(result.extra)
        # Where a trial's time goes besides the window: loading, preparing, warm-up and LoadGen.
        extra["runner_load_s"] = self.runners.last_load_s
        extra["runner_prepare_s"] = self.runners.last_prepare_s
        extra["window_call_s"] = measured_s
        extra["clocks_event_reasons"] = f"0x{telemetry.reasons:x}"
        extra.update(telemetry.clock_extras())
        extra["sm_clock"] = self.clock_state(telemetry)
        if telemetry.samples:
            extra["power_capped_fraction"] = telemetry.power_capped_samples / telemetry.samples
        update["extra"] = extra
        throttles = telemetry.throttle_reasons()
        if throttles:
            result = mark_invalid(result, f"throttled: {', '.join(throttles)}", throttled=True)
        not_held = self._not_held + telemetry.lock_misses(self._locks.get("sm_mhz"), self._locks.get("mem_mhz"))
        if not_held:
            result = mark_invalid(result, f"settings did not hold: {'; '.join(not_held)}")
        return result.model_copy(update=update)

    def describe(self) -> dict[str, Any]:
        driver = None
        try:
            driver = as_text(self.nvml.nvmlSystemGetDriverVersion())
        except Exception as exc:
            if not is_nvml_error(self.nvml, exc):
                raise
        return {
            "name": self.name,
            "kind": self.kind,
            "gpu": self.gpu_name,
            "gpu_uuid": self.uuid,
            "pci_bus_id": self.card.pci_bus_id,
            "nvml_index": self.card.nvml_index,
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "driver": driver,
            "observe_only": not self.allow_clock_changes,
            "simulated": False,
        }

    def close(self) -> None:
        """Free the cached runner and NVML."""
        self.close_runner()
        try:
            self.nvml.nvmlShutdown()
        except Exception as exc:
            if not is_nvml_error(self.nvml, exc):
                raise
