"""Time LearnedSampler.propose per call in the README quick start's loop (sim:orin, resnet50, 50 ms, 40 trials).

Usage: PYTHONPATH=. python benchmarks/propose_time.py [SEEDS]   (figures: benchmarks/results/search.md)
"""

from __future__ import annotations

import os
import statistics
import sys
import time

from tuner import strategies
from tuner.devices.twin import TwinDevice
from tuner.study import MEMORY_STORAGE, RunOptions, run_study

calls: list[float] = []
_propose = strategies.LearnedSampler.propose


def timed(self: strategies.LearnedSampler, study) -> object:
    started = time.perf_counter()
    out = _propose(self, study)
    calls.append(time.perf_counter() - started)
    return out


def main() -> None:
    strategies.LearnedSampler.propose = timed
    for seed in range(int(sys.argv[1]) if len(sys.argv) > 1 else 3):
        calls.clear()
        started = time.perf_counter()
        options = RunOptions(model="resnet50", max_latency_ms=50.0, trials=40, seed=seed, storage=MEMORY_STORAGE)
        run_study(TwinDevice("sim:orin"), options)
        wall = time.perf_counter() - started
        print(
            f"seed {seed}: run_study {wall:.1f} s, propose {len(calls)} calls, total {sum(calls):.2f} s, "
            f"mean {statistics.mean(calls):.3f} s, max {max(calls):.3f} s, load {os.getloadavg()[0]:.1f}"
        )


if __name__ == "__main__":
    main()
