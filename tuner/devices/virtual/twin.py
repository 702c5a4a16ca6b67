"""The twin as a device (``sim:orin``, ``sim:h200``, ...): the Device protocol over the twin's physics.

The parameters are tuner.devices.virtual.twin_schema, the physics
twin_physics, the Offline window's cut twin_cut, a fleet unit's variation
twin_units and the DLA lanes twin_dla; a Server window is the queueing
simulation of tuner.devices.virtual.queueing. Touches no hardware.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from tuner.devices.base import VirtualBoard
from tuner.devices.jetson.dla import for_runtime
from tuner.devices.virtual.queueing import server_measurement
from tuner.devices.virtual.twin_cut import offline_cut
from tuner.devices.virtual.twin_dla import dla_lanes, load_dla_params
from tuner.devices.virtual.twin_physics import TwinModel, TwinResult
from tuner.devices.virtual.twin_schema import TWIN_KINDS, TwinParams, load_params, twin_names
from tuner.devices.virtual.twin_units import UnitVariation
from tuner.errors import UserError
from tuner.measure.settings import WindowSettings
from tuner.measurement import Measurement
from tuner.models import profiled
from tuner.space import Config, load_space, load_space_file

SWEEP_CHUNK = 4096


class TwinDevice(VirtualBoard):
    """A simulated device: the Device protocol over :class:`TwinModel`; touches no hardware.

    ``params`` replaces the kind's committed parameters (the calibration scripts try candidates).
    """

    def __init__(self, name: str, space_file: str | None = None, params: TwinParams | None = None) -> None:
        short = name.split(":", 1)[1] if ":" in name else name
        short, _, option = short.partition("#")
        if short not in TWIN_KINDS:
            raise UserError(f"unknown twin {name!r}: known twins are {', '.join('sim:' + k for k in twin_names())}")
        self.kind, runtime = TWIN_KINDS[short]
        self.unit = UnitVariation.parse(option, name) if option else None
        suffix = f"#unit={self.unit.unit}" if self.unit else ""
        self.name = f"sim:{short}{suffix}"
        self.slug = f"sim-{short}" + (f"-unit{self.unit.unit}" if self.unit else "")
        self.params = params if params is not None else load_params(self.kind)
        # A TensorRT twin of a board with DLAs models them (tuner.devices.virtual.twin_dla); other twins leave a
        # runtime's own knobs out of their spaces.
        tensorrt = runtime.startswith("tensorrt")
        self.dla = load_dla_params(self.kind) if tensorrt else None
        own = "tensorrt" if tensorrt else None
        self._space = for_runtime(load_space(self.kind, "tensorrt"), own, self.dla is not None)
        if space_file is not None:
            custom = for_runtime(load_space_file(Path(space_file)), own, self.dla is not None)
            if custom.kind != self.kind or set(custom.knobs) - set(self._space.knobs):
                raise UserError(
                    f"{space_file} is a space for {custom.kind} with knobs {', '.join(custom.knobs)}: "
                    f"{self.name} needs kind {self.kind} with knobs from {', '.join(self._space.knobs)}"
                )
            self._space = custom
        self.model = TwinModel(self.params, self._space, runtime)

    def measure(self, model: str, config: Config, settings: WindowSettings) -> Measurement:
        """Simulate a window; noise is drawn from a generator seeded by the settings' seed.

        Not one configuration of ``measure_many``: a Server window is a queueing simulation.
        """
        profile = profiled(model)
        if settings.scenario == "server":
            return self._unit(server_measurement(self.model.serving(profile, config), config, settings))
        result = self.model.evaluate(profile, [config])
        rng = np.random.default_rng(settings.seed) if settings.noise else None
        return offline_cut(
            self._unit(self._measurements(model, result, [config], rng, settings.window_s)[0]), config, settings
        )

    def _unit(self, m: Measurement) -> Measurement:
        return self.unit.apply(m) if self.unit else m

    def measure_many(self, model: str, configs: list[Config], settings: WindowSettings) -> list[Measurement]:
        """Vectorized noise-free (or seeded) measurements: what makes a full sweep cheap.

        Configurations go through in chunks, so the configurations-by-layers
        arrays stay small (an H200 space has 145,200 points).
        """
        if settings.scenario == "server":
            return [self.measure(model, c, settings) for c in configs]
        profile = profiled(model)
        rng = np.random.default_rng(settings.seed) if settings.noise else None
        out: list[Measurement] = []
        for start in range(0, len(configs), SWEEP_CHUNK):
            chunk = configs[start : start + SWEEP_CHUNK]
            result = self.model.evaluate(profile, chunk)
            out += [self._unit(m) for m in self._measurements(model, result, chunk, rng, settings.window_s)]
        return out

    def use_runtime(self, runtime: str) -> None:
        """Refuse ``--runtime tensorrt`` on a twin that models eager PyTorch (sim:orin-trt is the TensorRT one).

        Any other runtime leaves the twin's own profile in place, as before runtimes were named.
        """
        if runtime == "tensorrt" and not self.model.runtime.startswith("tensorrt"):
            raise UserError(f"{self.name} models eager PyTorch, not TensorRT: use a TensorRT twin (sim:orin-trt)")

    def _measurements(
        self, model: str, result: TwinResult, configs: list[Config], rng: np.random.Generator | None, window_s: float
    ) -> list[Measurement]:
        """The GPU's result, with the DLA lanes of each configuration added where the twin models DLAs."""
        if self.dla is None:
            return [self.model.measurement(result, i, c.batch_size, rng, window_s) for i, c in enumerate(configs)]
        lanes = dla_lanes(self.dla, self._space, model, configs)
        batch = np.array([c.batch_size for c in configs], dtype=float)
        gpu_qps = batch / result.time_s
        latency = np.maximum(result.time_s, lanes.batch_s)
        rails = {**result.rails_w, self.dla.rail: result.rails_w[self.dla.rail] + lanes.power_w}
        power = result.power_w + lanes.power_w
        merged = TwinResult(latency, power, result.gpu_mhz, result.throttled, rails, self.model.wall(power))
        out = []
        for i, c in enumerate(configs):
            m = self.model.measurement(merged, i, c.batch_size, rng, window_s)
            if lanes.cores[i] == 0:
                out.append(m)
                continue
            # The window's samples are shared by the lanes: per batch latency, the GPU and the DLAs together
            # finish (gpu + dla images per second) x latency samples, not one GPU batch.
            share = (gpu_qps[i] + lanes.qps[i]) * latency[i] / c.batch_size
            queries = max(1, round(m.queries * share))
            noise = m.qps * latency[i] / c.batch_size  # the seeded time noise, as a rate factor
            extra = dict(m.extra)
            extra["engine_gpu_qps"] = float(gpu_qps[i]) * noise
            for core in range(int(lanes.cores[i])):
                extra[f"engine_dla{core}_qps"] = float(lanes.per_dla_qps[i]) * noise
            if "wall_w" in extra:
                extra["wall_j_per_query"] = float(extra["wall_w"]) * m.duration_s / queries
            out.append(
                m.model_copy(
                    update={
                        "j_per_query": m.energy_j / queries,
                        "qps": queries / m.duration_s,
                        "queries": queries,
                        "extra": extra,
                    }
                )
            )
        return out

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "twin": True,
            "title": self.params.title,
            "runtime": self.params.runtimes[self.model.runtime].description,
        }
