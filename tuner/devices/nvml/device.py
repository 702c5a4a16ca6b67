"""NVIDIA datacenter GPUs through NVML: ``cuda:N``.

Observe-only by default: every ``group: device`` knob (locked SM clock,
memory clock, power limit) is pinned to what the card runs now, so a study
tunes only batch size and runner knobs (precision, ...) and no NVML set
function is ever called. With ``allow_clock_changes=True`` the device locks
clocks and sets the power limit, and ``restore`` resets the locks and puts the
original power limit back; that path needs root (or ``nvidia-smi -acp
UNRESTRICTED``) and is exercised only against a fake NVML in the tests.

NVML has no getter for locked clocks, so ``restore`` can only reset locks to
the driver default; clocks locked by someone else before the run are not
reinstated (read_state records the clock-event reasons that hint at them).
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

from tuner.devices.host.meters import RaplMeter
from tuner.devices.meters.registry import device_meter
from tuner.devices.nvml.meters import EDGES_FOR_PERIOD, NvmlEnergyMeter
from tuner.devices.runner_cache import RunnerCache
from tuner.errors import UserError
from tuner.measure.meters import Meter, SampledPowerMeter
from tuner.measure.poller import Poller
from tuner.measure.session import mark_invalid, measure_with
from tuner.measure.settings import WindowSettings
from tuner.measure.window import sizes_to_warm
from tuner.measurement import Measurement
from tuner.space import Config, SearchSpace, load_space

KIND_BY_NAME = (("H200", "h200"), ("H100", "h100"), ("A30", "a30"))
METERS = ("nvml-energy", "nvml-power", "rapl")
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_SUPPORTED = 3
CLOCK_GRAPHICS = 0
CLOCK_MEM = 2
TEMPERATURE_GPU = 0
# Clock-event reason bits (nvml.h): these mean the clocks were pulled down by
# something other than the configuration under test, so the window is untrusted.
THROTTLE_BITS = {
    0x8: "hardware slowdown",
    0x20: "software thermal slowdown",
    0x40: "hardware thermal slowdown",
    0x80: "hardware power brake",
}
# SW power cap is the configured power limit doing its job: recorded, not disqualifying.
POWER_CAP_BIT = 0x4
POWER_SAMPLE_PERIOD_S = 0.05
TELEMETRY_PERIOD_S = 0.1


def _load_nvml(nvml: Any | None) -> Any:
    if nvml is not None:
        return nvml
    try:
        import pynvml
    except ImportError:
        raise UserError("NVML bindings are missing: pip install nvidia-ml-py") from None
    return pynvml


def _error_code(exc: BaseException) -> int | None:
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) else None


def _is_nvml_error(nvml: Any, exc: BaseException) -> bool:
    cls = getattr(nvml, "NVMLError", None)
    return (isinstance(cls, type) and isinstance(exc, cls)) or _error_code(exc) is not None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def kind_of(gpu_name: str) -> str:
    """Search-space kind from the marketing name NVML reports."""
    upper = gpu_name.upper()
    for marker, kind in KIND_BY_NAME:
        if marker in upper:
            return kind
    raise UserError(
        f"no search space for GPU {gpu_name!r}: write one (copy search_spaces/h200.yaml, "
        "set its clocks and power limits) and pass its path as the space file"
    )


class NvmlTelemetry:
    """Samples temperature and clock-event reasons on a thread during a window."""

    def __init__(self, nvml: Any, handle: Any, period_s: float = TELEMETRY_PERIOD_S) -> None:
        self.nvml = nvml
        self.handle = handle
        self.period_s = period_s
        self.temps_c: list[float] = []
        self.reasons = 0
        self.power_capped_samples = 0
        self.samples = 0
        self._poller = Poller(self.sample, period_s, "nvml-telemetry")

    def _reasons_now(self) -> int:
        getter = getattr(self.nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
        if getter is None:
            getter = self.nvml.nvmlDeviceGetCurrentClocksThrottleReasons
        return int(getter(self.handle))

    def sample(self) -> None:
        try:
            self.temps_c.append(float(self.nvml.nvmlDeviceGetTemperature(self.handle, TEMPERATURE_GPU)))
        except Exception as exc:
            if not _is_nvml_error(self.nvml, exc):
                raise
        try:
            reasons = self._reasons_now()
        except Exception as exc:
            if not _is_nvml_error(self.nvml, exc):
                raise
            return
        self.reasons |= reasons
        self.power_capped_samples += bool(reasons & POWER_CAP_BIT)
        self.samples += 1

    def start(self) -> None:
        self.temps_c, self.reasons, self.power_capped_samples, self.samples = [], 0, 0, 0
        self.sample()
        self._poller.start()

    def stop(self) -> NvmlTelemetry:
        self._poller.stop()
        self.sample()
        return self

    def throttle_reasons(self) -> list[str]:
        return [text for bit, text in THROTTLE_BITS.items() if self.reasons & bit]


class NvmlDevice:
    """One NVIDIA GPU by index, observe-only unless ``allow_clock_changes``."""

    simulated = False

    def __init__(
        self,
        index: int,
        allow_clock_changes: bool = False,
        nvml: Any | None = None,
        space_file: str | None = None,
    ) -> None:
        self.nvml = _load_nvml(nvml)
        self.index = index
        self.allow_clock_changes = allow_clock_changes
        self.name = f"cuda:{index}"
        try:
            self.nvml.nvmlInit()
        except Exception as exc:
            if not _is_nvml_error(self.nvml, exc):
                raise
            raise UserError(
                f"NVML is not available ({exc}): {self.name} needs an NVIDIA GPU and driver; "
                "use --device sim:h200 to try the tool without one"
            ) from None
        count = int(self.nvml.nvmlDeviceGetCount())
        if not 0 <= index < count:
            raise UserError(
                f"no GPU {self.name}: this machine has {count} NVIDIA GPU(s)"
                + (f", cuda:0..cuda:{count - 1}" if count else "; use --device sim:h200")
            )
        self.handle = self.nvml.nvmlDeviceGetHandleByIndex(index)
        self.gpu_name = _text(self.nvml.nvmlDeviceGetName(self.handle))
        self.space_file = space_file
        self.kind = load_space(space_file).kind if space_file else kind_of(self.gpu_name)
        self.slug = self.kind
        self._space: SearchSpace | None = None
        self.runners = RunnerCache(self.name)
        self._counter_rhythm: deque[float] = deque(maxlen=EDGES_FOR_PERIOD)

    def _call(self, fn: str, *args: Any) -> Any:
        return getattr(self.nvml, fn)(self.handle, *args)

    def _try(self, fn: str, *args: Any) -> Any | None:
        try:
            return self._call(fn, *args)
        except Exception as exc:
            if not _is_nvml_error(self.nvml, exc):
                raise
            return None

    def current_clocks(self) -> dict[str, float]:
        """What the card runs now: applications clocks where readable, else the max clocks."""
        values: dict[str, float] = {}
        for knob, clock in (("sm_mhz", CLOCK_GRAPHICS), ("mem_mhz", CLOCK_MEM)):
            value = self._try("nvmlDeviceGetApplicationsClock", clock)
            if not value:
                value = self._try("nvmlDeviceGetMaxClockInfo", clock)
            if value:
                values[knob] = float(value)
        limit = self._try("nvmlDeviceGetPowerManagementLimit")
        if limit:
            values["power_limit_w"] = limit / 1000.0
        return values

    def space(self) -> SearchSpace:
        """The kind's space cut to what this card supports; device knobs pinned if observe-only."""
        if self._space is None:
            self._space = self._build_space()
        return self._space

    def _build_space(self) -> SearchSpace:
        space = load_space(self.space_file or self.kind)
        supported = self._supported()
        for knob, allowed in supported.items():
            if knob not in space.knobs or allowed is None:
                continue
            kept = [v for v in space.knobs[knob].values if allowed(float(v))]
            if not kept:
                raise UserError(
                    f"{self.gpu_name} supports none of the {knob} values in the {self.kind} space: "
                    "edit that file to match `nvidia-smi -q -d SUPPORTED_CLOCKS`"
                )
            default = space.knobs[knob].default
            space.knobs[knob] = space.knobs[knob].model_copy(
                update={"values": kept, "default": default if default in kept else kept[-1]}
            )
        if not self.allow_clock_changes:
            current = self.current_clocks()
            for name, knob in list(space.knobs.items()):
                if knob.group != "device":
                    continue
                if name not in current:
                    raise UserError(f"cannot read the current {name} of {self.name} through NVML")
                value = current[name]
                space = space.pin(name, int(value) if float(value).is_integer() else value)
        return space

    def _supported(self) -> dict[str, Any]:
        """Predicates for values the card accepts; None where NVML cannot say."""
        mem = self._try("nvmlDeviceGetSupportedMemoryClocks")
        graphics: set[float] = set()
        for clock in mem or []:
            graphics.update(float(g) for g in self._try("nvmlDeviceGetSupportedGraphicsClocks", clock) or [])
        limits = self._try("nvmlDeviceGetPowerManagementLimitConstraints")
        if self.allow_clock_changes and (not mem or not graphics or not limits):
            raise UserError(
                f"NVML on {self.name} does not report supported clocks and power limits, "
                "so they cannot be "
                "changed safely: run without --allow-clock-changes"
            )
        mem_set = {float(m) for m in mem or []}
        result: dict[str, Any] = {
            "mem_mhz": (lambda v: v in mem_set) if mem_set else None,
            "sm_mhz": (lambda v: v in graphics) if graphics else None,
            "power_limit_w": None,
        }
        if limits:
            low, high = (x / 1000.0 for x in limits)
            result["power_limit_w"] = lambda v: low - 1e-6 <= v <= high + 1e-6
        return result

    def read_state(self) -> dict[str, Any]:
        """Power limit, clocks and clock-event reasons as found, before any write."""
        reasons = None
        getter = "nvmlDeviceGetCurrentClocksEventReasons"
        if not hasattr(self.nvml, getter):
            getter = "nvmlDeviceGetCurrentClocksThrottleReasons"
        reasons = self._try(getter)
        return {
            "device": self.name,
            "gpu": self.gpu_name,
            "allow_clock_changes": self.allow_clock_changes,
            "power_limit_mw": self._try("nvmlDeviceGetPowerManagementLimit"),
            "default_power_limit_mw": self._try("nvmlDeviceGetPowerManagementDefaultLimit"),
            "clocks": self.current_clocks(),
            "clocks_event_reasons": reasons,
            # bit 0x2: clocks held by an applications-clock or locked-clock setting
            "user_defined_clocks": bool(reasons is not None and reasons & 0x2),
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
        """Check the configuration; lock clocks and set the power limit only if allowed.

        Observe-only: device knobs must equal the pinned current values and no
        NVML set function is called. Otherwise, writes go SM clock, memory
        clock, power limit; if one fails, those already made are undone before
        the error is raised, so a missing privilege leaves the card untouched.
        """
        space = self.space()
        space.validate_config(config)
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
                if not _is_nvml_error(self.nvml, exc):
                    raise
                for undo_fn, undo_with in reversed(done):
                    if undo_fn != "nvmlDeviceSetPowerManagementLimit" or undo_with:
                        self._try(undo_fn, *undo_with)
                raise self._write_error(fn, exc) from None
            done.append((undo, undo_args))

    def _write_error(self, fn: str, exc: BaseException) -> UserError:
        if _error_code(exc) == NVML_ERROR_NO_PERMISSION:
            return UserError(
                f"{fn} on {self.name} needs root (or `nvidia-smi -acp UNRESTRICTED` for clocks): "
                "run as root, "
                "or drop --allow-clock-changes to tune batch size and precision only"
            )
        return UserError(f"{fn} on {self.name} failed ({exc}): the card refused the setting; nothing was kept")

    def restore(self, state: dict[str, Any]) -> None:
        """Reset clock locks and put back the original power limit; nothing if nothing could change.

        A state journaled by an earlier run that was allowed to change clocks
        is restored even by an observe-only device: it is the card's original.
        """
        if not (self.allow_clock_changes or state.get("allow_clock_changes")):
            return
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
                if not _is_nvml_error(self.nvml, exc):
                    raise
                if _error_code(exc) != NVML_ERROR_NOT_SUPPORTED:
                    failures.append(f"{fn}: {exc}")
        if failures:
            raise UserError(f"could not restore {self.name} ({'; '.join(failures)}): run `tune restore` as root")

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
            if self._try("nvmlDeviceGetPowerUsage") is None:
                raise UserError(f"{self.name} reports no power reading through NVML: no sensor to measure energy")
            return SampledPowerMeter(
                lambda: self._call("nvmlDeviceGetPowerUsage") / 1000.0,
                POWER_SAMPLE_PERIOD_S,
                "nvml-power",
                [f"{self.name} board power"],
            )
        return RaplMeter()

    def read_power_w(self) -> float:
        """Board power now as NVML reports it, in watts (the report samples it for its power-over-time figure)."""
        return self._call("nvmlDeviceGetPowerUsage") / 1000.0

    def close_runner(self) -> None:
        self.runners.close()

    def measure(self, model: str, config: Config, settings: WindowSettings) -> Measurement:
        """One LoadGen window on this GPU, metered and watched for throttling."""
        meter = device_meter(settings.meter, self.make_meter)
        warm = sizes_to_warm(settings, config.batch_size)
        runner = self.runners.get(model, config, self.space(), settings.runtime, warm)
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
        if telemetry.samples:
            extra["power_capped_fraction"] = telemetry.power_capped_samples / telemetry.samples
        update["extra"] = extra
        throttles = telemetry.throttle_reasons()
        if throttles:
            return mark_invalid(result, f"throttled: {', '.join(throttles)}", throttled=True, **update)
        return result.model_copy(update=update)

    def describe(self) -> dict[str, Any]:
        driver = None
        try:
            driver = _text(self.nvml.nvmlSystemGetDriverVersion())
        except Exception as exc:
            if not _is_nvml_error(self.nvml, exc):
                raise
        return {
            "name": self.name,
            "kind": self.kind,
            "gpu": self.gpu_name,
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
            if not _is_nvml_error(self.nvml, exc):
                raise
