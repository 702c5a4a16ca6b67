"""Checks of the twins against published behaviour they were not fitted on.

Used by scripts/calibrate_twin.py (docs/twin.md) and tests/devices/virtual/test_twin.py: the
power modes (each mode's tuned optimum at the wall, and each mode at its own
default clocks on the module's rails, against MAXN at its defaults), NVIDIA's
MLPerf MaxQ settings against MAXN at the wall (the GPU alone, and with both
DLAs as MLPerf runs them), per-operator figures measured on AGX Orin, and the
interior minimum of batch-1 energy against the GPU clock (PolyThrottle).
"""

from __future__ import annotations

from twin_calibration import ORIN_MAXN, ORIN_MAXQ

from runners.profile import LayerProfile, ModelProfile, load_profile
from tuner.devices.virtual.twin import TwinDevice
from tuner.measure.settings import WindowSettings
from tuner.space import Config

EXACT = WindowSettings(noise=False)
MODES = ("15W", "30W", "50W")
# The knobs the GPU twin reads (the DLA knobs of sim:orin-trt's space stay at their defaults: no DLA lanes).
GPU_KNOBS = ["nvpmodel", "gpu_mhz", "emc_mhz", "cpu_cores", "cpu_mhz"]


def _wall_j(device: TwinDevice, model: str, configs: list[Config], batch: int, governed: bool = False):
    result = device.model.evaluate(load_profile(model), configs, governed=governed)
    return result.wall_w * result.time_s / batch


def cheapest_in_mode(device: TwinDevice, model: str, mode: str, batch: int) -> tuple[Config, float]:
    """The lowest energy per query at the wall among every configuration the mode allows, at one batch size."""
    space = device.space()
    narrow = space.narrow(knobs=GPU_KNOBS, batch_sizes=[space.batch_sizes[0]])
    configs = {}
    for c in narrow.grid():
        if c.knobs["nvpmodel"] != mode:
            continue
        eff = space.effective(c)
        configs[str(sorted(eff.knobs.items()))] = Config(knobs=eff.knobs, batch_size=batch)
    chosen = list(configs.values())
    energy = _wall_j(device, model, chosen, batch)
    best = int(energy.argmin())
    return chosen[best], float(energy[best])


def mode_default(device: TwinDevice, mode: str, batch: int) -> Config:
    """A mode at its own default clocks: what a user gets by picking the mode and nothing else (evaluate it with
    ``governed=True``: its GPU clock is then a cap the devfreq governor works under)."""
    space = device.space()
    base = space.default_config(batch)
    return space.effective(base.model_copy(update={"knobs": {**base.knobs, "nvpmodel": mode}}))


def mode_ordering(model: str = "resnet50", batches: tuple[int, ...] = (64, 128), twin: str = "sim:orin") -> dict:
    """Cheapest energy per query at the wall in each lower mode over MAXN at its default clocks (under 1: saves)."""
    device = TwinDevice(twin)
    out = {}
    for batch in batches:
        base = float(_wall_j(device, model, [mode_default(device, "MAXN", batch)], batch, governed=True)[0])
        out[batch] = {mode: cheapest_in_mode(device, model, mode, batch)[1] / base for mode in MODES}
    return out


def mode_defaults(model: str, twin: str, batch: int) -> dict[str, float]:
    """Each lower mode at its default clocks over MAXN at its defaults, energy per query on the module's rails."""
    device = TwinDevice(twin)
    configs = [mode_default(device, mode, batch) for mode in ("MAXN", *MODES)]
    result = device.model.evaluate(load_profile(model), configs, governed=True)
    energy = result.power_w * result.time_s
    return {mode: float(energy[i + 1] / energy[0]) for i, mode in enumerate(MODES)}


# Per-operator figures measured on a Jetson AGX Orin 64GB that no fit uses.
# cupy/cupy issue 8151 (NVIDIA's AastaLLL, JetPack 5.1.2, CuPy 12.3 profiler): a 10000 x 10000 float32 dot
# (cuBLAS GemmEx, CUDA cores: CuPy leaves TF32 off) took 516.0 ms of GPU time. 2e12 FLOP in 516 ms is 3.88
# TFLOPS, above the 3.34 TFLOPS peak at 50W's 816 MHz cap: only MAXN's 1300.5 MHz allows it.
GEMM_FP32_N = 10000
GEMM_FP32_MS = 516.0
# MLPerf Inference v3.0 closed/NVIDIA Orin MaxP resnet50 Offline: 6438 samples/s with the GPU and both DLAs; the
# DLAs alone give 2037 images/s at the same clocks (NVIDIA/Deep-Learning-Accelerator-SW README): the GPU's share
# is about 6438 - 2037 = 4401 images/s (the two add up at MaxP: twin_params/orin-agx-dla.json, cross_check).
MAXP_GPU_ONLY_QPS = 6438.0 - 2037.0


def gemm_fp32_ms() -> float:
    """sim:orin's GPU time for the cupy 8151 GEMM at MAXN's default clocks (eager fp32: CUDA cores)."""
    orin = TwinDevice("sim:orin")
    n = float(GEMM_FP32_N)
    layer = LayerProfile(
        name="gemm", op="matmul", flops=2 * n**3, weight_bytes=4 * n * n, act_bytes=8 * n * n, op_class="gemm"
    )
    profile = ModelProfile(
        model="gemm", task="check", input_shape=[GEMM_FP32_N], generated_by="twin_checks", layers=[layer]
    )
    op = orin.model.operating([orin.space().default_config(1)])
    return float(orin.model.layer_times(profile, op, op.gpu_mhz)["gpu"].sum()) * 1e3


def maxp_gpu_only_qps(batch: int = 128) -> float:
    """sim:orin-trt resnet50 on the GPU alone at MaxP (MAXN, every clock at its top)."""
    trt = TwinDevice("sim:orin-trt")
    result = trt.model.evaluate(load_profile("resnet50"), [Config(knobs=ORIN_MAXN, batch_size=batch)])
    return float(batch / result.time_s[0])


def maxq_saving(batch: int = 64) -> dict:
    """sim:orin-trt resnet50 at NVIDIA's MaxQ caps against MAXN, at the wall: saving and throughput ratio."""
    trt = TwinDevice("sim:orin-trt")
    profile = load_profile("resnet50")
    res = trt.model.evaluate(
        profile, [Config(knobs=ORIN_MAXQ, batch_size=batch), Config(knobs=ORIN_MAXN, batch_size=batch)]
    )
    wall_j = res.wall_w * res.time_s / batch
    return {
        "saving": float(1 - wall_j[0] / wall_j[1]),
        "throughput_ratio": float(res.time_s[1] / res.time_s[0]),
        "maxq_wall_w": float(res.wall_w[0]),
        "maxn_wall_w": float(res.wall_w[1]),
        "maxq_qps": float(batch / res.time_s[0]),
        "maxn_qps": float(batch / res.time_s[1]),
    }


# MLPerf's ResNet-50 Offline DLA settings (mlcommons inference_results_v3.0 closed/NVIDIA
# configs/resnet50/Offline: Orin_MaxQ 883.2 MHz and DLA batch 8; Orin (MaxP) batch 2 at the 1600 MHz top).
MAXQ_DLAS = {"precision": "int8", "dla_cores": 2, "dla_mhz": 883.2, "dla_batch_size": 8}
MAXP_DLAS = {"precision": "int8", "dla_cores": 2, "dla_mhz": 1600, "dla_batch_size": 2}


def maxq_with_dlas(batch: int = 64) -> dict:
    """sim:orin-trt resnet50 with both DLAs at MLPerf's MaxQ against MaxP (MAXN, everything at full speed)."""
    trt = TwinDevice("sim:orin-trt")
    maxq = trt.measure("resnet50", Config(knobs={**ORIN_MAXQ, **MAXQ_DLAS}, batch_size=batch), EXACT)
    maxp = trt.measure("resnet50", Config(knobs={**ORIN_MAXN, **MAXP_DLAS}, batch_size=batch), EXACT)
    return {
        "throughput_ratio": maxq.qps / maxp.qps,
        "maxq_qps": maxq.qps,
        "maxp_qps": maxp.qps,
        "maxq_wall_w": float(maxq.extra["wall_w"]),
        "maxq_wall_j": float(maxq.extra["wall_j_per_query"]),
        "energy_ratio": float(maxq.extra["wall_j_per_query"]) / float(maxp.extra["wall_j_per_query"]),
    }


def clock_curve(model: str = "efficientnet_b0", batch: int = 1, twin: str = "sim:orin") -> list[tuple[float, float]]:
    """Energy per query against the GPU clock at MAXN (other knobs at default)."""
    orin = TwinDevice(twin)
    space = orin.space()
    configs = [
        Config(knobs={**space.default_config().knobs, "gpu_mhz": f}, batch_size=batch)
        for f in space.knobs["gpu_mhz"].values
    ]
    result = orin.model.evaluate(load_profile(model), configs)
    energy = result.power_w * result.time_s / batch
    return [(float(c.knobs["gpu_mhz"]), float(e)) for c, e in zip(configs, energy, strict=True)]


def published_checks() -> list[str]:
    """Markdown lines for docs/twin.md."""
    lines = []
    for twin in ("sim:orin", "sim:orin-trt"):
        for model in ("resnet50", "bert-base"):
            for batch, ratios in mode_ordering(model, (64,), twin).items():
                shown = ", ".join(f"{m} {r:.2f}" for m, r in ratios.items())
                holds = "holds" if min(ratios.values()) < 1.0 else "missed"
                lines.append(
                    f"- {twin} {model} batch {batch}: each mode's cheapest configuration over MAXN at its default "
                    f"clocks, energy per query at the wall: {shown} (evidence: a mode tuned for the model beats "
                    f"MAXN at its defaults at the wall; {holds})."
                )
    for batch, shape in ((1, "the source's shape: eager or TensorRT at batch 1, the governor"), (64, "saturated")):
        for twin in ("sim:orin", "sim:orin-trt"):
            for model in ("resnet50", "bert-base"):
                ratios = mode_defaults(model, twin, batch)
                shown = ", ".join(f"{m} {r:.2f}" for m, r in ratios.items())
                floor = 0.9 if model == "resnet50" else 1.0
                met = [m for m, r in ratios.items() if r >= floor]
                status = "holds" if len(met) == len(ratios) else f"holds for {', '.join(met) or 'no mode'}, missed"
                lines.append(
                    f"- {twin} {model} batch {batch} ({shape}): each mode at its own defaults over MAXN at its "
                    f"defaults, energy per query on the module's rails: {shown} (evidence: about 1.0 for resnet50, "
                    f"above 1.0 for bert; {status}, see 'Power modes at their default clocks')."
                )
    gemm = gemm_fp32_ms()
    lines.append(
        f"- sim:orin fp32 GEMM {GEMM_FP32_N}^3 at MAXN (CUDA cores): {gemm:.0f} ms against {GEMM_FP32_MS:.0f} ms "
        f"measured on an AGX Orin 64GB (cupy/cupy issue 8151; cuBLAS): {gemm / GEMM_FP32_MS - 1:+.1%} (held out)."
    )
    gpu = maxp_gpu_only_qps()
    lines.append(
        f"- sim:orin-trt resnet50 on the GPU alone at MaxP, batch 128: {gpu:.0f} images/s against about "
        f"{MAXP_GPU_ONLY_QPS:.0f} (MLPerf v3.0 MaxP 6438 less the DLAs' published 2037): "
        f"{gpu / MAXP_GPU_ONLY_QPS - 1:+.1%} (held out)."
    )
    for batch in (64, 128):
        q = maxq_saving(batch)
        lines.append(
            f"- sim:orin-trt resnet50 batch {batch}, NVIDIA's MaxQ caps vs MAXN at the wall: saves {q['saving']:.0%} "
            f"energy per query, throughput ratio {q['throughput_ratio']:.2f} (MLPerf Offline: 0.54 with the DLAs), "
            f"MaxQ wall {q['maxq_wall_w']:.1f} W (MLPerf 22.66 W, GPU plus two DLAs), MAXN wall "
            f"{q['maxn_wall_w']:.1f} W; {q['maxq_qps']:.0f} vs {q['maxn_qps']:.0f} images/s (MLPerf Offline "
            "3463 vs 6438 with the DLAs: the twin models the GPU only)."
        )
    d = maxq_with_dlas()
    lines.append(
        f"- sim:orin-trt resnet50 batch 64 with both DLAs, MLPerf's MaxQ (DLA 883.2 MHz, DLA batch 8) vs MaxP "
        f"(DLA 1600 MHz, batch 2): {d['maxq_qps']:.0f} vs {d['maxp_qps']:.0f} images/s, throughput ratio "
        f"{d['throughput_ratio']:.3f} (MLPerf v3.0 Offline 3463/6438 = 0.538); MaxQ wall {d['maxq_wall_w']:.1f} W "
        f"(MLPerf 22.66 W), {d['maxq_wall_j'] * 1e3:.2f} mJ per query at the wall (MLPerf 6.54 mJ); MaxQ over MaxP "
        f"energy per query at the wall {d['energy_ratio']:.2f} (MaxP is not power-measured in MLPerf: no published "
        "ratio to compare)."
    )
    for twin, model in (
        ("sim:orin", "efficientnet_b0"),
        ("sim:orin-trt", "efficientnet_b0"),
        ("sim:orin", "resnet50"),
        ("sim:orin-trt", "resnet50"),
    ):
        curve = clock_curve(model, 1, twin)
        best = min(range(len(curve)), key=lambda i: curve[i][1])
        shown = ", ".join(f"{f:g}: {e * 1000:.1f}" for f, e in curve)
        lines.append(
            f"- {twin} {model} batch 1 at MAXN, mJ per query by GPU MHz: {shown}; minimum at "
            f"{curve[best][0]:g} MHz (interior: {0 < best < len(curve) - 1})."
        )
    return lines
