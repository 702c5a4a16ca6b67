"""tune replay counts what a switch costs: the time queries wait, the board's power meanwhile, the queue carried over.

Every figure here comes from seeded simulations on the twin: nothing depends on timing or machine load.
"""

import numpy as np
import pytest

from tuner.devices.switching import SwitchCosts, switch_seconds
from tuner.devices.virtual.queueing import ServingProfile, simulate
from tuner.devices.virtual.twin import TwinDevice
from tuner.serve.policy import Band, BandProvenance, Policy
from tuner.serve.replay import GovernorRules, Replayer, Step
from tuner.serve.trace import Trace
from tuner.space import Config

ORIN = TwinDevice("sim:orin")
MAXN = ORIN.space().default_config().knobs


def band(lo, hi, **knobs):
    return Band(
        min_qps=lo, max_qps=hi, knobs={**MAXN, **knobs}, batch_size=8, batch_timeout_ms=5.0,
        j_per_query=0.1, latency_ms=40.0, avg_w=10.0,
        provenance=BandProvenance(study="s", storage="x", trial=0, measured_by_plan=True),
    )  # fmt: skip


def policy(*bands):
    return Policy(
        model="resnet50", device="sim:orin", device_kind="orin-agx", twin=True, percentile="p99",
        max_latency_ms=50.0, bands=list(bands),
    )  # fmt: skip


def cost(device, a, b, costs=None):
    return switch_seconds(
        device.space(), costs or SwitchCosts(), Config(knobs=a, batch_size=8), Config(knobs=b, batch_size=8)
    )


def test_a_switch_costs_what_its_steps_cost():
    c = SwitchCosts()
    assert cost(ORIN, MAXN, MAXN) == 0.0
    # hot-plugging six cores, plus the CPU clock limits
    fewer = {**MAXN, "cpu_cores": 6, "cpu_mhz": 1651.2}
    assert cost(ORIN, MAXN, fewer) == pytest.approx(6 * c.core_s + c.cpufreq_s)
    assert cost(ORIN, MAXN, {**MAXN, "gpu_mhz": 612}) == pytest.approx(c.devfreq_s)
    # a mode change runs nvpmodel (and 30W also has fewer cores and lower caps)
    assert cost(ORIN, MAXN, {**MAXN, "nvpmodel": "30W"}) > c.mode_s
    assert cost(ORIN, MAXN, fewer, SwitchCosts(scale=4)) == pytest.approx(4 * cost(ORIN, MAXN, fewer))
    assert cost(ORIN, MAXN, fewer, SwitchCosts.free()) == 0.0
    h200 = TwinDevice("sim:h200")
    default = h200.space().default_config().knobs
    assert cost(h200, default, {**default, "precision": "bf16"}) == pytest.approx(c.runner_s)
    assert cost(h200, default, {**default, "sm_mhz": 345, "power_limit_w": 500}) == pytest.approx(2 * c.nvml_s)


def test_a_window_stopped_early_leaves_its_queue_to_the_next():
    serving = ServingProfile(
        service_s=np.array([np.inf, 0.010, 0.010]), busy_w=np.array([0.0, 30.0, 30.0]), idle_w=10.0
    )
    arrivals = np.arange(10) * 0.001  # ten queries in 10 ms, batches of two take 10 ms each
    first = simulate(arrivals, serving, 2, 0.0, 0.02, stop_s=0.02)
    # a batch of one at 0, of two at 10 ms; none starts at the 20 ms stop
    assert first.queries == 3 and first.free_at == pytest.approx(0.02)
    # the rest start after a 0.1 s pause; their latency runs from their own arrival
    rest = simulate(arrivals[first.queries :], serving, 2, 0.0, 0.2, free_at=first.free_at + 0.1)
    assert rest.queries == 7
    assert rest.latencies_s.min() == pytest.approx(0.12 + 0.010 - 0.004)
    assert rest.energy_j == pytest.approx(rest.busy_j + 10.0 * (0.2 - 0.12 - rest.busy_s))


def test_during_a_switch_queries_wait_and_the_board_draws_power():
    # two bands that differ in six cores online: the switch hot-plugs them
    p = policy(band(0, 60, cpu_cores=6), band(60, 400))
    replayer = Replayer(ORIN, p, seed=3)
    steps = [Step(start=float(t), seconds=1.0, rate=150.0, band=0 if t < 5 else 1, row=0) for t in range(30)]
    free = replayer.serve_run(steps, SwitchCosts.free())
    paid = replayer.serve_run(steps, SwitchCosts())
    slow = replayer.serve_run(steps, SwitchCosts(scale=10))  # a 1.2 s pause
    assert free[3] == 0.0 and paid[3] == pytest.approx(6 * SwitchCosts().core_s)
    assert slow[3] == pytest.approx(10 * paid[3])
    # the same arrivals in each run: every query is served, and the pause puts the ones behind it over the bound
    assert free[1] == paid[1] == slow[1]
    assert free[2] < paid[2] < slow[2]
    assert slow[2] - free[2] > 150 * (slow[3] - 0.05)
    # a band too slow for the rate (six cores at 150 q/s) leaves a queue that the next band inherits and drains
    assert free[2] > 0


def test_the_governor_replay_counts_its_switches_and_costs_more_with_slower_switches():
    p = policy(band(0, 60, cpu_cores=2, gpu_mhz=612), band(60, 400))
    trace = Trace(times=np.arange(0.0, 600.0, 60.0), rates=np.array([20.0, 200.0] * 5))
    rules = GovernorRules(min_dwell_s=5.0)
    results = {
        name: Replayer(ORIN, p, seed=0).governed(trace, 1.0, rules, costs)
        for name, costs in {"free": SwitchCosts.free(), "x1": SwitchCosts(), "x20": SwitchCosts(scale=20)}.items()
    }
    assert results["free"].switches == results["x20"].switches >= 9
    pause = 10 * SwitchCosts().core_s + SwitchCosts().devfreq_s  # ten cores and the GPU clock
    assert results["x1"].switch_s == pytest.approx(results["x1"].switches * pause)
    assert results["free"].switch_s == 0.0
    assert results["free"].over_bound < results["x20"].over_bound
    assert results["x20"].row()["switching_s"] == pytest.approx(20 * results["x1"].switch_s, rel=1e-3)


def test_the_governor_switches_down_only_where_the_plan_measured_a_saving_worth_the_switch():
    from tuner.serve.governor import Governor
    from tuner.serve.policy import BandPoint

    def measured(*pairs):
        return [BandPoint(rate_qps=r, j_per_query=j, latency_ms=40.0) for r, j in pairs]

    def run(low_j, switch_s):
        low = band(0, 60, cpu_cores=6).model_copy(update={"measured": measured((20, low_j), (60, 0.2))})
        high = band(60, 400).model_copy(update={"measured": measured((20, 0.5), (60, 0.25), (400, 0.1))})
        g = Governor(policy(low, high), min_dwell_s=10.0, smoothing_s=0.0, switch_s=switch_s, clock=lambda: 0.0)
        g.observe(300.0, now=0.0)
        for t in range(1, 60):
            g.observe(20.0, now=float(t))
        return g.current

    assert run(low_j=0.3, switch_s=lambda a, b: 0.1) == 0  # 40% cheaper at 20 q/s: worth a 0.1 s switch
    assert run(low_j=0.49, switch_s=lambda a, b: 0.1) == 1  # 2% cheaper: inside the plan's noise, not worth it
    assert run(low_j=0.3, switch_s=lambda a, b: 30.0) == 1  # 4 W saved for 10 s < two 30 s switches at 10 W
    assert run(low_j=0.49, switch_s=None) == 0  # without switch costs, the band rule alone (as before)


def test_late_governors_idle_at_held_clocks_and_start_a_batch_slowly_after_the_clocks_fell():
    from tuner.devices.virtual.queueing import Reaction

    fast = ServingProfile(service_s=np.array([np.inf, 0.010]), busy_w=np.array([0.0, 30.0]), idle_w=5.0)
    reaction = Reaction(delay_s=0.02, held_w=12.0, service_s=np.array([np.inf, 0.040]), busy_w=np.array([0.0, 10.0]))
    late = ServingProfile(service_s=fast.service_s, busy_w=fast.busy_w, idle_w=5.0, reaction=reaction)
    arrivals = np.array([0.0, 0.015, 0.5])  # the second comes 5 ms after the first batch, the third long after
    now = simulate(arrivals, fast, 1, 0.0, 1.0)
    slow = simulate(arrivals, late, 1, 0.0, 1.0)
    assert now.latencies_s == pytest.approx([0.010, 0.010, 0.010])
    # the window starts with the clocks up; the third batch starts after they fell: 20 ms at a quarter of the
    # pace, then the rest at full clocks
    assert slow.latencies_s == pytest.approx([0.010, 0.010, 0.020 + 0.005])
    # after each batch the clocks idle up to 20 ms at the held power before they fall
    held = 0.005 + 0.02 + 0.02
    assert slow.energy_j == pytest.approx(
        (0.02 * 10.0 + 0.005 * 30.0) + 2 * 0.010 * 30.0 + 5.0 * (1.0 - slow.busy_s) + (12.0 - 5.0) * held
    )


def test_bands_held_as_caps_idle_at_the_floor_and_start_slowly_after_the_clocks_fell():
    from tuner.errors import UserError
    from tuner.serve.replay import replay

    p = policy(band(0, 60, cpu_cores=2, gpu_mhz=612), band(60, 400))
    trace = Trace(times=np.arange(0.0, 300.0, 60.0), rates=np.array([20.0, 20.0, 200.0, 20.0, 20.0]))
    lock = replay(p, ORIN, trace, clocks="lock")
    late = replay(p, ORIN, trace, clocks="cap")
    at_once = replay(p, ORIN, trace, clocks="cap", reaction_s=0.0)
    for name in ("static", "governor"):
        # idling at the floor saves energy; with the clocks back at once every batch runs as when locked
        assert at_once.results[name].energy_j < lock.results[name].energy_j
        assert at_once.results[name].over_bound == lock.results[name].over_bound
        # 25 ms late: batches that start after the clocks fell run slower, so more queries miss the bound
        assert late.results[name].over_bound > lock.results[name].over_bound
    # the default mode's baselines do not depend on how the tuned configurations hold their clocks
    for name in ("default", "default_locked"):
        assert late.results[name].energy_j == lock.results[name].energy_j
    with pytest.raises(UserError, match="choose lock or cap"):
        replay(p, ORIN, trace, clocks="max")
