"""The AGX Orin twin's memory, 5 V system and CPU rails and its module power limit, from per-rail evidence.

Used by scripts/calibrate_twin.py (parameters, docs/twin.md tables) and
tests/devices/virtual/test_twin.py. Evidence (cited in docs/twin.md):
- scripts/calibration_data/orin-mode-rails.json (scripts/orin_mode_rails.py): the four INA3221 rails of
  an AGX Orin devkit under HuggingFace PyTorch inference at each nvpmodel mode's defaults;
- NVIDIA forum thread 323456: VDD_GPU_SOC and VDD_CPU_CV under GPU and CPU stress per mode, and the module
  data sheet's maximum module power.

Closed-form fits on named rows; every other row is held out and its error
reported. The ResNet-152 runs are simulated by the twin itself (batch 1,
eager fp32, each mode's defaults: the GPU clock where the devfreq governor
settles under the mode's cap, as on the devkit) on a profile built from
resnet50's layers with ResNet-152's block counts (3, 8, 36, 3).
"""

from __future__ import annotations

import json
import re
import statistics
from dataclasses import replace

import numpy as np
from twin_calibration import CALIBRATION_DIR
from twin_depth_anything import depth_anything_v2_base

from runners.profile import ModelProfile, load_profile
from tuner.devices.virtual.twin import TwinDevice
from tuner.devices.virtual.twin_schema import TwinParams
from tuner.space import Config

RAILS = ("VDD_GPU_SOC", "VDD_CPU_CV", "VIN_SYS_5V0", "VDDQ_VDD2_1V8AO")
MODES = ("MAXN", "50W", "30W", "15W")
FORUM = "forums.developer.nvidia.com/t/323456"
# The thread's stress measurements (GPU and CPU loaded separately) on an AGX Orin devkit whose modes are
# nvpmodel_p3701_0000.conf's (12 cores; 30W offlines 4, 15W offlines 8): rail watts per mode.
STRESS_W = {
    "MAXN": {"VDD_GPU_SOC": 40.4, "VDD_CPU_CV": 15.2},
    "50W": {"VDD_GPU_SOC": 18.4, "VDD_CPU_CV": 6.0},
    "30W": {"VDD_GPU_SOC": 7.6, "VDD_CPU_CV": 5.6},
    "15W": {"VDD_GPU_SOC": 5.2, "VDD_CPU_CV": 1.6},
}
# Cores online and CPU cap per mode (nvpmodel_p3701_0000.conf, shared reference jetson-orin-agx.md): what a
# stress test runs every online core at.
MODE_CPU = {"MAXN": (12, 2201.6), "50W": (12, 1497.6), "30W": (8, 1728.0), "15W": (4, 1113.6)}
MODULE_LIMIT_W = 60.0
EMC_FLOOR_MHZ = 204.0
RESNET152_BLOCKS = {"layer1": 3, "layer2": 8, "layer3": 36, "layer4": 3}
# Which rows each closed-form fit uses; every other row is held out.
FIT_MEM = ("MAXN", "50W")
FIT_SYS = (
    ("resnet152", "MAXN"),
    ("resnet152", "15W"),
    ("depth-anything-v2-base", "MAXN"),
    ("depth-anything-v2-base", "15W"),
)
# The mode whose ResNet-152 idle mean (leakage per online core) and busy mean with the forum's stress row (per busy
# core and per busy cluster) fix the CPU rail.
FIT_CPU = "MAXN"
# The CPU floor clock of every mode (nvpmodel_p3701_0000.conf: CPU_A78_* MIN_FREQ 729600): where the logs show idle
# clusters (729 MHz) after every run, so the clock of the idle row that fixes the leakage per online core.
CPU_FLOOR_MHZ = 729.6
# The step of VDD_GPU_SOC and VDD_CPU_CV in these logs (every reading a multiple of 397-398 mW: the INA3221's 40 uV
# of shunt voltage over the 2 mOhm shunt of tegra234-p3701.dtsi is 20 mA, 0.397 W at a ~19.9 V bus).
SENSOR_STEP_W = 0.397
FIT_SOC = ("MAXN", "15W")
FIT_SOC_BUSY = "MAXN"
MODE_TPCS = {"MAXN": 8, "50W": 8, "30W": 4, "15W": 3}
GPU_FLOOR_MHZ = 306.0
# The GPU's devfreq governor at nvpmodel defaults: nvhost_pod_init's defaults (loads in per mille, bias in %).
PODGOV = {"load_target": 700 / 1000, "load_max": 900 / 1000, "bias": 80 / 100, "smooth": 10, "damp": 7}
PODGOV_SOURCE = (
    'nvhost_podgov, the devfreq governor of the Orin GPU (ga10b: devfreq_governor = "nvhost_podgov" in '
    "drivers/gpu/nvgpu/os/linux/platform_ga10b_tegra.c of the L4T r35 kernel, github.com/OE4T/linux-tegra-5.10); "
    "nvhost_pod_init's defaults in drivers/devfreq/governor_pod_scaling.c (same tree): p_load_target 700 and "
    "p_load_max 900 per mille, p_bias 80 (%), p_smooth 10, p_damp 7 (of 10), p_block_window 50 ms; the twin runs "
    "nvhost_pod_estimate_freq and scaling_state_check poll by poll from the mode's cap (smoothed busy cycles, "
    "boost = bias x freq x (busy - target) / target capped at max/3, max/3 undamped above load_max, request "
    "averaged and damped) and rounds each request up to the table (the ga10b platform's clock rounding, "
    "gp10b_round_clk_rate: the first table clock at or above it), and takes the mean clock of the last polls. "
    "Fixed point: the GPU 70% busy, the lowest table clock if lighter there, the cap if busier there. The "
    "per-poll load is the twin's steady busy share at that clock (no transient, no polling interval)"
)


def evidence() -> dict:
    return json.loads((CALIBRATION_DIR / "orin-mode-rails.json").read_text())


def run(data: dict, workload: str, mode: str) -> dict:
    return next(r for r in data["runs"] if r["workload"] == workload and r["mode"] == mode)


def resnet152() -> ModelProfile:
    """ResNet-152 from resnet50's profile: the same stem, first blocks and head; each stage's repeated
    bottleneck (block 1 of resnet50) repeated to ResNet-152's block counts."""
    base = load_profile("resnet50")
    pattern = re.compile(r"(layer\d)\.(\d+)\.(.*)")
    template: dict[str, list] = {}
    for layer in base.layers:
        m = pattern.match(layer.name)
        if m and m.group(2) == "1":
            template.setdefault(m.group(1), []).append(layer)
    layers, done = [], set()
    for layer in base.layers:
        m = pattern.match(layer.name)
        if m is None or m.group(2) == "0":
            layers.append(layer)
            continue
        stage = m.group(1)
        if stage in done:
            continue
        done.add(stage)
        for block in range(1, RESNET152_BLOCKS[stage]):
            for t in template[stage]:
                layers.append(t.model_copy(update={"name": f"{stage}.{block}.{t.name.split('.', 2)[2]}"}))
    return base.model_copy(update={"model": "resnet152", "layers": layers, "generated_by": "scripts/twin_rails.py"})


def mode_config(device: TwinDevice, mode: str, batch: int = 1) -> Config:
    space = device.space()
    base = space.default_config(batch)
    return space.effective(base.model_copy(update={"knobs": {**base.knobs, "nvpmodel": mode}}))


def harness(params: dict) -> dict[str, dict[str, float]]:
    """The twin's ResNet-152 batch-1 run at each mode's defaults: time, DRAM bytes/s, busy CPU cores."""
    device = TwinDevice("sim:orin", params=TwinParams.model_validate(params))
    configs = [mode_config(device, m) for m in MODES]
    op = device.model.operating(configs)
    clock = device.model.governed_gpu_mhz(resnet152(), op)
    time_s, u_gpu, _, bytes_per_s, u_cpu = device.model.activity(resnet152(), op, clock)
    return {
        m: {
            "time_s": float(time_s[i]),
            "bytes_per_s": float(bytes_per_s[i]),
            "u_cpu": float(u_cpu[i]),
            "cpu_mhz": float(op.cpu_mhz[i]),
            "cores": float(op.cores[i]),
            "emc_mhz": float(op.mem_mhz[i]),
            "gpu_mhz": float(clock[i]),
            "u_gpu": float(u_gpu[i]),
        }
        for i, m in enumerate(MODES)
    }


def _volts(curve: dict, mhz: float) -> float:
    span = curve["f_max_mhz"] - curve["f_knee_mhz"]
    return curve["v_min"] + (curve["v_max"] - curve["v_min"]) * max(0.0, (mhz - curve["f_knee_mhz"]) / span)


def fit(params: dict) -> dict:
    """The rail parameters (values for the twin JSON) from the evidence and the twin's own ResNet-152 runs."""
    data = evidence()
    h = harness(params)
    vddq = {m: run(data, "resnet152", m)["busy"]["VDDQ_VDD2_1V8AO"]["mean"] for m in MODES}
    # DRAM energy per byte: the same EMC cap (3199) at MAXN and 50W, different traffic.
    pj = (vddq["MAXN"] - vddq["50W"]) / (h["MAXN"]["bytes_per_s"] - h["50W"]["bytes_per_s"]) * 1e12
    loaded = vddq["MAXN"] - pj * 1e-12 * h["MAXN"]["bytes_per_s"]
    idle = statistics.median(r["idle"]["VDDQ_VDD2_1V8AO"]["median"] for r in data["runs"] if r["idle"])
    # VIN_SYS_5V0 against VDDQ: least squares over the fit runs' busy means.
    x = np.array([run(data, w, m)["busy"]["VDDQ_VDD2_1V8AO"]["mean"] for w, m in FIT_SYS])
    y = np.array([run(data, w, m)["busy"]["VIN_SYS_5V0"]["mean"] for w, m in FIT_SYS])
    slope, intercept = np.polyfit(x, y, 1)
    # CPU rail: leakage per online core x V; per busy core and per busy cluster x V^2 f. Leakage from the idle
    # samples after the MAXN run (12 cores online, every cluster at the 729.6 MHz floor, nothing running: the mean,
    # as a median of 0.4 W steps is a step). Then two rows, two unknowns, each less that leakage at its own clock:
    # the busy mean at MAXN (the twin's own busy cores, a launch thread with a cluster to itself) and the forum's CPU
    # stress at MAXN (12 busy cores sharing 3 clusters).
    curve = params["cpu_vf"]
    hm = h[FIT_CPU]
    maxn = run(data, "resnet152", FIT_CPU)
    leak = maxn["idle"]["VDD_CPU_CV"]["mean"] / (maxn["cores_online"] * _volts(curve, CPU_FLOOR_MHZ))
    cores, cap = MODE_CPU[FIT_CPU]
    v_h, v_s = _volts(curve, hm["cpu_mhz"]), _volts(curve, cap)
    clusters = cores / params["cpu_cluster_cores"]
    a = np.array(
        [
            [hm["u_cpu"], min(hm["u_cpu"], clusters)],
            [cores, clusters],
        ]
    ) * np.array([[v_h**2 * hm["cpu_mhz"] / 1000], [v_s**2 * cap / 1000]])
    b = np.array(
        [
            maxn["busy"]["VDD_CPU_CV"]["mean"] - leak * hm["cores"] * v_h,
            STRESS_W[FIT_CPU]["VDD_CPU_CV"] - leak * cores * v_s,
        ]
    )
    dyn, cluster = np.linalg.solve(a, b)
    # VDD_GPU_SOC idle (the GPU at its lowest clock, 306 MHz on the grid, powered TPCs leaking): SoC floor plus
    # leakage per powered TPC, from the idle samples after the MAXN (8 TPCs) and 15W (3 TPCs) ResNet-152 runs.
    gv = _volts(params["gpu_vf"], GPU_FLOOR_MHZ)
    gpu_idle = {m: run(data, "resnet152", m)["idle"]["VDD_GPU_SOC"]["median"] for m in FIT_SOC}
    tpcs = {m: MODE_TPCS[m] for m in FIT_SOC}
    a_soc = np.array([[1.0, gv * tpcs[m]] for m in FIT_SOC])
    soc, gpu_leak = np.linalg.solve(a_soc, np.array([gpu_idle[m] for m in FIT_SOC]))
    # VDD_GPU_SOC while ResNet-152 runs at MAXN (the governor holds the lowest clock) above what the twin's SoC
    # floor, leakage and GPU clock-following power give at that clock: the rail's draw under load that does not
    # follow the GPU clock. 50W, 30W and 15W held out.
    base = {**params, "soc_static_w": float(soc), "gpu_leak_w_per_v_tpc": float(gpu_leak), "soc_busy_w": 0.0}
    device = TwinDevice("sim:orin", params=TwinParams.model_validate(base))
    config = mode_config(device, FIT_SOC_BUSY)
    twin_gpu = float(device.model.evaluate(resnet152(), [config], governed=True).rails_w["VDD_GPU_SOC"][0])
    soc_busy = run(data, "resnet152", FIT_SOC_BUSY)["busy"]["VDD_GPU_SOC"]["mean"] - twin_gpu
    return {
        "soc_static_w": round(float(soc), 3),
        "soc_busy_w": round(soc_busy, 3),
        "gpu_leak_w_per_v_tpc": round(float(gpu_leak), 4),
        "mem_pj_per_byte": round(float(pj), 2),
        "mem_bg_curve": [[EMC_FLOOR_MHZ, round(idle, 3)], [2133.0, round(loaded, 3)], [3199.0, round(loaded, 3)]],
        "sys_static_w": round(float(intercept), 3),
        "sys_emc_w": 0.0,
        "sys_per_mem_w": round(float(slope), 3),
        "cpu_leak_w_per_core_v": round(float(leak), 4),
        "cpu_dyn_w_per_v2_ghz": round(float(dyn), 4),
        "cpu_cluster_w_per_v2_ghz": round(float(cluster), 4),
    }


def sources() -> dict[str, str]:
    ev = (
        "scripts/calibration_data/orin-mode-rails.json (BroncoSpace-Lab/scales-hardware tegrastats, scripts/"
        "orin_mode_rails.py)"
    )
    return {
        "mem_pj_per_byte": f"fitted by scripts/twin_rails.py: VDDQ_VDD2_1V8AO of {ev}, ResNet-152 at MAXN minus 50W "
        "(both EMC cap 3199 MHz) over the twin's DRAM bytes/s of the same runs; 30W and 15W held out (docs/twin.md)",
        "mem_bg_curve": f"VDDQ_VDD2_1V8AO background against the EMC rate, {ev}: at the EMC floor (204 MHz, the "
        "lowest rate; EMC DVFS settles there idle) the median of every run's idle samples; under load, ResNet-152 "
        "at MAXN less its traffic (energy per byte above), taken for EMC 2133 and 3199 alike (15W, capped at 2133, "
        "is held out and shows no lower background); between 204 and 2133 MHz linear (no run there)",
        "sys_static_w": f"fitted by scripts/twin_rails.py: intercept of VIN_SYS_5V0 against VDDQ_VDD2_1V8AO, {ev}, "
        "least squares over the busy means of ResNet-152 and Depth Anything at MAXN and 15W; every other run and "
        "every idle segment held out (docs/twin.md)",
        "soc_static_w": f"fitted by scripts/twin_rails.py (with gpu_leak_w_per_v_tpc, two rows, two unknowns): "
        f"VDD_GPU_SOC idle after the ResNet-152 runs at MAXN (8 TPCs powered) and 15W (3 TPCs), {ev}, the GPU at its "
        "lowest clock; 30W and 50W idle held out (docs/twin.md)",
        "gpu_leak_w_per_v_tpc": "fitted by scripts/twin_rails.py (see soc_static_w): per powered TPC per volt "
        "(TPC_PG_MASK gates the others)",
        "soc_busy_w": f"fitted by scripts/twin_rails.py: VDD_GPU_SOC of ResNet-152 at MAXN ({ev}, busy mean) less the "
        "twin's SoC floor, leakage and clock-following GPU power at the clock the devfreq governor holds there (its "
        "lowest, 306 MHz: the twin's GPU is under the governor's 70% target at every clock; the source's authors saw "
        "MAXN at the minimum clock under Phi-3.5): the rail's draw while a workload runs that does not follow the "
        "GPU clock (the SoC side of the shared rail: memory controller and fabric). One row, one unknown; the "
        "50W, 30W and 15W ResNet-152 rows and the forum's GPU stress rows at 50W and 30W are held out (docs/twin.md)",
        "sys_emc_w": "0: VIN_SYS_5V0 follows the memory rail (sys_per_mem_w), which carries the EMC dependence",
        "sys_per_mem_w": "fitted by scripts/twin_rails.py: slope of VIN_SYS_5V0 against VDDQ_VDD2_1V8AO (as "
        "sys_static_w): the 5 V system rail feeds the memory controller and DRAM-side supplies and rises with them",
        "cpu_leak_w_per_core_v": "fitted by scripts/twin_rails.py (one row, one unknown): VDD_CPU_CV idle after the "
        f"ResNet-152 run at MAXN ({ev}: mean 0.075 W, median 0, with 12 cores "
        "online and every cluster at the 729.6 MHz floor of nvpmodel_p3701_0000.conf's CPU_A78_* MIN_FREQ); per "
        "online core per volt. Idle online cores draw less than one 0.4 W step of the sensor after every run (4, 8 "
        "and 12 cores online), so it is small; the 30W, 50W and 15W idle rows are held out (docs/twin.md)",
        "cpu_dyn_w_per_v2_ghz": "fitted by scripts/twin_rails.py (with cpu_cluster_w_per_v2_ghz, two rows, two "
        f"unknowns, each less the leakage at its clock): VDD_CPU_CV of ResNet-152 at MAXN ({ev}, busy mean, the twin's "
        "own busy cores: its launch thread, with a cluster to itself) and under CPU stress at MAXN "
        f"({FORUM}: 15.2 W, 12 cores at 2201.6 MHz sharing 3 clusters); per busy core x V^2 f. The two rows alone "
        "disagree by 1.9x per busy core (1.09 and 0.57 W per V^2 GHz); the logs' own per-core loads at their "
        "clocks give about 1.0 over every segment of the logs (docs/twin.md). The other modes' harness, Depth "
        "Anything and stress rows are held out",
        "cpu_cluster_w_per_v2_ghz": "fitted by scripts/twin_rails.py (see cpu_dyn_w_per_v2_ghz): per busy cluster x "
        "V^2 f, the cluster's own draw beside its busy cores (shared cache and interconnect); a busy thread takes a "
        "cluster to itself until every cluster is busy",
        "cpu_cluster_cores": "nvpmodel_p3701_0000.conf: the twelve Cortex-A78AE cores are three clock domains "
        "(CPU_A78_0, _1, _2 at cpu0, cpu4, cpu8: clusters of four)",
        "fixed": "PyTorch fp32 as in the Pagoda calibration rows (runtime pytorch); power_limit_w: the module data "
        f"sheet's maximum module power, 'JAO 64GB Maximum Module Power: Up to 60W', quoted by NVIDIA in {FORUM}; "
        "over it the module throttles its clocks (hardware over-current throttling, BPMP firmware; docs/twin.md)",
    }


def check_rows(params: dict) -> list[dict]:
    """Every row of the evidence the twin can be held to, with its error and whether a fit used it."""
    data = evidence()
    device = TwinDevice("sim:orin", params=TwinParams.model_validate(params))
    configs = [mode_config(device, m) for m in MODES]
    result = device.model.evaluate(resnet152(), configs, governed=True)
    pinned = device.model.evaluate(resnet152(), configs)
    op = device.model.operating(configs)
    _, u_gpu, _, _, _ = device.model.activity(resnet152(), op, result.gpu_mhz)
    rows = []
    maxn_energy = run(data, "resnet152", "MAXN")["busy"]["sum_mean"] / run(data, "resnet152", "MAXN")["table"]["fps"]
    twin_maxn_energy = float(result.power_w[0] * result.time_s[0])
    for i, mode in enumerate(MODES):
        r = run(data, "resnet152", mode)
        measured = {rail: r["busy"][rail]["mean"] for rail in RAILS}
        twin = {rail: float(result.rails_w[rail][i]) for rail in RAILS}
        fps = r["table"]["fps"]
        energy = r["busy"]["sum_mean"] / fps
        fitted = {
            "VDDQ_VDD2_1V8AO": mode in FIT_MEM,
            "VIN_SYS_5V0": ("resnet152", mode) in FIT_SYS,
            "VDD_CPU_CV": mode == FIT_CPU,
            "VDD_GPU_SOC": mode == FIT_SOC_BUSY,
        }
        rows.append(
            {
                "mode": mode,
                "fps": fps,
                "twin_fps": 1.0 / float(result.time_s[i]),
                "gr3d": r["busy"]["gr3d_pct"]["mean"] / 100.0,
                "twin_gr3d": float(u_gpu[i]),
                "twin_gpu_mhz": float(result.gpu_mhz[i]),
                "cap_mhz": float(op.gpu_mhz[i]),
                "rails": measured,
                "twin_rails": twin,
                "fitted": fitted,
                "sum": r["busy"]["sum_mean"],
                "twin_sum": float(result.power_w[i]),
                "twin_sum_pinned": float(pinned.power_w[i]),
                "energy_ratio": energy / maxn_energy,
                "twin_energy_ratio": float(result.power_w[i] * result.time_s[i]) / twin_maxn_energy,
                "power_ratio": r["busy"]["sum_mean"] / run(data, "resnet152", "MAXN")["busy"]["sum_mean"],
                "twin_power_ratio": float(result.power_w[i] / result.power_w[0]),
            }
        )
    return rows


def saturated_rows(params: dict) -> list[dict]:
    """The devkit's Depth Anything V2 base runs (GR3D 87-97% busy: the governor at each mode's cap) replayed on
    sim:orin as the source ran them (batch 1, eager fp32, 518 x 518, each mode's defaults, the governed clock):
    per-rail busy means, throughput and each mode over MAXN. No fit uses these rows' GPU and CPU rails or
    throughput (VIN_SYS_5V0 at MAXN and 15W enters the 5 V line's fit)."""
    data = evidence()
    device = TwinDevice("sim:orin", params=TwinParams.model_validate(params))
    profile = depth_anything_v2_base()
    configs = [mode_config(device, m) for m in MODES]
    result = device.model.evaluate(profile, configs, governed=True)
    op = device.model.operating(configs)
    _, u_gpu, _, _, _ = device.model.activity(profile, op, result.gpu_mhz)
    base = run(data, "depth-anything-v2-base", "MAXN")
    out = []
    for i, mode in enumerate(MODES):
        r = run(data, "depth-anything-v2-base", mode)
        out.append(
            {
                "mode": mode,
                "fps": r["table"]["fps"],
                "twin_fps": 1.0 / float(result.time_s[i]),
                "gr3d": r["busy"]["gr3d_pct"]["mean"] / 100.0,
                "twin_gr3d": float(u_gpu[i]),
                "twin_mhz": float(result.gpu_mhz[i]),
                "rails": {rail: r["busy"][rail]["mean"] for rail in RAILS},
                "twin_rails": {rail: float(result.rails_w[rail][i]) for rail in RAILS},
                "sum": r["busy"]["sum_mean"],
                "twin_sum": float(result.power_w[i]),
                "time_ratio": base["table"]["fps"] / r["table"]["fps"],
                "power_ratio": r["busy"]["sum_mean"] / base["busy"]["sum_mean"],
                "energy_ratio": (r["busy"]["sum_mean"] / r["table"]["fps"])
                / (base["busy"]["sum_mean"] / base["table"]["fps"]),
                "twin_time_ratio": float(result.time_s[i] / result.time_s[0]),
                "twin_power_ratio": float(result.power_w[i] / result.power_w[0]),
                "twin_energy_ratio": float(
                    result.power_w[i] * result.time_s[i] / (result.power_w[0] * result.time_s[0])
                ),
            }
        )
    return out


def sys_rows(params: dict) -> list[dict]:
    """VIN_SYS_5V0 from each run's own VDDQ through the twin's relation: busy means and idle medians."""
    data = evidence()
    out = []
    for r in data["runs"]:
        for part, stat in (("busy", "mean"), ("idle", "median")):
            if r[part] is None:
                continue
            vddq = r[part]["VDDQ_VDD2_1V8AO"][stat]
            predicted = params["sys_static_w"] + params["sys_per_mem_w"] * vddq
            measured = r[part]["VIN_SYS_5V0"][stat]
            fitted = part == "busy" and (r["workload"], r["mode"]) in FIT_SYS
            out.append(
                {
                    "run": f"{r['workload']} {r['mode']} {part}",
                    "vddq": vddq,
                    "measured": measured,
                    "twin": predicted,
                    "error": predicted / measured - 1.0,
                    "fitted": fitted,
                }
            )
    return out


def cpu_rows(params: dict) -> list[dict]:
    """VDD_CPU_CV of every run segment (busy and idle means) beside its cores' own activity in the logs: busy cores
    at each CPU clock x V(f)^2 f on the twin's CPU curve (V^2 GHz of busy core), and the watts per unit of it that
    one least squares through the origin gives over every segment (no fit uses it: a check on the per-core term)."""
    curve = params["cpu_vf"]
    rows = []
    for r in evidence()["runs"]:
        for part in ("busy", "idle"):
            if r[part] is None:
                continue
            by_mhz = {float(k): v for k, v in r[part]["busy_cores_by_mhz"].items()}
            rows.append(
                {
                    "run": f"{r['workload']} {r['mode']} {part}",
                    "cores_online": r["cores_online"],
                    "busy_cores": sum(by_mhz.values()),
                    "activity": sum(v * _volts(curve, f) ** 2 * f / 1000 for f, v in by_mhz.items()),
                    "measured": r[part]["VDD_CPU_CV"]["mean"],
                }
            )
    x = np.array([r["activity"] for r in rows])
    y = np.array([r["measured"] for r in rows])
    per_activity = float(x @ y / (x @ x))
    for r in rows:
        r["per_activity"] = per_activity
    return rows


def stress_rows(params: dict) -> list[dict]:
    """The forum's stress rows: CPU rail with every online core busy at the mode's cap; GPU rail at full load."""
    p = TwinParams.model_validate(params)
    device = TwinDevice("sim:orin", params=p)
    out = []
    for mode in MODES:
        cores, cap = MODE_CPU[mode]
        config = mode_config(device, mode)
        op = replace(device.model.operating([config]), cpu_mhz=np.array([cap]))
        one = np.ones(1)
        rails = device.model.rails(op, op.gpu_mhz, one, one, np.zeros(1), np.array([float(cores)]))
        out.append(
            {
                "mode": mode,
                "cpu": STRESS_W[mode]["VDD_CPU_CV"],
                "twin_cpu": float(rails["VDD_CPU_CV"][0]),
                "gpu": STRESS_W[mode]["VDD_GPU_SOC"],
                "twin_gpu": float(rails["VDD_GPU_SOC"][0]),
                "fitted": mode == FIT_CPU,
            }
        )
    return out


def doc_lines(params: dict) -> list[str]:
    """docs/twin.md's section: the fitted and held-out rows of the rail evidence, with their errors."""

    def pct(twin: float, measured: float) -> str:
        return f"{100 * (twin / measured - 1):+.1f}%"

    lines = [
        "## Per-rail evidence: AGX Orin under inference at each mode's defaults",
        "",
        "ResNet-152 (HuggingFace, PyTorch eager fp32, batch 1) on the scales-hardware devkit, each mode at its "
        "default clocks; the twin runs the same network (resnet50's profile with ResNet-152's block counts) on "
        "sim:orin at each mode's defaults: the GPU clock where the devfreq governor settles under the mode's cap "
        "(the logs carry the GR3D load but not the clock). Measured: busy mean of each rail (W), throughput from "
        "the repository's table. 'fit' marks the rail a closed-form fit used (scripts/twin_rails.py; VDD_GPU_SOC at "
        "MAXN fixes soc_busy_w); everything else is held out.",
        "",
        "| mode | images/s (twin) | VDD_GPU_SOC | VDD_CPU_CV | VIN_SYS_5V0 | VDDQ_VDD2_1V8AO | module sum |",
        "|---|---|---|---|---|---|---|",
    ]
    rows = check_rows(params)
    for r in rows:
        cells = []
        for rail in RAILS:
            tag = " fit" if r["fitted"].get(rail) else ""
            cells.append(
                f"{r['rails'][rail]:.2f} / {r['twin_rails'][rail]:.2f} "
                f"({pct(r['twin_rails'][rail], r['rails'][rail])}{tag})"
            )
        lines.append(
            f"| {r['mode']} | {r['fps']:.1f} ({r['twin_fps']:.1f}, {pct(r['twin_fps'], r['fps'])}) | "
            + " | ".join(cells)
            + f" | {r['sum']:.2f} / {r['twin_sum']:.2f} ({pct(r['twin_sum'], r['sum'])}) |"
        )
    lines += [
        "",
        "The governor's clock and the GPU load: the log's GR3D busy mean (at the clock the board ran) against the "
        "twin's busy share at the governed clock, and the twin's module sum if the GPU were held at the mode's cap "
        "instead (as the tuner pins clocks):",
        "",
        "| mode | cap MHz | governed MHz | GR3D load | twin load | module sum at the cap | error |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['mode']} | {r['cap_mhz']:.1f} | {r['twin_gpu_mhz']:.1f} | {100 * r['gr3d']:.0f}% | "
            f"{100 * r['twin_gr3d']:.0f}% | {r['twin_sum_pinned']:.2f} | {pct(r['twin_sum_pinned'], r['sum'])} |"
        )
    lines += [
        "",
        "Mode-to-mode ratios (each mode over MAXN; module rails), measured and twin:",
        "",
        "| mode | power ratio | twin | error | energy per image ratio | twin | error |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows[1:]:
        lines.append(
            f"| {r['mode']} | {r['power_ratio']:.3f} | {r['twin_power_ratio']:.3f} | "
            f"{pct(r['twin_power_ratio'], r['power_ratio'])} | {r['energy_ratio']:.3f} | "
            f"{r['twin_energy_ratio']:.3f} | {pct(r['twin_energy_ratio'], r['energy_ratio'])} |"
        )
    lines += [
        "",
        "A saturated GPU: Depth Anything V2 base (HuggingFace depth-estimation pipeline, PyTorch eager fp32, batch 1, "
        "CIFAR-100 images resized to 518 x 518) at each mode's defaults, the GPU 87-97% busy, so the governor holds "
        "each mode's cap. The twin replays it on sim:orin at each mode's defaults with a layer table built from the "
        "architecture (scripts/twin_depth_anything.py: DINOv2 ViT-B/14 encoder, DPT head; 381 GFLOP and 97.2 M "
        "parameters per frame against the model card's 97.5 M). No fit uses these rows' GPU or CPU rails or their "
        "throughput. Measured busy mean / twin (error), W; frames/s from the repository's table:",
        "",
        "| mode | frames/s (twin) | GR3D load (twin) | VDD_GPU_SOC | VDD_CPU_CV | VIN_SYS_5V0 | VDDQ_VDD2_1V8AO | "
        "module sum |",
        "|---|---|---|---|---|---|---|---|",
    ]
    saturated = saturated_rows(params)
    for r in saturated:
        cells = [
            f"{r['rails'][rail]:.2f} / {r['twin_rails'][rail]:.2f} ({pct(r['twin_rails'][rail], r['rails'][rail])})"
            for rail in RAILS
        ]
        lines.append(
            f"| {r['mode']} | {r['fps']:.2f} ({r['twin_fps']:.2f}, {pct(r['twin_fps'], r['fps'])}) | "
            f"{100 * r['gr3d']:.0f}% ({100 * r['twin_gr3d']:.0f}%, {r['twin_mhz']:.0f} MHz) | "
            + " | ".join(cells)
            + f" | {r['sum']:.2f} / {r['twin_sum']:.2f} ({pct(r['twin_sum'], r['sum'])}) |"
        )
    lines += [
        "",
        "Each mode over MAXN (module rails), measured and twin:",
        "",
        "| mode | time ratio | twin | error | power ratio | twin | error | energy per frame ratio | twin | error |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in saturated[1:]:
        lines.append(
            f"| {r['mode']} | {r['time_ratio']:.2f} | {r['twin_time_ratio']:.2f} | "
            f"{pct(r['twin_time_ratio'], r['time_ratio'])} | {r['power_ratio']:.3f} | {r['twin_power_ratio']:.3f} | "
            f"{pct(r['twin_power_ratio'], r['power_ratio'])} | {r['energy_ratio']:.3f} | "
            f"{r['twin_energy_ratio']:.3f} | {pct(r['twin_energy_ratio'], r['energy_ratio'])} |"
        )
    lines += [
        "",
        "VIN_SYS_5V0 from each run's own VDDQ_VDD2_1V8AO through the twin's relation (busy means; idle medians "
        "after each run):",
        "",
        "| run | VDDQ W | VIN_SYS_5V0 W | twin | error | rows |",
        "|---|---|---|---|---|---|",
    ]
    for r in sys_rows(params):
        lines.append(
            f"| {r['run']} | {r['vddq']:.2f} | {r['measured']:.2f} | {r['twin']:.2f} | {100 * r['error']:+.1f}% | "
            f"{'fitted' if r['fitted'] else 'held out'} |"
        )
    lines += [
        "",
        "VDD_GPU_SOC idle after each ResNet-152 run (median; the GPU at its lowest clock, the mode's TPCs powered):",
        "",
        "| mode | measured W | twin | error | rows |",
        "|---|---|---|---|---|",
    ]
    device = TwinDevice("sim:orin", params=TwinParams.model_validate(params))
    data = evidence()
    for mode in MODES:
        measured = run(data, "resnet152", mode)["idle"]["VDD_GPU_SOC"]["median"]
        idle = device.model.idle([mode_config(device, mode)], GPU_FLOOR_MHZ, EMC_FLOOR_MHZ)
        twin = float(idle.rails_w["VDD_GPU_SOC"][0])
        lines.append(
            f"| {mode} | {measured:.2f} | {twin:.2f} | {pct(twin, measured)} | "
            f"{'fitted' if mode in FIT_SOC else 'held out'} |"
        )
    cpu = cpu_rows(params)
    lines += [
        "",
        "VDD_CPU_CV of every segment (busy and idle means) against the cores' own activity in the logs: tegrastats "
        "prints each core's load and clock (a cluster of four shares one), so the busy cores at each clock x V(f)^2 "
        f"f on the twin's CPU curve; one least squares through the origin over every segment gives "
        f"{cpu[0]['per_activity']:.2f} W per V^2 GHz of busy core (no fit uses it). The sensor reads this rail in "
        f"steps of {SENSOR_STEP_W:.3f} W (every reading a multiple of it), so a segment's mean below one step is "
        "resolved only by averaging.",
        "",
        "| segment | cores online | busy cores | activity V^2 GHz | VDD_CPU_CV W | at the least squares W |",
        "|---|---|---|---|---|---|",
    ]
    for r in cpu:
        lines.append(
            f"| {r['run']} | {r['cores_online']} | {r['busy_cores']:.2f} | {r['activity']:.3f} | "
            f"{r['measured']:.3f} | {r['per_activity'] * r['activity']:.3f} |"
        )
    lines += [
        "",
        f"Stress rows ({FORUM}; GPU and CPU loaded separately, every online core busy at the mode's cap; the "
        "twin's GPU at full busy and math activity at the mode's default clocks; VDD_GPU_SOC at MAXN and 15W are "
        "fitted rows of scripts/calibrate_twin.py, 50W and 30W held out):",
        "",
        "| mode | VDD_CPU_CV W | twin | error | VDD_GPU_SOC W | twin | error |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in stress_rows(params):
        tag = " (fit)" if r["fitted"] else ""
        gtag = " (fit)" if r["mode"] in ("MAXN", "15W") else ""
        lines.append(
            f"| {r['mode']} | {r['cpu']:.1f} | {r['twin_cpu']:.2f} | {pct(r['twin_cpu'], r['cpu'])}{tag} | "
            f"{r['gpu']:.1f} | {r['twin_gpu']:.2f} | {pct(r['twin_gpu'], r['gpu'])}{gtag} |"
        )
    return [*lines, ""]
