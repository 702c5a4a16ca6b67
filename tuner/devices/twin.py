"""Digital twins (``sim:orin``, ``sim:h200``, ...): a physical model of a device running a model.

Time per batch, per layer: the GPU side is the larger of compute time
(FLOPs over the clock- and TPC-scaled peak of the precision) and memory time
(bytes over the memory-clock-scaled bandwidth), plus a minimum kernel time, and never under the latency floor of the
precision's matmul kernels (small-batch convolutions are latency-bound);
the CPU side is the launch cost of the operator (cycles over CPU frequency).
Eager frameworks launch asynchronously, so each layer costs the larger of the
two; per-sample host work (input staging) runs on the online CPU cores.

Power: board static power, plus for the GPU leakage (proportional to voltage
and to the powered TPCs) and dynamic C*V^2*f*activity, plus memory power
(static scaled with its clock and energy per byte moved), plus CPU leakage per
online core and dynamic power of the busy cores. Voltage follows a
voltage-frequency curve that is flat below a knee. Where the device has a
power limit, the clock is lowered until the board fits under it, as the
firmware does.

The evaluation is vectorized over configurations so that ``tune sweep`` can
score every point of a space. Parameters and their sources are in
twin_params/<kind>.json and docs/twin.md.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from runners.profile import ModelProfile, load_profile
from tuner.devices.base import WindowSettings
from tuner.devices.queueing import server_measurement
from tuner.errors import UserError
from tuner.measurement import Measurement
from tuner.space import Config, SearchSpace, load_space, load_space_file

SWEEP_CHUNK = 4096
PRECISION_BYTES = {"fp32": 4.0, "fp16": 2.0, "bf16": 2.0}


class VfCurve(BaseModel):
    """Voltage against frequency: v_min up to f_knee_mhz, then linear to v_max at f_max_mhz."""

    model_config = ConfigDict(extra="forbid")

    v_min: float
    v_max: float
    f_knee_mhz: float
    f_max_mhz: float

    def volts(self, f_mhz: np.ndarray) -> np.ndarray:
        span = max(self.f_max_mhz - self.f_knee_mhz, 1e-9)
        frac = np.clip((f_mhz - self.f_knee_mhz) / span, 0.0, None)
        return self.v_min + (self.v_max - self.v_min) * frac


class TwinParams(BaseModel):
    """Every constant of one twin. ``sources`` says where each came from (datasheet, fit, assumption)."""

    model_config = ConfigDict(extra="forbid")

    version: int = 1
    kind: str
    title: str
    knob_map: dict[str, str]
    fixed: dict[str, float | str] = Field(default_factory=dict)
    tpcs_max: int
    peak_flops_per_cycle_per_tpc: dict[str, float]
    vector_flops_per_cycle_per_tpc: float
    compute_efficiency: dict[str, float]
    conv_factor: dict[str, float] = Field(default_factory=lambda: {"fp32": 1.0, "fp16": 1.0, "bf16": 1.0})
    nchw_conv_factor: dict[str, float] = Field(default_factory=lambda: {"fp32": 1.0, "fp16": 1.0, "bf16": 1.0})
    fp32_linear_peak_per_cycle_per_tpc: float | None = None
    bytes_per_mem_mhz: float
    memory_efficiency: float
    min_kernel_us: float
    matmul_min_us: dict[str, float]
    launch_cycles: float
    host_cycles_per_sample: float
    host_parallel_fraction: float
    gpu_vf: VfCurve
    gpu_leak_w_per_v: float
    gpu_dyn_w_per_v2_ghz: float
    gpu_compute_activity: float
    mem_static_w: float
    mem_pj_per_byte: float
    cpu_vf: VfCurve | None = None
    cpu_leak_w_per_core_v: float = 0.0
    cpu_dyn_w_per_v2_ghz: float = 0.0
    cpu_metered: bool = True
    base_w: float
    p50_jitter_ms: float
    p99_jitter_ms: float
    p99_tail_fraction: float
    noise_time: float = 0.015
    noise_power: float = 0.01
    sources: dict[str, str] = Field(default_factory=dict)


@dataclass
class Operating:
    """Arrays (one entry per configuration) the physics needs, decoded from knobs."""

    gpu_mhz: np.ndarray
    mem_mhz: np.ndarray
    tpcs: np.ndarray
    cpu_mhz: np.ndarray
    cores: np.ndarray
    batch: np.ndarray
    precision: np.ndarray
    power_limit_w: np.ndarray
    channels_last: np.ndarray


@dataclass
class TwinResult:
    """Noise-free outcome per configuration (arrays)."""

    time_s: np.ndarray
    power_w: np.ndarray
    gpu_mhz: np.ndarray
    throttled: np.ndarray


TWIN_KINDS = {"orin": "orin-agx", "orin-agx": "orin-agx", "h200": "h200", "orin-nano": "orin-nano"}


def load_params(kind: str) -> TwinParams:
    resource = resources.files("tuner.devices") / "twin_params" / f"{kind}.json"
    if not resource.is_file():
        raise UserError(f"no twin for {kind!r}: known twins are {', '.join('sim:' + k for k in twin_names())}")
    return TwinParams.model_validate(json.loads(resource.read_text()))


def twin_names() -> list[str]:
    return sorted({k for k in TWIN_KINDS if "-" not in k} | set(TWIN_KINDS.values()) - {"orin-agx"})


class TwinModel:
    """The vectorized physics of one device kind running one model."""

    def __init__(self, params: TwinParams, space: SearchSpace) -> None:
        self.params = params
        self.space = space

    def operating(self, configs: list[Config]) -> Operating:
        """Decode knobs into physical quantities, applying mode caps and fixed values."""
        p = self.params
        n = len(configs)

        def column(role: str, default: float | str) -> list[Any]:
            knob = p.knob_map.get(role)
            out = []
            for config in configs:
                if knob is not None and knob in config.knobs:
                    out.append(config.knobs[knob])
                else:
                    out.append(p.fixed.get(role, default))
            return out

        effective = [self.space.effective(c) for c in configs]
        modes = [self.space.mode_of(c) for c in configs]
        configs = effective
        tpcs = np.array(
            [m.properties.get("tpcs", p.tpcs_max) if m is not None else p.tpcs_max for m in modes], dtype=float
        )
        return Operating(
            gpu_mhz=np.array(column("gpu_mhz", 0.0), dtype=float),
            mem_mhz=np.array(column("mem_mhz", 0.0), dtype=float),
            tpcs=tpcs,
            cpu_mhz=np.array(column("cpu_mhz", 0.0), dtype=float),
            cores=np.array(column("cpu_cores", 1), dtype=float),
            batch=np.array([c.batch_size for c in configs], dtype=float),
            precision=np.array(column("precision", "fp32"), dtype=object),
            power_limit_w=np.array(column("power_limit_w", np.inf), dtype=float) if n else np.zeros(0),
            channels_last=np.array([str(v).lower() in ("true", "1") for v in column("channels_last", True)], bool),
        )

    def _time_and_power(self, profile: ModelProfile, op: Operating, gpu_mhz: np.ndarray) -> tuple[np.ndarray, ...]:
        p = self.params
        flops = np.array([layer.flops for layer in profile.layers])
        wbytes = np.array([layer.weight_bytes for layer in profile.layers])
        abytes = np.array([layer.act_bytes for layer in profile.layers])
        matmul = np.array([layer.matmul for layer in profile.layers])
        conv = np.array([layer.op.startswith("conv") for layer in profile.layers])

        scale = np.array([PRECISION_BYTES[str(x)] / 4.0 for x in op.precision])
        eff = np.array([p.compute_efficiency[str(x)] for x in op.precision])
        peak_mm = np.array([p.peak_flops_per_cycle_per_tpc[str(x)] for x in op.precision])
        ghz = gpu_mhz / 1000.0
        rate_mm = peak_mm * op.tpcs * ghz * 1e9 * eff
        rate_vec = p.vector_flops_per_cycle_per_tpc * op.tpcs * ghz * 1e9 * p.memory_efficiency
        bandwidth = p.bytes_per_mem_mhz * op.mem_mhz * p.memory_efficiency

        b = op.batch[:, None]
        work = flops[None, :] * b
        rate = np.where(matmul[None, :], rate_mm[:, None], rate_vec[:, None])
        conv_f = np.array([p.conv_factor[str(x)] for x in op.precision])
        nchw_f = np.array([p.nchw_conv_factor[str(x)] for x in op.precision])
        layout_f = np.where(op.channels_last, 1.0, nchw_f)
        rate = np.where(conv[None, :], rate * (conv_f * layout_f)[:, None], rate)
        if p.fp32_linear_peak_per_cycle_per_tpc is not None:
            fp32 = np.array([str(x) == "fp32" for x in op.precision])
            rate_fp32 = p.fp32_linear_peak_per_cycle_per_tpc * op.tpcs * ghz * 1e9 * eff
            linear = matmul & ~conv
            rate = np.where(fp32[:, None] & linear[None, :], rate_fp32[:, None], rate)
        t_compute = work / rate
        moved = (wbytes[None, :] + abytes[None, :] * b) * scale[:, None]
        t_memory = moved / bandwidth[:, None]
        floor_mm = np.array([p.matmul_min_us[str(x)] for x in op.precision]) * 1e-6
        floor = np.where(matmul[None, :], floor_mm[:, None], p.min_kernel_us * 1e-6)
        t_gpu = np.maximum(np.maximum(t_compute, t_memory) + p.min_kernel_us * 1e-6, floor)
        cpu_hz = op.cpu_mhz * 1e6
        t_launch = np.broadcast_to((p.launch_cycles / cpu_hz)[:, None], t_gpu.shape)
        t_layer = np.maximum(t_gpu, t_launch)

        workers = 1.0 + (op.cores - 1.0) * p.host_parallel_fraction
        t_host = op.batch * p.host_cycles_per_sample / cpu_hz / workers
        time_s = t_layer.sum(axis=1) + t_host

        u_gpu = t_gpu.sum(axis=1) / time_s
        u_compute = np.where(matmul[None, :], t_compute, 0.0).sum(axis=1) / time_s
        bytes_per_s = moved.sum(axis=1) / time_s
        u_cpu = (t_launch.sum(axis=1) + t_host * workers) / time_s

        volts = p.gpu_vf.volts(gpu_mhz)
        tpc_frac = op.tpcs / p.tpcs_max
        activity = (1 - p.gpu_compute_activity) * u_gpu + p.gpu_compute_activity * u_compute
        gpu_w = p.gpu_leak_w_per_v * volts * tpc_frac + p.gpu_dyn_w_per_v2_ghz * volts**2 * ghz * tpc_frac * activity
        mem_max = max(float(v) for v in self._mem_values())
        mem_w = p.mem_static_w * op.mem_mhz / mem_max + p.mem_pj_per_byte * 1e-12 * bytes_per_s
        cpu_w = np.zeros_like(time_s)
        if p.cpu_vf is not None and p.cpu_metered:
            cv = p.cpu_vf.volts(op.cpu_mhz)
            cpu_w = (
                p.cpu_leak_w_per_core_v * cv * op.cores + p.cpu_dyn_w_per_v2_ghz * cv**2 * (op.cpu_mhz / 1000) * u_cpu
            )
        power = p.base_w + gpu_w + mem_w + cpu_w
        return time_s, power

    def _mem_values(self) -> list[float]:
        knob = self.params.knob_map.get("mem_mhz")
        if knob and knob in self.space.knobs:
            return [float(v) for v in self.space.knobs[knob].values]
        return [float(self.params.fixed.get("mem_mhz", 1.0))]

    def evaluate(self, profile: ModelProfile, configs: list[Config]) -> TwinResult:
        """Noise-free time per batch and average power for each configuration.

        Where the power limit is exceeded, the GPU clock is bisected down to
        the highest clock that fits, as the power-capping firmware settles.
        """
        op = self.operating(configs)
        gpu = op.gpu_mhz.copy()
        time_s, power = self._time_and_power(profile, op, gpu)
        over = power > op.power_limit_w
        if over.any():
            low = np.full_like(gpu, self._lowest_gpu_mhz())
            high = gpu.copy()
            for _ in range(24):
                mid = np.where(over, (low + high) / 2, gpu)
                _, p_mid = self._time_and_power(profile, op, mid)
                fits = p_mid <= op.power_limit_w
                low = np.where(over & fits, mid, low)
                high = np.where(over & ~fits, mid, high)
            gpu = np.where(over, low, gpu)
            time_s, power = self._time_and_power(profile, op, gpu)
        return TwinResult(time_s=time_s, power_w=power, gpu_mhz=gpu, throttled=over)

    def _lowest_gpu_mhz(self) -> float:
        knob = self.params.knob_map["gpu_mhz"]
        return min(float(v) for v in self.space.knobs[knob].values)

    def measurement(
        self, result: TwinResult, index: int, batch: int, rng: np.random.Generator | None, window_s: float
    ) -> Measurement:
        """One configuration's result as a Measurement, with seeded noise when an RNG is given."""
        p = self.params
        t = float(result.time_s[index])
        w = float(result.power_w[index])
        jitter50, jitter99 = p.p50_jitter_ms / 1000, p.p99_jitter_ms / 1000
        if rng is not None:
            t *= float(rng.lognormal(0.0, p.noise_time))
            w *= float(rng.lognormal(0.0, p.noise_power))
            jitter99 *= float(rng.lognormal(0.0, 0.1))
        batches = max(1, int(window_s / t))
        queries = batches * batch
        duration = batches * t
        energy = w * duration
        p99 = t * (1 + p.p99_tail_fraction) + jitter99
        p90 = t * (1 + p.p99_tail_fraction / 2) + (jitter50 + jitter99) / 2
        return Measurement(
            j_per_query=energy / queries,
            p50_ms=(t + jitter50) * 1000,
            p90_ms=p90 * 1000,
            p99_ms=p99 * 1000,
            qps=queries / duration,
            avg_w=w,
            energy_j=energy,
            queries=queries,
            duration_s=duration,
            meter="twin",
            rails=["twin:board"],
            twin=True,
            throttled=bool(result.throttled[index]),
            extra={"gpu_mhz_effective": round(float(result.gpu_mhz[index]), 1)},
        )


class TwinDevice:
    """A simulated device: the Device protocol over :class:`TwinModel`; touches no hardware."""

    simulated = True

    def __init__(self, name: str, space_file: str | None = None) -> None:
        short = name.split(":", 1)[1] if ":" in name else name
        if short not in TWIN_KINDS:
            raise UserError(f"unknown twin {name!r}: known twins are {', '.join('sim:' + k for k in twin_names())}")
        self.kind = TWIN_KINDS[short]
        self.name = f"sim:{short}"
        self.slug = f"sim-{short}"
        self.params = load_params(self.kind)
        self._space = load_space(self.kind)
        if space_file is not None:
            custom = load_space_file(Path(space_file))
            if custom.kind != self.kind or set(custom.knobs) - set(self._space.knobs):
                raise UserError(
                    f"{space_file} is a space for {custom.kind} with knobs {', '.join(custom.knobs)}: "
                    f"{self.name} needs kind {self.kind} with knobs from {', '.join(self._space.knobs)}"
                )
            self._space = custom
        self.model = TwinModel(self.params, self._space)
        self._applied: Config | None = None

    def space(self) -> SearchSpace:
        return self._space

    def read_state(self) -> dict[str, Any]:
        return {}

    def apply(self, config: Config) -> None:
        self._space.validate_config(config)
        self._applied = config

    def restore(self, state: dict[str, Any]) -> None:
        self._applied = None

    def measure(self, model: str, config: Config, settings: WindowSettings) -> Measurement:
        """Simulate a window; noise is drawn from a generator seeded by the settings' seed."""
        profile = load_profile(model)
        if settings.scenario == "server":
            return server_measurement(self.model, profile, config, settings)
        result = self.model.evaluate(profile, [config])
        rng = np.random.default_rng(settings.seed) if settings.noise else None
        return self.model.measurement(result, 0, config.batch_size, rng, settings.window_s)

    def measure_many(self, model: str, configs: list[Config], settings: WindowSettings) -> list[Measurement]:
        """Vectorized noise-free (or seeded) measurements: what makes a full sweep cheap.

        Configurations go through in chunks, so the configurations-by-layers
        arrays stay small (an H200 space has 145,200 points).
        """
        if settings.scenario == "server":
            return [self.measure(model, c, settings) for c in configs]
        profile = load_profile(model)
        rng = np.random.default_rng(settings.seed) if settings.noise else None
        out: list[Measurement] = []
        for start in range(0, len(configs), SWEEP_CHUNK):
            chunk = configs[start : start + SWEEP_CHUNK]
            result = self.model.evaluate(profile, chunk)
            window = settings.window_s
            out += [self.model.measurement(result, i, c.batch_size, rng, window) for i, c in enumerate(chunk)]
        return out

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "twin": True, "title": self.params.title}
