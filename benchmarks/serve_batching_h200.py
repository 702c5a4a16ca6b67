"""Server and SingleStream on a real GPU, observe-only: the batch that arrived against the old padded batch.

For each configuration (model, precision, layout, graph mode, maximum batch
size) it runs LoadGen windows at three Server arrival rates (low, middle,
near capacity) and one SingleStream window, each twice: ``before`` runs
every dynamic batch at the maximum batch size with Python's garbage collector
left as it was (``pad_batches``, ``gc_freeze`` off: the window as it used to
be), ``after`` runs the samples that arrived (on the runner's ladder for CUDA
graphs) with the collector frozen for the window (the default). At the lowest
rate a third window, ``arrived-gc``, runs the arrived batches with the
collector left on, to separate the two changes.

Every window keeps its per-query arrivals and latencies, its per-batch start
and end, and every garbage collection's start and end (``gc.callbacks``), all
on ``time.monotonic``; the slow queries (above max(5 x p50, p50 + 5 ms)) are
attributed to what overlapped them: a collection, a slow batch on the GPU,
queueing behind a batch, or the worker starting late. Nothing on the card is
changed: no clocks, power limit or modes are written.

    python3 benchmarks/serve_batching_h200.py --out serve-batching.json --window 5 --budget 330
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from runners import make_runner
from tuner.devices.nvml.device import NvmlDevice
from tuner.devices.nvml.telemetry import NvmlTelemetry
from tuner.measure.loadgen_run import run_window
from tuner.measure.results import WindowResult
from tuner.measure.session import build_measurement
from tuner.measure.settings import WindowSettings

# (model, precision, channels_last, graph, maximum batch, Server rates low/middle/near capacity)
CONFIGS = [
    ("bert-base", "fp16", False, "cudagraphs", 8, (200, 1000, 5000)),
    ("resnet50", "fp16", True, "cudagraphs", 32, (500, 2000, 10000)),
    ("resnet50", "fp16", True, "eager", 32, (500, 2000, 5000)),
    ("bert-base", "fp16", False, "eager", 8, (200, 600, 1200)),
]
MODES = {
    "before": {"pad_batches": True, "gc_freeze": False},
    "after": {},
    "arrived-gc": {"gc_freeze": False},
}


class GcWatch:
    """Every collection's generation, start and end on the monotonic clock."""

    def __init__(self) -> None:
        self.events: list[tuple[int, float, float]] = []
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.monotonic()
        else:
            self.events.append((int(info["generation"]), self._started, time.monotonic()))


def stall_report(win: WindowResult, gcs: list[tuple[int, float, float]]) -> dict[str, Any]:
    """Attribute every slow query to what overlapped it; summarise collections and batch run times."""
    lat = np.asarray(win.query_latencies_ms)
    arr = np.asarray(win.arrivals)
    recs = win.batch_records
    if not len(lat) or not recs:
        return {}
    p50 = float(np.median(lat))
    threshold = max(5 * p50, p50 + 5.0)
    batch_of = np.repeat(np.arange(len(recs)), [r.size for r in recs])
    run_ms = np.array([(r.done - r.start) * 1e3 for r in recs])
    executed = np.array([r.executed for r in recs])
    median_run = {int(s): float(np.median(run_ms[executed == s])) for s in np.unique(executed)}
    inside = [(g, a, b) for g, a, b in gcs if b >= win.start_monotonic and a <= win.end_monotonic]
    causes: dict[str, int] = {}
    slowest = []
    for q in np.flatnonzero(lat > threshold):
        b = int(batch_of[q])
        r = recs[b]
        found = []
        if any(a <= r.done and e >= arr[q] for _, a, e in inside):
            found.append("gc")
        if run_ms[b] > 3 * median_run[r.executed] + 1.0:
            found.append("slow-batch")
        busy_until = recs[b - 1].done if b else 0.0
        if busy_until > arr[q] + 1e-4:
            found.append("queued")
        late_ms = (r.start - max(arr[q], busy_until)) * 1e3
        if late_ms > 2.0:
            found.append("late-start")
        if r.start - win.start_monotonic < 0.2:
            found.append("window-start")
        key = "+".join(found) or "unexplained"
        causes[key] = causes.get(key, 0) + 1
        slowest.append((float(lat[q]), round((r.start - arr[q]) * 1e3, 3), round(float(run_ms[b]), 3), key))
    slowest.sort(reverse=True)
    gaps = np.array([recs[i].start - recs[i - 1].done for i in range(1, len(recs))])
    runs = run_ms[1:]
    after_gap = {}
    for s in median_run:
        same = executed[1:] == s
        long, short = runs[same & (gaps > 0.02)], runs[same & (gaps < 0.002)]
        if len(long) >= 3 and len(short) >= 3:
            after_gap[s] = {
                "after_gap_over_20ms": float(np.median(long)),
                "after_gap_under_2ms": float(np.median(short)),
            }
    pauses = {}
    for g in (0, 1, 2):
        ms = [(e - a) * 1e3 for gen, a, e in inside if gen == g]
        if ms:
            pauses[g] = {"count": len(ms), "max_ms": round(max(ms), 3), "total_ms": round(sum(ms), 3)}
    return {
        "p50_ms": p50,
        "slow_threshold_ms": threshold,
        "slow_queries": int(np.count_nonzero(lat > threshold)),
        "causes": causes,
        "slowest": slowest[:12],
        "median_run_ms_by_executed": median_run,
        "run_ms_after_idle_gap": after_gap,
        "gc_in_window": pauses,
    }


def one_window(dev: NvmlDevice, runner: Any, batch: int, scenario: str, rate: float | None, window: float,
               options: dict[str, Any], log_dir: Path) -> dict[str, Any]:  # fmt: skip
    opts = dict(options)
    if rate is not None:
        opts["server_target_qps"] = float(rate)
    settings = WindowSettings(scenario=scenario, window_s=window, warmup_s=0.5, options=opts)
    telemetry = NvmlTelemetry(dev.nvml, dev.handle)
    watch = GcWatch()
    gc.callbacks.append(watch)
    try:
        win = run_window(runner, batch, settings, log_dir, meter=dev.make_meter(None), monitors=[telemetry])
    finally:
        gc.callbacks.remove(watch)
    m = build_measurement(win, dev.make_meter(None), "p99")
    loadgen = {
        k: v / 1e6 for k, v in win.summary.latencies_ns.items() if "percentile" in k or k.startswith(("Min", "Max"))
    }
    return {
        "scenario": scenario,
        "target_qps": rate,
        "valid": m.valid,
        "reason": m.reason,
        "j_per_query": m.j_per_query,
        "qps": m.qps,
        "avg_w": m.avg_w,
        "queries": m.queries,
        "duration_s": m.duration_s,
        "p50_ms": m.p50_ms,
        "p90_ms": m.p90_ms,
        "p99_ms": m.p99_ms,
        "sut_ms": {k: m.extra[f"sut_{k}_ms"] for k in ("p50", "p90", "p99")},
        "loadgen_latency_ms": loadgen,
        "batch_sizes": win.batch_sizes(),
        "padding": win.padding,
        "clock_reasons": f"0x{telemetry.reasons:x}",
        "stalls": stall_report(win, watch.events),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--window", type=float, default=5.0)
    parser.add_argument("--budget", type=float, default=330.0, help="seconds; later windows are skipped")
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}")
    args = parser.parse_args()
    modes = {name: MODES[name] for name in args.modes.split(",")}
    started = time.monotonic()
    dev = NvmlDevice(0)
    import torch

    result: dict[str, Any] = {
        "version": 1,
        "what": "Server at three rates and SingleStream, padded (before) and arrived (after) batches",
        "date_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": " ".join(["python3", *sys.argv]),
        "gpu": dev.gpu_name,
        "driver": dev.nvml.nvmlSystemGetDriverVersion(),
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "gc_threshold": gc.get_threshold(),
        "gc_objects_at_start": len(gc.get_objects()),
        "latency_clock": "p50/p90/p99: LoadGen's per-query figures (its clock, scheduled issue to completion); "
        "sut_ms: the SUT's per-query figures on time.monotonic (arrival at the SUT to the batch's end)",
        "rows": [],
        "skipped": [],
    }
    log_dir = Path("/tmp/powertune-serve-batching")
    for model, precision, channels_last, graph, batch, rates in CONFIGS:
        runner = make_runner(model, "cuda:0")
        t0 = time.monotonic()
        runner.prepare(batch, precision, {"channels_last": channels_last, "graph": graph})
        prepare_s = time.monotonic() - t0
        points = [("server", r) for r in rates] + [("singlestream", None)]
        for scenario, rate in points:
            for mode, options in modes.items():
                if mode == "arrived-gc" and rate != rates[0]:
                    continue
                config = {"model": model, "precision": precision, "channels_last": channels_last, "graph": graph,
                          "max_batch": batch, "mode": mode}  # fmt: skip
                if time.monotonic() - started > args.budget:
                    result["skipped"].append({**config, "scenario": scenario, "target_qps": rate})
                    continue
                row = one_window(dev, runner, batch, scenario, rate, args.window, options, log_dir)
                row = {**config, "prepare_s": prepare_s, **row}
                result["rows"].append(row)
                print(
                    f"{model} {graph} b{batch} {scenario} {rate} {mode}: p50 {row['p50_ms']:.2f} p90 "
                    f"{row['p90_ms']:.2f} p99 {row['p99_ms']:.2f} ms, {row['j_per_query']:.4f} J/q, "
                    f"{row['qps']:.0f} q/s, pad {row['padding']:.2f}, causes {row['stalls'].get('causes')}, "
                    f"gc {row['stalls'].get('gc_in_window')}",
                    flush=True,
                )
        runner.close()
        del runner
        torch.cuda.empty_cache()
    result["seconds"] = round(time.monotonic() - started, 1)
    args.out.write_text(json.dumps(result, indent=1, default=str))
    dev.close()


if __name__ == "__main__":
    main()
