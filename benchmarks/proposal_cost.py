"""CPU a proposal of the default strategy costs in the quick start, this code against earlier code, in turn.

Each run is the README's quick start (``tune run --model resnet50 --device
sim:orin --max-latency 50ms``, 40 trials, ``--seed`` given) in a fresh folder
and a fresh process, with a CPU timer (time.process_time) around every
``LearnedSampler.propose``; the process's whole CPU time is reported too. A
code version is a folder put first on the path (a checkout, e.g. ``git
worktree add DIR COMMIT``) and a BLAS thread setting: ``threads=default``
leaves OpenBLAS to choose, as a process that does not set it (the code
before tune held it to one thread in launch.py), ``threads=1`` is what tune
sets now. Versions run in turn, ``--repeats`` times, so a shared machine's
load falls on all alike; the proposals of every run are compared (a version
that proposes differently is flagged).

    PYTHONPATH=. python benchmarks/proposal_cost.py --version before=/path/to/old:default \\
        --version before-1thread=/path/to/old:1 --version now=.:1 --repeats 3 --out results/proposal-cost.md
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import statistics
import sys
import tempfile
from pathlib import Path

from tune_process import child_json

ROOT = Path(__file__).resolve().parents[1]
STUDY = "resnet50|sim-orin|offline|50ms"
CHILD = r"""
import json, os, resource, sys, time
from tuner.strategies import learned
spent = []
propose = learned.LearnedSampler.propose
def timed(self, study):
    started = time.process_time()
    try:
        return propose(self, study)
    finally:
        spent.append(time.process_time() - started)
learned.LearnedSampler.propose = timed
from tuner.cli.root import main
seed = sys.argv[1]
sys.argv = ["tune", "run", "--model", "resnet50", "--device", "sim:orin", "--max-latency", "50ms", "--seed", seed]
out = sys.stdout
sys.stdout = open(os.devnull, "w")
try:
    main()
except SystemExit:
    pass
import optuna
study = optuna.load_study(study_name=STUDY_NAME, storage="sqlite:///studies/tune.db")
keys = [t.user_attrs.get("effective_key") for t in study.trials]
usage = resource.getrusage(resource.RUSAGE_SELF)
out.write(json.dumps({"spent": spent, "cpu": usage.ru_utime + usage.ru_stime, "keys": keys}))
""".replace("STUDY_NAME", repr(STUDY))


def one_run(code: Path, threads: str, seed: int) -> dict:
    """One quick start of ``code`` in a fresh folder and process: per-proposal CPU, process CPU, proposals."""
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    if threads != "default":
        env["OPENBLAS_NUM_THREADS"] = threads
    with tempfile.TemporaryDirectory(prefix="proposal-cost-") as tmp:
        return child_json(code, CHILD, [str(seed)], env, cwd=tmp)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="append", required=True, help="NAME=DIR:THREADS (THREADS: default or 1)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    versions = []
    for spec in args.version:
        name, rest = spec.split("=", 1)
        folder, threads = rest.rsplit(":", 1)
        versions.append((name, Path(folder).resolve(), threads))
    load_before = os.getloadavg()
    runs: dict[str, list[dict]] = {name: [] for name, _, _ in versions}
    for i in range(args.repeats):
        for name, folder, threads in versions:
            runs[name].append(one_run(folder, threads, args.seed))
            r = runs[name][-1]
            print(f"repeat {i} {name}: {statistics.mean(r['spent']) * 1000:.0f} ms a proposal, {r['cpu']:.1f} s CPU")
    load = os.getloadavg()
    first = next(iter(runs.values()))[0]["keys"]
    lines = [
        "# CPU of the default strategy's proposals in the quick start (sim:orin, resnet50, p99 <= 50 ms, 40 trials)",
        "",
        f"command: `PYTHONPATH=. python benchmarks/proposal_cost.py {' '.join(sys.argv[1:])}`",
        "",
        f"date: {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC; machine: {platform.node()} "
        f"({platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}); load average "
        f"before {load_before[0]:.1f}, after {load[0]:.1f}; seed {args.seed}; versions run in turn",
        "",
        "| version | code | BLAS threads | mean ms a proposal (median of runs) | runs | first proposal ms "
        "| mean of the rest | process CPU s (median) | same proposals as the first version |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, folder, threads in versions:
        rs = runs[name]
        means = [statistics.mean(r["spent"]) * 1000 for r in rs]
        firsts = [max(r["spent"]) * 1000 for r in rs]
        rest = [statistics.mean(sorted(r["spent"])[:-1]) * 1000 for r in rs]
        same = all(r["keys"] == first for r in rs)
        lines.append(
            f"| {name} | {folder.name} | {threads} | {statistics.median(means):.0f} | "
            f"{', '.join(f'{m:.0f}' for m in means)} | {statistics.median(firsts):.0f} | "
            f"{statistics.median(rest):.0f} | {statistics.median(r['cpu'] for r in rs):.1f} | "
            f"{'yes' if same else 'no'} |"
        )
    lines += [
        "",
        "first proposal: the dearest one (it imports scipy.optimize and builds the space's tables); mean of the "
        "rest: the other 39.",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if args.out is not None:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
