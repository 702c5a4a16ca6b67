"""What one configuration switch costs a serving device: how long queries wait, and what the board draws.

The governor switches bands by applying a configuration the way ``tune apply``
does (tuner/devices/jetson/device.py on a Jetson, NVML calls on a GPU card).
The steps, and the time each is taken to cost here:

- ``nvpmodel -m`` (a Jetson mode change): ``mode_s`` = 1 s. An assumption: no
  published latency was found. nvpmodel is a user-space program that rewrites
  some forty sysfs files (cores online, CPU/GPU/EMC caps, the TPC power-gating
  mask, with the GPU's runtime power control forced on around the mask; see the
  nvpmodel conf that NVIDIA's MLPerf v3.0 Orin code writes,
  closed/*/code/common/nvpmodel_orin.py in mlcommons/inference_results_v3.0),
  and the tuner then polls ``nvpmodel -q`` every 0.1 s until the mode reads
  back. benchmarks/results/governor.md reports the replay with this figure
  scaled by 0.25 and by 4.
- A CPU core put online or offline: ``core_s`` = 20 ms per core. Linux CPU
  hotplug "takes tens of milliseconds to reconfigure the OS" and stops the
  whole machine for a few milliseconds (Panneerselvam and Swift, "Bolt: Faster
  Reconfiguration in Operating Systems", USENIX ATC 2015).
- New CPU clock limits: ``cpufreq_s`` = 3 ms for the three clusters; the
  Tegra186/194 cpufreq drivers declare a 300 us transition latency
  (drivers/cpufreq/tegra186-cpufreq.c, ``cpuinfo.transition_latency``), plus a
  sysfs write and a BPMP request per cluster.
- New GPU clock limits (devfreq min/max): ``devfreq_s`` = 2 ms; the EMC rate
  (a BPMP request and a DRAM frequency change): ``emc_s`` = 5 ms. Assumptions
  of the same order as the CPU's.
- On a GPU card, each NVML setting that changes (locked SM or memory clocks,
  the power limit): ``nvml_s`` = 10 ms, an assumption.
- A runner knob (precision, CUDA graphs, memory layout): ``runner_s`` = 50 ms
  to switch the serving process to another runner, assuming every band's runner
  was loaded and warmed when serving started (building one costs seconds).
- Batch size and batching timeout only: nothing (the serving process reads
  them with the band).

While a switch runs no batch starts (a batch already running completes), so
the queries that arrive wait for it, and the board draws the higher of the two
configurations' idle power plus ``work_w`` for the CPU doing the switch (1 W on
a Jetson, an assumption; nothing on a card, whose meter does not see the host).
``scale`` multiplies every time, for the sensitivity check.
"""

from __future__ import annotations

from dataclasses import dataclass

from tuner.roofline import knob_roles
from tuner.space import Config, SearchSpace


@dataclass(frozen=True)
class SwitchCosts:
    """Seconds per step of a switch and the extra power while it runs; see the module docstring."""

    mode_s: float = 1.0
    core_s: float = 0.020
    cpufreq_s: float = 0.003
    devfreq_s: float = 0.002
    emc_s: float = 0.005
    nvml_s: float = 0.010
    runner_s: float = 0.050
    work_w: float = 1.0
    scale: float = 1.0

    @classmethod
    def free(cls) -> SwitchCosts:
        """Switches that cost nothing (the replay as it was before switch costs were modelled)."""
        return cls(scale=0.0, work_w=0.0)


def switch_seconds(space: SearchSpace, costs: SwitchCosts, a: Config, b: Config) -> float:
    """How long applying ``b`` over ``a`` keeps the device from serving.

    A Jetson space (one with a mode knob) pays sysfs and nvpmodel steps, any
    other device NVML calls; runner knobs pay a runner switch on either.
    """
    roles = knob_roles(space)
    ea, eb = space.effective(a).knobs, space.effective(b).knobs
    changed = {name for name in space.knobs if ea.get(name) != eb.get(name)}
    jetson = space.mode_knob is not None
    seconds = 0.0
    if jetson and space.mode_knob in changed:
        seconds += costs.mode_s
    cores = roles.get("cpu_cores")
    if cores in changed and cores is not None:
        seconds += costs.core_s * abs(float(ea[cores]) - float(eb[cores]))
    for role, jetson_s in (("cpu_mhz", costs.cpufreq_s), ("gpu_mhz", costs.devfreq_s), ("mem_mhz", costs.emc_s)):
        if roles.get(role) in changed:
            seconds += jetson_s if jetson else costs.nvml_s
    if not jetson and roles.get("power_limit_w") in changed:
        seconds += costs.nvml_s
    if any(space.knobs[name].group == "runner" for name in changed):
        seconds += costs.runner_s
    return seconds * costs.scale


def switch_power_w(costs: SwitchCosts, idle_a_w: float, idle_b_w: float, jetson: bool) -> float:
    """The board's power while a switch runs: the higher idle floor, plus the switching CPU on a Jetson."""
    extra = costs.work_w if jetson and costs.scale > 0 else 0.0
    return max(idle_a_w, idle_b_w) + extra
