"""A twin's parameters: the schema of twin_params/<kind>.json, and which file each twin name reads.

Every constant of the physics (tuner.devices.virtual.twin_physics) is a field
here, with its source in ``sources``; docs/twin.md lists them.
"""

from __future__ import annotations

import json
from importlib import resources

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from tuner.errors import UserError


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


class OpClass(BaseModel):
    """What one kernel family achieves: fractions of peak compute (per precision) and bandwidth, and a floor."""

    model_config = ConfigDict(extra="forbid")

    compute_eff: dict[str, float]
    bw_eff: float
    kernel_min_cycles: float


class Runtime(BaseModel):
    """How a framework runs the graph: precision, fused layers, launch cost relative to eager PyTorch."""

    model_config = ConfigDict(extra="forbid")

    description: str
    precision: str | None = None
    fused_ops: list[str] = Field(default_factory=list)
    launch_scale: float = 1.0
    kernel_floor_scale: float = 1.0
    module_overhead: bool = True


class Wall(BaseModel):
    """Wall power = (rails + carrier) / PSU efficiency: what an AC meter (MLPerf Power) reads."""

    model_config = ConfigDict(extra="forbid")

    carrier_w: float
    psu_efficiency: float


class Governor(BaseModel):
    """The GPU's devfreq load governor (a mode at its defaults: nothing pinned), polled as the kernel's does.

    Each poll it smooths the GPU's busy cycles (``smooth``), asks for the current
    clock plus ``bias`` x clock x (busy share - ``load_target``) / ``load_target``
    (at most a third of the cap; above ``load_max`` that third, undamped),
    averages and damps the request (``smooth``, ``damp`` of 10), and the clock
    driver rounds it up to the next table clock within the mode's cap.
    """

    model_config = ConfigDict(extra="forbid")

    load_target: float
    load_max: float
    bias: float
    smooth: int
    damp: int


class TwinParams(BaseModel):
    """Every constant of one twin; ``sources`` says where each came from (datasheet, microbenchmark, fit, guess)."""

    model_config = ConfigDict(extra="forbid")

    version: int = 2
    kind: str
    title: str
    knob_map: dict[str, str]
    fixed: dict[str, float | str] = Field(default_factory=dict)
    tpcs_max: int
    peak_per_cycle_per_tpc: dict[str, float]
    bytes_per_mem_mhz: float
    op_classes: dict[str, OpClass]
    launch_us: dict[str, float]
    module_overhead_us: float
    nchw_conv_eff: float = 1.0
    nchw_conv_eff_by_precision: dict[str, float] = Field(default_factory=dict)
    host_factor: float
    host_ref_mhz: float
    host_cycles_per_sample: float = 0.0
    host_parallel_fraction: float = 0.8
    graph_replay_us: float = 0.0
    floor_activity: float = 1.0
    awake_idle_w: float | None = None
    runtimes: dict[str, Runtime]
    gpu_vf: VfCurve
    gpu_governor: Governor | None = None
    gpu_leak_w_per_v_tpc: float
    gpu_clock_w_per_v2_ghz: float
    gpu_dyn_w_per_v2_ghz: float
    gpu_compute_activity: float
    soc_static_w: float
    soc_busy_w: float = 0.0
    mem_bg_w: float
    mem_bg_curve: list[tuple[float, float]] = Field(default_factory=list)
    mem_pj_per_byte: float
    sys_static_w: float = 0.0
    sys_emc_w: float = 0.0
    sys_per_mem_w: float = 0.0
    cpu_vf: VfCurve | None = None
    cpu_leak_w_per_core_v: float = 0.0
    cpu_dyn_w_per_v2_ghz: float = 0.0
    cpu_cluster_w_per_v2_ghz: float = 0.0
    cpu_cluster_cores: int = 4
    cpu_metered: bool = True
    wall: Wall | None = None
    rails: list[str]
    p50_jitter_ms: float
    p99_jitter_ms: float
    p99_tail_fraction: float
    noise_time: float = 0.015
    noise_power: float = 0.01
    sources: dict[str, str] = Field(default_factory=dict)


# name -> (parameter file, runtime profile)
TWIN_KINDS = {
    "orin": ("orin-agx", "pytorch"),
    "orin-agx": ("orin-agx", "pytorch"),
    "orin-trt": ("orin-agx", "tensorrt-int8"),
    "h200": ("h200", "pytorch"),
    "orin-nano": ("orin-nano", "pytorch"),
}


def load_params(kind: str) -> TwinParams:
    resource = resources.files("tuner.devices.virtual") / "twin_params" / f"{kind}.json"
    if not resource.is_file():
        raise UserError(f"no twin for {kind!r}: known twins are {', '.join('sim:' + k for k in twin_names())}")
    return TwinParams.model_validate(json.loads(resource.read_text()))


def twin_names() -> list[str]:
    return sorted(k for k in TWIN_KINDS if k != "orin-agx")
