"""Generated boards for the search benchmark: random, physically plausible devices (``--device gen:SEED``).

A strategy tuned on the project's own twins can learn their physics instead
of how to search; these boards draw other physics per seed, so a strategy is
tuned on some seeds and judged on seeds it never saw. Each is a plugin
device (entry point ``gen``) with 2-6 knobs named from several vendors'
vocabularies, 5-8 batch sizes, 1,000-50,000 configurations and three
workloads of its own with per-layer profiles. The physics (pipelined host and
accelerator stages, a cache cliff, gated power modes, a voltage floor, 1-3%
noise) and what is not modelled are listed in docs/search.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from runners.profile import LayerProfile, ModelProfile
from tuner.devices.base import VirtualBoard
from tuner.errors import UserError
from tuner.measure.settings import WindowSettings
from tuner.measurement import Measurement
from tuner.plumbing.units import MAX_SEED
from tuner.space import Config, Knob, Mode, SearchSpace

MIN_CONFIGS = 1_000
MAX_CONFIGS = 50_000
MAX_BOARDS = 10_000  # boards one benchmark may name; a hundred thousand would take days
WORKLOADS = ("wl-conv", "wl-mlp", "wl-attn")
NAMES = {
    "mode": ("nvpmodel", "power_profile", "perf_mode"),
    "gpu": ("gpu_mhz", "core_clk", "xpu_freq_mhz", "shader_level"),
    "mem": ("emc_mhz", "dram_freq", "mem_level"),
    "cpu": ("cpu_mhz", "host_clk", "cluster_freq"),
    "cores": ("cpu_cores", "host_threads", "big_cores_online"),
    "fabric": ("fabric_level", "noc_mhz", "bus_clk"),
}


@dataclass
class Workload:
    """One model on one board: its totals per sample and the stage it stresses."""

    flops: float
    weight_bytes: float
    act_bytes: float
    host_cycles: float
    layers: int
    launch_cycles: float
    b_half: float
    cache_bytes: float
    cliff: float
    profile: ModelProfile


@dataclass
class Physics:
    """Constants of one board."""

    peak_flops_per_ghz: float
    bytes_per_mem_unit: float
    kernel_floor_s: float
    parallel_fraction: float
    overlap_loss: float
    tail: float
    jitter_s: float
    noise_time: float
    gpu_vf: tuple[float, float, float, float]
    cpu_vf: tuple[float, float, float, float]
    gpu_leak_w: float
    gpu_dyn_w: float
    mem_static_w: float
    pj_per_byte: float
    cpu_leak_w: float
    cpu_dyn_w: float
    fabric_w: float


def _volts(vf: tuple[float, float, float, float], f: np.ndarray) -> np.ndarray:
    """Voltage: v_min below the knee, then linear up to v_max at the top clock."""
    v_min, v_max, knee, top = vf
    return v_min + (v_max - v_min) * np.clip((f - knee) / max(top - knee, 1e-9), 0.0, 1.0)


class GeneratedBoard(VirtualBoard):
    """A random board drawn from its seed (``gen:SEED``); deterministic, touches no hardware."""

    def __init__(self, name: str) -> None:
        text = name.split(":", 1)[1] if ":" in name else ""
        if not text.isdigit():
            raise UserError(f"cannot read {name!r}: write gen:SEED with a non-negative integer seed, e.g. gen:7")
        self.seed = int(text)
        self.name = f"gen:{self.seed}"
        self.kind = f"gen-{self.seed}"
        self.slug = f"gen-{self.seed}"
        rng = np.random.default_rng([20261129, self.seed])
        self.roles: dict[str, str] = {}
        self._space = self._draw_space(rng)
        self.physics = self._draw_physics(rng)
        self.bottleneck = str(rng.choice(["host", "compute", "memory"]))
        self.workloads = {w: self._draw_workload(rng, w) for w in WORKLOADS}

    # -- drawing the board ------------------------------------------------------------------------
    def _draw_space(self, rng: np.random.Generator) -> SearchSpace:
        optional = ["mode", "mem", "cpu", "cores", "fabric"]
        for _ in range(200):
            count = int(rng.integers(2, 7))
            chosen = ["gpu", *rng.choice(optional, size=count - 1, replace=False).tolist()]
            sizes = {
                "gpu": int(rng.integers(5, 15)),
                "mem": int(rng.integers(2, 7)),
                "cpu": int(rng.integers(4, 11)),
                "cores": int(rng.integers(2, 9)),
                "fabric": int(rng.integers(2, 5)),
                "mode": int(rng.integers(2, 4)),
            }
            batches = [2**i for i in range(int(rng.integers(4, 8)))]
            space = self._build(rng, chosen, sizes, batches)
            size = _effective_size(space)
            if MIN_CONFIGS <= size <= MAX_CONFIGS:
                self.size = size
                return space
        raise UserError(f"gen:{self.seed}: no board within {MIN_CONFIGS}-{MAX_CONFIGS} configurations was drawn")

    def _build(
        self, rng: np.random.Generator, chosen: list[str], sizes: dict[str, int], batches: list[int]
    ) -> SearchSpace:
        knobs: dict[str, Knob] = {}
        self.roles = {}
        self.ranges = {
            "gpu": (float(rng.uniform(150, 400)), float(rng.uniform(900, 1800))),
            "mem": (float(rng.uniform(200, 800)), float(rng.uniform(1600, 3200))),
            "cpu": (float(rng.uniform(300, 700)), float(rng.uniform(1400, 2600))),
        }
        for role in chosen:
            name = str(rng.choice(NAMES[role]))
            self.roles[role] = name
            if role in ("gpu", "mem", "cpu"):
                low, high = self.ranges[role]
                values = [round(float(v), 1) for v in np.linspace(low, high, sizes[role])]
                knobs[name] = Knob(values=values, default=values[-1], unit="MHz")
            elif role == "cores":
                values = list(range(1, sizes["cores"] + 1))
                knobs[name] = Knob(values=values, default=values[-1])
            elif role == "fabric":
                values = list(range(1, sizes["fabric"] + 1))
                knobs[name] = Knob(values=values, default=values[-1])
        modes: dict[str, Mode] = {}
        mode_knob = None
        if "mode" in chosen:
            mode_knob = self.roles["mode"]
            names = ["MAX", "MID", "LOW"][: sizes["mode"]]
            for i, label in enumerate(names):
                units = 1.0 if i == 0 else float(rng.uniform(0.25, 0.9))
                caps: dict[str, float] = {}
                for role in ("gpu", "cpu"):
                    if i > 0 and role in self.roles and rng.random() < 0.7:
                        values = knobs[self.roles[role]].values
                        caps[self.roles[role]] = float(values[int(rng.integers(len(values) // 2, len(values)))])
                base = float(rng.uniform(2.0, 9.0)) * (1.0 if i == 0 else float(rng.uniform(0.5, 1.0)))
                modes[label] = Mode(id=i, caps=caps, properties={"units": units, "base_w": base})
            knobs[mode_knob] = Knob(values=names, default="MAX", ordered=False)
        return SearchSpace(
            kind=f"gen-{self.seed}",
            description=f"generated board {self.seed} (tuner/devices/virtual/generated.py)",
            source="random draw, not a real device",
            knobs=knobs,
            batch_sizes=batches,
            mode_knob=mode_knob,
            modes=modes,
        )

    def _draw_physics(self, rng: np.random.Generator) -> Physics:
        gpu_low, gpu_high = self.ranges["gpu"]
        cpu_low, cpu_high = self.ranges["cpu"]
        return Physics(
            peak_flops_per_ghz=float(rng.uniform(0.5e12, 8e12)),
            bytes_per_mem_unit=float(rng.uniform(15e6, 60e6)),
            kernel_floor_s=float(rng.uniform(3e-6, 20e-6)),
            parallel_fraction=float(rng.uniform(0.5, 0.95)),
            overlap_loss=float(rng.uniform(0.05, 0.3)),
            tail=float(rng.uniform(0.02, 0.12)),
            jitter_s=float(rng.uniform(0.1e-3, 1e-3)),
            noise_time=float(rng.uniform(0.01, 0.03)),
            gpu_vf=(
                float(rng.uniform(0.55, 0.7)),
                float(rng.uniform(0.9, 1.1)),
                gpu_low + (gpu_high - gpu_low) * float(rng.uniform(0.15, 0.6)),
                gpu_high,
            ),
            cpu_vf=(
                float(rng.uniform(0.6, 0.75)),
                float(rng.uniform(0.95, 1.1)),
                cpu_low + (cpu_high - cpu_low) * float(rng.uniform(0.2, 0.6)),
                cpu_high,
            ),
            gpu_leak_w=float(rng.uniform(2.0, 12.0)),
            gpu_dyn_w=float(rng.uniform(8.0, 40.0)),
            mem_static_w=float(rng.uniform(0.5, 4.0)),
            pj_per_byte=float(rng.uniform(5.0, 40.0)),
            cpu_leak_w=float(rng.uniform(0.1, 0.6)),
            cpu_dyn_w=float(rng.uniform(0.3, 1.5)),
            fabric_w=float(rng.uniform(0.5, 3.0)),
        )

    def _draw_workload(self, rng: np.random.Generator, name: str) -> Workload:
        layers = int(rng.integers(20, 160))
        flops = float(10 ** rng.uniform(8.5, 10.5))
        weights = float(10 ** rng.uniform(6, 8.3))
        acts = float(10 ** rng.uniform(6, 7.7))
        host = float(10 ** rng.uniform(5, 7))
        draft = Workload(
            flops,
            weights,
            acts,
            host,
            layers,
            float(rng.uniform(2e3, 2e4)),
            float(rng.uniform(1, 16)),
            float(10 ** rng.uniform(6.5, 8)),
            float(rng.uniform(1.5, 3.0)),
            _profile(rng, name, layers, flops, weights, acts),
        )
        mid = self._space.default_config(self._space.batch_sizes[len(self._space.batch_sizes) // 2])
        host_t, compute_t, memory_t = self._stages(draft, [mid])
        target = max(float(host_t[0]), float(compute_t[0]), float(memory_t[0])) * float(rng.uniform(1.3, 2.5))
        if self.bottleneck == "host":
            draft.host_cycles *= target / float(host_t[0])
        elif self.bottleneck == "compute":
            draft.flops *= target / float(compute_t[0])
            draft.profile = _scaled(draft.profile, flops=target / float(compute_t[0]))
        else:
            factor = target / float(memory_t[0])
            draft.weight_bytes *= factor
            draft.act_bytes *= factor
            draft.profile = _scaled(draft.profile, bytes_=factor)
        return draft

    # -- the physics ------------------------------------------------------------------------------
    def _column(self, configs: list[Config], role: str) -> np.ndarray | None:
        name = self.roles.get(role)
        if name is None or name not in self._space.knobs:
            return None
        return np.array([float(c.knobs[name]) for c in configs])

    def _operating(self, configs: list[Config]) -> dict[str, np.ndarray]:
        n = len(configs)
        modes = [self._space.mode_of(c) for c in configs]
        gpu = self._column(configs, "gpu")
        mem = self._column(configs, "mem")
        cpu = self._column(configs, "cpu")
        cores = self._column(configs, "cores")
        fabric = self._column(configs, "fabric")
        fabric_top = max(len(self._space.knobs[self.roles["fabric"]].values) - 1, 1) if fabric is not None else 1
        return {
            "gpu": gpu if gpu is not None else np.full(n, self.ranges["gpu"][1]),
            "mem": mem if mem is not None else np.full(n, self.ranges["mem"][1]),
            "cpu": cpu if cpu is not None else np.full(n, self.ranges["cpu"][1]),
            "cores": cores if cores is not None else np.full(n, 4.0),
            "fabric": (fabric - 1) / fabric_top if fabric is not None else np.ones(n),
            "units": np.array([m.properties["units"] if m is not None else 1.0 for m in modes]),
            "base": np.array([m.properties["base_w"] if m is not None else 4.0 for m in modes]),
            "batch": np.array([float(c.batch_size) for c in configs]),
        }

    def _stages(self, wl: Workload, configs: list[Config]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Host time, compute time and memory time per batch (seconds)."""
        op = self._operating([self._space.effective(c) for c in configs])
        p = self.physics
        b = op["batch"]
        workers = 1.0 + (op["cores"] - 1.0) * p.parallel_fraction
        host = b * wl.host_cycles / (op["cpu"] * 1e6 * workers) + wl.layers * wl.launch_cycles / (op["cpu"] * 1e6)
        utilisation = b / (b + wl.b_half)
        compute = wl.flops * b / (p.peak_flops_per_ghz * op["units"] * op["gpu"] / 1000 * utilisation)
        spill = 1.0 + (wl.cliff - 1.0) / (1.0 + np.exp(-(wl.act_bytes * b / wl.cache_bytes - 1.0) * 12))
        traffic = wl.weight_bytes + wl.act_bytes * b * spill
        bandwidth = p.bytes_per_mem_unit * op["mem"] * (0.6 + 0.4 * op["fabric"])
        return host, compute, traffic / bandwidth

    def evaluate(self, model: str, configs: list[Config]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Noise-free period per batch (s), latency per batch (s) and average power (W)."""
        wl = self._workload(model)
        p = self.physics
        op = self._operating([self._space.effective(c) for c in configs])
        host, compute, memory = self._stages(wl, configs)
        accel = np.maximum(compute, memory) + wl.layers * p.kernel_floor_s
        period = np.maximum(host, accel) + p.overlap_loss * np.minimum(host, accel)
        latency = host + accel
        gpu_v = _volts(p.gpu_vf, op["gpu"])
        cpu_v = _volts(p.cpu_vf, op["cpu"])
        busy = accel / period
        activity = 0.3 + 0.7 * compute / np.maximum(accel, 1e-12)
        traffic_rate = memory * p.bytes_per_mem_unit * op["mem"] * (0.6 + 0.4 * op["fabric"]) / period
        mem_top = self.ranges["mem"][1]
        cpu_busy = np.minimum(host / period, 1.0) * np.minimum(
            op["cores"], 1.0 + (op["cores"] - 1.0) * p.parallel_fraction
        )
        power = (
            op["base"]
            + p.gpu_leak_w * gpu_v * op["units"]
            + p.gpu_dyn_w * gpu_v**2 * op["gpu"] / 1000 * op["units"] * busy * activity
            + p.mem_static_w * op["mem"] / mem_top
            + p.pj_per_byte * 1e-12 * traffic_rate
            + p.fabric_w * op["fabric"]
            + p.cpu_leak_w * cpu_v * op["cores"]
            + p.cpu_dyn_w * cpu_v**2 * op["cpu"] / 1000 * cpu_busy
        )
        return period, latency, power

    def _workload(self, model: str) -> Workload:
        if model not in self.workloads:
            raise UserError(f"{self.name} runs its own workloads only: choose one of {', '.join(WORKLOADS)}")
        return self.workloads[model]

    def _measurement(
        self, period: float, latency: float, watts: float, batch: int, rng, window_s: float
    ) -> Measurement:
        p = self.physics
        jitter = p.jitter_s
        if rng is not None:
            scale = float(rng.lognormal(0.0, p.noise_time))
            period *= scale
            latency *= scale
            watts *= float(rng.lognormal(0.0, 0.01))
            jitter *= float(rng.lognormal(0.0, 0.2))
        batches = max(1, int(window_s / period))
        duration = batches * period
        queries = batches * batch
        p99 = latency * (1 + p.tail) + jitter
        return Measurement(
            j_per_query=watts * duration / queries,
            p50_ms=latency * 1000,
            p90_ms=(latency * (1 + p.tail / 2) + jitter / 2) * 1000,
            p99_ms=p99 * 1000,
            qps=queries / duration,
            avg_w=watts,
            energy_j=watts * duration,
            queries=queries,
            duration_s=duration,
            meter="generated",
            rails=["generated:board"],
            twin=True,
        )

    # -- the device protocol ----------------------------------------------------------------------
    def models(self) -> list[str]:
        """The workloads this board declares (a plugin's own models)."""
        return list(WORKLOADS)

    def profile(self, model: str) -> ModelProfile | None:
        """Per-layer profile of one of its workloads (what the roofline prior reads)."""
        return self._workload(model).profile

    def measure_many(self, model: str, configs: list[Config], settings: WindowSettings) -> list[Measurement]:
        """Every configuration at once (a sweep of 50,000 points takes a second); seeded noise if asked."""
        rng = np.random.default_rng(settings.seed) if settings.noise else None
        out: list[Measurement] = []
        for start in range(0, len(configs), 8192):
            chunk = configs[start : start + 8192]
            period, latency, power = self.evaluate(model, chunk)
            out += [
                self._measurement(
                    float(period[i]), float(latency[i]), float(power[i]), c.batch_size, rng, settings.window_s
                )
                for i, c in enumerate(chunk)
            ]
        return out

    def describe(self) -> dict[str, Any]:
        knobs = ", ".join(self._space.knobs)
        return {
            "name": self.name,
            "kind": self.kind,
            "twin": True,
            "title": f"generated board ({self.bottleneck}-bound, {self.size} configurations; knobs {knobs})",
        }


def _effective_size(space: SearchSpace) -> int:
    """Distinct effective configurations, counted per mode from the caps (no grid is built)."""
    batches = len(space.batch_sizes)
    free = [n for n in space.knobs if n != space.mode_knob]
    if space.mode_knob is None:
        return batches * math.prod(len(space.knobs[n].values) for n in free)
    total = 0
    for mode in space.modes.values():
        counts = []
        for n in free:
            values = space.knobs[n].values
            cap = mode.caps.get(n)
            counts.append(len(values) if cap is None else max(1, sum(1 for v in values if v <= cap)))
        total += math.prod(counts)
    return batches * total


def _profile(
    rng: np.random.Generator, name: str, layers: int, flops: float, weights: float, acts: float
) -> ModelProfile:
    """A synthetic per-layer profile whose totals are the workload's (matmul layers carry the weights)."""
    share_f = rng.dirichlet(np.ones(layers))
    share_a = rng.dirichlet(np.ones(layers))
    matmul = rng.random(layers) < 0.5
    matmul[0] = True
    share_w = np.where(matmul, rng.dirichlet(np.ones(layers)), 0.0)
    share_w /= share_w.sum()
    return ModelProfile(
        model=name,
        task="generated",
        input_shape=[1],
        generated_by="tuner.devices.virtual.generated (synthetic)",
        layers=[
            LayerProfile(
                name=f"layer{i}",
                op="matmul" if matmul[i] else "elementwise",
                flops=float(flops * share_f[i]),
                weight_bytes=float(weights * share_w[i]),
                act_bytes=float(acts * share_a[i]),
                matmul=bool(matmul[i]),
            )
            for i in range(layers)
        ],
    )


def _scaled(profile: ModelProfile, flops: float = 1.0, bytes_: float = 1.0) -> ModelProfile:
    layers = [
        layer.model_copy(
            update={
                "flops": layer.flops * flops,
                "weight_bytes": layer.weight_bytes * bytes_,
                "act_bytes": layer.act_bytes * bytes_,
            }
        )
        for layer in profile.layers
    ]
    return profile.model_copy(update={"layers": layers})


def board_seeds(text: str) -> list[int]:
    """``0-19`` or ``3,5,8`` (or both, comma-separated) to a list of board seeds.

    Seeds are 0..2**32-1 and a list holds at most ``MAX_BOARDS``: a range
    the other way round or of a billion boards is refused before any is made.
    """
    seeds: list[int] = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        low, _, high = part.partition("-")
        try:
            first, last = int(low), int(high) if high else int(low)
        except ValueError:
            raise UserError(f"cannot read board seeds {text!r}: write e.g. 0-19 or 3,5,8") from None
        if not 0 <= first <= last <= MAX_SEED:
            raise UserError(f"board seeds {part!r}: write LOW-HIGH with 0 <= LOW <= HIGH <= {MAX_SEED}, e.g. 0-19")
        if len(seeds) + last - first + 1 > MAX_BOARDS:
            raise UserError(f"board seeds {text!r} name more than {MAX_BOARDS} boards: give a shorter range, e.g. 0-19")
        seeds += list(range(first, last + 1))
    return seeds
