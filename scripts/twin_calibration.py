"""Calibration rows (published or measured), the op-class microbenchmark fit, and the twin's error on each row.

Shared by scripts/calibrate_twin.py (which fits parameters), docs/twin.md and
the tests that hold the twin to its calibration; not part of the package. Rows carry the machine they
were measured on (``host``): eager launch cost depends on the host CPU, which
differs between the machines the H200 rows came from, so each machine has one
host-speed factor (scripts/calibration_data/hosts.json).
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from runners.profile import load_profile
from tuner.devices.virtual.twin import TwinDevice
from tuner.devices.virtual.twin_schema import TwinParams
from tuner.space import Config

CALIBRATION_DIR = Path(__file__).resolve().parent / "calibration_data"
DTYPES = {"float16": "fp16", "float32": "fp32", "bfloat16": "bf16"}
ORIN_MAXN = {"nvpmodel": "MAXN", "gpu_mhz": 1300.5, "emc_mhz": 3199, "cpu_cores": 12, "cpu_mhz": 2201.6}
# NVIDIA's MLPerf v3.0 MaxQ caps for resnet50 (orin-mlperf.md): GPU 624.75 MHz (612 on the 102 MHz grid:
# the highest available clock under the cap), EMC 2133 MHz, 4 cores at 576 MHz, under MAXN's caps.
ORIN_MAXQ = {"nvpmodel": "MAXN", "gpu_mhz": 612, "emc_mhz": 2133, "cpu_cores": 4, "cpu_mhz": 576.0}
H200_DEFAULT = {"sm_mhz": 1980, "mem_mhz": 3201, "power_limit_w": 700}
# H200 microbenchmark classes -> (twin op class, precision it measures)
MICRO_CLASSES = {
    "conv_dense": "conv_dense",
    "conv_pointwise": "conv_pointwise",
    "conv_depthwise": "conv_depthwise",
    "gemm_fp16": "gemm",
    "gemm_bf16": "gemm",
    "gemm_fp32": "gemm",
    "attention": "attention",
    "layout_copy": "layout_copy",
    "broadcast": "broadcast",
}
NORM_LABELS = ("layernorm", "batchnorm", "softmax")
# Launch-bound H200 reference rows whose source is noisier than 15%: batch 8 runs faster than batch 1 (fp16 3.84
# vs fp32-batch-1 5.53 ms) where the twin's launch-bound time is one figure for both, so no figure is within
# sqrt(5.53 / 3.84) - 1 = 19.9% of both. The fit gives them half-weight plain log errors (no penalty beyond 12%), so
# that they do not pull the reference host's speed away from the rows it can meet.
SOURCE_LIMITED_ROWS = {"resnet50 fp16 bs8", "resnet50 fp32 bs1"}
NOMINAL_MHZ = 1980.0  # the lent H200's default (and maximum) SM clock
HOST_BOUND = 1.6  # a case within this factor of its operator's fastest call is launch-bound in the timing loop


@dataclass
class Row:
    """One calibration point: a configuration and what was observed under it.

    ``power`` says what the source measured: the Jetson's summed rails, the
    wall (an AC meter), or the GPU board (NVML). ``idle`` rows are the floor
    with nothing running. ``fitted`` says whether the row takes part in the fit.
    """

    source: str
    twin: str
    model: str
    config: Config
    time_ms: float | None
    power_w: float | None
    label: str
    host: str = "default"
    power_kind: str = "rails"
    idle_gpu_mhz: float | None = None
    idle_emc_mhz: float | None = None
    fitted: bool = True
    note: str = ""
    extra: dict = field(default_factory=dict)


def _load(name: str) -> dict:
    return json.loads((CALIBRATION_DIR / name).read_text())


def hosts() -> dict[str, float]:
    """Host-speed factor of each machine a row was measured on (fitted by scripts/calibrate_twin.py)."""
    path = CALIBRATION_DIR / "hosts.json"
    return json.loads(path.read_text())["factors"] if path.is_file() else {}


def orin_rows(data: dict) -> list[Row]:
    """Pagoda's MAXN PyTorch resnet50 rows (summed rails); the bs 32 power is a glitch in the source."""
    block = data["orin_agx_maxn_pytorch_resnet50"]
    rows = []
    for r in block["rows"]:
        power = None if "glitch" in r.get("note", "") else r["power_W"]
        config = Config(knobs=ORIN_MAXN, batch_size=r["bs"])
        rows.append(
            Row(
                "orin_agx_maxn_pytorch_resnet50",
                "sim:orin",
                "resnet50",
                config,
                r["time_ms"],
                power,
                f"MAXN bs{r['bs']}",
            )
        )
    return rows


def mlperf_rows() -> list[Row]:
    """orin-mlperf.md, v3.0 resnet50: SingleStream (GPU only, batch 1) latencies and MaxQ wall power, the
    idle floor at the wall; Offline rows (GPU plus two DLAs) are checks the GPU-only twin is not fitted on."""
    src = "orin_mlperf_v3.0_resnet50"
    maxp = Config(knobs=ORIN_MAXN, batch_size=1)
    maxq = Config(knobs=ORIN_MAXQ, batch_size=1)
    return [
        Row(src, "sim:orin-trt", "resnet50", maxp, 0.633, None, "MaxP SingleStream p90", note="p90"),
        Row(src, "sim:orin-trt", "resnet50", maxq, 1.638, 14.81, "MaxQ SingleStream p90", power_kind="wall"),
        Row(
            src,
            "sim:orin-trt",
            "resnet50",
            maxq,
            None,
            6.3,
            "idle at the wall (MaxQ caps)",
            power_kind="wall",
            idle_gpu_mhz=306,
            idle_emc_mhz=204,
        ),
    ]


def h200_rows(data: dict, key: str, host: str, fitted: bool | None = True) -> list[Row]:
    """H200 rows at default clocks; a row without ``channels_last`` was measured with it (the reference's setup)."""
    block = data[key]
    rows = []
    for r in block["rows"]:
        precision = DTYPES[r["dtype"]]
        layout = r.get("channels_last", True)
        knobs = {**H200_DEFAULT, "precision": precision, "channels_last": layout}
        model = r.get("model", "resnet50")
        label = f"{model} {precision}{'' if layout else ' nchw'} bs{r['bs']}"
        time_ms = r.get("time_ms_per_batch") or 1000 * r["bs"] / r["qps"]
        config = Config(knobs=knobs, batch_size=r["bs"])
        use = r["bs"] == 8 if fitted is None else fitted
        rows.append(
            Row(
                key,
                "sim:h200",
                model,
                config,
                time_ms,
                r.get("avg_W", r.get("avg_w")),
                label,
                host,
                "board",
                fitted=use,
            )
        )
    return rows


def load_rows(path: Path | None = None) -> list[Row]:
    """The published reference rows (../shared/reference/calibration.json and orin-mlperf.md)."""
    data = json.loads((path or CALIBRATION_DIR / "reference.json").read_text())
    return orin_rows(data) + h200_rows(data, "h200_default_clocks_pytorch_resnet50", "reference") + mlperf_rows()


def sweep_rows() -> list[Row]:
    """This project's five-model sweep on the lent H200 (benchmarks/zoo_energy_sweep.py; results/h200-call8/).

    Only the launch-bound batch-8 rows are fitted (they fix that machine's host speed); batch 64 and 256
    are held out: the twin predicts them from the microbenchmarks and the other rows.
    """
    data = {"zoo_sweep": _load("h200-zoo-sweep.json")}
    return h200_rows(data, "zoo_sweep", "default", fitted=None)


def measured_rows() -> list[Row]:
    """Rows this project measured earlier with its own runners (NCHW; benchmarks/h200_studies.sh, another machine)."""
    return h200_rows(_load("h200-measured.json"), "h200_measured_powertune", "issue3")


# Each nvpmodel mode at its default clocks on the orin-agx space (the 102 MHz grid under the mode's caps).
ORIN_MODE_DEFAULTS = {
    "MAXN": ORIN_MAXN,
    "50W": {"nvpmodel": "50W", "gpu_mhz": 816, "emc_mhz": 3199, "cpu_cores": 12, "cpu_mhz": 1497.6},
    "30W": {"nvpmodel": "30W", "gpu_mhz": 612, "emc_mhz": 3199, "cpu_cores": 8, "cpu_mhz": 1651.2},
    "15W": {"nvpmodel": "15W", "gpu_mhz": 408, "emc_mhz": 2133, "cpu_cores": 4, "cpu_mhz": 1036.8},
}
# NVIDIA forum thread 323456 ("Maximum power consumption bounds for Orin AGX"): VDD_GPU_SOC under a GPU stress
# test at each mode, on an AGX Orin devkit with nvpmodel_p3701_0000.conf's modes (12 cores; 30W offlines 4, 15W 8).
GPU_STRESS_W = {"MAXN": 40.4, "50W": 18.4, "30W": 7.6, "15W": 5.2}
GPU_STRESS_FITTED = ("MAXN", "15W")


def stress_rows() -> list[Row]:
    """The GPU rail at full load per mode (the twin's GPU busy and math-unit activity at 1): MAXN and 15W fitted,
    50W and 30W held out."""
    return [
        Row(
            "forum_323456_gpu_stress",
            "sim:orin",
            "resnet50",
            Config(knobs=ORIN_MODE_DEFAULTS[mode], batch_size=1),
            None,
            watts,
            f"GPU stress {mode} (VDD_GPU_SOC)",
            power_kind="rail:VDD_GPU_SOC",
            fitted=mode in GPU_STRESS_FITTED,
        )
        for mode, watts in GPU_STRESS_W.items()
    ]


def all_rows() -> list[Row]:
    return load_rows() + sweep_rows() + measured_rows() + stress_rows()


def device_for(row: Row, devices: dict[str, TwinDevice], host_values: dict[str, float]) -> TwinDevice:
    """The row's twin, with the host-speed factor of the machine the row was measured on."""
    if row.twin not in devices:
        devices[row.twin] = TwinDevice(row.twin)
    device = devices[row.twin]
    factor = host_values.get(row.host) if row.host != "default" else None
    if factor is None:
        return device
    key = f"{row.twin}@{row.host}"
    clone = devices.get(key)
    wanted = device.params.model_copy(update={"host_factor": factor})
    if clone is None or clone.params != wanted:
        clone = TwinDevice(row.twin, params=wanted)
        devices[key] = clone
    return clone


def twin_errors(
    rows: list[Row], devices: dict[str, TwinDevice] | None = None, host_values: dict[str, float] | None = None
) -> list[dict]:
    """Relative error of the noise-free twin on each row: time, power (as the source measured it), energy."""
    out = []
    devices = {} if devices is None else devices
    host_values = hosts() if host_values is None else host_values
    for row in rows:
        device = device_for(row, devices, host_values)
        if row.idle_gpu_mhz is not None:
            result = device.model.idle([row.config], row.idle_gpu_mhz, row.idle_emc_mhz)
            time_ms = None
        elif row.power_kind.startswith("rail:"):
            result = device.model.full_load([row.config])
            time_ms = None
        else:
            result = device.model.evaluate(load_profile(row.model), [row.config])
            time_ms = float(result.time_s[0]) * 1000
            if row.note == "p90":
                time_ms *= 1 + device.params.p99_tail_fraction / 2
        if row.power_kind.startswith("rail:"):
            power = float(result.rails_w[row.power_kind.split(":", 1)[1]][0])
        else:
            power = float(result.wall_w[0] if row.power_kind == "wall" else result.power_w[0])
        t_err = None if row.time_ms is None or time_ms is None else time_ms / row.time_ms - 1
        p_err = None if row.power_w is None else power / row.power_w - 1
        e_err = None if t_err is None or p_err is None else (1 + t_err) * (1 + p_err) - 1
        out.append(
            {
                "row": row.label,
                "source": row.source,
                "fitted": row.fitted,
                "power_kind": row.power_kind,
                "time_ms": row.time_ms,
                "twin_time_ms": time_ms,
                "time_err": t_err,
                "power_w": row.power_w,
                "twin_power_w": power,
                "power_err": p_err,
                "energy_err": e_err,
            }
        )
    return out


def fit_op_classes(micro: dict, floors: dict[str, float], peak: dict[str, float], tpcs: int, bw_peak: float) -> dict:
    """Per op class: achieved fraction of peak compute (per precision) and of peak bandwidth, from the sweep
    of sizes in benchmarks/opclass_microbench.py, with the kernel floor from graph-replayed small kernels.

    Model of one call: max(FLOPs / (peak x clock x eff), bytes / (bandwidth x bw_eff)) + floor cycles /
    clock, at the card's nominal 1980 MHz: under heavy load the card lowers its own clock (NVML read
    1410-1980 MHz after the largest cases), and the fraction includes that, as a user at default clocks
    sees it. Cases within HOST_BOUND of their operator's fastest call are launch-bound in the timing loop
    (host time hides the GPU time) and are left out.
    """
    from scipy.optimize import least_squares

    from tuner.devices.virtual.twin_physics import math_unit

    fastest: dict[tuple[str, str], float] = {}
    for case in micro["cases"]:
        if "error" in case:
            continue
        key = (case["label"].split()[0], case["precision"])
        fastest[key] = min(fastest.get(key, np.inf), case["seconds"])

    def cls(case: dict) -> str:
        if case["class"] == "elementwise":
            return "normalisation" if case["label"].split()[0] in NORM_LABELS else "elementwise"
        return MICRO_CLASSES[case["class"]]

    floor_cycles = {
        "conv_dense": floors["conv_dense"],
        "conv_pointwise": floors["conv_pointwise"],
        "conv_depthwise": floors["conv_depthwise"],
        "gemm": floors["gemm_fp16"],
        "attention": floors["attention"],
        "elementwise": floors["elementwise"],
        "normalisation": statistics.mean([floors["layernorm"], floors["softmax"]]),
        # copies and broadcast multiplies are elementwise kernels too (their microbenchmark measured bandwidth only)
        "layout_copy": floors["elementwise"],
        "broadcast": floors["elementwise"],
    }
    floor_cycles = {k: v * NOMINAL_MHZ * 1e6 for k, v in floor_cycles.items()}  # replayed at the 1980 MHz the card held
    groups: dict[tuple[str, str], list[dict]] = {}
    for case in micro["cases"]:
        if "error" in case or case["seconds"] < HOST_BOUND * fastest[(case["label"].split()[0], case["precision"])]:
            continue
        groups.setdefault((cls(case), case["precision"]), []).append(case)
    fits: dict[tuple[str, str], dict] = {}
    for (name, precision), cases in sorted(groups.items()):
        unit_peak = peak[math_unit(name, precision)] * tpcs
        k = floor_cycles[name]

        def residuals(x: np.ndarray, cases=cases, unit_peak=unit_peak, k=k) -> list[float]:
            eff, bw = np.exp(x)
            out = []
            for c in cases:
                hz = NOMINAL_MHZ * 1e6
                t = max(c["flops"] / (unit_peak * hz * eff), c["bytes"] / (bw_peak * bw)) + k / hz
                out.append(float(np.log(t / c["seconds"])))
            return out

        sol = least_squares(residuals, np.log([0.5, 0.5]), bounds=(np.log([0.01, 0.05]), np.log([1.0, 1.0])))
        res = np.array(residuals(sol.x))
        eff, bw = (float(v) for v in np.exp(sol.x))
        fits[(name, precision)] = {
            "eff": round(eff, 4),
            "bw": round(bw, 4),
            "cases": len(cases),
            "rms_log_err": round(float(np.sqrt(np.mean(res**2))), 3),
        }
    classes: dict[str, dict] = {}
    for name, k in floor_cycles.items():
        per = {p: f for (n, p), f in fits.items() if n == name}
        half = per.get("fp16") or per.get("bf16") or next(iter(per.values()))
        full = per.get("fp32", half)
        eff = {
            "fp16": half["eff"],
            "bf16": per.get("bf16", half)["eff"],
            "fp32": full["eff"],
            "int8": half["eff"],
        }
        if name in ("elementwise", "normalisation", "layout_copy", "broadcast"):
            eff = dict.fromkeys(eff, 1.0)
        if name == "attention" and "fp32" not in per:
            eff["fp32"] = fits[("gemm", "fp32")]["eff"]
        bws = [f["bw"] for f in per.values()]
        classes[name] = {
            "compute_eff": eff,
            "bw_eff": round(statistics.median(bws), 4),
            "kernel_min_cycles": round(k, 1),
            "fit": {p: f for p, f in per.items()},
        }
    return classes


def launch_table(launch: dict) -> tuple[dict[str, float], float]:
    """Host microseconds per eager layer by operator type (median over every zoo layer of that type), and
    the per-layer cost of the Python containers around them (forward minus the layers' sum, per layer)."""
    by_op: dict[str, list[float]] = {}
    overhead = []
    for model in launch["models"].values():
        layers = model["layers"]
        for op, seconds in layers:
            by_op.setdefault(op, []).append(seconds * 1e6)
        overhead.append((model["forward_host_s"] - sum(s for _, s in layers)) * 1e6 / len(layers))
    table = {op: round(statistics.median(v), 2) for op, v in sorted(by_op.items())}
    table["default"] = round(statistics.median([v for vs in by_op.values() for v in vs]), 2)
    return table, round(statistics.median(overhead), 2)


def params_with(params: TwinParams, values: dict[str, float]) -> TwinParams:
    """A copy of ``params`` with dotted-path values replaced (used by the fit)."""
    data = params.model_dump()
    for path, value in values.items():
        node = data
        parts = path.split(".")
        for part in parts[:-1]:
            node = node[part]
        node[parts[-1]] = value
    return TwinParams.model_validate(data)
