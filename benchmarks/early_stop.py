"""What the early stop costs: the same study stopped by itself against run to its cap (twins, generated boards).

Usage: python benchmarks/early_stop.py [--devices sim:orin,...] [--models resnet50,...] [--bounds tight,medium,loose]
           [--boards 1000-1005] [--seeds 3] [--trials 40] [--bounds-judged window3,latent3] [--out results.json]

Each landscape (tuner.bench: a device, model and bound from the noise-free sweep; a generated board gets its own
bound, or --board-bound) runs once per seed through run_study with the default strategy and early stop off, to its
cap. The stop rule (tuner.strategies.stopping.decide) reads only finished trials and never changes a proposal, so
the run that stops by itself is this run's prefix up to the trial where the rule first fires
(tests/study/test_early_stop.py checks that a real early-stopped run is that prefix). Per run: the trials measured at
the stop, and the true energy (noise-free sweep) of the answer at the stop and at the cap over the optimum.
The cost of the stop is their ratio minus 1 (an answer truly over the bound counts as infinite regret). Also the
exported regret at 20 trials (item 4: tight bounds on generated boards), with and without the stop.

The bound the rule reads (the learned strategy's ``headroom``) never changes a proposal either, so one run
judges several bounds: each proposal records every bound named by ``--bounds-judged`` (``window3``: the
spread of a new window, 3 sd; ``latent3``: the spread of the configuration's true energy and latency, 3 sd;
any spread and z), and each is judged with every rule.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
import time
from pathlib import Path

import optuna

from tuner.bench import BenchSettings, Landscape, _landscapes, _violation, build_landscapes, device, true_ratio, truth
from tuner.devices.virtual.generated import WORKLOADS
from tuner.measure.settings import WindowSettings
from tuner.records import recommended_of
from tuner.run_options import RunOptions
from tuner.strategies import LearnedSampler
from tuner.strategies.base import COULD_WIN_KEY, HEADROOM_KEY
from tuner.strategies.learned.headroom import Headroom
from tuner.strategies.stopping import StopRule, decide
from tuner.study import MEMORY_STORAGE, narrowed_space, run_study
from tuner.sweep import optimum, run_sweep


def setting(value: str) -> float | int | None:
    """A strategy setting from the command line: ``none``, an int, or a float (has a dot)."""
    if value == "none":
        return None
    return float(value) if "." in value else int(value)


def boards(spec: str) -> list[int]:
    out: list[int] = []
    for part in filter(None, spec.split(",")):
        lo, _, hi = part.partition("-")
        out += list(range(int(lo), int(hi or lo) + 1))
    return out


def judged_bounds(spec: str) -> dict[str, Headroom]:
    """``window3,latent2.5,latent3all``: the bounds to record at each proposal, by spread, z and models."""
    out = {}
    for name in filter(None, spec.split(",")):
        match = re.fullmatch(r"(window|latent)([0-9.]+)(all)?", name)
        if match is None:
            raise SystemExit(f"--bounds-judged {name}: write window<z> or latent<z>[all], e.g. latent3all")
        latent, every = match.group(1) == "latent", match.group(3) is not None
        out[name] = Headroom(float(match.group(2)), 0.05, 0.05, latent=latent, every_model=every)
    return out


class Several:
    """Every judged bound at each proposal; the strategy's own (``first``) is what it records as its headroom."""

    def __init__(self, bounds: dict[str, Headroom]) -> None:
        self.bounds = bounds
        self.last: dict[str, tuple[float, int]] = {}
        self.winners: list[int] = []

    def clear(self) -> None:
        """Forget the last proposal's bounds (a proposal that made none records none)."""
        self.last = {}

    def bound(self, *args) -> tuple[float, int]:
        self.last = {name: h.bound(*args) for name, h in self.bounds.items()}
        self.winners = next(iter(self.bounds.values())).winners
        return next(iter(self.last.values()))

    def plausible(self, *args) -> list[int]:
        return next(iter(self.bounds.values())).plausible(*args)


class Judged(LearnedSampler):
    """The default strategy, recording each judged bound beside its own (``headroom:<name>``, ``could_win:<name>``)."""

    def __init__(self, seed: int, bounds: dict[str, Headroom], **settings) -> None:
        super().__init__(seed=seed, **settings)
        self.several = Several(bounds)
        self.bounding = self.several

    def sample_relative(self, study, trial, search_space):
        self.several.clear()
        params = super().sample_relative(study, trial, search_space)
        for name, judged in self.several.last.items():
            headroom, could = self.widened(judged)
            study._storage.set_trial_user_attr(trial._trial_id, f"{HEADROOM_KEY}:{name}", round(headroom, 6))
            study._storage.set_trial_user_attr(trial._trial_id, f"{COULD_WIN_KEY}:{name}", could)
        return params


def as_bound(trials: list[optuna.trial.FrozenTrial], name: str) -> list[optuna.trial.FrozenTrial]:
    """The trials as the rule reads them had the strategy recorded bound ``name`` as its headroom."""
    out = []
    for t in trials:
        attrs = {k: v for k, v in t.user_attrs.items() if k not in (HEADROOM_KEY, COULD_WIN_KEY)}
        if f"{HEADROOM_KEY}:{name}" in attrs:
            attrs[HEADROOM_KEY] = attrs[f"{HEADROOM_KEY}:{name}"]
            attrs[COULD_WIN_KEY] = attrs[f"{COULD_WIN_KEY}:{name}"]
        out.append(
            optuna.trial.FrozenTrial(
                number=t.number,
                state=t.state,
                value=t.value,
                datetime_start=t.datetime_start,
                datetime_complete=t.datetime_complete,
                params=t.params,
                distributions=t.distributions,
                user_attrs=attrs,
                system_attrs=t.system_attrs,
                intermediate_values=t.intermediate_values,
                trial_id=t._trial_id,
            )
        )
    return out


def run(
    land: Landscape, seed: int, trials: int, bounds: dict[str, Headroom], rules: dict[str, StopRule], settings: dict
) -> dict:
    started = time.monotonic()
    options = RunOptions(
        model=land.model,
        max_latency_ms=land.max_latency_ms,
        trials=trials,
        seed=seed,
        storage=MEMORY_STORAGE,
        early_stop=False,
        window=WindowSettings(seed=seed),
    )
    study, _ = run_study(device(land.device), options, sampler=Judged(seed, bounds, **settings))
    table = truth(land.device, land.model, "p99")
    done = sorted((t for t in study.trials if t.state.is_finished()), key=lambda t: t.number)

    def ratio(prefix: list[optuna.trial.FrozenTrial]) -> float:
        best = recommended_of([t for t in prefix if t.state == optuna.trial.TrialState.COMPLETE])
        return true_ratio(best, table, land.max_latency_ms, land.optimum_j)

    measured_at = []
    count = 0
    for t in done:
        count += "reused_from" not in t.user_attrs and "effective_key" in t.user_attrs
        measured_at.append(count)
    cap = ratio(done)
    at20 = next((i for i, m in enumerate(measured_at) if m >= 20), len(done) - 1)
    out: dict = {
        "device": land.device,
        "model": land.model,
        "bound": land.bound,
        "seed": seed,
        "measured_cap": measured_at[-1] if measured_at else 0,
        "regret_cap": cap - 1,
        "regret_at_20": ratio(done[: at20 + 1]) - 1,
        "seconds": round(time.monotonic() - started, 1),
        "rules": {},
    }
    windows_at = []
    count = 0
    for t in done:
        count += int(t.user_attrs.get("measurements", 1)) if "reused_from" not in t.user_attrs else 0
        windows_at.append(count)
    for bound, (name, rule) in ((b, r) for b in bounds for r in rules.items()):
        read = as_bound(done, bound)
        stop = next((i for i in range(len(read)) if decide(read[: i + 1], rule) is not None), None)
        end = len(done) - 1 if stop is None else stop
        at_stop = ratio(done[: end + 1])
        answer = recommended_of([t for t in done[: end + 1] if t.state == optuna.trial.TrialState.COMPLETE])
        out["rules"][f"{bound}/{name}"] = {
            "stopped": stop is not None,
            "measured": measured_at[end],
            "regret": at_stop - 1,
            "cost": (at_stop / cap - 1) if math.isfinite(cap) and math.isfinite(at_stop) else math.inf,
            "regret_at_20": ratio(done[: min(end, at20) + 1]) - 1,
            "windows": windows_at[end],
            # share of fresh noisy windows of the answer at the stop past the bound (tune bench's violation)
            "violation": None if answer is None else _violation(device(land.device), land, answer, seed, "p99"),
        }
    return out


def fixed(name: str, model: str, bound_ms: float) -> Landscape:
    """A landscape at a bound given in milliseconds (the quick start's 50 ms), its optimum from the noise-free sweep."""
    dev = device(name)
    rows = run_sweep(dev, narrowed_space(dev, None, None), model, WindowSettings(noise=False, seed=None))
    truth(name, model, "p99")
    best = optimum(rows, bound_ms, "p99")
    lats = [r.measurement.latency_ms("p99") for r in rows if r.measurement is not None and r.measurement.valid]
    return Landscape(
        device=name,
        model=model,
        bound=f"{bound_ms:g}ms",
        max_latency_ms=bound_ms,
        optimum_j=best.measurement.j_per_query,
        optimum={"config": best.config.knobs, "batch_size": best.config.batch_size},
        feasible_fraction=sum(lat <= bound_ms for lat in lats) / len(lats),
    )


def summary(runs: list[dict], rules: list[str]) -> list[dict]:
    rows = []
    groups: dict[str, list[dict]] = {}
    for r in runs:
        groups.setdefault("generated" if r["device"].startswith("gen:") else r["device"], []).append(r)
        groups.setdefault("all", []).append(r)
    for scope, members in groups.items():
        for name in rules:
            stats = [m["rules"][name] for m in members]
            rows.append(
                {
                    "scope": scope,
                    "rule": name,
                    "runs": len(members),
                    "stopped": sum(s["stopped"] for s in stats),
                    "median_trials": statistics.median(s["measured"] for s in stats),
                    "max_trials": max(s["measured"] for s in stats),
                    "median_cost": statistics.median(s["cost"] for s in stats),
                    "worst_cost": max(s["cost"] for s in stats),
                    "median_regret_at_20_cap": statistics.median(m["regret_at_20"] for m in members),
                    "worst_regret_at_20_cap": max(m["regret_at_20"] for m in members),
                    "median_regret_at_20_stop": statistics.median(s["regret_at_20"] for s in stats),
                    "worst_regret_at_20_stop": max(s["regret_at_20"] for s in stats),
                }
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", default="sim:orin,sim:h200,sim:orin-nano")
    parser.add_argument("--models", default="resnet50,mobilenet_v2,efficientnet_b0,bert-base,bert-large")
    parser.add_argument("--bounds", default="tight,medium,loose")
    parser.add_argument("--boards", default="", help="generated boards, e.g. 1000-1005")
    parser.add_argument("--board-bound", default="", help="one bound for every generated board (default its own)")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--trials", type=int, default=40)
    parser.add_argument("--settings", default="", help="the strategy's settings, e.g. settle=3 (ints, floats, none)")
    parser.add_argument("--bounds-judged", default="window3,latent3,latent2", help="bounds recorded and judged")
    parser.add_argument("--patience", default="3", help="patience values of the rule to judge, e.g. 3,4,5")
    parser.add_argument("--min-measured", default="8", help="min_measured values of the rule to judge, e.g. 8,12")
    parser.add_argument("--bound-ms", type=float, default=None, help="one fixed bound (the quick start: 50)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    settings = BenchSettings(
        devices=[d for d in args.devices.split(",") if d],
        models=args.models.split(","),
        bounds=args.bounds.split(","),
        tune_boards=[],
        judge_boards=[],
    )
    if args.bound_ms is not None:
        lands = [fixed(name, model, args.bound_ms) for name in settings.devices for model in settings.models]
    else:
        lands = build_landscapes(settings) if settings.devices else []
    for seed in boards(args.boards):
        bound = args.board_bound or ("tight", "medium", "loose")[(seed // 3) % 3]
        lands += _landscapes("judge boards", f"gen:{seed}", WORKLOADS[seed % len(WORKLOADS)], [bound], "p99")
    rules = {
        f"patience={p},min={m}": StopRule(patience=int(p), min_measured=int(m))
        for p in args.patience.split(",")
        for m in args.min_measured.split(",")
    }
    bounds = judged_bounds(args.bounds_judged)
    strategy = {k: setting(v) for k, v in (p.split("=") for p in args.settings.split(",") if p)}
    runs = []
    started = time.monotonic()
    for land in lands:
        for seed in range(args.seeds):
            runs.append(run(land, seed, args.trials, bounds, rules, strategy))
            r = runs[-1]
            stops = "; ".join(f"{k}: {v['measured']} trials cost {v['cost']:+.2%}" for k, v in r["rules"].items())
            print(
                f"{land.device} {land.model} {land.bound} seed {seed}: cap regret {r['regret_cap']:.2%}; {stops}",
                flush=True,
            )
            args.out.write_text(json.dumps({"command": " ".join(sys.argv), "runs": runs}, indent=1))
    result = {
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": "python " + " ".join(sys.argv),
        "bounds_judged": args.bounds_judged,
        "settings": strategy,
        "seconds": round(time.monotonic() - started, 1),
        "summary": summary(runs, [f"{b}/{r}" for b in bounds for r in rules]),
        "runs": runs,
    }
    args.out.write_text(json.dumps(result, indent=1))
    for row in result["summary"]:
        print(json.dumps(row))


if __name__ == "__main__":
    main()
