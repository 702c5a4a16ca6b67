"""How long the test suite takes, in wall seconds and in CPU seconds per test (robust to a shared machine).

Runs ``pytest -m "not slow"`` (or the whole suite with ``--all``) as the README offers it, so with the
pytest-xdist workers that pyproject.toml's ``addopts`` asks for (``-n auto``: one per core), with this
file loaded as a pytest plugin in every worker, and writes benchmarks/results/suite-time[-all].md: the
date, the machine, its load average before and after, the wall time, the CPU time of the run (pytest,
its workers and every process they started), the 25 tests that cost the most CPU and the 10 that
waited the most. On a machine that others share the wall time follows the load; the CPU time is what
an idle machine of the same speed would spend, give or take the seconds spent waiting on windows,
sockets and sleeps.

    python benchmarks/suite_time.py          # the fast subset, as the README offers it
    python benchmarks/suite_time.py --all    # the whole suite
    python benchmarks/suite_time.py -n 0     # ... in one process (extra arguments go to pytest)
"""

from __future__ import annotations

import datetime
import os
import platform
import resource
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


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


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


def pytest_sessionfinish(session):
    """Each process (the controller, every xdist worker) leaves its rows and its own CPU in a file of its own."""
    out = os.environ.get("SUITE_TIME_ROWS")
    if not out:
        return
    worker = getattr(session.config, "workerinput", {}).get("workerid", "main")
    with open(f"{out}.{worker}", "w") as fh:
        fh.write(f"#cpu\t{_cpu():.2f}\n")
        fh.writelines(f"{cpu:.2f}\t{wall:.2f}\t{node}\n" for cpu, wall, node in _rows)
    if worker == "main":  # only the controller sees every report once
        with open(out + ".outcomes", "w") as fh:
            fh.write(", ".join(f"{n} {k}" if not k.startswith("failed: ") else k for k, n in _outcomes.items()))


def main(argv: list[str]) -> None:
    whole = "--all" in argv
    extra = [a for a in argv if a != "--all"]
    rows_base = tempfile.mkdtemp(prefix="suite-time-")
    rows_file = os.path.join(rows_base, "rows")
    command = [sys.executable, "-m", "pytest", "-p", "suite_time", "-p", "no:randomly", *extra]
    if not whole:
        command += ["-m", "not slow"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "benchmarks"), os.environ.get("PYTHONPATH", "")])}
    env["SUITE_TIME_ROWS"] = rows_file
    load_before = os.getloadavg()
    start, cpu0 = time.monotonic(), _children_cpu()
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.monotonic() - start
    cpu = _children_cpu() - cpu0
    load_after = os.getloadavg()
    rows: list[list[str]] = []
    processes: dict[str, float] = {}
    for path in sorted(Path(rows_base).glob("rows.*")):
        if path.name == "rows.outcomes":
            continue
        lines = path.read_text().splitlines()
        processes[path.name.removeprefix("rows.")] = float(lines[0].split("\t")[1])
        rows += [line.split("\t") for line in lines[1:]]
    rows.sort(key=lambda r: float(r[0]), reverse=True)
    waits = sorted(((float(r[1]) - float(r[0]), r) for r in rows), key=lambda x: x[0], reverse=True)
    outcomes = Path(rows_file + ".outcomes")
    said = outcomes.read_text() if outcomes.exists() else proc.stdout[-300:] + proc.stderr[-300:]
    workers = sorted(k for k in processes if k != "main")
    shared = (
        f"{len(workers)} xdist workers ({', '.join(f'{w} {processes[w]:.0f} s' for w in workers)})"
        if workers
        else "one process"
    )
    name = "suite-time-all.md" if whole else "suite-time.md"
    shown = " ".join(c if " " not in c else f'"{c}"' for c in command[3:])
    lines = [
        f"# Test suite time: {'the whole suite' if whole else 'the fast subset'}",
        "",
        f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
        f"- machine: {platform.node()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        f"- command: `python benchmarks/suite_time.py{' ' + ' '.join(argv) if argv else ''}` "
        f"(runs `pytest {shown}` with pyproject.toml's addopts)",
        f"- load average (1, 5, 15 min) before: {', '.join(f'{x:.1f}' for x in load_before)}; "
        f"after: {', '.join(f'{x:.1f}' for x in load_after)}",
        f"- outcomes: {said} (pytest exit code {proc.returncode})",
        f"- wall: {wall:.0f} s ({wall / 60:.1f} min); CPU (user+sys, pytest, its workers and their subprocesses): "
        f"{cpu:.0f} s ({cpu / 60:.1f} min); ran in {shared}; CPU of the tests themselves: "
        f"{sum(float(r[0]) for r in rows):.0f} s",
        "",
        "| CPU s | wall s | test |",
        "|---:|---:|---|",
        *(f"| {r[0]} | {r[1]} | {r[2]} |" for r in rows[:25]),
        "",
        "The tests that waited the most (wall minus CPU: windows, sockets, sleeps, subprocesses' exits, a",
        "study another worker was building): a worker that waits runs nothing else meanwhile.",
        "",
        "| wait s | CPU s | test |",
        "|---:|---:|---|",
        *(f"| {w:.2f} | {r[0]} | {r[2]} |" for w, r in waits[:10]),
        "",
    ]
    (ROOT / "benchmarks" / "results" / name).write_text("\n".join(lines))
    for path in Path(rows_base).iterdir():
        path.unlink()
    os.rmdir(rows_base)
    print("\n".join(lines))
    if proc.returncode not in (0, 5):
        print(proc.stdout[-3000:], proc.stderr[-3000:], sep="\n")


if __name__ == "__main__":
    main(sys.argv[1:])
