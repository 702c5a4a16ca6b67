"""trials.csv: every trial of a study in one row, with where its configuration came from and its verdict."""

from __future__ import annotations

import csv
from pathlib import Path

import optuna

from tuner.measurement import METRIC_KEYS, TOKEN_KEYS
from tuner.plumbing import atomicfile
from tuner.records import EARLY_STOP_ATTR, clocks_ran, is_feasible, recommended, windows


def write_trials_csv(study: optuna.Study, path: Path) -> None:
    trials = study.get_trials(deepcopy=False)
    knob_names = sorted({k for t in trials for k in t.user_attrs.get("effective", {})})
    ran = sorted({k for t in trials for k in clocks_ran(t)})
    metrics = [*METRIC_KEYS, *(k for k in TOKEN_KEYS if any(k in t.user_attrs for t in trials))]
    best = recommended(study)
    with atomicfile.writing(path) as fh:
        writer = csv.writer(fh)
        writer.writerow(
            [
                "trial",
                "state",
                "batch_size",
                *knob_names,
                *metrics,
                "feasible",
                "windows",
                "recommended",
                "reused_from",
                "meter",
                "twin",
                "device",
                "host",
                "fail_reason",
                "source",
                "feasibility",
                "proposed_by",
                "why",
                "cut",
                "setup_s",
                "windows_s",
                "search_s",
                "switch_s",
                "headroom",
                "could_win",
                "stopped",
                "throttled",
                *ran,
            ]
        )
        bound = study.user_attrs.get("max_latency_ms")
        stop = study.user_attrs.get(EARLY_STOP_ATTR)
        stop = stop if isinstance(stop, dict) else {}
        for t in trials:
            a = t.user_attrs
            eff = a.get("effective", {})
            writer.writerow(
                [
                    t.number,
                    t.state.name,
                    a.get("batch_size", ""),
                    *[eff.get(k, "") for k in knob_names],
                    *[a.get(m, "") for m in metrics],
                    "yes" if is_feasible(t) else "no",
                    windows(t) if "j_per_query" in a else "",
                    "yes" if best is not None and t.number == best.number else "no",
                    a.get("reused_from", ""),
                    a.get("meter", ""),
                    "yes" if a.get("twin") else "no",
                    a.get("device", ""),
                    a.get("host", ""),
                    a.get("fail_reason", ""),
                    trial_source(t),
                    feasibility(t, bound),
                    a.get("proposed_by", ""),
                    a.get("why", ""),
                    a.get("cut", ""),
                    *[a.get(key, "") for key in ("setup_s", "windows_s", "search_s")],
                    a.get("switch_s", ""),
                    a.get("headroom", ""),
                    a.get("could_win", ""),
                    f"early stop: {stop.get('line', '')}" if stop.get("trial") == t.number else "",
                    "yes" if a.get("throttled") else "no",
                    *[clocks_ran(t).get(key, "") for key in ran],
                ]
            )


def trial_source(trial: optuna.trial.FrozenTrial) -> str:
    """Where a trial's numbers come from, so an empty reused_from is never a mystery."""
    a = trial.user_attrs
    measured = "simulated on a digital twin" if a.get("twin") else "measured"
    if "reused_from" in a:
        return f"copied from trial {a['reused_from']} (same effective configuration)"
    if "repeat_of" in a:
        again = "re-simulation" if a.get("twin") else "re-measurement"
        return f"{again} of trial {a['repeat_of']}: mean of {windows(trial)} windows"
    if "j_per_query" in a:
        return measured if windows(trial) == 1 else f"{measured}, confirmed: mean of {windows(trial)} windows"
    return ""


def feasibility(trial: optuna.trial.FrozenTrial, bound_ms: float | None) -> str:
    """Why a trial is (in)feasible: its verdict, written when it completed (tuner.objective)."""
    if "verdict" in trial.user_attrs:
        return str(trial.user_attrs["verdict"])
    slack = trial.constraints.get("latency") if trial.constraints else None
    key = trial.user_attrs.get("latency_key", "p99_ms")
    latency = trial.user_attrs.get(key)
    if slack is None or latency is None or bound_ms is None:
        return ""
    return f"{'meets' if slack <= 0 else 'misses'} the bound: {latency:.4g} ms vs {bound_ms:g} ms"
