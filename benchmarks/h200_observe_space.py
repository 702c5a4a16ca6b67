"""The whole observe-only H200 space of one model, every configuration measured in two windows.

Usage: python benchmarks/h200_observe_space.py --model resnet50 --out FILE [--window 1.2] [--budget 540]

In observe-only mode the H200's device knobs (SM clock, memory clock, power
limit) are pinned to what the card runs now, which leaves precision x
channels_last x graph x batch: 120 configurations. Each is measured through
the project's own path (``NvmlDevice.measure``: LoadGen Offline window, NVML
energy counter, telemetry for throttling), once in a first pass in grid order
and once more in a second pass in reverse order, so the two windows of one
configuration are minutes apart and their spread is measured noise, drift
included. For a model without 4-D float inputs (bert-base) channels_last does
nothing in the runner (runners/torch_runner.py), so only channels_last=false
is measured and the board answers the other from it.

The JSON is rewritten after every window, so a call cut short keeps what it
measured. Nothing on the card is changed: the card's state is read before and
after.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from pathlib import Path

from tuner.devices.nvml.device import NvmlDevice
from tuner.measure.settings import WindowSettings
from tuner.objective import METRIC_KEYS
from tuner.space import Config

CONV_MODELS = ("resnet50", "mobilenet_v2", "efficientnet_b0")
# The fields of each window's Measurement written to the raw file (tuner/devices/virtual/recorded.py reads them back):
# the metrics every trial records, and whether the window is trustworthy and how hot the card ran.
RECORDED = {*METRIC_KEYS, "valid", "reason", "temps_c"}
KEEP_EXTRA = ("stop_rule", "warmup_s", "loadgen_s", "runner_load_s", "runner_prepare_s", "clocks_event_reasons")


def grid(dev: NvmlDevice, model: str) -> list[Config]:
    space = dev.space()
    layouts = space.knobs["channels_last"].values if model in CONV_MODELS else [False]
    out = []
    for precision in space.knobs["precision"].values:
        for channels_last in layouts:
            for graph in space.knobs["graph"].values:
                for batch in space.batch_sizes:
                    knobs = {
                        **space.default_config(batch).knobs,
                        "precision": precision,
                        "channels_last": channels_last,
                        "graph": graph,
                    }
                    out.append(Config(knobs=knobs, batch_size=batch))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--window", type=float, default=1.2)
    parser.add_argument("--warmup", type=float, default=0.3)
    parser.add_argument("--budget", type=float, default=540.0, help="start no window after this many seconds")
    args = parser.parse_args()
    started = time.monotonic()
    import torch

    dev = NvmlDevice(0)
    settings = WindowSettings(window_s=args.window, warmup_s=args.warmup, log_dir="/tmp/powertune-observe-space")
    configs = grid(dev, args.model)
    plan = [(0, c) for c in configs] + [(1, c) for c in reversed(configs)]
    report = {
        "version": 1,
        "what": "observe-only H200 space, every configuration in two windows (benchmarks/h200_observe_space.py)",
        "date_utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": "python3 " + " ".join(["benchmarks/h200_observe_space.py", *sys.argv[1:]]),
        "device": dev.describe(),
        "torch": torch.__version__,
        "model": args.model,
        "settings": settings.model_dump(),
        "space": dev.space().model_dump(mode="json"),
        "card_before": dev.observe_only_state(),
        "rows": [],
        "skipped_for_time": 0,
    }
    for window, config in plan:
        if time.monotonic() - started > args.budget:
            report["skipped_for_time"] += 1
            continue
        row = {"window": window, "batch_size": config.batch_size, "config": config.knobs}
        try:
            m = dev.measure(args.model, config, settings)
            row.update(m.model_dump(include=RECORDED), **{k: m.extra.get(k) for k in KEEP_EXTRA})
        except Exception as exc:  # recorded, so one failing configuration does not lose the rest
            row["error"] = f"{type(exc).__name__}: {exc}"
        row["t_s"] = round(time.monotonic() - started, 2)
        report["rows"].append(row)
        args.out.write_text(json.dumps(report, indent=1, default=str) + "\n")
        print(
            window,
            config.knobs["precision"],
            "cl" if config.knobs["channels_last"] else "--",
            config.knobs["graph"][:5],
            config.batch_size,
            *(f"{row[k]:.4g}" if isinstance(row.get(k), float) else row.get(k) for k in ("j_per_query", "p99_ms")),
            row.get("valid"),
            row.get("error") or "",
            row["t_s"],
            flush=True,
        )
    dev.close_runner()
    report["card_after"] = dev.observe_only_state()
    report["seconds"] = round(time.monotonic() - started, 1)
    args.out.write_text(json.dumps(report, indent=1, default=str) + "\n")
    print("windows", len(report["rows"]), "skipped", report["skipped_for_time"], "seconds", report["seconds"])


if __name__ == "__main__":
    main()
