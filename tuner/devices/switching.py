"""What one configuration switch costs a device: how long it takes, and what the board draws meanwhile.

A switch is costed step by step as ``tune apply`` performs it: an nvpmodel
mode change (``mode_s``), CPU cores put on or offline (``core_s`` each), new
CPU, GPU and EMC clock limits, NVML settings on a card, and a change of
runner. While it runs no batch starts, and the board draws the higher idle
power of the two configurations plus ``work_w``. ``scale`` multiplies every
time, for the sensitivity check. Each figure's source or assumption is in
docs/serving.md. The governor's replay pays these pauses; a study's twin
reports them as each trial's switch time (what a board's would cost).
"""

from __future__ import annotations

from dataclasses import dataclass

from tuner.space import Config, SearchSpace, knob_roles


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
