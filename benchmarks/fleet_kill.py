"""Fleets that lose a worker must still finish exactly: repeat a four-worker fleet with one worker SIGKILLed.

Each repetition starts ``--workers`` real ``tune run`` processes on one study
(``--study-trials N``, the default sampler, twins whose measurements take
``--delay`` seconds, via tests/support/fleet_worker.py), kills one of them with
SIGKILL once the study's storage shows it holding a RUNNING trial (its
second: it parks inside that trial's measurement), waits for the others and
checks that the fleet finished exactly: N COMPLETE trials, nothing WAITING or
RUNNING, every surviving worker exited 0. A repetition in which the victim
never held a second trial (the others filled the quota first) still counts,
judged on the same outcome, and says so (``killed_mid_trial`` false). PostgreSQL runs on a private loopback
cluster (tests/support/pgserver.py); SQLite on one file. The run stops at the first
failed repetition unless ``--keep-going``.

    nice -n 10 .venv/bin/python benchmarks/fleet_kill.py --storage sqlite --reps 20
    nice -n 10 .venv/bin/python benchmarks/fleet_kill.py --storage postgres --reps 20
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import optuna
from optuna.trial import TrialState

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests" / "fakes"), str(ROOT / "tests" / "support")]
sys.path.insert(0, str(ROOT))

import pgserver  # noqa: E402
from fleetproc import start_worker  # noqa: E402

from tuner.storage import open_storage  # noqa: E402

STUDY = "resnet50|sim-orin|offline|50ms"


def git_head() -> str:
    done = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    return done.stdout.strip()


def wait_for_victims_trial(
    storage: optuna.storages.RDBStorage, victim: subprocess.Popen, others: list[subprocess.Popen], deadline: float
) -> int | None:
    """The number of the victim's RUNNING trial once storage shows it holds one past its first; None if it never does.

    Gives up when the victim has ended, every other worker has ended, or the deadline passed.
    """
    while time.monotonic() < deadline and victim.poll() is None and any(p.poll() is None for p in others):
        with contextlib.suppress(KeyError):
            study_id = storage.get_study_id_from_name(STUDY)
            trials = storage.get_all_trials(study_id, deepcopy=False)
            mine = [t for t in trials if t.user_attrs.get("worker") == "victim"]
            running = [t.number for t in mine if t.state == TrialState.RUNNING]
            if running and any(t.state == TrialState.COMPLETE for t in mine):
                return running[0]
        time.sleep(0.25)
    return None


def one_fleet(url: str, read_url: str, env: dict[str, str], folder: Path, opts: argparse.Namespace) -> dict:
    """One repetition: start the fleet, kill one worker mid-trial, wait for the rest, read the study back."""
    common = [
        "run",
        "--model",
        "resnet50",
        "--device",
        "sim:orin",
        "--max-latency",
        "50ms",
        "--study-trials",
        str(opts.trials),
        "--heartbeat",
        str(opts.heartbeat),
        "--storage",
        url,
        "--out",
        "studies",
        "--json",
    ]
    marker = folder / "parked"
    delay = {"FLEET_DELAY_S": str(opts.delay)}
    began = time.monotonic()
    # The victim parks inside its second measurement (after one completed trial), so once it holds a trial it
    # keeps holding it until killed; it is killed only when the study's storage shows that RUNNING trial.
    victim = start_worker(
        [*common, "--seed", "0", "--worker-id", "victim"],
        {**env, **delay, "FLEET_HANG_AFTER": "1", "FLEET_MARKER": str(marker)},
        folder,
    )
    others = [
        start_worker([*common, "--seed", str(i), "--worker-id", f"w{i}"], {**env, **delay}, folder)
        for i in range(1, opts.workers)
    ]
    watch = open_storage(read_url, None)
    try:
        held = wait_for_victims_trial(watch, victim, others, deadline=time.monotonic() + 900)
    finally:
        with contextlib.suppress(Exception):
            watch.engine.dispose()
    # Killed whatever happened: a victim that never got a trial (the others filled the quota first) or that
    # had already ended is still a repetition, judged on how the study ended.
    victim.kill()
    victim.communicate(timeout=60)
    killed = held is not None and victim.returncode == -signal.SIGKILL
    codes, errors = [], []
    for p in others:
        try:
            _, err = p.communicate(timeout=opts.timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            _, err = p.communicate(timeout=60)
        codes.append(p.returncode)
        if p.returncode != 0:
            errors.append(err.strip().splitlines()[-1:] if err.strip() else ["(no output)"])
    study = optuna.load_study(study_name=STUDY, storage=open_storage(read_url, None))
    states = [t.state for t in study.trials]
    result = {
        "seconds": round(time.monotonic() - began, 1),
        "killed_mid_trial": killed,
        "complete": states.count(TrialState.COMPLETE),
        "waiting": states.count(TrialState.WAITING),
        "running": states.count(TrialState.RUNNING),
        "failed": states.count(TrialState.FAIL),
        "retried": sum("failed_trial" in t.system_attrs for t in study.trials),
        "remeasured": sum("repeat_of" in t.user_attrs for t in study.trials if t.state == TrialState.COMPLETE),
        "survivor_exit_codes": codes,
        "errors": errors,
    }
    result["victim_trial"] = held
    result["ok"] = (
        result["complete"] == opts.trials
        and result["waiting"] == 0
        and result["running"] == 0
        and all(c == 0 for c in codes)
    )
    with contextlib.suppress(Exception):
        study._storage._backend.engine.dispose()
    return result


def write_report(opts: argparse.Namespace, results: list[dict]) -> int:
    """Write the results so far (after every repetition, so a run stopped early keeps them); passed count."""
    passed = sum(r["ok"] for r in results)
    in_a_row = next((i for i, r in enumerate(results) if not r["ok"]), len(results))
    report = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}",
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "commit": os.environ.get("FLEET_KILL_COMMIT") or git_head(),
        "storage": opts.storage,
        "workers": opts.workers,
        "study_trials": opts.trials,
        "sampler": "default (auto)",
        "passed": passed,
        "repetitions": len(results),
        "passed_in_a_row": in_a_row,
        "median_seconds": sorted(r["seconds"] for r in results)[len(results) // 2] if results else None,
        "results": results,
    }
    opts.out.mkdir(parents=True, exist_ok=True)
    (opts.out / f"fleet_kill-{opts.storage}.json").write_text(json.dumps(report, indent=2) + "\n")
    return passed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--storage", choices=("sqlite", "postgres"), required=True)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--trials", type=int, default=24, help="--study-trials N (24 keeps 3 x 2 slots to re-measure)")
    parser.add_argument("--delay", type=float, default=0.2, help="seconds added to every twin measurement")
    parser.add_argument("--heartbeat", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=600, help="seconds to wait for a surviving worker")
    parser.add_argument("--keep-going", action="store_true")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    opts = parser.parse_args()

    results: list[dict] = []
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(pgserver.running_server()) if opts.storage == "postgres" else None
        for rep in range(opts.reps):
            folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="fleet-kill-")))
            if server is not None:
                server.create_database(f"rep{rep}")
                # Workers read the credentials from PG* variables, as docs/fleet-commands.md's fleet command does.
                url, read_url, env = "postgresql://", server.url(f"rep{rep}"), server.env(f"rep{rep}")
            else:
                url = read_url = f"sqlite:///{folder / 'tune.db'}"
                env = {}
            result = one_fleet(url, read_url, env, folder, opts)
            results.append(result)
            print(json.dumps({"rep": rep, **result}), flush=True)
            write_report(opts, results)
            if not result["ok"] and not opts.keep_going:
                break
    passed = write_report(opts, results)
    in_a_row = next((i for i, r in enumerate(results) if not r["ok"]), len(results))
    print(f"{opts.storage}: {passed}/{len(results)} repetitions passed, {in_a_row} in a row")
    return 0 if passed == len(results) == opts.reps else 1


if __name__ == "__main__":
    sys.exit(main())
