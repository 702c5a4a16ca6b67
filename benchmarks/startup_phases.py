"""CPU seconds by phase of the README's quick start, in one process, without a profiler's overhead.

cProfile inflates import-heavy and call-heavy code several times over, so
this wraps the few functions that bound each phase with CPU-time
accumulators (a nested call is counted once) and runs ``tune run --model
resnet50 --device sim:orin --max-latency 50ms`` in-process, in a fresh
``--out`` folder. It prints one JSON object; run it against two checkouts
(``PYTHONPATH=<checkout>``) to compare them.

    PYTHONPATH=. python benchmarks/startup_phases.py
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

began = time.process_time()
import tuner.cli.root  # noqa: E402  (timed: the import is a phase; tuner.cli alone is light)

IMPORTS = time.process_time() - began

import optuna.storages._rdb.storage as rdb  # noqa: E402

import tuner.storage  # noqa: E402
import tuner.strategies  # noqa: E402
import tuner.study  # noqa: E402
from tuner.cli import tuning  # noqa: E402

COMMAND = ["run", "--model", "resnet50", "--device", "sim:orin", "--max-latency", "50ms"]
spent: dict[str, float] = {}


def timed(owner: Any, name: str, phase: str) -> None:
    """Replace ``owner.name`` by a wrapper adding its CPU time to ``phase`` (outermost call only)."""
    inner: Callable = getattr(owner, name)
    depth = [0]

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if depth[0]:
            return inner(*args, **kwargs)
        depth[0] += 1
        start = time.process_time()
        try:
            return inner(*args, **kwargs)
        finally:
            spent[phase] = spent.get(phase, 0.0) + time.process_time() - start
            depth[0] -= 1

    setattr(owner, name, wrapper)


def main() -> None:
    timed(tuner.study, "open_study", "study setup: open the storage")
    timed(tuner.study, "_stamp", "study setup: study attributes")
    timed(tuner.strategies.LearnedSampler, "propose", "default strategy's proposals")
    timed(rdb.RDBStorage, "set_trial_user_attr", "trial user-attribute writes")
    if hasattr(tuner.storage.FleetStorage, "set_trial_user_attrs"):
        timed(tuner.storage.FleetStorage, "set_trial_user_attrs", "trial user-attribute writes")
    timed(tuner.study, "_optimize", "the trial loop (all 40 trials)")
    timed(tuning, "write_results", "results written (pareto, trials.csv, plot)")
    first: dict[str, float] = {}
    update = tuning.trial_progress.update

    def after_trial(self: Any, *args: Any) -> None:
        first.setdefault("cpu", time.process_time())
        update(self, *args)

    tuning.trial_progress.update = after_trial
    with tempfile.TemporaryDirectory(prefix="phases-") as out:
        sys.argv = ["tune", *COMMAND, "--out", out]
        try:
            tuner.cli.main()
        except SystemExit as exc:
            if exc.code:
                raise
    report = {
        "imports (tuner.cli)": IMPORTS,
        **spent,
        "CPU to the end of the first trial": first.get("cpu", float("nan")),
        "CPU of the whole process": time.process_time(),
    }
    print(json.dumps({k: round(v, 2) for k, v in report.items()}, indent=1), file=sys.stderr)


if __name__ == "__main__":
    main()
