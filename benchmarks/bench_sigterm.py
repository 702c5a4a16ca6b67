"""Seconds from SIGTERM to the exit of ``tune bench --quick``, earlier code and this code in turn.

Each delay starts ``tune bench --quick`` as a new process (this
environment's ``tune`` script, PYTHONPATH at the code measured), sends it
SIGTERM that many seconds after its start and times the exit; before and now
run back to back at each delay, so both see the same load. A run that ended
before its signal is counted as finished, not timed. The exit code and the
last line of stderr are recorded with each time.

    nice -n 10 python benchmarks/bench_sigterm.py --baseline /tmp/base --delays 1-7 --step 0.5 --note "shared"
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tune_process import machine_line, tune_command

ROOT = Path(__file__).resolve().parents[1]


def one_run(code: Path, delay: float, out: Path) -> tuple[float | None, int, str]:
    """Seconds from SIGTERM to exit (None: ended before the signal), the exit code, stderr's last line."""
    env = {**os.environ, "PYTHONPATH": str(code)}
    proc = subprocess.Popen(
        [*tune_command(), "bench", "--quick", "--out", str(out)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        proc.wait(timeout=delay)
        lag = None
    except subprocess.TimeoutExpired:
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=600)
        lag = time.monotonic() - sent
    err = proc.stderr.read() if proc.stderr else ""
    return lag, proc.returncode, (err.strip().splitlines() or [""])[-1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", type=Path, required=True, help="a checkout of earlier code")
    parser.add_argument("--delays", default="1-7", help="seconds after the start, LOW-HIGH")
    parser.add_argument("--step", type=float, default=0.5, help="seconds between two delays")
    parser.add_argument("--note", default="", help="e.g. whether the machine was shared with other work")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "bench-sigterm.md")
    args = parser.parse_args()
    low, high = (float(x) for x in args.delays.split("-"))
    delays = [low + k * args.step for k in range(round((high - low) / args.step) + 1)]
    codes = {"before": args.baseline.resolve(), "now": ROOT}
    load_before = os.getloadavg()
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-sigterm-") as tmp:
        for delay in delays:
            row = {"delay": delay}
            for name, code in codes.items():
                row[name] = one_run(code, delay, Path(tmp) / f"{name}-{delay:g}")
            rows.append(row)
            print(f"delay {delay:g} s: " + "; ".join(f"{n} {row[n]}" for n in codes), flush=True)
    load = os.getloadavg()

    def timed(name: str) -> list[float]:
        return [row[name][0] for row in rows if row[name][0] is not None]

    def cell(result: tuple[float | None, int, str]) -> str:
        lag, code, last = result
        return f"finished ({code})" if lag is None else f"{lag:.2f} s ({code}: {last})"

    lines = [
        "# SIGTERM to exit of `tune bench --quick`",
        "",
        f"command: `{Path(sys.executable).name} benchmarks/bench_sigterm.py {' '.join(sys.argv[1:])}`",
        "each delay: before (the baseline's code) then now, each a new `tune bench --quick` process signalled "
        "that many seconds after its start",
        "",
        machine_line(load_before, load),
        "",
        f"note: {args.note or '-'}",
        "",
        "| code | signalled runs | median s to exit | longest s to exit |",
        "|---|---|---|---|",
    ]
    for name in codes:
        lags = timed(name)
        if lags:
            lines.append(f"| {name} | {len(lags)} | {statistics.median(lags):.2f} | {max(lags):.2f} |")
    lines += ["", "| delay s | before | now |", "|---|---|---|"]
    lines += [f"| {row['delay']:g} | {cell(row['before'])} | {cell(row['now'])} |" for row in rows]
    lines.append("")
    args.out.write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
