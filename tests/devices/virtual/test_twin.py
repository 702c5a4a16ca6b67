import itertools
import json

import numpy as np
import pytest
from orin_mode_rails import RUN_GAP_S, own_run, parse, summary
from twin_calibration import (
    CALIBRATION_DIR,
    SOURCE_LIMITED_ROWS,
    fit_op_classes,
    load_rows,
    sweep_rows,
    twin_errors,
)
from twin_checks import (
    GEMM_FP32_MS,
    MAXP_GPU_ONLY_QPS,
    clock_curve,
    gemm_fp32_ms,
    maxp_gpu_only_qps,
    maxq_saving,
    mode_defaults,
    mode_ordering,
)
from twin_depth_anything import depth_anything_v2_base
from twin_dla_power import power_points
from twin_rails import (
    MODULE_LIMIT_W,
    PODGOV,
    SENSOR_STEP_W,
    check_rows,
    cpu_rows,
    resnet152,
    saturated_rows,
    stress_rows,
    sys_rows,
)

from runners.profile import load_profile
from tuner.devices.virtual.twin import TwinDevice
from tuner.devices.virtual.twin_dla import load_dla_params
from tuner.devices.virtual.twin_schema import load_params
from tuner.errors import UserError
from tuner.measure.settings import WindowSettings
from tuner.space import Config

EXACT = WindowSettings(noise=False)
# Launch-bound H200 reference rows no single launch-bound figure can meet (scripts/twin_calibration.py): held to the
# source's own limit, sqrt(slowest / fastest) - 1 = 19.9%, plus 1% (docs/twin.md).
KNOWN_MISSES = SOURCE_LIMITED_ROWS
# MLPerf's wall rows (MaxQ SingleStream power, the idle floor) against the devkit's measured rails: the Orin twin's
# idle, static and load-time SoC rails come from the scales-hardware devkit's own idle and loaded samples
# (scripts/twin_rails.py), whose sums through the stated carrier and supply assumption are above MLPerf's devkit at
# the wall (idle +21%, MaxQ SingleStream +34%: the two devkits disagree by about the load-time SoC draw, docs/twin.md
# 'Power modes at their default clocks'); held to 35% instead of 15%, and at half weight in the fit.
MLPERF_WALL_BOUND = 0.35


def test_twin_reproduces_every_calibration_row_within_15_percent():
    errors = twin_errors(load_rows())
    assert len(errors) == 18  # 5 Pagoda Orin rows, 10 H200 reference rows, 3 MLPerf rows
    times = {e["row"]: e["time_ms"] for e in errors if e["source"].startswith("h200")}
    spread = (max(times[r] for r in KNOWN_MISSES) / min(times[r] for r in KNOWN_MISSES)) ** 0.5 - 1
    for e in errors:
        bound = spread + 0.01 if e["row"] in KNOWN_MISSES and e["source"].startswith("h200") else 0.15
        for key in ("time_err", "power_err"):
            if key == "power_err" and e["source"].startswith("orin_mlperf") and e["power_kind"] == "wall":
                assert e[key] is None or abs(e[key]) <= MLPERF_WALL_BOUND, e
                continue
            if e[key] is not None:
                assert abs(e[key]) <= bound, e


def test_h200_zoo_sweep_energy_per_query():
    """Five zoo models at batch 8, 64, 256 on the lent H200 (call 8): every row within 15% in energy per query,
    the batch 64 and 256 rows held out of the fit (only the launch-bound batch-8 rows fix that host's speed)."""
    errors = twin_errors(sweep_rows())
    assert len(errors) == 15
    assert sum(not e["fitted"] for e in errors) == 10
    for e in errors:
        assert abs(e["energy_err"]) <= 0.15, e


def test_profiles_count_eager_attentions_layout_copies_from_batch_2():
    """The call-7 kernel profile found 4 copies per BERT layer (transposed heads made contiguous) above batch 1."""
    profile = load_profile("bert-base")
    copies = [layer for layer in profile.layers if layer.op_class == "layout_copy"]
    assert len(copies) == 4 * 12 and all(layer.min_batch == 2 for layer in copies)
    h200 = TwinDevice("sim:h200")
    configs = [h200.space().default_config(b) for b in (1, 8)]
    op = h200.model.operating(configs)
    gpu = h200.model.layer_times(profile, op, op.gpu_mhz)["gpu"]
    index = [i for i, layer in enumerate(h200.model.layers(profile)) if layer.op_class == "layout_copy"]
    assert gpu[0, index].sum() == 0 and gpu[1, index].min() > 0


def test_op_classes_are_the_microbenchmark_fit_not_whole_model_rows():
    micro = json.loads((CALIBRATION_DIR / "h200-opclass-microbench.json").read_text())
    floors = json.loads((CALIBRATION_DIR / "h200-launch-microbench.json").read_text())["graph_kernel_s"]
    h200 = load_params("h200")
    fresh = fit_op_classes(micro, floors, h200.peak_per_cycle_per_tpc, 66, 4.8e12)
    for kind in ("h200", "orin-agx"):
        classes = load_params(kind).op_classes
        assert set(classes) == set(fresh)
        for name, params in classes.items():
            assert params.compute_eff == fresh[name]["compute_eff"]
            assert params.bw_eff == fresh[name]["bw_eff"]
            assert params.kernel_min_cycles == fresh[name]["kernel_min_cycles"]


@pytest.mark.parametrize("twin", ["sim:orin", "sim:orin-trt"])
@pytest.mark.parametrize("model", ["resnet50", "bert-base"])
def test_a_mode_tuned_for_the_model_beats_maxn_at_its_defaults_at_the_wall(twin, model):
    """The evidence (MaxQ-style tuned clocks): a mode tuned for the model uses less energy per query at the wall
    than MAXN at its default clocks; on both twins and both models 50W's cheapest configuration does. 30W and 15W
    are not held to it: with the module's measured static and load-time rails (scripts/twin_rails.py) their longer
    runs pay more static power, and the devkit's saturated eager transformer costs 1.11x (30W) and 1.62x (15W) of
    MAXN at their defaults (Depth Anything rows, docs/twin.md); eager bert-base's best 30W costs about MAXN's."""
    for batch, ratios in mode_ordering(model, (64,), twin).items():
        assert ratios["50W"] < 1.0, (batch, ratios)


def test_orin_tensor_core_peaks_meet_held_out_orin_figures():
    """NVIDIA's technical brief peaks (170 sparse INT8 TOPS): sim:orin-trt's resnet50 on the GPU alone at MaxP
    within 10% of MLPerf's MaxP less the DLAs' published share (it was -40% at half these peaks), and a large
    fp32 GEMM within 10% of the 516 ms measured on an AGX Orin (cupy issue 8151)."""
    assert maxp_gpu_only_qps() == pytest.approx(MAXP_GPU_ONLY_QPS, rel=0.10)
    assert gemm_fp32_ms() == pytest.approx(GEMM_FP32_MS, rel=0.10)
    peaks = load_params("orin-agx").peak_per_cycle_per_tpc
    assert peaks["tensor_int8"] * 8 * 1300.5e6 * 2 == pytest.approx(170e12, rel=0.02)  # the brief's sparse TOPS


def test_dla_watts_are_derived_through_the_current_gpu_power_model():
    """twin_params/orin-agx-dla.json's watts follow from NVIDIA's DLA/GPU perf/W ratios and today's GPU twin."""
    points, _ = power_points()
    assert [tuple(p) for p in load_dla_params("orin-agx").power_w_per_dla] == points


def test_mlperf_maxq_settings_save_energy_at_the_wall():
    """MaxQ's caps against MAXN (GPU only): at least a fifth saved at the wall (23% now; 46% before the module's
    static and load-time rails were sourced: static power is paid over MaxQ's longer run), MLPerf's throughput
    ratio, and MaxQ's wall power within 20% of MLPerf's 22.66 W (which adds two DLAs)."""
    q = maxq_saving(64)
    assert q["saving"] >= 0.20, q
    assert 0.4 < q["throughput_ratio"] < 0.65  # MLPerf kept 54% of the throughput
    assert q["maxq_wall_w"] == pytest.approx(22.66, rel=0.20)


def test_batch1_energy_against_gpu_clock_has_an_interior_minimum():
    """PolyThrottle-style sweeps: at batch 1 the lowest clock is not the cheapest once kernel floors (GPU
    cycles) make the GPU the bottleneck. Holds for efficientnet_b0 and resnet50 under the TensorRT runtime; eager
    models stay launch-bound at batch 1 and flatten below the V(f) knee (docs/twin.md)."""
    for twin, model in (("sim:orin-trt", "efficientnet_b0"), ("sim:orin-trt", "resnet50")):
        curve = clock_curve(model, 1, twin)
        best = min(range(len(curve)), key=lambda i: curve[i][1])
        assert 0 < best < len(curve) - 1, (twin, model, curve)


def test_orin_rails_meet_the_held_out_rows_of_the_devkit_and_the_forum():
    """scripts/twin_rails.py: every held-out VIN_SYS_5V0 row (busy and idle, three workloads) within 5% through the
    twin's relation to VDDQ; the twin's own ResNet-152 runs at each mode's defaults (the governed GPU clock) within
    12% in throughput, within 10% on VDDQ, VIN_SYS_5V0 and VDD_GPU_SOC and within 15% on the module sum on the
    held-out modes, within 15% on VDD_CPU_CV (+29% at 50W when every online core leaked at the cap's voltage);
    the forum's held-out CPU and GPU stress rows within 15%."""
    params = load_params("orin-agx").model_dump()
    held = [r for r in sys_rows(params) if not r["fitted"]]
    assert len(held) >= 15 and all(abs(r["error"]) <= 0.05 for r in held), held
    for r in check_rows(params):
        assert r["twin_fps"] == pytest.approx(r["fps"], rel=0.12), r
        for rail in ("VDDQ_VDD2_1V8AO", "VIN_SYS_5V0", "VDD_GPU_SOC"):
            if not r["fitted"][rail]:
                assert r["twin_rails"][rail] == pytest.approx(r["rails"][rail], rel=0.10), (rail, r)
        if not r["fitted"]["VDD_CPU_CV"]:
            assert r["twin_rails"]["VDD_CPU_CV"] == pytest.approx(r["rails"]["VDD_CPU_CV"], rel=0.15), r
        if r["mode"] != "MAXN":
            assert r["twin_sum"] == pytest.approx(r["sum"], rel=0.15), r
    for r in stress_rows(params):
        if r["mode"] in ("50W", "30W"):
            assert r["twin_cpu"] == pytest.approx(r["cpu"], rel=0.15), r
            assert r["twin_gpu"] == pytest.approx(r["gpu"], rel=0.15), r


def test_held_out_mode_ratios_of_the_devkit_within_15_percent():
    """The devkit's ResNet-152 runs at each mode's defaults: every lower mode's module power and energy per image
    over MAXN's within 15% of the measured ratios (-23% to -46% when the twin held each mode at its cap)."""
    rows = check_rows(load_params("orin-agx").model_dump())
    for r in rows[1:]:
        assert r["twin_power_ratio"] == pytest.approx(r["power_ratio"], rel=0.15), r
        assert r["twin_energy_ratio"] == pytest.approx(r["energy_ratio"], rel=0.15), r


def test_the_governor_is_nvhost_podgov_with_its_kernel_defaults():
    """The Orin twins' GPU governor parameters are nvhost_pod_init's defaults (load_target 700 and load_max 900 per
    mille, bias 80%, smooth 10, damp 7: scripts/twin_rails.py cites the L4T kernel), with their source."""
    for kind in ("orin-agx", "orin-nano"):
        params = load_params(kind)
        assert params.gpu_governor is not None and params.gpu_governor.model_dump() == PODGOV
        assert "governor_pod_scaling.c" in params.sources["gpu_governor"]


def test_the_governor_drops_a_light_load_to_the_floor_and_holds_a_saturated_one_at_the_cap():
    """At a mode's defaults the GPU clock follows the load: eager ResNet-152 at batch 1 (the devkit's run, its
    GPU 50-69% busy in the logs) runs at the 306 MHz floor in every mode, as the source's authors saw MAXN at its
    minimum clock; TensorRT at batch 64 holds each mode's cap; a middling load settles between them with the GPU
    near the 70% target. Without the governor the devkit's MAXN module sum would be over 1.3x the measured one."""
    orin, trt = TwinDevice("sim:orin"), TwinDevice("sim:orin-trt")
    for r in check_rows(load_params("orin-agx").model_dump()):
        assert r["twin_gpu_mhz"] == 306.0 and r["twin_gr3d"] < PODGOV["load_target"], r
        if r["mode"] == "MAXN":
            assert r["twin_sum_pinned"] > 1.3 * r["sum"] and r["twin_sum"] == pytest.approx(r["sum"], rel=0.05), r
    modes = ("MAXN", "50W", "30W", "15W")
    configs = [_mode_default(trt, mode, 64) for mode in modes]
    saturated = trt.model.evaluate(load_profile("resnet50"), configs, governed=True)
    assert list(saturated.gpu_mhz) == [float(c.knobs["gpu_mhz"]) for c in configs]
    config = _mode_default(orin, "MAXN", 4)
    profile = load_profile("resnet50")
    middle = orin.model.evaluate(profile, [config], governed=True)
    assert 306.0 < float(middle.gpu_mhz[0]) < 1300.5
    op = orin.model.operating([config])
    busy = float(orin.model.activity(profile, op, middle.gpu_mhz)[1][0])
    assert 0.6 <= busy <= 0.8, busy
    resnet = orin.model.evaluate(resnet152(), [_mode_default(orin, "MAXN", 1)], governed=True)
    assert float(resnet.gpu_mhz[0]) == 306.0


def test_the_devkit_depth_anything_runs_replayed_on_the_twin():
    """Depth Anything V2 base on the devkit (GPU 87-97% busy: each mode's cap), replayed on sim:orin as the source
    ran it (batch 1, eager fp32, 518 x 518; no fit uses these rows' GPU or CPU rail or throughput): every mode's
    module sum and VDD_GPU_SOC within 15%, VDD_CPU_CV within one step of the sensor (1.0 W over at MAXN when idle
    online cores leaked at the cap's voltage), its time ratios within 12%. The energy ratios are 12-19% low (twin
    0.74, 0.90, 1.33 against 0.84, 1.11, 1.62): 50W costs less than MAXN on the devkit too, 15W more on both
    (docs/twin.md)."""
    rows = saturated_rows(load_params("orin-agx").model_dump())
    for r in rows:
        assert r["gr3d"] > 0.85 and r["twin_mhz"] == {"MAXN": 1300.5, "50W": 816, "30W": 612, "15W": 408}[r["mode"]]
        assert r["twin_sum"] == pytest.approx(r["sum"], rel=0.15), r
        assert r["twin_rails"]["VDD_GPU_SOC"] == pytest.approx(r["rails"]["VDD_GPU_SOC"], rel=0.15), r
        assert abs(r["twin_rails"]["VDD_CPU_CV"] - r["rails"]["VDD_CPU_CV"]) < SENSOR_STEP_W, r
        assert r["twin_time_ratio"] == pytest.approx(r["time_ratio"], rel=0.12), r
        assert r["twin_energy_ratio"] == pytest.approx(r["energy_ratio"], rel=0.20), r
    assert rows[1]["energy_ratio"] < 1.0 < rows[2]["energy_ratio"] < rows[3]["energy_ratio"]
    assert rows[1]["twin_energy_ratio"] < 1.0 < rows[3]["twin_energy_ratio"]


def test_the_depth_anything_layer_table_matches_the_model_card():
    """DINOv2 ViT-B/14 + DPT head at 518 x 518: 97.5 M parameters on the model card; a ViT-B encoder pass over
    1370 tokens is about 300 GFLOP (2 x MACs)."""
    profile = depth_anything_v2_base()
    assert profile.weight_bytes / 4 == pytest.approx(97.5e6, rel=0.01)
    encoder = sum(layer.flops for layer in profile.layers if layer.name.startswith("layers."))
    assert encoder == pytest.approx(12 * (24 * 1370 * 768**2 + 4 * 1370**2 * 768), rel=0.01)


def test_idle_online_cores_cost_what_the_devkit_idle_rail_shows():
    """After every ResNet-152 run the devkit's CPU rail reads below one sensor step (0.397 W) with 4, 8 or 12 cores
    online, and so does the twin's idle CPU rail in every mode at its caps (MAXN drew 1.34 W of leakage on 12 idle
    cores before the leakage came from the idle rows)."""
    rows = [r for r in cpu_rows(load_params("orin-agx").model_dump()) if r["run"].startswith("resnet152 ")]
    assert all(r["measured"] < SENSOR_STEP_W for r in rows if r["run"].endswith("idle"))
    orin = TwinDevice("sim:orin")
    for mode in ("MAXN", "50W", "30W", "15W"):
        idle = orin.model.idle([_mode_default(orin, mode, 1)])
        assert float(idle.rails_w["VDD_CPU_CV"][0]) < SENSOR_STEP_W, mode


def test_the_idle_rows_that_fix_the_soc_floor_are_whole_sensor_steps():
    """The devkit's VDD_GPU_SOC idle medians after the ResNet-152 runs are 5, 5 and 4 steps of 0.397 W at MAXN (8
    TPCs), 30W (4) and 15W (3): the sensor resolves no TPC dependence at idle, and the twin's fitted idle rows
    (without the clock tree in the closed form) stay within 1.5 steps of them (docs/twin.md)."""
    data = json.loads((CALIBRATION_DIR / "orin-mode-rails.json").read_text())
    idle = {r["mode"]: r["idle"]["VDD_GPU_SOC"]["median"] for r in data["runs"] if r["workload"] == "resnet152"}
    steps = {mode: idle[mode] / SENSOR_STEP_W for mode in ("MAXN", "30W", "15W")}
    assert steps == {
        "MAXN": pytest.approx(5, abs=0.02),
        "30W": pytest.approx(5, abs=0.02),
        "15W": pytest.approx(4, abs=0.02),
    }
    orin = TwinDevice("sim:orin")
    for mode in ("MAXN", "15W"):
        twin = orin.model.idle([_mode_default(orin, mode, 1)], 306.0, 204.0).rails_w["VDD_GPU_SOC"][0]
        assert abs(float(twin) - idle[mode]) < 1.5 * SENSOR_STEP_W, (mode, float(twin))


def test_the_orin_modes_are_nvpmodel_p3701_0000s_tpc_masks_and_caps():
    """NVIDIA's nvpmodel_p3701_0000.conf: TPC_PG_MASK 0, 0, 240, 248 (8, 8, 4, 3 of 8 TPCs on), GPU MAX_FREQ
    1300.5 (no cap), 816, 612, 408 MHz, EMC MAX_FREQ capped at 2133 MHz at 15W only. The twin's modes are these, so
    neither the TPC count nor the EMC cap explains its fast GPU at 30W and 15W under Depth Anything (docs/twin.md)."""
    masks = {"MAXN": 0, "50W": 0, "30W": 240, "15W": 248}
    gpu = {"MAXN": 1300.5, "50W": 816, "30W": 612, "15W": 408}
    emc = {"MAXN": 3199, "50W": 3199, "30W": 3199, "15W": 2133}
    modes = TwinDevice("sim:orin").space().modes
    for name, mask in masks.items():
        assert modes[name].properties["tpcs"] == 8 - bin(mask).count("1")
        assert modes[name].caps["gpu_mhz"] == gpu[name] and modes[name].caps["emc_mhz"] == emc[name]


def test_a_lone_busy_thread_costs_what_the_logs_per_core_loads_say():
    """tegrastats logs each core's load and clock: over every segment of the devkit's logs the CPU rail is 1.01 W per
    V^2 GHz of busy core (least squares, no fit uses it). The twin's launch thread (a busy core with a cluster to
    itself) costs within 15% of that (0.52 when a busy core cost the same alone or beside three others). The last
    assertion is the fit itself, not held-out evidence: the forum's MAXN stress row (cores sharing their clusters
    four to one) is one of the two rows the cluster term is fitted on; the held-out CPU rows are checked in
    test_orin_rails_meet_the_held_out_rows_of_the_devkit_and_the_forum."""
    params = load_params("orin-agx")
    per_activity = cpu_rows(params.model_dump())[0]["per_activity"]
    assert 0.8 <= per_activity <= 1.2
    lone = params.cpu_dyn_w_per_v2_ghz + params.cpu_cluster_w_per_v2_ghz
    shared = params.cpu_dyn_w_per_v2_ghz + params.cpu_cluster_w_per_v2_ghz / params.cpu_cluster_cores
    assert lone == pytest.approx(per_activity, rel=0.15)
    assert shared == pytest.approx(15.2 / (12 * 2.2016), rel=0.05)  # the forum's MAXN stress row, 1.0 V assumed


def test_a_log_is_cut_where_a_run_at_another_mode_starts():
    """depth_maxn.txt holds its MAXN run, then after an idle gap a 50W run (the CPU capped at 1497 MHz): the MAXN
    row takes the first run only; a later run at the same CPU cap and short GR3D blips stay."""

    def sample(gr3d: int, mhz: float) -> dict:
        return {"gr3d": gr3d, "cpu_mhz_max": mhz}

    maxn = [sample(90, 2201.0)] * 100
    idle = [sample(0, 729.0)] * (RUN_GAP_S + 5)
    other = [sample(90, 1497.0)] * RUN_GAP_S
    assert own_run(maxn + idle + other) == maxn + idle
    assert own_run(maxn + idle + maxn) == maxn + idle + maxn
    assert own_run(maxn + idle + other[:3]) == maxn + idle + other[:3]


def _mode_default(device: TwinDevice, mode: str, batch: int) -> Config:
    space = device.space()
    base = space.default_config(batch)
    return space.effective(base.model_copy(update={"knobs": {**base.knobs, "nvpmodel": mode}}))


def test_tegrastats_lines_parse_into_rails_load_and_cores():
    """scripts/orin_mode_rails.py reads the four INA3221 rails (instantaneous mW), GR3D load and per-core CPU
    load and clock of a tegrastats line; offline cores count as not online; a line without all rails is skipped."""
    line = (
        "10-25-2024 10:59:39 RAM 7901/30698MB (lfb 79x4MB) SWAP 0/15349MB (cached 0MB) CPU [4%@2201,99%@2201,"
        "12%@729,off] GR3D_FREQ 61% cpu@46.312C VDD_GPU_SOC 5961mW/5782mW VDD_CPU_CV 2386mW/2415mW "
        "VIN_SYS_5V0 4622mW/4551mW VDDQ_VDD2_1V8AO 1708mW/1664mW"
    )
    (sample,) = parse(line + "\n" + line.split(" VDDQ")[0])
    rails = {"VDD_GPU_SOC": 5.961, "VDD_CPU_CV": 2.386, "VIN_SYS_5V0": 4.622, "VDDQ_VDD2_1V8AO": 1.708}
    assert sample["rails"] == rails
    assert sample["gr3d"] == 61 and sample["cores_online"] == 3 and sample["cpu_mhz_max"] == 2201
    assert sample["busy_cores"] == pytest.approx(1.15) and sample["ram_total_mb"] == 30698
    other = {**sample, "core_loads": [(0.5, 729.0)], "busy_cores": 0.5}
    by_mhz = summary([sample, other])["busy_cores_by_mhz"]
    assert by_mhz == {"729": pytest.approx(0.31), "2201": pytest.approx(0.515)}
    assert sum(by_mhz.values()) == pytest.approx((1.15 + 0.5) / 2)


def test_the_module_throttles_at_its_power_limit_instead_of_drawing_more():
    """The 64GB module's data-sheet maximum (60 W) is the twin's limit; MAXN TensorRT resnet50 at batch 64 draws
    about 55 W under it on the module's rails (73 W before the rails were sourced). A load over a limit runs at a
    lower GPU clock, marked throttled (shown at 45 W); a mode under it is untouched."""
    trt = TwinDevice("sim:orin-trt")
    assert trt.model.params.fixed["power_limit_w"] == MODULE_LIMIT_W == 60.0
    space = trt.space()
    maxn = space.default_config(64)
    low = _mode_default(trt, "15W", 64)
    free = trt.measure("resnet50", maxn, EXACT)
    assert not free.throttled and 50.0 <= free.avg_w <= MODULE_LIMIT_W
    params = trt.model.params.model_copy(update={"fixed": {**trt.model.params.fixed, "power_limit_w": 45.0}})
    capped = TwinDevice("sim:orin-trt", params=params)
    over, under = (capped.measure("resnet50", c, EXACT) for c in (maxn, low))
    assert over.throttled and over.avg_w == pytest.approx(45.0, abs=0.1)
    assert over.extra["gpu_mhz_effective"] < 1300.5
    assert not under.throttled and under.extra["gpu_mhz_effective"] == 408


def test_15w_at_its_defaults_costs_more_than_maxns_energy_under_tensorrt():
    """sim:orin-trt resnet50 batch 64: with the module's sourced static and load-time rails, 15W at its default
    clocks costs more than MAXN's energy per query on the module's rails (1.42; 0.69 before the rails were
    sourced) and draws about 12 W (7.6 before)."""
    ratios = mode_defaults("resnet50", "sim:orin-trt", 64)
    assert 1.0 <= ratios["15W"] <= 1.6, ratios
    trt = TwinDevice("sim:orin-trt")
    assert 10.0 <= trt.measure("resnet50", _mode_default(trt, "15W", 64), EXACT).avg_w <= 14.0


def test_rails_sum_to_the_reading_and_wall_adds_carrier_and_psu_loss():
    orin = TwinDevice("sim:orin")
    m = orin.measure("resnet50", orin.space().default_config(8), EXACT)
    rails = {k.split(":", 1)[1]: v for k, v in m.extra.items() if k.startswith("rail_w:")}
    assert set(rails) == {"VDD_GPU_SOC", "VDD_CPU_CV", "VIN_SYS_5V0", "VDDQ_VDD2_1V8AO"}
    assert sum(rails.values()) == pytest.approx(m.avg_w, rel=1e-3)
    assert m.extra["wall_w"] > m.avg_w / 0.95 + 0.5


def test_static_power_falls_with_mode_voltage_cores_and_gated_tpcs():
    orin = TwinDevice("sim:orin")
    space = orin.space()
    idle = {}
    for mode in ("MAXN", "15W"):
        config = space.default_config(1)
        config = space.effective(config.model_copy(update={"knobs": {**config.knobs, "nvpmodel": mode}}))
        idle[mode] = float(orin.model.idle([config]).power_w[0])
    assert idle["15W"] < 0.6 * idle["MAXN"]


def test_kernel_floors_scale_with_gpu_clock():
    orin = TwinDevice("sim:orin")
    profile = load_profile("tiny-cnn")
    configs = [Config(knobs={**orin.space().default_config().knobs, "gpu_mhz": f}, batch_size=1) for f in (306, 1224)]
    op = orin.model.operating(configs)
    gpu = orin.model.layer_times(profile, op, op.gpu_mhz)["gpu"]
    assert 3.5 < gpu[0].sum() / gpu[1].sum() <= 1224 / 306  # nearly all kernel floor at batch 1: ~1/clock


def test_energy_per_query_falls_with_batch_size_until_the_gpu_saturates():
    for name in ("sim:orin", "sim:h200"):
        device = TwinDevice(name)
        space = device.space()
        energy = [device.measure("resnet50", space.default_config(b), EXACT).j_per_query for b in space.batch_sizes]
        assert all(a > b for a, b in itertools.pairwise(energy)), (name, energy)
        assert energy[0] / energy[2] > 1.5  # small batches waste energy on launch-bound idle power
        assert energy[-2] / energy[-1] < 1.05  # saturated: the last doubling gains little


def test_h200_power_limit_is_enforced_by_lowering_the_clock():
    h200 = TwinDevice("sim:h200")
    knobs = {"sm_mhz": 1980, "mem_mhz": 3201, "power_limit_w": 300, "precision": "fp16"}
    m = h200.measure("resnet50", Config(knobs=knobs, batch_size=512), EXACT)
    assert m.avg_w <= 300 + 1e-6
    assert m.throttled
    assert m.extra["gpu_mhz_effective"] < 1980
    free = h200.measure("resnet50", Config(knobs={**knobs, "power_limit_w": 700}, batch_size=512), EXACT)
    assert free.qps > m.qps and not free.throttled


def test_lower_clocks_are_slower_and_memory_clock_matters_for_memory_bound_models():
    orin = TwinDevice("sim:orin")
    base = orin.space().default_config(32)
    slow = base.model_copy(update={"knobs": {**base.knobs, "gpu_mhz": 624.75}})
    assert orin.measure("resnet50", slow, EXACT).qps < orin.measure("resnet50", base, EXACT).qps
    low_emc = base.model_copy(update={"knobs": {**base.knobs, "emc_mhz": 665.6}})
    ratio_mobilenet = orin.measure("mobilenet_v2", low_emc, EXACT).qps / orin.measure("mobilenet_v2", base, EXACT).qps
    ratio_bert = orin.measure("bert-base", low_emc, EXACT).qps / orin.measure("bert-base", base, EXACT).qps
    assert ratio_mobilenet < ratio_bert  # low arithmetic intensity suffers more from a slow EMC


def test_seeded_noise_is_reproducible_and_about_one_to_two_percent():
    orin = TwinDevice("sim:orin")
    config = orin.space().default_config(8)
    seeded = [orin.measure("resnet50", config, WindowSettings(seed=s)).j_per_query for s in range(200)]
    again = [orin.measure("resnet50", config, WindowSettings(seed=s)).j_per_query for s in range(200)]
    assert seeded == again
    cv = np.std(seeded) / np.mean(seeded)
    assert 0.005 < cv < 0.03


def test_every_twin_output_says_twin():
    m = TwinDevice("sim:h200").measure("bert-base", TwinDevice("sim:h200").space().default_config(8), EXACT)
    assert m.twin and m.meter == "twin"
    assert "twin" in TwinDevice("sim:orin").describe()["title"]


def test_vectorized_matches_single_evaluation():
    orin = TwinDevice("sim:orin")
    grid = orin.space().narrow(knobs=["gpu_mhz"], batch_sizes=[4]).grid()
    many = orin.measure_many("efficientnet_b0", grid, EXACT)
    for config, m in zip(grid[:5], many[:5], strict=False):
        assert orin.measure("efficientnet_b0", config, EXACT).j_per_query == pytest.approx(m.j_per_query)


def test_unknown_twin_and_model():
    with pytest.raises(UserError, match="sim:orin"):
        TwinDevice("sim:gameboy")
    with pytest.raises(UserError, match="resnet50"):
        load_profile("alexnet")


# -- the DLAs on sim:orin-trt ---------------------------------------------------------------

MAXQ_DLA = {
    "nvpmodel": "MAXN", "gpu_mhz": 612, "emc_mhz": 2133, "cpu_cores": 4, "cpu_mhz": 576.0, "precision": "int8",
    "dla_cores": 2, "dla_mhz": 883.2, "dla_batch_size": 8,
}  # fmt: skip
MAXP_DLA = {
    "nvpmodel": "MAXN", "gpu_mhz": 1300.5, "emc_mhz": 3199, "cpu_cores": 12, "cpu_mhz": 2201.6, "precision": "int8",
    "dla_cores": 2, "dla_mhz": 1600, "dla_batch_size": 2,
}  # fmt: skip


def _dla_measure(knobs: dict, model: str = "resnet50", batch: int = 64):
    from tuner.devices.virtual.twin import TwinDevice
    from tuner.measure.settings import WindowSettings
    from tuner.space import Config

    return TwinDevice("sim:orin-trt").measure(
        model, Config(knobs=knobs, batch_size=batch), WindowSettings(window_s=10, noise=False)
    )


def test_only_the_tensorrt_twin_of_a_board_with_dlas_offers_dla_knobs():
    from tuner.devices.virtual.twin import TwinDevice

    assert {"dla_cores", "dla_mhz", "dla_batch_size"} <= set(TwinDevice("sim:orin-trt").space().knobs)
    for eager in ("sim:orin", "sim:orin-nano", "sim:h200"):
        assert not {"dla_cores", "dla_mhz", "dla_batch_size"} & set(TwinDevice(eager).space().knobs)


def test_the_dla_fit_reproduces_nvidias_published_dla_throughput():
    """Deep-Learning-Accelerator-SW: 2x DLA ResNet-50 images/s per mode; 30W and 50W are held out of the fit."""
    from tuner.devices.virtual.twin_dla import dla_lanes, load_dla_params
    from tuner.space import Config, load_space

    params = load_dla_params("orin-agx")
    space = load_space("orin-agx", "tensorrt")
    published = {"MAXN": 2037, "50W": 1948, "30W": 1928, "15W": 1072}
    configs = [Config(knobs={**space.default_config().knobs, "nvpmodel": m, "dla_cores": 2}, batch_size=8)
               for m in published]  # fmt: skip
    lanes = dla_lanes(params, space, "resnet50", configs)
    for (mode, images), qps in zip(published.items(), lanes.qps, strict=True):
        assert qps == pytest.approx(images, rel=0.01 if mode in ("MAXN", "15W") else 0.02), mode


def test_a_dla_starved_of_memory_bandwidth_slows_down():
    fast, starved = _dla_measure({**MAXQ_DLA, "emc_mhz": 3199}), _dla_measure({**MAXQ_DLA, "emc_mhz": 204})
    assert starved.extra["engine_dla0_qps"] < 0.2 * fast.extra["engine_dla0_qps"]


def test_dla_lanes_add_their_throughput_and_their_power_on_the_cv_rail():
    with_dlas, gpu_only = _dla_measure(MAXQ_DLA), _dla_measure({**MAXQ_DLA, "dla_cores": 0})
    per_dla = 1 / ((569.5 / 883.2 + 0.6259 * 3199 / 2133) / 1e3)  # MaxQ: DLA 883.2 MHz, EMC 2133 MHz
    assert with_dlas.qps == pytest.approx(gpu_only.qps + 2 * per_dla, rel=1e-3)
    assert with_dlas.extra["engine_dla0_qps"] == pytest.approx(per_dla, rel=1e-6)
    cv = "rail_w:VDD_CPU_CV"
    clocks, watts = zip(*load_dla_params("orin-agx").power_w_per_dla, strict=True)
    assert with_dlas.extra[cv] - gpu_only.extra[cv] == pytest.approx(2 * np.interp(883.2, clocks, watts), 1e-3)
    assert with_dlas.j_per_query < gpu_only.j_per_query  # the DLAs are the cheaper engines
    bert, bert_gpu = _dla_measure(MAXQ_DLA, "bert-base"), _dla_measure({**MAXQ_DLA, "dla_cores": 0}, "bert-base")
    assert bert.qps == bert_gpu.qps  # no published DLA figure for BERT: NVIDIA runs it on the GPU alone


def test_maxq_vs_maxp_throughput_with_dlas_is_within_15pct_of_mlperf():
    """orin-mlperf.md v3.0 resnet50 Offline: MaxQ 3463 over MaxP 6438 samples/s, GPU plus both DLAs."""
    ratio = _dla_measure(MAXQ_DLA).qps / _dla_measure(MAXP_DLA).qps
    assert ratio == pytest.approx(3463 / 6438, rel=0.15)


def test_runtime_tensorrt_is_refused_on_an_eager_twin_and_taken_by_the_tensorrt_one():
    from tuner.models import check_model

    with pytest.raises(UserError, match="sim:orin-trt"):
        check_model("resnet50", "tensorrt", True, TwinDevice("sim:orin"))
    check_model("resnet50", "tensorrt", True, TwinDevice("sim:orin-trt"))
    check_model("resnet50", "auto", True, TwinDevice("sim:orin-trt"))  # the twin's own runtime, as before
