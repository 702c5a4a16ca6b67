"""A twin's physics: time per batch and power per rail of one device kind running a model, vectorized.

Time per batch is summed per layer: each layer's op class has an achieved
fraction of its unit's peak and of peak bandwidth and a kernel floor in GPU
cycles (microbenchmarks on a real GPU), plus the host's launch cost where
eager launch is not hidden (CUDA graphs replace it by one replay cost).
Power is built per rail (the Jetson INA3221 rails; ``wall`` adds carrier and
supply loss), and a power limit lowers the clock until the board fits.
Evaluation is vectorized over configurations so ``tune sweep`` scores a whole
space. The model: docs/twin-model.md; its parameters: docs/twin.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from runners.profile import ModelProfile
from tuner.devices.virtual.queueing import ServingProfile, executed_sizes
from tuner.devices.virtual.twin_schema import TwinParams
from tuner.measurement import Measurement, TokenMetrics
from tuner.space import Config, SearchSpace

PRECISION_BYTES = {"fp32": 4.0, "fp16": 2.0, "bf16": 2.0, "int8": 1.0}
TENSOR_CLASSES = ("conv_dense", "conv_pointwise", "gemm", "attention")
NORM_OPS = ("batchnorm", "layernorm", "softmax")
# Polls of the GPU load governor simulated from the cap, and the last of them its clock is averaged over.
GOVERNOR_POLLS = 400
GOVERNOR_TAIL = 100


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
    graphed: np.ndarray


@dataclass
class TwinResult:
    """Noise-free outcome per configuration (arrays); ``rails_w`` per rail, ``wall_w`` where modelled."""

    time_s: np.ndarray
    power_w: np.ndarray
    gpu_mhz: np.ndarray
    throttled: np.ndarray
    rails_w: dict[str, np.ndarray]
    wall_w: np.ndarray | None


def math_unit(op_class: str, precision: str) -> str:
    """The math unit a layer runs on: tensor cores for conv/GEMM/attention (eager PyTorch leaves TF32
    off for matmuls, on for cuDNN convolutions), CUDA cores for depthwise and elementwise work."""
    if op_class not in TENSOR_CLASSES:
        return "vector"
    if precision == "int8":
        return "tensor_int8"
    if precision in ("fp16", "bf16"):
        return "tensor_fp16"
    return "tensor_tf32" if op_class.startswith("conv") else "vector"


class TwinModel:
    """The vectorized physics of one device kind running one model under one runtime."""

    def __init__(self, params: TwinParams, space: SearchSpace, runtime: str = "pytorch") -> None:
        self.params = params
        self.space = space
        self.runtime = runtime

    def operating(self, configs: list[Config]) -> Operating:
        """Decode knobs into physical quantities, applying mode caps and fixed values."""
        p = self.params
        n = len(configs)
        forced = p.runtimes[self.runtime].precision

        def column(role: str, default: float | str) -> list[Any]:
            knob = p.knob_map.get(role)
            out = []
            for config in configs:
                if knob is not None and knob in config.knobs:
                    out.append(config.knobs[knob])
                else:
                    out.append(p.fixed.get(role, default))
            return out

        modes = [self.space.mode_of(c) for c in configs]
        configs = [self.space.effective(c) for c in configs]
        tpcs = np.array(
            [m.properties.get("tpcs", p.tpcs_max) if m is not None else p.tpcs_max for m in modes], dtype=float
        )
        precision = column("precision", "fp32") if forced is None else [forced] * n
        return Operating(
            gpu_mhz=np.array(column("gpu_mhz", 0.0), dtype=float),
            mem_mhz=np.array(column("mem_mhz", 0.0), dtype=float),
            tpcs=tpcs,
            cpu_mhz=np.array(column("cpu_mhz", 0.0), dtype=float),
            cores=np.array(column("cpu_cores", 1), dtype=float),
            batch=np.array([c.batch_size for c in configs], dtype=float),
            precision=np.array(precision, dtype=object),
            power_limit_w=np.array(column("power_limit_w", np.inf), dtype=float) if n else np.zeros(0),
            channels_last=np.array([str(v).lower() in ("true", "1") for v in column("channels_last", True)], bool),
            graphed=np.array([str(v) == "cudagraphs" for v in column("graph", "eager")], bool),
        )

    def layers(self, profile: ModelProfile) -> list:
        """The layers the runtime executes: fused ones (folded into the kernel before them) drop out."""
        fused = set(self.params.runtimes[self.runtime].fused_ops)
        return [layer for layer in profile.layers if layer.op not in fused]

    def class_of(self, layer) -> str:
        return "normalisation" if layer.op in NORM_OPS else layer.op_class

    def layer_times(self, profile: ModelProfile, op: Operating, gpu_mhz: np.ndarray) -> dict[str, np.ndarray]:
        """Per configuration x layer: GPU time, compute-unit time, launch time and bytes moved (zero for a layer
        that does not run at the configuration's batch size, as a layout copy that is a view at batch 1)."""
        p = self.params
        runtime = p.runtimes[self.runtime]
        layers = self.layers(profile)
        classes = [self.class_of(layer) for layer in layers]
        runs = op.batch[:, None] >= np.array([layer.min_batch for layer in layers])[None, :]
        flops = np.array([layer.flops for layer in layers])
        wbytes = np.array([layer.weight_bytes for layer in layers])
        abytes = np.array([layer.act_bytes for layer in layers])
        hz = gpu_mhz * 1e6
        precisions = [str(x) for x in op.precision]
        peak = np.array(
            [
                [p.peak_per_cycle_per_tpc[math_unit(c, x)] * p.op_classes[c].compute_eff[x] for c in classes]
                for x in precisions
            ]
        ).reshape(len(precisions), len(classes))
        bw_eff = np.array([p.op_classes[c].bw_eff for c in classes])
        kmin = np.array([p.op_classes[c].kernel_min_cycles for c in classes]) * runtime.kernel_floor_scale
        scale = np.array([PRECISION_BYTES[x] / 4.0 for x in precisions])

        conv = np.array([c.startswith("conv") for c in classes])
        nchw = np.array([p.nchw_conv_eff_by_precision.get(x, p.nchw_conv_eff) for x in precisions])
        layout = np.where(op.channels_last, 1.0, nchw)
        peak = np.where(conv[None, :], peak * layout[:, None], peak)
        b = op.batch[:, None]
        rate = peak * (op.tpcs * hz)[:, None]
        t_compute = np.where(flops[None, :] > 0, flops[None, :] * b / rate, 0.0)
        moved = (wbytes[None, :] + abytes[None, :] * b) * scale[:, None]
        bandwidth = p.bytes_per_mem_mhz * op.mem_mhz
        t_memory = moved / (bandwidth[:, None] * bw_eff[None, :])
        t_gpu = np.where(runs, np.maximum(t_compute, t_memory) + kmin[None, :] / hz[:, None], 0.0)

        launch = np.array([p.launch_us.get(layer.op, p.launch_us["default"]) for layer in layers])
        launch = launch * runtime.launch_scale + (p.module_overhead_us if runtime.module_overhead else 0.0)
        host_scale = p.host_factor * p.host_ref_mhz / op.cpu_mhz
        t_launch = np.where(runs & ~op.graphed[:, None], launch[None, :] * 1e-6 * host_scale[:, None], 0.0)
        tensor = np.array([c in TENSOR_CLASSES for c in classes])
        return {
            "gpu": t_gpu,
            "floor": np.where(runs, kmin[None, :] / hz[:, None], 0.0),
            "compute": np.where(tensor[None, :] & runs, t_compute, 0.0),
            "launch": t_launch,
            "moved": np.where(runs, moved, 0.0),
        }

    def activity(
        self, profile: ModelProfile, op: Operating, gpu_mhz: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Time per batch and what drives power: GPU busy share, math-unit share, DRAM bytes/s, busy CPU cores."""
        p = self.params
        lt = self.layer_times(profile, op, gpu_mhz)
        t_gpu, t_launch = lt["gpu"], lt["launch"]
        cpu_hz = op.cpu_mhz * 1e6
        workers = 1.0 + (op.cores - 1.0) * p.host_parallel_fraction
        t_host = op.batch * p.host_cycles_per_sample / cpu_hz / workers
        t_replay = np.where(op.graphed, p.graph_replay_us * 1e-6, 0.0)
        time_s = np.maximum(t_gpu, t_launch).sum(axis=1) + t_host + t_replay

        # Under graph replay a kernel's floor (its fill and drain on the GPU) keeps few SMs working and counts
        # as busy for dynamic power at ``floor_activity`` of a full load; eager keeps the full share its power
        # coefficients were fitted with (scripts/calibrate_twin.py).
        idle_floor = np.where(op.graphed[:, None], (1.0 - p.floor_activity) * lt["floor"], 0.0)
        u_gpu = (t_gpu - idle_floor).sum(axis=1) / time_s
        u_compute = lt["compute"].sum(axis=1) / time_s
        bytes_per_s = lt["moved"].sum(axis=1) / time_s
        u_cpu = (t_launch.sum(axis=1) + t_host * workers) / time_s
        return time_s, u_gpu, u_compute, bytes_per_s, u_cpu

    def _time_and_power(
        self, profile: ModelProfile, op: Operating, gpu_mhz: np.ndarray
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        time_s, u_gpu, u_compute, bytes_per_s, u_cpu = self.activity(profile, op, gpu_mhz)
        return time_s, self.rails(op, gpu_mhz, u_gpu, u_compute, bytes_per_s, u_cpu)

    def rails(
        self,
        op: Operating,
        gpu_mhz: np.ndarray,
        u_gpu: np.ndarray,
        u_compute: np.ndarray,
        bytes_per_s: np.ndarray,
        u_cpu: np.ndarray,
    ) -> dict[str, np.ndarray]:
        """Average power per rail for the given utilisations (zero utilisation: the idle floor)."""
        p = self.params
        ghz = gpu_mhz / 1000.0
        volts = p.gpu_vf.volts(gpu_mhz)
        tpc_frac = op.tpcs / p.tpcs_max
        activity = (1 - p.gpu_compute_activity) * u_gpu + p.gpu_compute_activity * u_compute
        # soc_busy_w: the GPU/SoC rail's draw while a workload runs that does not follow the GPU clock.
        gpu = (
            p.soc_static_w
            + np.where(u_gpu > 0, p.soc_busy_w, 0.0)
            + p.gpu_leak_w_per_v_tpc * volts * op.tpcs
            + (p.gpu_clock_w_per_v2_ghz + p.gpu_dyn_w_per_v2_ghz * activity) * volts**2 * ghz * tpc_frac
        )
        mem_max = max(float(v) for v in self._mem_values())
        emc = op.mem_mhz / mem_max
        if p.mem_bg_curve:
            knots = np.array(p.mem_bg_curve, dtype=float)
            background = np.interp(op.mem_mhz, knots[:, 0], knots[:, 1])
        else:
            background = p.mem_bg_w * emc
        mem = background + p.mem_pj_per_byte * 1e-12 * bytes_per_s
        out: dict[str, np.ndarray] = {}

        def add(rail: str, watts: np.ndarray) -> None:
            out[rail] = out.get(rail, 0.0) + watts

        add(p.rails[0], gpu)
        if p.cpu_vf is not None and p.cpu_metered:
            cv = p.cpu_vf.volts(op.cpu_mhz)
            busy = np.minimum(u_cpu, op.cores)
            # A busy cluster draws on its own (its shared cache and interconnect) beside its busy cores; busy threads
            # take a cluster each before two share one, so a single launch thread keeps one cluster busy with it.
            clusters = np.minimum(busy, np.ceil(op.cores / p.cpu_cluster_cores))
            switching = p.cpu_dyn_w_per_v2_ghz * busy + p.cpu_cluster_w_per_v2_ghz * clusters
            cpu = p.cpu_leak_w_per_core_v * cv * op.cores + switching * cv**2 * (op.cpu_mhz / 1000)
            add(p.rails[1], cpu)
        # The module's 5 V system rail feeds the memory controller and DRAM-side supplies too: it follows the
        # memory rail (sys_per_mem_w W per W of it) on top of its floor.
        add(p.rails[2] if len(p.rails) > 3 else p.rails[0], p.sys_static_w + p.sys_emc_w * emc + p.sys_per_mem_w * mem)
        add(p.rails[-1], mem)
        return out

    def wall(self, rails_sum: np.ndarray) -> np.ndarray | None:
        w = self.params.wall
        return None if w is None else (rails_sum + w.carrier_w) / w.psu_efficiency

    def _mem_values(self) -> list[float]:
        knob = self.params.knob_map.get("mem_mhz")
        if knob and knob in self.space.knobs:
            return [float(v) for v in self.space.knobs[knob].values]
        return [float(self.params.fixed.get("mem_mhz", 1.0))]

    def idle(self, configs: list[Config], gpu_mhz: float | None = None, emc_mhz: float | None = None) -> TwinResult:
        """The idle floor under configurations (nothing running); the GPU at ``gpu_mhz`` and the memory at
        ``emc_mhz`` if given (devfreq settles at the lowest clocks when caps leave the minimum free, as MLPerf's
        v3.0 settings do)."""
        op = self.operating(configs)
        if emc_mhz is not None:
            op.mem_mhz = np.full_like(op.mem_mhz, emc_mhz)
        gpu = op.gpu_mhz if gpu_mhz is None else np.full_like(op.gpu_mhz, gpu_mhz)
        zero = np.zeros_like(gpu)
        rails = self.rails(op, gpu, zero, zero, zero, zero)
        total = sum(rails.values())
        return TwinResult(zero, total, gpu, zero.astype(bool), rails, self.wall(total))

    def full_load(self, configs: list[Config]) -> TwinResult:
        """Every rail with the GPU fully busy on its math units (a stress test) and no DRAM or CPU load."""
        op = self.operating(configs)
        one, zero = np.ones_like(op.gpu_mhz), np.zeros_like(op.gpu_mhz)
        rails = self.rails(op, op.gpu_mhz, one, one, zero, zero)
        total = sum(rails.values())
        return TwinResult(zero, total, op.gpu_mhz, zero.astype(bool), rails, self.wall(total))

    def serving(self, profile: ModelProfile, config: Config) -> ServingProfile:
        """Time and power of a batch of every size up to the configuration's (maximum) batch size, as it runs.

        What the Server queue (tuner.devices.virtual.queueing) serves from: each
        arrived batch runs at its executed size (the graph ladder's, or its own).
        """
        sizes = executed_sizes(config)
        configs = [Config(knobs=dict(config.knobs), batch_size=b) for b in sizes]
        result = self.evaluate(profile, configs)
        p = self.params
        idle_w = float(self.idle(configs[:1], float(result.gpu_mhz[0])).power_w[0])
        if p.awake_idle_w is not None:
            # Between batches milliseconds apart the GPU stays awake: the measured awake power at the
            # default clocks, above the idle floor by the same watts at every clock.
            default = self.space.default_config()
            idle_w += p.awake_idle_w - float(self.idle([default]).power_w[0])
        return ServingProfile(
            service_s=np.concatenate([[np.inf], result.time_s]),
            busy_w=np.concatenate([[0.0], result.power_w]),
            idle_w=idle_w,
            jitter_s=p.p50_jitter_ms / 1000.0,
            noise=p.noise_time,
            executed=np.array([0, *sizes]),
        )

    def governed_gpu_mhz(self, profile: ModelProfile, op: Operating) -> np.ndarray:
        """The GPU clock the load governor holds under each configuration's clock as its cap (a mode at its
        defaults): its mean over the last polls of a run started at the cap, where nvpmodel leaves the clock."""
        gov = self.params.gpu_governor
        if gov is None:
            return op.gpu_mhz.copy()
        table = np.array(sorted(float(v) for v in self.space.knobs[self.params.knob_map["gpu_mhz"]].values))
        n = len(op.gpu_mhz)
        load = np.column_stack([np.minimum(self.activity(profile, op, np.full(n, f))[1], 1.0) for f in table])
        cap = op.gpu_mhz
        top = np.searchsorted(table, cap, side="right") - 1
        index, rows = top.copy(), np.arange(n)
        cycles, request_avg, held = np.zeros(n), np.zeros(n), np.zeros(n)
        for poll in range(GOVERNOR_POLLS):
            f = table[index]
            load_now = load[rows, index]
            cycles = (cycles * gov.smooth + f * load_now) / (gov.smooth + 1)
            boost = np.minimum(gov.bias * f * (cycles / f - gov.load_target) / gov.load_target, cap / 3)
            busy = load_now > gov.load_max
            boost = np.where(busy, cap / 3, boost)
            damp = np.where(busy, 10, gov.damp)
            request = f + boost
            request_avg = (request_avg * gov.smooth + request) / (gov.smooth + 1)
            request = np.clip((damp * request + (10 - damp) * request_avg) / 10, table[0], cap)
            index = np.minimum(np.searchsorted(table, request - 1e-9), top)
            if poll >= GOVERNOR_POLLS - GOVERNOR_TAIL:
                held += table[index]
        return held / GOVERNOR_TAIL

    def evaluate(self, profile: ModelProfile, configs: list[Config], governed: bool = False) -> TwinResult:
        """Noise-free time per batch and average power for each configuration.

        ``governed``: each configuration's GPU clock is a cap the load governor
        works under (a mode at its defaults), not a pinned clock. Where the
        power limit is exceeded, the GPU clock is bisected down to the highest
        clock that fits, as the power-capping firmware settles.
        """
        op = self.operating(configs)
        gpu = self.governed_gpu_mhz(profile, op) if governed else op.gpu_mhz.copy()
        time_s, rails = self._time_and_power(profile, op, gpu)
        power = sum(rails.values())
        over = power > op.power_limit_w
        if over.any():
            low = np.full_like(gpu, self._lowest_gpu_mhz())
            high = gpu.copy()
            for _ in range(24):
                mid = np.where(over, (low + high) / 2, gpu)
                _, r_mid = self._time_and_power(profile, op, mid)
                fits = sum(r_mid.values()) <= op.power_limit_w
                low = np.where(over & fits, mid, low)
                high = np.where(over & ~fits, mid, high)
            gpu = np.where(over, low, gpu)
            time_s, rails = self._time_and_power(profile, op, gpu)
            power = sum(rails.values())
        return TwinResult(time_s, power, gpu, over, rails, self.wall(power))

    def _lowest_gpu_mhz(self) -> float:
        knob = self.params.knob_map["gpu_mhz"]
        return min(float(v) for v in self.space.knobs[knob].values)

    def measurement(
        self, result: TwinResult, index: int, batch: int, rng: np.random.Generator | None, window_s: float
    ) -> Measurement:
        """One configuration's result as a Measurement (power as the rails read it), with seeded noise."""
        p = self.params
        t = float(result.time_s[index])
        w = float(result.power_w[index])
        jitter50, jitter99 = p.p50_jitter_ms / 1000, p.p99_jitter_ms / 1000
        noise_w = 1.0
        if rng is not None:
            t *= float(rng.lognormal(0.0, p.noise_time))
            noise_w = float(rng.lognormal(0.0, p.noise_power))
            jitter99 *= float(rng.lognormal(0.0, 0.1))
        w *= noise_w
        batches = max(1, int(window_s / t))
        queries = batches * batch
        duration = batches * t
        p99 = t * (1 + p.p99_tail_fraction) + jitter99
        p90 = t * (1 + p.p99_tail_fraction / 2) + (jitter50 + jitter99) / 2
        extra: dict[str, float | str] = {"gpu_mhz_effective": round(float(result.gpu_mhz[index]), 1)}
        for rail, watts in result.rails_w.items():
            extra[f"rail_w:{rail}"] = round(float(np.broadcast_to(watts, result.time_s.shape)[index]) * noise_w, 3)
        if result.wall_w is not None:
            wall = float(result.wall_w[index]) * noise_w
            extra["wall_w"] = round(wall, 3)
            extra["wall_j_per_query"] = wall * duration / queries
        return twin_measurement(p, w, duration, queries, (t + jitter50, p90, p99), bool(result.throttled[index]), extra)


def twin_measurement(
    params: TwinParams,
    watts: float,
    duration: float,
    queries: int,
    latencies_s: tuple[float, float, float],
    throttled: bool,
    extra: dict[str, float | str],
    tokens: TokenMetrics | None = None,
) -> Measurement:
    """A twin's window as a Measurement: ``watts`` over ``duration`` s for ``queries``, p50/p90/p99 in seconds."""
    energy = watts * duration
    p50, p90, p99 = latencies_s
    return Measurement(
        j_per_query=energy / queries,
        p50_ms=p50 * 1000,
        p90_ms=p90 * 1000,
        p99_ms=p99 * 1000,
        qps=queries / duration,
        avg_w=watts,
        energy_j=energy,
        queries=queries,
        duration_s=duration,
        meter="twin",
        rails=[f"twin:{r}" for r in params.rails],
        twin=True,
        throttled=throttled,
        extra=extra,
        tokens=tokens,
    )
