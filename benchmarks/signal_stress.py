"""Signals at random moments of real `tune run` processes on a fake Jetson board: the board is always restored.

Each moment starts ``tune run`` in the background from a non-interactive
shell (so it inherits SIGINT as ignored, as such jobs do), and a second
background shell sends it SIGINT or SIGTERM (alternately) after a seeded
random delay drawn over the length of an unsignalled run. After each one:

- the run ended (no hang: a run still alive 180 s after its signal counts as hung and is killed);
- the fake sysfs tree is byte-identical to the original, and no journal is left;
- no trial of the study is left RUNNING (the study resumes).

At the end one unsignalled run of the same command resumes the study and must
exit 0. A signal whose sender found the process already gone is reported as
"late" (it proves nothing either way). Results go to JSON (and a short
summary on stdout); the fake board is tests/fakes/fakeboard.py, the runner is the
real tiny-cnn on the CPU, the windows are real LoadGen windows.

    nice -n 10 python benchmarks/signal_stress.py --moments 50 --seed 0 \\
        --out benchmarks/results/signal_stress.json
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "tests" / "fakes"), str(REPO / "tests" / "support")]

from fakeboard import make_fake_board, tiny_run  # noqa: E402

HANG_S = 180.0


def command(out: Path) -> list[str]:
    return [sys.executable, "-m", "tuner", *tiny_run(), "--trials", "2", "--out", str(out)]


def launch(cmd: list[str], env: dict[str, str], logs: Path) -> tuple[subprocess.Popen, int]:
    """Start ``cmd`` as a background job of a non-interactive shell; return the shell and the job's PID."""
    script = '"$@" >"$LOG.out" 2>"$LOG.err" & echo $!; wait $!'
    shell = subprocess.Popen(
        ["sh", "-c", script, "sh", *cmd], env={**env, "LOG": str(logs)}, stdout=subprocess.PIPE, text=True, cwd=REPO
    )
    assert shell.stdout is not None
    return shell, int(shell.stdout.readline())


def running_trials(out: Path) -> int:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    url = f"sqlite:///{out / 'tune.db'}"
    total = 0
    for summary in optuna.get_all_study_summaries(url):
        study = optuna.load_study(study_name=summary.study_name, storage=url)
        total += len(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)))
    return total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--moments", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--max-delay",
        type=float,
        default=None,
        help="draw delays up to this many seconds (default: an unsignalled run)",
    )
    args = parser.parse_args()
    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="signal-stress-"))
    board = make_fake_board(work / "board", "orin-nano", "l4t36", seed=1)
    original = board.snapshot()
    state = work / "state"
    env = {**os.environ, **board.env(), "TUNE_TORCH_DEVICE": "cpu", "TUNE_STATE_DIR": str(state)}
    study = work / "studies"
    cmd = command(study)

    started = time.monotonic()
    calib = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=REPO)
    duration = time.monotonic() - started
    if calib.returncode != 0 or board.snapshot() != original:
        print(f"calibration run failed ({calib.returncode}): {calib.stderr[-400:]}")
        return 1
    span = args.max_delay or duration
    print(f"unsignalled run: {duration:.1f} s; signals drawn over [0.2, {span:.1f}] s", flush=True)

    results = []
    for i in range(args.moments):
        sig = signal.SIGINT if i % 2 == 0 else signal.SIGTERM
        delay = rng.uniform(0.2, span)
        logs = work / f"run-{i:02d}"
        shell, pid = launch(cmd, env, logs)
        status = work / f"kill-{i:02d}"
        sender = subprocess.Popen(
            ["sh", "-c", f'sleep {delay:.3f}; kill -s {sig.name[3:]} {pid} 2>/dev/null; echo $? >"{status}"']
        )
        sender.wait()
        sent_at = time.monotonic()
        try:
            rc = shell.wait(timeout=HANG_S)
            hung = False
        except subprocess.TimeoutExpired:
            os.kill(pid, signal.SIGKILL)
            rc = shell.wait()
            hung = True
        ended_s = time.monotonic() - sent_at
        delivered = status.read_text().strip() == "0"
        err = Path(f"{logs}.err").read_text(errors="replace").strip().splitlines()
        restored = board.snapshot() == original
        journals = sorted(p.name for p in (state / "journal").glob("*.json")) if (state / "journal").is_dir() else []
        running = running_trials(study)
        expected_rc = 130 if sig == signal.SIGINT else 143
        if not delivered:
            verdict = "late"
        elif hung or not restored or journals or running or rc != expected_rc or any("Traceback" in e for e in err):
            verdict = "FAIL"
        else:
            verdict = "ok"
        row = {
            "moment": i,
            "signal": sig.name,
            "delay_s": round(delay, 3),
            "delivered": delivered,
            "exit_code": rc,
            "ended_s_after_signal": round(ended_s, 2),
            "hung": hung,
            "board_restored": restored,
            "journals_left": journals,
            "trials_running": running,
            "last_stderr": err[-1] if err else "",
            "verdict": verdict,
        }
        results.append(row)
        print(json.dumps(row), flush=True)
        if not restored or journals:
            board_fix = subprocess.run([sys.executable, "-m", "tuner", "restore"], env=env, cwd=REPO)
            assert board_fix.returncode == 0

    final = subprocess.run([*cmd, "--json"], env=env, capture_output=True, text=True, cwd=REPO)
    resumed = final.returncode == 0 and board.snapshot() == original and running_trials(study) == 0
    counts = {v: sum(r["verdict"] == v for r in results) for v in ("ok", "late", "FAIL")}
    summary = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.node()} {platform.machine()}, {os.cpu_count()} CPUs (shared, loaded)",
        "python": platform.python_version(),
        "command": " ".join(["python", *sys.argv]),
        "board": "tests/fakes/fakeboard.py orin-nano l4t36 (fake sysfs, fake nvpmodel); tiny-cnn on the CPU; LoadGen",
        "unsignalled_run_s": round(duration, 2),
        "delays_drawn_up_to_s": round(span, 2),
        "moments": args.moments,
        "seed": args.seed,
        "counts": counts,
        "final_resume_exit_code": final.returncode,
        "resumed_cleanly": resumed,
        "results": results,
    }
    print(json.dumps({k: v for k, v in summary.items() if k != "results"}, indent=1))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(summary, indent=1) + "\n")
    return 0 if counts["FAIL"] == 0 and resumed else 1


if __name__ == "__main__":
    sys.exit(main())
