"""The DLA twin's watts per busy DLA, derived from NVIDIA's published DLA-over-GPU perf/W ratios.

NVIDIA/Deep-Learning-Accelerator-SW's README gives, per nvpmodel mode, ResNet-50's
DLA perf/W over the GPU's (accelerator power only; GPU batch 256) and the two
DLAs' images/s. A DLA's watts are then the GPU's energy per image (the twin's
sim:orin-trt, each mode at its default clocks, VDD_GPU_SOC above its idle
floor) over the ratio, times the DLA's images/s: a derivation through the
twin's GPU power model, so scripts/calibrate_twin.py redoes it whenever that
model changes.

Usage: python scripts/twin_dla_power.py (prints the points)
"""

from __future__ import annotations

from runners.profile import load_profile
from tuner.devices.virtual.twin import TwinDevice
from tuner.space import Config

# mode -> (DLA MHz, DLA perf/W over GPU perf/W, images/s of both DLAs), from the README's tables.
PUBLISHED = {
    "MAXN": (1600.0, 3.5, 2037.0),
    "50W": (1369.6, 2.9, 1948.0),
    "30W": (1369.6, 2.6, 1928.0),
    "15W": (614.4, 3.9, 1072.0),
}
GPU_BATCH = 256


def gpu_mj_per_image() -> dict[str, float]:
    """sim:orin-trt's GPU energy per ResNet-50 image at each mode's default clocks, above the rail's idle floor."""
    trt = TwinDevice("sim:orin-trt")
    space = trt.space()
    rail = trt.params.rails[0]
    profile = load_profile("resnet50")
    out = {}
    for mode in PUBLISHED:
        base = space.default_config(1)
        config = space.effective(base.model_copy(update={"knobs": {**base.knobs, "nvpmodel": mode}}))
        config = Config(knobs=config.knobs, batch_size=GPU_BATCH)
        busy = trt.model.evaluate(profile, [config])
        idle = trt.model.idle([config], float(busy.gpu_mhz[0]))
        above = float(busy.rails_w[rail][0]) - float(idle.rails_w[rail][0])
        out[mode] = above * float(busy.time_s[0]) / GPU_BATCH * 1e3
    return out


def power_points() -> tuple[list[tuple[float, float]], dict[str, float]]:
    """(DLA MHz, watts per busy DLA) points, 50W and 30W (same clock) averaged; and the GPU mJ per image used."""
    mj = gpu_mj_per_image()
    watts = {mode: mj[mode] / 1e3 / ratio * images / 2 for mode, (_, ratio, images) in PUBLISHED.items()}
    points = {}
    for mode, (mhz, _, _) in PUBLISHED.items():
        points.setdefault(mhz, []).append(watts[mode])
    return [(mhz, round(sum(w) / len(w), 2)) for mhz, w in sorted(points.items())], mj


if __name__ == "__main__":
    points, mj = power_points()
    print("GPU mJ/image above idle:", {k: round(v, 2) for k, v in mj.items()})
    print("W per busy DLA:", points)
