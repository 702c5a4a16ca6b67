"""The answer a study gives: its recommended configuration, read the way Optuna reads it.

The recommended configuration is Optuna's own best trial: the cheapest
completed trial whose constraints all hold (``study.best_trial``, what
optuna-dashboard marks). That is the right answer because of how trials are
recorded (tuner.objective): a window that would beat the best so far by a
close call is confirmed in the same trial by more windows, and the trial then
carries their mean energy and a latency constraint with a noise margin (a
clear win of the learned strategy stays one window, with one window's
margin). A trial's verdict never changes after it completes, so ``tune
run``, export, pareto, status, apply, the plots and the dashboard all name one
trial, in a resumed study and in a fleet alike.
"""

from __future__ import annotations

import math
from typing import Any

import optuna

from tuner.measurement import METRIC_KEYS, TOKEN_KEYS

COMPLETE = optuna.trial.TrialState.COMPLETE
RAN_SUFFIXES = ("_mhz_mean", "_mhz_min", "_mhz_max")
"""Extras naming a clock a window ran, as its device sampled it (NVML ``sm_mhz_*``, Jetson ``gpu_mhz_*`` ...)."""
EARLY_STOP_ATTR = "early_stop"
"""The study user attribute that holds a stop decision (tuner.strategies.stopping): every worker reads it."""


def is_feasible(trial: optuna.trial.FrozenTrial) -> bool:
    """Feasible as Optuna counts it: completed, and every constraint <= 0."""
    return trial.state == COMPLETE and all(v <= 0 for v in trial.constraints.values())


def recommended(study: optuna.Study) -> optuna.trial.FrozenTrial | None:
    """The study's answer: Optuna's best trial, or None while no trial is feasible."""
    try:
        return study.best_trial
    except ValueError:
        return None


def recommended_of(trials: list[optuna.trial.FrozenTrial]) -> optuna.trial.FrozenTrial | None:
    """The answer a study holding only ``trials`` would give (Optuna's rule; ties: the earliest)."""
    feasible = [t for t in trials if is_feasible(t) and t.value is not None]
    return min(feasible, key=lambda t: (t.value, t.number)) if feasible else None


def fastest(trials: list[optuna.trial.FrozenTrial]) -> optuna.trial.FrozenTrial | None:
    """The completed trial nearest to feasible: the lowest latency as feasibility judges it (noise margin included)."""
    judged = [t for t in trials if t.state == COMPLETE and "latency" in (t.constraints or {})]
    return min(judged, key=lambda t: (t.constraints["latency"], t.number), default=None)


def unmet_bound(trials: list[optuna.trial.FrozenTrial], bound_ms: float, percentile: str) -> str:
    """What a study says when no configuration met its bound: the fastest one measured and a bound that admits it."""
    done = sum(t.state == COMPLETE for t in trials)
    head = f"no configuration met {percentile} <= {bound_ms:g} ms in {done} completed trials"
    best = fastest(trials)
    if best is None:
        return f"{head}; none measured a latency: relax --max-latency or widen the space"
    attrs = best.user_attrs
    latency = float(attrs.get(attrs.get("latency_key", "p99_ms"), bound_ms + best.constraints["latency"]))
    admits = _round_up(bound_ms + best.constraints["latency"])
    config = ", ".join(f"{k}={v}" for k, v in (attrs.get("effective") or attrs.get("config") or {}).items())
    shown = f"batch {attrs.get('batch_size')}" + (f", {config}" if config else "")
    margin = attrs.get("latency_margin")
    noise = f", {float(margin):.1%} noise margin" if margin else ""
    ran = f"{head}; the fastest measured, trial {best.number} ({shown}), ran {percentile} {latency:.4g} ms"
    if attrs.get("cut"):
        return (
            f"{ran} or more (its window was cut once past the bound){noise}; only a bound of {admits:g} ms or "
            f"more can admit it: --max-latency {admits:g}ms"
        )
    return f"{ran}{noise}; a bound of {admits:g} ms would admit it: --max-latency {admits:g}ms"


def unmet_bounds(trials: list[optuna.trial.FrozenTrial], bounds: dict[str, tuple[str, float]], percentile: str) -> str:
    """An LLM study's line when nothing met its bounds: the trial nearest to all of them, and what it ran.

    Nearest is the smallest worst relative excess over the bounds (each
    constraint over its bound), so a trial far past one bound is not called
    near because it meets the other.
    """
    done = [t for t in trials if t.state == COMPLETE and set(bounds) <= set(t.constraints or {})]
    said = ", ".join(f"{name} {percentile} <= {bound:g} ms" for name, (_attr, bound) in bounds.items())
    head = f"no configuration met {said} in {sum(t.state == COMPLETE for t in trials)} completed trials"
    if not done:
        return f"{head}; none measured: relax the bounds or widen the space"
    nearest = min(done, key=lambda t: (max(t.constraints[n] / b for n, (_a, b) in bounds.items()), t.number))
    ran = ", ".join(f"{name} {bound + nearest.constraints[name]:.4g} ms" for name, (_attr, bound) in bounds.items())
    flags = " ".join(
        f"--max-{name} {_round_up(bound + nearest.constraints[name]):g}ms" for name, (_a, bound) in bounds.items()
    )
    batch = nearest.user_attrs.get("batch_size")
    if nearest.user_attrs.get("cut"):
        ran += " or more (its window was cut once past a bound)"
    return f"{head}; the nearest, trial {nearest.number} (batch {batch}), ran {ran}: {flags} would admit it"


def _round_up(ms: float) -> float:
    """``ms`` rounded up to three significant digits, so the bound said admits the latency it is for."""
    if ms <= 0:
        return ms
    step = 10.0 ** (math.floor(math.log10(ms)) - 2)
    return round(math.ceil(ms / step - 1e-9) * step, 10)


def windows(trial: optuna.trial.FrozenTrial) -> int:
    """How many windows a trial's figures are the mean of (a reuse counts those it copied)."""
    return int(trial.user_attrs.get("measurements", 1))


def tail_latency_ms(trial: optuna.trial.FrozenTrial) -> float | None:
    """The tail latency a trial is judged on (the percentile its study bounds, p99 if it does not say)."""
    latency = trial.user_attrs.get(trial.user_attrs.get("latency_key", "p99_ms"))
    return None if latency is None else float(latency)


def clocks_ran(trial: optuna.trial.FrozenTrial) -> dict[str, float]:
    """The clocks the trial's (last) window ran, mean/min/max in MHz, and the over-current events in it.

    What the device sampled, not what was asked: a window whose clocks did not
    hold is marked ``throttled`` and fails its trial, so it is never the answer.
    """
    extra = trial.user_attrs.get("extra") or {}
    return {k: float(v) for k, v in extra.items() if k.endswith(RAN_SUFFIXES) or k == "oc_events"}


def trial_record(trial: optuna.trial.FrozenTrial) -> dict:
    """A flat, JSON-ready view of a trial: configuration, metrics and feasibility."""
    attrs = trial.user_attrs
    record = {
        "trial": trial.number,
        "batch_size": attrs.get("batch_size"),
        "config": attrs.get("effective", attrs.get("config", {})),
        "feasible": is_feasible(trial),
        "windows": windows(trial),
        "verdict": attrs.get("verdict"),
        "twin": attrs.get("twin", False),
        "meter": attrs.get("meter"),
        "device": attrs.get("device"),
        "host": attrs.get("host"),
        "worker": attrs.get("worker"),
        "throttled": bool(attrs.get("throttled")),
        "clocks_ran": clocks_ran(trial),
    }
    for key in METRIC_KEYS:
        record[key] = attrs.get(key)
    for key in TOKEN_KEYS:
        if key in attrs:
            record[key] = attrs[key]
    return record


def recommendation_change(before: dict[str, Any] | None, after: dict[str, Any] | None) -> str:
    """One line when a resumed study's answer changed during a run (trial records before and after), else ""."""
    if before is None or after is None or before["trial"] == after["trial"]:
        return ""
    return (
        f"the recommendation changed: trial {after['trial']} ({after['j_per_query']:.4g} J/query, "
        f"mean of {after['windows']} windows) replaces trial {before['trial']} ({before['j_per_query']:.4g} J/query): "
        "a new configuration met the bound for less energy"
    )
