"""Start-up and quick-start wall time of the README's first command, as a user runs it.

Runs the README's ``tune run --model resnet50 --device sim:orin --max-latency
50ms`` (40 trials, default sampler) with this environment's ``tune`` script,
in a fresh empty folder each time, as a new process ``--repeats`` times, and
reports the median of:

- start-up: from launching the process to the end of the first trial (read
  back from the study: trial 0's completion time; its start is shown too);
- quick start: the whole command, results written.

Targets (set for a newcomer's first hour): start-up under 2 s, quick start under 20 s on an idle
2-core machine; the exit code is 1 when a median misses one. The load
average before and after goes into the results: say whether the machine was
shared.

``--baseline DIR`` (a checkout of earlier code, e.g. ``git worktree add DIR
COMMIT``) runs that code's quick start before each run of this one, with the
same ``tune`` script, so both are measured in the same conditions; the table
adds its CPU time and the ratio. A BLAS thread setting in this environment
is not passed on: each code version runs with the threads it chooses.

    nice -n 10 .venv/bin/python benchmarks/startup.py --repeats 5 --note "shared with other work"
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import sys
import tempfile
from pathlib import Path

import optuna
from tune_process import machine_line, run_tune, tune_command

ROOT = Path(__file__).resolve().parents[1]
COMMAND = ["run", "--model", "resnet50", "--device", "sim:orin", "--max-latency", "50ms"]
STUDY = "resnet50|sim-orin|offline|50ms"
FIRST_TRIAL_TARGET_S = 2.0
QUICK_START_TARGET_S = 20.0


def one_run(root: Path = ROOT) -> tuple[float, float, float, float]:
    """Seconds to the first trial's start and end, for the whole command, and of CPU the command used.

    The README's command exactly: no ``--out`` or ``--json``, run in a fresh
    empty folder (so ``studies/`` is created there, as in a fresh clone). The
    CPU time is what a shared machine cannot inflate much: on an idle 2-core
    machine the wall time of this single-process command is close to it.
    """
    with tempfile.TemporaryDirectory(prefix="startup-") as tmp:
        env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
        env["PYTHONPATH"] = str(root)
        began_wall = dt.datetime.now()
        done, total, cpu = run_tune(COMMAND, tmp, env)
        if done.returncode != 0:
            raise SystemExit(f"tune run failed: {done.stderr.strip().splitlines()[-1:]}")
        storage = optuna.storages.RDBStorage(f"sqlite:///{Path(tmp) / 'studies' / 'tune.db'}")
        try:
            first = optuna.load_study(study_name=STUDY, storage=storage).trials[0]
        finally:
            storage.engine.dispose()
        # Optuna stamps trials with the local wall clock, as began_wall is.
        return (
            (first.datetime_start - began_wall).total_seconds(),
            (first.datetime_complete - began_wall).total_seconds(),
            total,
            cpu,
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--note", default="", help="e.g. whether the machine was shared with other work")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "startup.md")
    parser.add_argument("--baseline", type=Path, help="a checkout of earlier code, measured before each run")
    args = parser.parse_args()
    load_before = os.getloadavg()
    runs = []
    before: list[float] = []
    for i in range(args.repeats):
        if args.baseline is not None:
            before.append(one_run(args.baseline.resolve())[3])
            print(f"run {i}, baseline: {before[-1]:.1f} s CPU", flush=True)
        runs.append(one_run())
        started, first, whole, cpu = runs[-1]
        print(
            f"run {i}: first trial started after {started:.2f} s, ended after {first:.2f} s, "
            f"whole command {whole:.1f} s ({cpu:.1f} s CPU)",
            flush=True,
        )
    started, first, whole, cpu = (statistics.median(r[i] for r in runs) for i in range(4))
    load = os.getloadavg()
    met = first < FIRST_TRIAL_TARGET_S and whole < QUICK_START_TARGET_S

    def row(what: str, i: int, fmt: str, target: str) -> str:
        median = statistics.median(r[i] for r in runs)
        return f"| {what} | {median:{fmt}} s | " + ", ".join(f"{r[i]:{fmt}}" for r in runs) + f" | {target} |"

    lines = [
        "# Start-up and quick start: `tune " + " ".join(COMMAND) + "` (40 trials, default sampler)",
        "",
        f"command: `{Path(sys.executable).name} benchmarks/startup.py {' '.join(sys.argv[1:])}`".rstrip(),
        f"measured: `{' '.join(Path(c).name for c in tune_command()[:1])} {' '.join(COMMAND)}` in a fresh empty "
        "folder, as the README runs it (a twin: no hardware is measured)",
        "",
        machine_line(load_before, load),
        "",
        f"note: {args.note or '-'}",
        "",
        "| | median of " + str(len(runs)) + " | runs | target (idle 2-core machine) |",
        "|---|---|---|---|",
        row("start-up to the start of the first trial", 0, ".2f", "-"),
        row("start-up to the end of the first trial", 1, ".2f", f"< {FIRST_TRIAL_TARGET_S:g} s"),
        row("whole quick start (40 trials, results written)", 2, ".1f", f"< {QUICK_START_TARGET_S:g} s"),
        row("CPU time of the whole quick start (user + system)", 3, ".1f", "-"),
    ]
    if before:
        lines += [
            f"| CPU time of the whole quick start, code of {args.baseline} (run before each run above) | "
            f"{statistics.median(before):.1f} s | " + ", ".join(f"{b:.1f}" for b in before) + " | - |",
            "",
            f"CPU time now / before: {cpu / statistics.median(before):.2f} (medians of runs taken in turn)",
        ]
    lines += [
        "",
        f"targets {'met' if met else 'NOT met'} (medians: first trial {first:.2f} s, quick start {whole:.1f} s, "
        f"first trial started at {started:.2f} s, {cpu:.1f} s CPU)",
        "",
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines))
    print("\n".join(lines))
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
