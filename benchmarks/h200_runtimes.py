"""Runtimes and cheaper trials on a real NVIDIA GPU, observe-only.

Usage: python benchmarks/h200_runtimes.py {overhead,graph,check,breakdown} --out FILE [options]

- overhead: queries/s of a fixed LoadGen window (energy counter + telemetry,
  as a trial runs) against the bare runner loop, interleaved (bare, window,
  bare, window) on resnet50 fp16 channels_last batch 128.
- graph: energy per query of the graph knob (eager, cudagraphs, compile) for
  resnet50 and bert-base at the given batch sizes, each configuration in an
  adaptive window; compile time is paid in prepare() and reported apart.
  Stops starting new configurations after --budget seconds.
- check: the best configuration of a finished study measured again in fixed
  10 s windows and in default adaptive windows, to compare energy per query.
- breakdown: where each trial's wall time went, from the study storage
  (Optuna's trial start/end, the window bracket and the phases the NVML
  device records per trial).

Nothing on the card is changed: the device is opened observe-only and the
card's settings are read before and after.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import time
from pathlib import Path

from tuner.devices.nvml.device import NvmlDevice
from tuner.devices.nvml.meters import NvmlEnergyMeter
from tuner.devices.nvml.telemetry import NvmlTelemetry
from tuner.measure.session import measure_with
from tuner.measure.settings import WindowSettings
from tuner.space import Config


def bare_qps(runner, batch_size: int, seconds: float) -> float:
    runner.infer()
    start = time.monotonic()
    n = 0
    while time.monotonic() - start < seconds:
        runner.infer()
        n += 1
    return n * batch_size / (time.monotonic() - start)


def config_for(dev: NvmlDevice, batch: int, **knobs) -> Config:
    space = dev.space()
    return Config(knobs={**space.default_config(batch).knobs, **knobs}, batch_size=batch)


def window(dev: NvmlDevice, model: str, config: Config, settings: WindowSettings) -> dict:
    runner = dev.runners.get(model, config, dev.space())
    prepare_s = dev.runners.last_prepare_s + dev.runners.last_load_s
    meter = NvmlEnergyMeter(dev.nvml, dev.handle)
    m = measure_with(runner, meter, config.batch_size, settings, monitors=[NvmlTelemetry(dev.nvml, dev.handle)])
    keep = ("stop_rule", "ci_achieved", "ci_blocks", "warmup_s", "loadgen_s", "skipped_queries", "loadgen_attempts")
    return {
        "model": model,
        "config": config.knobs,
        "batch_size": config.batch_size,
        "j_per_query": m.j_per_query,
        "qps": m.qps,
        "avg_w": m.avg_w,
        "p99_ms": m.p99_ms,
        "duration_s": m.duration_s,
        "queries": m.queries,
        "valid": m.valid,
        "reason": m.reason,
        "prepare_s": prepare_s,
        **{k: m.extra.get(k) for k in keep},
    }


def overhead(dev: NvmlDevice, args) -> dict:
    config = config_for(dev, 128, precision=args.precision, channels_last=True, graph="eager")
    fixed = WindowSettings(window_s=args.window, log_dir="/tmp/powertune-overhead")
    runner = dev.runners.get(args.model, config, dev.space())
    rows, bare = [], []
    for _ in range(args.repeats):
        bare.append(bare_qps(runner, 128, args.window))
        rows.append(window(dev, args.model, config, fixed))
        print("overhead", round(bare[-1]), round(rows[-1]["qps"]), rows[-1]["j_per_query"], flush=True)
    loadgen = statistics.median(r["qps"] for r in rows)
    return {
        "config": config.label(),
        "window_s": args.window,
        "bare_qps": bare,
        "windows": rows,
        "median_bare_qps": statistics.median(bare),
        "median_window_qps": loadgen,
        "overhead": 1 - loadgen / statistics.median(bare),
    }


def graph(dev: NvmlDevice, args) -> dict:
    start = time.monotonic()
    settings = WindowSettings(window_s=args.window, min_window_s=args.min_window, log_dir="/tmp/powertune-graph")
    rows, skipped = [], []
    for mode in args.graphs.split(","):
        for model in args.models.split(","):
            for batch in (int(b) for b in args.batch_sizes.split(",")):
                label = f"{model} bs{batch} {mode}"
                if time.monotonic() - start > args.budget:
                    skipped.append(label)
                    continue
                config = config_for(dev, batch, precision=args.precision, channels_last=True, graph=mode)
                try:
                    row = window(dev, model, config, settings)
                except Exception as exc:  # recorded, so one failing mode does not lose the rest
                    row = {"model": model, "batch_size": batch, "config": config.knobs, "error": repr(exc)}
                rows.append(row)
                # Written after every configuration: a call cut short keeps what it measured.
                args.out.write_text(json.dumps({"rows": rows}, indent=2, default=str) + "\n")
                print(
                    label,
                    json.dumps(
                        {
                            k: row.get(k)
                            for k in ("j_per_query", "qps", "p99_ms", "prepare_s", "stop_rule", "ci_achieved", "error")
                        }
                    ),
                    flush=True,
                )
            dev.close_runner()
    return {"settings": settings.model_dump(), "rows": rows, "skipped_for_time": skipped}


def check(dev: NvmlDevice, args) -> dict:
    pareto = json.loads(Path(args.pareto).read_text())
    best = pareto["best"]
    config = Config(knobs=best["config"], batch_size=best["batch_size"])
    fixed = WindowSettings(window_s=10.0, log_dir="/tmp/powertune-check-fixed")
    adaptive = WindowSettings(window_s=10.0, min_window_s=2.0, log_dir="/tmp/powertune-check-adaptive")
    rows = []
    for i in range(args.repeats):
        for name, settings in (("fixed-10s", fixed), ("adaptive", adaptive)):
            row = window(dev, args.model, config, settings)
            row["kind"] = name
            row["repeat"] = i
            rows.append(row)
            print(name, row["j_per_query"], row["duration_s"], row["stop_rule"], row["ci_achieved"], flush=True)
    fixed_j = statistics.median(r["j_per_query"] for r in rows if r["kind"] == "fixed-10s")
    adaptive_j = statistics.median(r["j_per_query"] for r in rows if r["kind"] == "adaptive")
    return {
        "study_best": best,
        "rows": rows,
        "median_fixed_j_per_query": fixed_j,
        "median_adaptive_j_per_query": adaptive_j,
        "study_vs_fixed": best["j_per_query"] / fixed_j - 1,
        "adaptive_vs_fixed": adaptive_j / fixed_j - 1,
    }


def breakdown(args) -> dict:
    """Per trial: Optuna's wall time, the window bracket, and the phases recorded in extra."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = f"sqlite:///{args.db}"
    summaries = optuna.get_all_study_summaries(storage)
    study = optuna.load_study(study_name=summaries[0].study_name, storage=storage)
    rows = []
    trials = sorted(study.get_trials(deepcopy=False), key=lambda t: t.number)
    for prev, t in zip([None, *trials[:-1]], trials, strict=True):
        extra = t.user_attrs.get("extra") or {}
        if t.datetime_start is None or t.datetime_complete is None:
            continue
        wall = (t.datetime_complete - t.datetime_start).total_seconds()
        gap = None
        if prev is not None and prev.datetime_complete is not None:
            gap = (t.datetime_start - prev.datetime_complete).total_seconds()
        window_s = (extra.get("window_end_unix") or 0) - (extra.get("window_start_unix") or 0)
        rows.append(
            {
                "trial": t.number,
                "state": t.state.name,
                "reused": "reused_from" in t.user_attrs,
                "batch_size": t.user_attrs.get("batch_size"),
                "config": t.user_attrs.get("config"),
                "wall_s": wall,
                "gap_before_s": gap,
                "window_s": window_s if "window_end_unix" in extra else None,
                **{
                    k: extra.get(k)
                    for k in ("runner_load_s", "runner_prepare_s", "warmup_s", "loadgen_s", "window_call_s",
                              "stop_rule", "ci_achieved", "skipped_queries", "loadgen_attempts")
                },
                "j_per_query": t.user_attrs.get("j_per_query"),
            }
        )  # fmt: skip
    measured = [r for r in rows if r["window_s"] and not r["reused"]]

    def total(key: str) -> float:
        return sum(r[key] or 0.0 for r in measured)

    return {
        "study": study.study_name,
        "trials": len(rows),
        "measured": len(measured),
        "sum_wall_s": sum(r["wall_s"] for r in rows),
        "sum_gap_s": sum(r["gap_before_s"] or 0.0 for r in rows),
        "sum_window_s": total("window_s"),
        "sum_runner_load_s": total("runner_load_s"),
        "sum_runner_prepare_s": total("runner_prepare_s"),
        "sum_warmup_s": total("warmup_s"),
        "sum_loadgen_s": total("loadgen_s"),
        "sum_window_call_s": total("window_call_s"),
        "stop_rules": {
            rule: sum(1 for r in measured if r["stop_rule"] == rule) for rule in {r["stop_rule"] for r in measured}
        },
        "rows": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("what", choices=("overhead", "graph", "check", "breakdown"))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--window", type=float, default=10.0)
    parser.add_argument("--min-window", type=float, default=2.0)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--model", default="resnet50", help="overhead, check: the model")
    parser.add_argument("--precision", default="fp16", help="overhead, graph: the precision")
    parser.add_argument("--models", default="resnet50,bert-base", help="graph: the models")
    parser.add_argument("--batch-sizes", default="1,8,32")
    parser.add_argument("--graphs", default="eager,cudagraphs,compile")
    parser.add_argument("--budget", type=float, default=300.0, help="graph: start no configuration after this")
    parser.add_argument("--pareto", help="check: the study's pareto.json")
    parser.add_argument("--db", help="breakdown: the study's sqlite file")
    args = parser.parse_args()
    if args.what == "breakdown":
        result = breakdown(args)
    else:
        dev = NvmlDevice(0)
        before = dev.observe_only_state()
        result = {"device": dev.describe(), "card_before": before}
        result.update({"overhead": overhead, "graph": graph, "check": check}[args.what](dev, args))
        dev.close_runner()
        result["card_after"] = dev.observe_only_state()
        result["card_untouched"] = result["card_after"] == before
    result["date"] = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    args.out.write_text(json.dumps(result, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
