"""Wall time to an answer on the recorded H200 board: each trial charged what its windows cost on the card.

Usage: python benchmarks/wall_replay.py [--cases resnet50-offline,bert-offline] [--seeds 3]
           [--variants current:,lazy3:confirm_within=0.03,tpe] [--tpe-trials 40] [--out results.json]

The recorded board (``measured:h200``, tuner.devices.virtual.recorded) answers every configuration of the
observe-only H200 space from windows measured on a real card, but it takes no time and never cuts a window.
Here it does both as the card did in the time-to-answer calls (benchmarks/time_to_answer_h200.py, the
trials of benchmarks/results/time-to-answer-h200/call12-call14): a window whose p99 is past the bound is cut
(tail) and one whose energy per query is above the best so far is cut (costs more), as tuner.measure.stopping
would; each window is charged the median seconds the card spent on such a window (a full window by batch
size, a tail cut by batch size, a costlier cut), each trial its setup (by graph mode; the first trial of a
process its own) and its search seconds (by sampler), each run the seconds before its first trial. The study
runs through run_study as `tune run` would (the default strategy stops by itself, at most ``--cap``; TPE runs
``--tpe-trials``), and is scored by the board's truth (the mean of its windows): the simulated seconds at
which the recommended configuration first came within 1% of the whole-space optimum and stayed there, the
seconds at its end, and the answer's regret. A replay, not hardware: the costs are medians, not each
configuration's own, and the board's two windows per configuration are its whole noise.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import optuna
from early_stop import fixed

from tuner.bench import true_ratio, truth
from tuner.devices.virtual.recorded import RecordedBoard
from tuner.measure.settings import WindowSettings
from tuner.measure.stopping import STOP_COSTLIER, STOP_TAIL, costs_more
from tuner.measurement import Measurement
from tuner.records import recommended_of
from tuner.run_options import RunOptions
from tuner.sampling import make_sampler
from tuner.space import Config
from tuner.strategies import LearnedSampler
from tuner.study import MEMORY_STORAGE, run_study

CASES = {"resnet50-offline": ("resnet50", 50.0), "bert-offline": ("bert-base", 20.0)}
CALLS = ("call12", "call13", "call14")
RESULTS = Path(__file__).resolve().parent / "results" / "time-to-answer-h200"
WITHIN = 0.01
# A window cut once its tail was proven past the bound read, on the card, 0.86x the energy per query and 0.90x the
# p99 of the same configuration's full windows on the recorded board (medians of bert-base's 34 such trials in
# calls 12-14; resnet50's 3: 0.83x and 0.98x): its first batches, before the tail built up.
TAIL_BIAS = (0.86, 0.90)


class Costs:
    """Median seconds per window, setup and search of one case, from the card's recorded trials."""

    def __init__(self, case: str, calls: tuple[str, ...] = CALLS) -> None:
        full: dict[int, list[float]] = defaultdict(list)
        tail: dict[int, list[float]] = defaultdict(list)
        setup: dict[str, list[float]] = defaultdict(list)
        search: dict[str, list[float]] = defaultdict(list)
        costlier, first, before = [], [], []
        for call in calls:
            for run in json.loads((RESULTS / call / "time-to-answer.json").read_text())["runs"]:
                if run["case"] != case:
                    continue
                before.append(run["before_first_trial_s"])
                for t in run["trials"]:
                    if t["state"] != "COMPLETE" or t.get("reused_from") is not None:
                        continue
                    if t["cut"] == STOP_COSTLIER:
                        costlier.append(t["windows_s"])
                    elif t["cut"]:
                        tail[t["batch_size"]].append(t["windows_s"])
                    else:
                        full[t["batch_size"]].append(t["windows_s"] / t["windows"])
                    (first if t["trial"] == 0 else setup[t["config"]["graph"]]).append(t["setup_s"])
                    search["auto" if run["sampler"] in ("auto", "learned") else run["sampler"]].append(t["search_s"])
        self.full = {b: statistics.median(v) for b, v in full.items()}
        self.tail = {b: statistics.median(v) for b, v in tail.items()}
        self.costlier = statistics.median(costlier)
        self.setup = {g: statistics.median(v) for g, v in setup.items()}
        self.first = statistics.median(first)
        self.search = {s: statistics.median(v) for s, v in search.items()}
        self.before = statistics.median(before)

    @staticmethod
    def nearest(table: dict[int, float], batch: int) -> float:
        """The recorded figure of the batch size nearest in log2 (the card's windows scale with it smoothly)."""
        return table[min(table, key=lambda b: (abs(math.log2(b) - math.log2(batch)), b))]

    def describe(self) -> dict:
        return dict(vars(self))


class ChargedBoard(RecordedBoard):
    """The recorded board with the card's cuts and seconds: ``clock`` is the simulated wall time so far."""

    def __init__(self, costs: Costs) -> None:
        super().__init__("measured:h200")
        self.costs = costs
        self.clock = costs.before
        self.applied = 0
        self.spent = {"before_s": costs.before, "setup_s": 0.0, "windows_s": 0.0, "cut_windows_s": 0.0, "search_s": 0.0}

    def charge(self, key: str, seconds: float) -> None:
        self.clock += seconds
        self.spent[key] += seconds

    def apply(self, config: Config) -> None:
        super().apply(config)
        graph = str(config.knobs.get("graph", "eager"))
        self.charge("setup_s", self.costs.first if self.applied == 0 else self.costs.setup.get(graph, self.costs.first))
        self.applied += 1

    def measure(self, model: str, config: Config, settings: WindowSettings) -> Measurement:
        m = super().measure(model, config, settings)
        cut = ""
        if settings.bound_ms is not None and m.p99_ms > settings.bound_ms:
            cut, seconds = STOP_TAIL, self.costs.nearest(self.costs.tail, config.batch_size)
        elif costs_more(m.j_per_query, settings.ci, settings.cut_j_per_query, settings.ci):
            cut, seconds = STOP_COSTLIER, self.costs.costlier
        else:
            seconds = self.costs.nearest(self.costs.full, config.batch_size)
        self.charge("cut_windows_s" if cut else "windows_s", seconds)
        if not cut:
            return m
        update: dict = {"extra": {**m.extra, "cut": cut, "stop_rule": cut}}
        if cut == STOP_TAIL:
            # A partial window read cheaper and faster than the configuration's full windows (TAIL_BIAS).
            j, p99 = m.j_per_query * TAIL_BIAS[0], max(m.p99_ms * TAIL_BIAS[1], settings.bound_ms * 1.001)
            update.update(j_per_query=j, energy_j=j * m.queries, avg_w=j * m.qps, p99_ms=p99)
        return m.model_copy(update=update)


def variant(spec: str) -> tuple[str, dict]:
    """``name:key=value;key=value`` (a LearnedSampler's settings), or ``tpe``."""
    name, _, rest = spec.partition(":")
    settings = {}
    for item in filter(None, rest.split(";")):
        key, _, value = item.partition("=")
        settings[key] = None if value == "none" else float(value) if "." in value else int(value)
    return name, settings


def run(case: str, name: str, settings: dict, seed: int, cap: int, tpe_trials: int, costs: Costs, land) -> dict:
    started = time.monotonic()
    model, bound = CASES[case]
    board = ChargedBoard(costs)
    tpe = name == "tpe"
    sampler = make_sampler("tpe", seed) if tpe else LearnedSampler(seed, **settings)
    search = costs.search.get("tpe" if tpe else "auto", costs.search["auto"])
    table = truth("measured:h200", model, "p99")
    curve: list[tuple[float, float, int]] = []

    def on_trial(study: optuna.Study, trial: optuna.trial.FrozenTrial, measured: int) -> None:
        board.charge("search_s", search)
        done = [t for t in study.get_trials(deepcopy=False) if t.state == optuna.trial.TrialState.COMPLETE]
        curve.append((board.clock, true_ratio(recommended_of(done), table, bound, land.optimum_j), measured))

    options = RunOptions(
        model=model,
        max_latency_ms=bound,
        trials=tpe_trials if tpe else cap,
        seed=seed,
        storage=MEMORY_STORAGE,
        early_stop=not tpe,
        window=WindowSettings(seed=seed),
    )
    study, summary = run_study(board, options, on_trial=on_trial, sampler=sampler)
    final = curve[-1][1] if curve else math.inf
    reached = next((i for i in range(len(curve)) if all(r <= 1 + WITHIN for _c, r, _n in curve[i:])), None)
    windows = sum(int(t.user_attrs.get("measurements", 1)) for t in study.trials if "reused_from" not in t.user_attrs)
    return {
        "case": case,
        "variant": name,
        "settings": settings,
        "seed": seed,
        "measured": summary.measured,
        "windows": windows,
        "wall_s": round(board.clock, 2),
        "to_answer_s": None if reached is None else round(curve[reached][0], 2),
        "to_answer_trials": None if reached is None else curve[reached][2],
        "regret": final - 1,
        "spent": {k: round(v, 2) for k, v in board.spent.items()},
        "stopped": summary.stopped,
        "cpu_s": round(time.monotonic() - started, 1),
    }


def medians(runs: list[dict]) -> list[dict]:
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in runs:
        groups[(r["case"], r["variant"])].append(r)
    rows = []
    for (case, name), rs in groups.items():

        def med(key: str, rs: list[dict] = rs) -> float:
            return statistics.median(math.inf if r[key] is None else r[key] for r in rs)

        rows.append(
            {
                "case": case,
                "variant": name,
                "runs": len(rs),
                "wall_s": med("wall_s"),
                "to_answer_s": med("to_answer_s"),
                "measured": med("measured"),
                "windows": med("windows"),
                "regret_median": med("regret"),
                "regret_worst": max(r["regret"] for r in rs),
                "reached": sum(r["to_answer_s"] is not None for r in rs),
            }
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="resnet50-offline,bert-offline")
    ap.add_argument("--variants", default="current:,lazy3:confirm_within=0.03,tpe")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--cap", type=int, default=40)
    ap.add_argument("--tpe-trials", type=int, default=40)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    runs = []
    for case in args.cases.split(","):
        costs = Costs(case)
        model, bound = CASES[case]
        land = fixed("measured:h200", model, bound)
        for spec in args.variants.split(","):
            name, settings = variant(spec)
            for seed in range(args.seeds):
                r = run(case, name, settings, seed, args.cap, args.tpe_trials, costs, land)
                runs.append(r)
                print(json.dumps(r), file=sys.stderr, flush=True)
    rows = medians(runs)
    for row in rows:
        print(json.dumps(row))
    if args.out:
        costs_of = {case: Costs(case).describe() for case in args.cases.split(",")}
        args.out.write_text(
            json.dumps({"command": " ".join(sys.argv), "costs": costs_of, "runs": runs, "medians": rows}, indent=1)
        )


if __name__ == "__main__":
    main()
