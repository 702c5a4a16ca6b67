"""Checks of the twins against published behaviour they were not fitted on.

Used by scripts/calibrate_twin.py (docs/twin.md) and tests/test_twin.py: the
direction of the power modes for resnet50 (Pagoda, orin-mlperf.md), NVIDIA's
MLPerf MaxQ settings against MAXN at the wall (the GPU alone, and with both
DLAs as MLPerf runs them), and the interior minimum of batch-1 energy against
the GPU clock (PolyThrottle).
"""

from __future__ import annotations

from twin_calibration import ORIN_MAXN, ORIN_MAXQ

from runners.profile import load_profile
from tuner.devices.virtual.twin import TwinDevice
from tuner.measure.settings import WindowSettings
from tuner.space import Config

EXACT = WindowSettings(noise=False)
MODES = ("15W", "30W", "50W")


def cheapest_in_mode(device: TwinDevice, model: str, mode: str, batch: int) -> tuple[Config, float]:
    """The lowest energy per query among every configuration the mode allows, at one batch size."""
    space = device.space()
    grid = [c for c in space.narrow(batch_sizes=[space.batch_sizes[0]]).grid() if c.knobs["nvpmodel"] == mode]
    configs = {}
    for c in grid:
        eff = space.effective(c)
        configs[str(sorted(eff.knobs.items()))] = Config(knobs=eff.knobs, batch_size=batch)
    chosen = list(configs.values())
    result = device.model.evaluate(load_profile(model), chosen)
    energy = result.power_w * result.time_s / batch
    best = int(energy.argmin())
    return chosen[best], float(energy[best])


def maxn_default(device: TwinDevice, model: str, batch: int) -> float:
    config = Config(knobs=device.space().default_config().knobs, batch_size=batch)
    result = device.model.evaluate(load_profile(model), [config])
    return float(result.power_w[0] * result.time_s[0] / batch)


def mode_ordering(model: str = "resnet50", batches: tuple[int, ...] = (64, 128)) -> dict:
    """Cheapest energy per query in each lower mode over MAXN at default clocks (under 1: the mode saves)."""
    orin = TwinDevice("sim:orin")
    out = {}
    for batch in batches:
        base = maxn_default(orin, model, batch)
        out[batch] = {mode: cheapest_in_mode(orin, model, mode, batch)[1] / base for mode in MODES}
    return out


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
    order = mode_ordering()
    for batch, ratios in order.items():
        shown = ", ".join(f"{m} {r:.2f}" for m, r in ratios.items())
        lines.append(
            f"- resnet50 (eager fp32) batch {batch}: cheapest configuration per mode over MAXN at its "
            f"default clocks: {shown} (published: the lower modes use less energy per query)."
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
    for twin, model in (("sim:orin", "efficientnet_b0"), ("sim:orin-trt", "efficientnet_b0"), ("sim:orin", "resnet50")):
        curve = clock_curve(model, 1, twin)
        best = min(range(len(curve)), key=lambda i: curve[i][1])
        shown = ", ".join(f"{f:g}: {e * 1000:.1f}" for f, e in curve)
        lines.append(
            f"- {twin} {model} batch 1 at MAXN, mJ per query by GPU MHz: {shown}; minimum at "
            f"{curve[best][0]:g} MHz (interior: {0 < best < len(curve) - 1})."
        )
    return lines
