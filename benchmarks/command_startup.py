"""Wall and CPU time of light ``tune`` commands, each a new process, against earlier code in turn.

The commands a user types between runs: ``tune --help``, ``tune status``
in an empty folder (the one-line "no study storage" error, exit code 2, after
the command's imports), and ``tune status`` and ``tune export`` of a small
twin study made once at the start (8 trials on sim:orin, by this code; both
versions read the same file). Their cost is almost all Python imports, so
the figures measure what each code version imports.

``--baseline DIR`` (a ``git archive`` of earlier code) runs the same command
with that code just before each run of this one, with the same ``tune``
script and PYTHONPATH pointing at the code measured, so both see the same
load; the table gives medians of each and their ratio.

    nice -n 10 .venv/bin/python benchmarks/command_startup.py --repeats 9 --baseline /tmp/base --note "shared"
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

from tune_process import machine_line, run_tune

ROOT = Path(__file__).resolve().parents[1]
STUDY = ["--model", "resnet50", "--device", "sim:orin", "--max-latency", "50ms"]
COMMANDS: dict[str, tuple[list[str], str, int]] = {
    "tune --help": (["--help"], "empty", 0),
    "tune status (empty folder)": (["status"], "empty", 2),
    "tune status (8-trial twin study)": (["status", *STUDY], "study", 0),
    "tune export (8-trial twin study)": (["export", *STUDY, "-o", "best.yaml"], "study", 0),
}


def one_run(code: Path, args: list[str], cwd: Path, expected: int) -> tuple[float, float]:
    """Wall and CPU seconds (user + system) of ``tune ARGS`` in CWD with the tuner of CODE."""
    done, wall, cpu = run_tune(args, cwd, {**os.environ, "PYTHONPATH": str(code)})
    if done.returncode != expected:
        raise SystemExit(f"tune {' '.join(args)} exited {done.returncode}: {done.stderr.strip()[-300:]}")
    return wall, cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--baseline", type=Path, required=True, help="a checkout of earlier code")
    parser.add_argument("--note", default="", help="e.g. whether the machine was shared with other work")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "command-startup.md")
    args = parser.parse_args()
    baseline = args.baseline.resolve()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="command-startup-") as tmp:
        folders = {"empty": Path(tmp) / "empty", "study": Path(tmp) / "study"}
        for folder in folders.values():
            folder.mkdir()
        one_run(ROOT, ["run", *STUDY, "--trials", "8", "--seed", "1"], folders["study"], 0)
        times: dict[str, dict[str, list[tuple[float, float]]]] = {}
        for i in range(args.repeats):
            for name, (argv, where, expected) in COMMANDS.items():
                runs = times.setdefault(name, {"before": [], "now": []})
                runs["before"].append(one_run(baseline, argv, folders[where], expected))
                runs["now"].append(one_run(ROOT, argv, folders[where], expected))
                before, now = runs["before"][-1][0], runs["now"][-1][0]
                print(f"run {i}, {name}: before {before:.2f} s, now {now:.2f} s", flush=True)
    load = os.getloadavg()

    def median(runs: list[tuple[float, float]], i: int) -> float:
        return statistics.median(r[i] for r in runs)

    lines = [
        "# Start-up of light commands: `tune --help`, `tune status`, `tune export`",
        "",
        f"command: `{Path(sys.executable).name} benchmarks/command_startup.py {' '.join(sys.argv[1:])}`",
        "each command a new process with this environment's `tune` script; before (the baseline's code) and "
        "now run in turn, one pair per command per round",
        "",
        machine_line(load_before, load),
        "",
        f"note: {args.note or '-'}",
        "",
        f"| command (median of {args.repeats}) | wall before | wall now | now / before | CPU before | CPU now | "
        "now / before |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, runs in times.items():
        wb, wn = median(runs["before"], 0), median(runs["now"], 0)
        cb, cn = median(runs["before"], 1), median(runs["now"], 1)
        lines.append(f"| {name} | {wb:.2f} s | {wn:.2f} s | {wn / wb:.2f} | {cb:.2f} s | {cn:.2f} s | {cn / cb:.2f} |")
    lines += ["", "all runs (wall s, before / now):", ""]
    for name, runs in times.items():
        pairs = ", ".join(f"{b[0]:.2f}/{n[0]:.2f}" for b, n in zip(runs["before"], runs["now"], strict=True))
        lines.append(f"- {name}: {pairs}")
    lines.append("")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
