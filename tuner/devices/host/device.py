"""The host CPU as a device (``--device cpu``): observe-only, measured with RAPL.

Nothing on the machine is changed: the space has only runner knobs
(precision) and batch sizes, so apply() checks the configuration and writes
nothing. Its main use is CI, which drives the real LoadGen path end to end
with a tiny model and a fake powercap tree (``TUNE_POWERCAP_ROOT``).
"""

from __future__ import annotations

import platform
from typing import Any

from tuner.devices.host.meters import RaplMeter
from tuner.devices.meters.registry import device_meter
from tuner.devices.runner_cache import RunnerCache
from tuner.errors import UserError
from tuner.measure.meters import Meter
from tuner.measure.session import measure_with
from tuner.measure.settings import WindowSettings, sizes_to_warm
from tuner.measurement import Measurement
from tuner.space import Config, SearchSpace, load_space


class HostDevice:
    """The CPU this process runs on."""

    name = "cpu"
    kind = "cpu"
    slug = "cpu"
    simulated = False

    def __init__(self) -> None:
        self._space: SearchSpace | None = None
        self.runners = RunnerCache("cpu")

    def space(self) -> SearchSpace:
        if self._space is None:
            self._space = load_space(self.kind)
        return self._space

    def read_state(self) -> dict[str, Any]:
        """Nothing is ever written, so there is nothing to remember."""
        return {}

    def apply(self, config: Config) -> None:
        """Check the configuration only: every knob of this device is a runner knob."""
        self.space().validate_config(config)

    def restore(self, state: dict[str, Any]) -> None:
        """Nothing was changed."""

    def make_meter(self, choice: str | None) -> Meter:
        if choice not in (None, "rapl"):
            raise UserError(f"meter {choice!r} is not available on the cpu device: use --meter rapl")
        return RaplMeter()

    def measure(self, model: str, config: Config, settings: WindowSettings) -> Measurement:
        """One LoadGen window on the CPU, metered by RAPL (checked before the model loads)."""
        meter = device_meter(settings.meter, self.make_meter)
        warm = sizes_to_warm(settings, config.batch_size)
        runner = self.runners.get(model, config, self.space(), settings.runtime, warm)
        result = measure_with(runner, meter, config.batch_size, settings, warm_qps=self.runners.warm_qps())
        if result.valid and settings.scenario == "offline" and result.qps > 0:
            self.runners.ran(result.qps)
        return result

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "cpu": platform.processor() or platform.machine(),
            "observe_only": True,
            "simulated": False,
        }

    def close(self) -> None:
        """Free the cached runner."""
        self.runners.close()
        self._runner, self._runner_key = None, None
