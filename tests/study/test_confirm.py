"""A contender's confirmation stops once its answer is known, on a twin whose windows are scripted.

The first window that would become the best is confirmed in its own trial
by one more window when the two agree and their mean is as precise as the
study asks, by two when they do not; a confirmation whose mean already costs
more than the best stops there and never holds the best value; a first
window that could not reach the study's interval within the longest window
is confirmed to the interval it reached. No assertion depends on time.
"""

from __future__ import annotations

import math

import pytest

from tuner.devices.virtual.twin import TwinDevice
from tuner.measure.settings import WindowSettings
from tuner.measure.stopping import STOP_COSTLIER
from tuner.measurement import Measurement
from tuner.objective import CONFIRM_WINDOWS, engine_rates, half_width, pooled, settled
from tuner.records import recommended
from tuner.run_options import RunOptions
from tuner.strategies import LearnedSampler
from tuner.study import run_study


def window(j_per_query: float, queries: int = 10_000, reached: float | None = 0.01) -> Measurement:
    extra = {} if reached is None else {"ci_achieved": reached}
    return Measurement(
        j_per_query=j_per_query,
        p50_ms=1.0,
        p90_ms=1.5,
        p99_ms=2.0,
        qps=queries / 2.0,
        avg_w=j_per_query * queries / 2.0,
        energy_j=j_per_query * queries,
        queries=queries,
        duration_s=2.0,
        meter="fake",
        extra=extra,
    )


def test_a_window_is_taken_at_the_interval_it_reached_or_else_at_its_aim():
    assert half_width(window(1.0, reached=0.004), 0.01) == 0.004
    assert half_width(window(1.0, reached=None), 0.017) == 0.017
    assert half_width(window(1.0, reached=math.inf), 0.017) == 0.017


def test_two_windows_that_agree_to_the_interval_settle_the_confirmation():
    aims = [0.01, 0.01 * math.sqrt(3)]
    assert settled([window(1.0), window(1.005)], aims, 0.01, None) == "agreed"
    # apart by more than their combined interval: a third window decides
    assert settled([window(1.0), window(1.05)], aims, 0.01, None) == ""
    # they agree, but a short second window leaves the mean less precise than asked
    wide = [window(1.0, reached=0.01), window(1.0, queries=10_000, reached=0.03)]
    assert settled(wide, aims, 0.01, None) == ""
    # the mean is above the best beyond its interval: more windows cannot make this trial the best
    assert settled([window(1.0), window(1.2)], aims, 0.01, 1.02) == STOP_COSTLIER
    assert settled([window(1.0), window(1.005)], aims, 0.01, 1.02) == "agreed"


class ScriptedTwin(TwinDevice):
    """The H200 twin whose Offline windows read a scripted energy per query and interval, in order."""

    def __init__(self, script: list[tuple]) -> None:
        super().__init__("sim:h200")
        self.script = list(script)
        self.aims: list[float] = []

    def measure(self, model, config, settings: WindowSettings) -> Measurement:
        m = super().measure(model, config, settings)
        self.aims.append(settings.ci)
        if not self.script:
            return m
        j_per_query, reached, *more = self.script.pop(0)
        extra = {k: v for k, v in m.extra.items() if k not in ("cut", "stop_rule")}
        extra.update(*more)
        latency = {k: extra.pop(k) for k in ("p50_ms", "p90_ms", "p99_ms") if k in extra}
        if reached is not None:
            extra["ci_achieved"] = reached
        return m.model_copy(
            update={
                "j_per_query": j_per_query,
                "energy_j": j_per_query * m.queries,
                "avg_w": j_per_query * m.queries / m.duration_s,
                "extra": extra,
                **latency,
            }
        )


def one_trial(tmp_path, script: list[tuple], trials: int = 1):
    device = ScriptedTwin(script)
    options = RunOptions(model="resnet50", max_latency_ms=1000.0, trials=trials, seed=1, sampler="random", out=tmp_path)
    study, _ = run_study(device, options)
    return study.trials[trials - 1], device, study


def test_a_contender_whose_two_windows_agree_is_confirmed_by_one(tmp_path):
    trial, device, study = one_trial(tmp_path, [(0.10, 0.008), (0.1003, 0.012)])
    assert trial.user_attrs["measurements"] == 2 and trial.user_attrs["confirmation"] == "agreed"
    assert len(device.aims) == 2 and device.aims[1] == pytest.approx(0.01 * math.sqrt(1 + CONFIRM_WINDOWS))
    assert recommended(study).number == trial.number
    assert trial.value == pytest.approx(0.10015, rel=1e-3)


def test_a_contender_whose_windows_disagree_is_confirmed_by_two(tmp_path):
    trial, device, _ = one_trial(tmp_path, [(0.10, 0.008), (0.11, 0.012), (0.104, 0.012)])
    assert trial.user_attrs["measurements"] == 3 and "confirmation" not in trial.user_attrs
    assert len(device.aims) == 3
    assert trial.value == pytest.approx((0.10 + 0.11 + 0.104) / 3, rel=1e-3)


def test_a_first_window_that_could_not_reach_the_interval_is_confirmed_to_what_it_reached(tmp_path):
    # A launch-bound configuration: 4% after the longest window, where the study asks 1%.
    trial, device, _ = one_trial(tmp_path, [(0.50, 0.04), (0.51, 0.06)])
    assert device.aims[1] == pytest.approx(0.04 * math.sqrt(1 + CONFIRM_WINDOWS))
    assert trial.user_attrs["measurements"] == 2 and trial.user_attrs["confirmation"] == "agreed"
    # at 1%, the study's own interval, these two windows would not have settled it
    assert (
        settled([w for w in (window(0.50, reached=0.04), window(0.51, reached=0.06))], [0.01, 0.017], 0.01, None) == ""
    )


def test_windows_of_unknown_precision_are_judged_at_their_aim(tmp_path):
    # A twin window reports no interval of its own: it is taken to have reached the one it aimed at.
    trial, device, _ = one_trial(tmp_path, [(0.10, None), (0.10, None)])
    assert device.aims[0] == pytest.approx(0.01)
    assert trial.user_attrs["measurements"] == 2 and trial.user_attrs["confirmation"] == "agreed"


def test_a_window_cut_as_costlier_whose_whole_figure_is_not_is_confirmed_and_may_be_the_best(tmp_path):
    # The cut judged the blocks read so far; the whole window came out below the best: it contends.
    costlier = {"cut": STOP_COSTLIER, "stop_rule": STOP_COSTLIER}
    script = [(0.10, 0.008), (0.10, 0.008), (0.099, 0.009, costlier), (0.0991, 0.01)]
    trial, device, study = one_trial(tmp_path, script, trials=2)
    assert len(device.aims) == 4 and "cut" not in trial.user_attrs
    assert trial.user_attrs["measurements"] == 2 and recommended(study).number == trial.number == 1
    # one whose whole figure is above the best stays a cut, costlier trial with its one window
    trial, device, study = one_trial(tmp_path / "again", [(0.10, 0.008), (0.10, 0.008), (0.101, 0.009, costlier)], 2)
    assert trial.user_attrs["cut"] == STOP_COSTLIER and trial.user_attrs["measurements"] == 1
    assert recommended(study).number == 0


def test_a_confirmation_whose_mean_already_costs_more_than_the_best_stops_and_is_not_the_answer(tmp_path):
    # The first window looked cheaper than the best; the confirming one shows the mean above it beyond the interval.
    script = [(0.10, 0.008), (0.10, 0.008), (0.099, 0.008), (0.13, 0.008)]
    trial, device, study = one_trial(tmp_path, script, trials=2)
    assert len(device.aims) == 4 and trial.user_attrs["confirmation"] == STOP_COSTLIER
    assert trial.user_attrs["measurements"] == 2 and trial.value > study.trials[0].value
    assert recommended(study).number == 0


def test_a_confirmed_trial_s_engines_add_up_to_its_pooled_throughput():
    """GPU and DLA lanes of several windows: each engine's share of their queries at the pooled rate."""
    first = window(1.0, queries=10_000).model_copy(
        update={"extra": {"engine_gpu_qps": 3000.0, "engine_dla0_qps": 2000.0}}
    )
    second = window(1.0, queries=12_000).model_copy(
        update={"duration_s": 3.0, "qps": 4000.0, "extra": {"engine_gpu_qps": 3000.0, "engine_dla0_qps": 1000.0}}
    )
    qps = pooled([m.model_dump() for m in (first, second)])["qps"]
    rates = engine_rates([first, second], qps)
    assert sum(rates.values()) == pytest.approx(qps)
    # 6000 + 9000 GPU queries and 4000 + 3000 DLA queries served in the two windows
    assert rates["engine_gpu_qps"] / rates["engine_dla0_qps"] == pytest.approx(15 / 7)
    assert engine_rates([window(1.0)], qps) == {}  # one lane: nothing per engine


def lazy_trials(tmp_path, script: list[tuple], trials: int, bound_ms: float = 1000.0):
    """A study whose strategy confirms only close calls (LearnedSampler ``confirm_within`` 2%)."""
    device = ScriptedTwin(script)
    options = RunOptions(model="resnet50", max_latency_ms=bound_ms, trials=trials, seed=1, out=tmp_path)
    study, _ = run_study(device, options, sampler=LearnedSampler(seed=1, confirm_within=0.02))
    return study.trials, device, study


def test_lazy_confirmation_leaves_clear_wins_at_one_window_and_confirms_close_calls(tmp_path):
    # The first feasible window and one 50% below it are clear wins; one 1% below the best is a close call.
    trials, device, study = lazy_trials(tmp_path, [(0.10, 0.008), (0.05, 0.008), (0.0495, 0.008), (0.0496, 0.008)], 3)
    first, win, close = trials
    assert first.user_attrs["measurements"] == 1 and win.user_attrs["measurements"] == 1
    assert "clear win" in win.user_attrs["verdict"] and "confirmation" not in win.user_attrs
    assert close.user_attrs["measurements"] == 2 and close.user_attrs["confirmation"] == "agreed"
    assert len(device.aims) == 4
    assert recommended(study).number == close.number


def test_a_clear_win_s_single_window_carries_the_noise_margin_of_one_window(tmp_path):
    trials, _, _ = lazy_trials(tmp_path, [(0.10, 0.008)], 1)
    (trial,) = trials
    margin = trial.user_attrs["latency_margin"]
    # no configuration measured twice yet: the 1% noise floor, for one future window and a mean of one
    assert margin == pytest.approx(1.645 * 0.01 * math.sqrt(2))
    assert trial.constraints["latency"] == pytest.approx(trial.user_attrs["p99_ms"] * (1 + margin) - 1000.0)


def test_a_clear_win_whose_latency_is_near_its_bound_is_confirmed(tmp_path):
    # 97 ms against 100 ms: within twice one window's noise margin (2 x 2.3%), so feasibility is the close call
    near = {"p50_ms": 90.0, "p90_ms": 95.0, "p99_ms": 97.0}
    trials, device, _ = lazy_trials(tmp_path, [(0.10, 0.008, near), (0.1003, 0.008, near)], 1, bound_ms=100.0)
    (trial,) = trials
    assert trial.user_attrs["measurements"] == 2 and len(device.aims) == 2
    # 90 ms clears it by more: one window
    far = {"p50_ms": 80.0, "p90_ms": 85.0, "p99_ms": 90.0}
    trials, device, _ = lazy_trials(tmp_path / "far", [(0.10, 0.008, far)], 1, bound_ms=100.0)
    assert trials[0].user_attrs["measurements"] == 1


def test_without_the_setting_every_contender_is_confirmed(tmp_path):
    # the same first window under a strategy without confirm_within (the random sampler) is confirmed
    trial, device, _ = one_trial(tmp_path, [(0.10, 0.008), (0.1003, 0.012)])
    assert trial.user_attrs["measurements"] == 2 and len(device.aims) == 2
