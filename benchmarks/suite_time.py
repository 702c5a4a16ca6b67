"""How long the test suite takes, in wall seconds and in CPU seconds per test (robust to a shared machine).

Runs ``pytest -m "not slow"`` (or the whole suite with ``--all``) with this file loaded as a
pytest plugin, and writes benchmarks/results/suite-time[-all].md: the date, the machine, its load
average before and after, the wall time, the CPU time of the run (pytest and every process it
started), and the 25 tests that cost the most CPU. On a machine that others share the wall time
follows the load; the CPU time is what an idle machine of the same speed would take, give or
take the seconds spent waiting on windows, sockets and sleeps.

    python benchmarks/suite_time.py          # the fast subset, as the README offers it
    python benchmarks/suite_time.py --all    # the whole suite
"""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_rows: list[tuple[float, float, str]] = []
_outcomes: dict[str, int] = {}


def _cpu() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    c0, w0 = _cpu(), time.monotonic()
    yield
    _rows.append((_cpu() - c0, time.monotonic() - w0, item.nodeid))


def pytest_runtest_logreport(report):
    if report.when == "call" or report.outcome != "passed":
        _outcomes[report.outcome] = _outcomes.get(report.outcome, 0) + 1
        if report.outcome == "failed":
            _outcomes.setdefault("failed: " + report.nodeid, 1)


def pytest_terminal_summary(terminalreporter):
    out = os.environ.get("SUITE_TIME_ROWS")
    if out:
        with open(out + ".outcomes", "w") as fh:
            fh.write(", ".join(f"{n} {k}" if not k.startswith("failed: ") else k for k, n in _outcomes.items()))
        with open(out, "w") as fh:
            fh.writelines(f"{cpu:.2f}\t{wall:.2f}\t{node}\n" for cpu, wall, node in sorted(_rows, reverse=True))


def main(argv: list[str]) -> None:
    whole = "--all" in argv
    rows_file = Path(tempfile.mkstemp(suffix=".tsv")[1])
    command = [sys.executable, "-m", "pytest", "-q", "-p", "suite_time", "-p", "no:randomly"]
    if not whole:
        command += ["-m", "not slow"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "benchmarks"), os.environ.get("PYTHONPATH", "")])}
    env["SUITE_TIME_ROWS"] = str(rows_file)
    load_before = os.getloadavg()
    start, cpu0 = time.monotonic(), os.times()
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.monotonic() - start
    cpu1 = os.times()
    cpu = (cpu1.children_user - cpu0.children_user) + (cpu1.children_system - cpu0.children_system)
    load_after = os.getloadavg()
    rows = [line.split("\t") for line in rows_file.read_text().splitlines()]
    outcomes = Path(f"{rows_file}.outcomes")
    said = outcomes.read_text() if outcomes.exists() else proc.stderr[-500:]
    name = "suite-time-all.md" if whole else "suite-time.md"
    lines = [
        f"# Test suite time: {'the whole suite' if whole else 'the fast subset'}",
        "",
        f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
        f"- machine: {platform.node()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        f"- command: `python benchmarks/suite_time.py{' --all' if whole else ''}` (runs `{' '.join(command[2:])}`)",
        f"- load average (1, 5, 15 min) before: {', '.join(f'{x:.1f}' for x in load_before)}; "
        f"after: {', '.join(f'{x:.1f}' for x in load_after)}",
        f"- outcomes: {said} (pytest exit code {proc.returncode})",
        f"- wall: {wall:.0f} s ({wall / 60:.1f} min); CPU (user+sys, pytest and its subprocesses): "
        f"{cpu:.0f} s ({cpu / 60:.1f} min); CPU of the tests themselves: {sum(float(r[0]) for r in rows):.0f} s",
        "",
        "| CPU s | wall s | test |",
        "|---:|---:|---|",
        *(f"| {r[0]} | {r[1]} | {r[2]} |" for r in rows[:25]),
        "",
    ]
    (ROOT / "benchmarks" / "results" / name).write_text("\n".join(lines))
    rows_file.unlink()
    outcomes.unlink(missing_ok=True)
    print("\n".join(lines))


if __name__ == "__main__":
    main(sys.argv[1:])
