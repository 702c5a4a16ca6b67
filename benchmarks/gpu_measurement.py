"""Measurement quality on a real NVIDIA GPU, observe-only: repeatability, meter agreement, overhead.

Usage: python benchmarks/gpu_measurement.py --out DIR [--index 0] [--window 10] [--repeats 5]

Nothing on the card is changed: the NVML device is opened observe-only, so
only batch size and precision vary and no NVML set function is called. The
card's clocks and power limit are read before and after and both are written
to the result, so the claim can be checked.

Three figures, each for a throughput-bound (resnet50 fp16 bs 128) and a
launch-bound (resnet50 fp16 bs 8) configuration:
- repeatability: coefficient of variation of energy per query over N windows;
- meter agreement: the sampled-power integral (50 ms polls of
  nvmlDeviceGetPowerUsage) over the energy-counter delta, in the same windows;
- overhead: queries/s of the LoadGen window with metering (and the telemetry
  monitor a trial runs) against the bare runner loop (infer() back to back for
  the same duration), same runner.
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
from tuner.measure.meters import EnergyReading, SampledPowerMeter
from tuner.measure.session import measure_with
from tuner.measure.settings import WindowSettings
from tuner.space import Config


class PairedMeter:
    """Both NVML meters over exactly the same window; reports the counter, keeps the sampled reading."""

    def __init__(self, counter: NvmlEnergyMeter, sampled: SampledPowerMeter) -> None:
        self.counter = counter
        self.sampled = sampled
        self.name = counter.name
        self.rails = counter.rails
        self.min_window_s = counter.min_window_s
        self.last_sampled: EnergyReading | None = None

    def start(self) -> None:
        self.sampled.start()
        self.counter.start()

    def stop(self) -> EnergyReading:
        reading = self.counter.stop()
        self.last_sampled = self.sampled.stop()
        return reading


def bare_qps(runner, batch_size: int, seconds: float) -> float:
    runner.infer()
    start = time.monotonic()
    n = 0
    while time.monotonic() - start < seconds:
        runner.infer()
        n += 1
    return n * batch_size / (time.monotonic() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--index", type=int, default=0)
    parser.add_argument("--window", type=float, default=10.0)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batch-sizes", default="128,8", help="configurations (resnet50 fp16) to measure")
    parser.add_argument("--poll-ms", default="5", help="energy-counter poll periods to compare, e.g. 5,20")
    parser.add_argument("--no-sampled", action="store_true", help="leave the sampled-power meter out (overhead runs)")
    parser.add_argument("--logs", type=Path, default=Path("/tmp/powertune-loadgen"), help="LoadGen log folder")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    dev = NvmlDevice(args.index)
    before = dev.observe_only_state()
    space = dev.space()
    result: dict = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "device": dev.describe(),
        "window_s": args.window,
        "repeats": args.repeats,
        "card_before": before,
        "configs": [],
    }
    for batch in (int(b) for b in args.batch_sizes.split(",")):
        config = Config(knobs={**space.default_config(batch).knobs, "precision": "fp16"}, batch_size=batch)
        dev.apply(config)
        settings = WindowSettings(window_s=args.window, warmup_s=3.0, log_dir=str(args.logs / f"bs{batch}"))
        runner = dev.runners.get("resnet50", config, space)
        for poll_ms in (float(p) for p in args.poll_ms.split(",")):
            summary = measure_config(dev, runner, config, batch, settings, args, poll_ms)
            result["configs"].append(summary)
            print(json.dumps({k: v for k, v in summary.items() if k != "rows"}), flush=True)
    dev.close_runner()
    result["card_after"] = dev.observe_only_state()
    result["card_untouched"] = result["card_after"] == before
    (args.out / "gpu_measurement.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    print("card untouched:", result["card_untouched"])


def measure_config(dev, runner, config, batch, settings, args, poll_ms: float) -> dict:
    """Repeated windows of one configuration with the counter polled every ``poll_ms``, then the bare loop."""
    rows = []
    for i in range(args.repeats):
        counter = NvmlEnergyMeter(dev.nvml, dev.handle, poll_s=poll_ms / 1000)
        meter = counter if args.no_sampled else PairedMeter(counter, dev.make_meter("nvml-power"))
        window = settings.model_copy(update={"log_dir": f"{settings.log_dir}-{i}"})
        m = measure_with(runner, meter, batch, window, monitors=[NvmlTelemetry(dev.nvml, dev.handle)])
        sampled = None if args.no_sampled else meter.last_sampled.energy_j
        rows.append(
            {
                "j_per_query": m.j_per_query,
                "qps": m.qps,
                "avg_w": m.avg_w,
                "p99_ms": m.p99_ms,
                "valid": m.valid,
                "reason": m.reason,
                "counter_j": m.energy_j,
                "sampled_j": sampled,
            }
        )
        line = f"bs{batch} poll {poll_ms:g} ms repeat {i}: {m.j_per_query:.5f} J/q {m.qps:.0f} q/s {m.avg_w:.0f} W"
        print(line, m.reason, flush=True)
    bare = [bare_qps(runner, batch, args.window) for _ in range(2)]
    energies = [r["j_per_query"] for r in rows]
    loadgen_qps = statistics.median(r["qps"] for r in rows)
    ratios = [r["sampled_j"] / r["counter_j"] for r in rows if r["sampled_j"] is not None]
    return {
        "config": config.label(),
        "poll_ms": poll_ms,
        "sampled_meter_running": not args.no_sampled,
        "rows": rows,
        "bare_qps": bare,
        "median_j_per_query": statistics.median(energies),
        "cv_j_per_query": statistics.stdev(energies) / statistics.mean(energies) if len(energies) > 1 else 0.0,
        "median_sampled_over_counter": statistics.median(ratios) if ratios else None,
        "median_loadgen_qps": loadgen_qps,
        "median_bare_qps": statistics.median(bare),
        "overhead": 1 - loadgen_qps / statistics.median(bare),
    }


if __name__ == "__main__":
    main()
