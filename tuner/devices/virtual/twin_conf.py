"""A Jetson twin's model of the board's /etc/nvpmodel.conf, so a twin's study exports its custom nvpmodel mode.

The conf is written in NVIDIA's grammar (tuner.devices.jetson.nvpconf) from
the twin's space, whose modes are those of NVIDIA's conf: the AGX Orin's
MAXN, MODE_15W, MODE_30W and MODE_50W of nvpmodel_p3701_0000.conf (their
core counts and clock caps, search_spaces/orin-agx.yaml; the copy NVIDIA
ships in github.com/LineageOS/android_device_nvidia_concord nvpmodel/), the
Orin Nano's 15W and 7W of the Jetson Linux guide. It names the PARAMs those
confs name (CPU_ONLINE CORE_n, TPC_POWER_GATING, GPU_POWER_CONTROL_ENABLE and
_DISABLE, one CPU_A78_n clock per cluster of four cores, GPU, EMC,
DLA0/1_CORE), writes a cap at the table's top as -1 (no cap; EMC as 0, as
MAXN's line does) and the TPC power-gating mask as the TPCs a mode gates
(of 8 on AGX Orin: 15W gates 5, mask 248; 30W gates 4, mask 240). Its paths
are placeholders: a mode block holds names and values only, and is checked
against the real board's conf when exported there.

The tuned mode is built and read back by the same code as on a board
(tuned_mode, with_mode, check_mode), so what a twin's export shows is what the
board's export would add, save for the board's own tables.
"""

from __future__ import annotations

from typing import Any

from tuner.devices.jetson.nvpconf import check_mode, fresh_id, read_conf, render_mode, tuned_mode, with_mode
from tuner.space import Config, SearchSpace

CLUSTER = 4
TPCS_MAX = 8


def _top(space: SearchSpace, knob: str) -> float | None:
    return max(float(v) for v in space.knobs[knob].values) if knob in space.knobs else None


def _cap(value: Any, top: float | None, scale: float, none: int = -1) -> int:
    """A mode's cap as the conf writes it: the table's top as no cap, else the value in the conf's unit."""
    if value is None or (top is not None and float(value) >= top):
        return none
    return round(float(value) * scale)


def conf_text(space: SearchSpace) -> str:
    """The twin's nvpmodel.conf: PARAM sections, one POWER_MODEL per mode of the space, then PM_CONFIG."""
    cores = int(_top(space, "cpu_cores") or CLUSTER)
    clusters = [list(range(i, min(i + CLUSTER, cores))) for i in range(0, cores, CLUSTER)]
    dla = "dla_mhz" in space.knobs
    out = ["# a digital twin's model of NVIDIA's nvpmodel.conf (paths are placeholders)", ""]
    out += ["< PARAM TYPE=FILE NAME=CPU_ONLINE >", *(f"CORE_{c} /cpu{c}/online" for c in range(cores)), ""]
    out += ["< PARAM TYPE=FILE NAME=TPC_POWER_GATING >", "TPC_PG_MASK /gpu/tpc_pg_mask", ""]
    out += ["< PARAM TYPE=FILE NAME=GPU_POWER_CONTROL_ENABLE >", "GPU_PWR_CNTL_EN /gpu/power/control", ""]
    out += ["< PARAM TYPE=FILE NAME=GPU_POWER_CONTROL_DISABLE >", "GPU_PWR_CNTL_DIS /gpu/power/control", ""]
    for index, cluster in enumerate(clusters):
        path = f"/cpu{cluster[0]}/cpufreq"
        out += [f"< PARAM TYPE=CLOCK NAME=CPU_A78_{index} >"]
        out += [f"FREQ_TABLE {path}/scaling_available_frequencies", f"MAX_FREQ {path}/scaling_max_freq"]
        out += [f"MIN_FREQ {path}/scaling_min_freq", ""]
    out += ["< PARAM TYPE=CLOCK NAME=GPU >", "FREQ_TABLE /gpu/available_frequencies"]
    out += ["MAX_FREQ /gpu/max_freq", "MIN_FREQ /gpu/min_freq", ""]
    out += ["< PARAM TYPE=CLOCK NAME=EMC >", "MAX_FREQ /emc/max_rate", ""]
    for core in range(2 if dla else 0):
        out += [f"< PARAM TYPE=CLOCK NAME=DLA{core}_CORE >", f"MAX_FREQ /nvdla{core}/clk_cap", ""]
    cpu_low = round(min(float(v) for v in space.knobs["cpu_mhz"].values) * 1000) if "cpu_mhz" in space.knobs else 0
    for label, mode in sorted(space.modes.items(), key=lambda item: item[1].id):
        caps = mode.caps
        online = int(caps.get("cpu_cores", cores))
        tpcs = int(mode.properties.get("tpcs", TPCS_MAX))
        name = label if label == "MAXN" else f"MODE_{label}"
        out.append(f"< POWER_MODEL ID={mode.id} NAME={name} >")
        out += [f"CPU_ONLINE CORE_{c} {1 if c < online else 0}" for c in range(cores)]
        out += [f"TPC_POWER_GATING TPC_PG_MASK {(2**TPCS_MAX - 1) ^ (2**tpcs - 1)}"]
        out += ["GPU_POWER_CONTROL_ENABLE GPU_PWR_CNTL_EN on"]
        cpu = _cap(caps.get("cpu_mhz"), _top(space, "cpu_mhz"), 1e3)
        for index, cluster in enumerate(clusters):
            if cluster[0] < online:
                out += [f"CPU_A78_{index} MIN_FREQ {cpu_low}", f"CPU_A78_{index} MAX_FREQ {cpu}"]
        out += ["GPU MIN_FREQ 0", f"GPU MAX_FREQ {_cap(caps.get('gpu_mhz'), _top(space, 'gpu_mhz'), 1e6)}"]
        out += ["GPU_POWER_CONTROL_DISABLE GPU_PWR_CNTL_DIS auto"]
        out += [f"EMC MAX_FREQ {_cap(caps.get('emc_mhz'), _top(space, 'emc_mhz'), 1e6, none=0)}"]
        if dla:
            cap = _cap(caps.get("dla_mhz"), _top(space, "dla_mhz"), 1e6)
            out += [f"DLA{core}_CORE MAX_FREQ {cap}" for core in range(2)]
        out.append("")
    default = space.modes[str(space.knobs[space.mode_knob].default)].id if space.mode_knob else 0
    out += [f"< PM_CONFIG DEFAULT={default} >"]
    return "\n".join(out) + "\n"


def targets(space: SearchSpace, config: Config) -> dict[str, int]:
    """What a configuration asks of the modelled board after the mode's caps: mode id, cores, kHz, Hz."""
    mode = space.mode_of(config)
    assert mode is not None
    eff = space.effective(config).knobs
    out: dict[str, int] = {"mode": mode.id}
    if "cpu_cores" in eff:
        out["cores"] = int(eff["cpu_cores"])
    for knob, key, scale in (("cpu_mhz", "cpu_khz", 1e3), ("gpu_mhz", "gpu_hz", 1e6), ("emc_mhz", "emc_hz", 1e6)):
        if knob in eff:
            out[key] = round(float(eff[knob]) * scale)
    if "dla_mhz" in eff:
        out["dla_hz"] = round(float(eff["dla_mhz"]) * 1e6)
    return out


def custom_mode_block(space: SearchSpace, config: Config, name: str) -> str:
    """The tuned configuration as a POWER_MODEL of the twin's conf, built on its mode and read back."""
    text = conf_text(space)
    conf = read_conf(text)
    t = targets(space, config)
    mode = tuned_mode(conf, t["mode"], t, fresh_id(conf), name)
    tables: dict[str, list[int]] = {}
    for knob, param, scale in (("gpu_mhz", "GPU", 1e6), ("emc_mhz", "EMC", 1e6)):
        if knob in space.knobs:
            tables[param] = [round(float(v) * scale) for v in space.knobs[knob].values]
    return render_mode(check_mode(with_mode(text, mode, default=True), mode, tables))
