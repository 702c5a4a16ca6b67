"""Start-up and quick-start wall time of the README's first command, as a user runs it.

Runs ``tune run --model resnet50 --device sim:orin --max-latency 50ms`` (40
trials, default sampler, a fresh ``--out`` folder each time) as a new process
``--repeats`` times and reports the median of:

- start-up: from launching the process to the end of the first trial (read
  back from the study: trial 0's completion time);
- quick start: the whole command, results written.

Targets (issue 13): start-up under 2 s, quick start under 20 s on an idle
2-core machine. Say in the results whether the machine was shared.

    nice -n 10 .venv/bin/python benchmarks/startup.py --repeats 5 --note "shared with other work"
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import optuna

ROOT = Path(__file__).resolve().parents[1]
COMMAND = ["run", "--model", "resnet50", "--device", "sim:orin", "--max-latency", "50ms"]
STUDY = "resnet50|sim-orin|offline|50ms"


def one_run() -> tuple[float, float, float]:
    """Seconds to the first trial's end, for the whole command, and of CPU the command used.

    The CPU time is what a shared machine cannot inflate much: on an idle
    2-core machine the wall time of this single-process command is close to it.
    """
    with tempfile.TemporaryDirectory(prefix="startup-") as tmp:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        began_wall = dt.datetime.now()
        began = time.monotonic()
        cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
        done = subprocess.run(
            [sys.executable, "-m", "tuner", *COMMAND, "--out", tmp, "--json"],
            cwd=tmp,
            env=env,
            capture_output=True,
            text=True,
        )
        total = time.monotonic() - began
        cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (cpu_after.ru_utime - cpu_before.ru_utime) + (cpu_after.ru_stime - cpu_before.ru_stime)
        if done.returncode != 0:
            raise SystemExit(f"tune run failed: {done.stderr.strip().splitlines()[-1:]}")
        storage = optuna.storages.RDBStorage(f"sqlite:///{Path(tmp) / 'tune.db'}")
        try:
            first = optuna.load_study(study_name=STUDY, storage=storage).trials[0]
        finally:
            storage.engine.dispose()
        return (first.datetime_complete - began_wall).total_seconds(), total, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--note", default="", help="e.g. whether the machine was shared with other work")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "startup.md")
    args = parser.parse_args()
    runs = []
    for i in range(args.repeats):
        runs.append(one_run())
        first, whole, cpu = runs[-1]
        print(f"run {i}: first trial after {first:.2f} s, whole command {whole:.1f} s ({cpu:.1f} s CPU)", flush=True)
    first = statistics.median(r[0] for r in runs)
    whole = statistics.median(r[1] for r in runs)
    cpu = statistics.median(r[2] for r in runs)
    load = os.getloadavg()
    lines = [
        "# Start-up and quick start: `tune " + " ".join(COMMAND) + "` (40 trials, default sampler)",
        "",
        f"command: `{Path(sys.executable).name} benchmarks/startup.py {' '.join(sys.argv[1:])}`".rstrip(),
        "",
        f"date: {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC; machine: {platform.node()} "
        f"({platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}); "
        f"load average at the end {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}",
        "",
        f"note: {args.note or '-'}",
        "",
        "| | median of " + str(len(runs)) + " | runs | target (idle 2-core machine) |",
        "|---|---|---|---|",
        f"| start-up to the end of the first trial | {first:.2f} s | "
        + ", ".join(f"{r[0]:.2f}" for r in runs)
        + " | < 2 s |",
        f"| whole quick start (40 trials, results written) | {whole:.1f} s | "
        + ", ".join(f"{r[1]:.1f}" for r in runs)
        + " | < 20 s |",
        f"| CPU time of the whole quick start (user + system) | {cpu:.1f} s | "
        + ", ".join(f"{r[2]:.1f}" for r in runs)
        + " | - |",
        "",
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
