"""Signals at seeded random moments of studies on a fake Jetson board, in one process (the suite's share).

benchmarks/signal_stress.py signals 50 real ``tune run`` processes; that takes
most of an hour on a loaded 2-core machine. Here one process runs the same
study loop, lock, journal, apply and restore on the fake board, with real
LoadGen windows around a stand-in runner (a sleep per batch, so no model
loads), again and again; a timer thread sends the process SIGINT or SIGTERM
(alternately) at a seeded offset drawn over an unsignalled run's length.
Started from a background shell by the test, the process has SIGINT
inherited as ignored. One JSON line per moment on stdout:

- ``outcome``: "interrupted" (the run raised the signal's exception),
  "late" (the signal came after the run had returned), or "lost" (it came
  during the run and the run returned normally: a bug);
- ``restored``: the fake sysfs tree is byte-identical to the original;
- ``journals`` and ``running``: journals left, trials left RUNNING.

    python tests/support/signal_moments.py BOARD_DIR OUT_DIR MOMENTS SEED
"""

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import optuna
from fakeboard import make_fake_board
from journals import pending_journals

from tuner.devices.jetson import JetsonDevice
from tuner.errors import Terminated
from tuner.measure.settings import WindowSettings
from tuner.study import RunOptions, run_study


class SleepRunner:
    """Stands in for a model: one batch takes 2 ms."""

    def infer(self, size: int | None = None) -> int:
        time.sleep(0.002)
        return size or 1


def main() -> None:
    board_dir, out, moments, seed = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    import random

    rng = random.Random(seed)
    board = make_fake_board(board_dir, "orin-nano", "l4t36", seed=1)
    original = board.snapshot()
    device = JetsonDevice(
        "orin-nano",
        name="orin-nano",
        sysfs_root=board.root,
        nvpmodel=str(board.nvpmodel),
        runner_factory=lambda model, config: SleepRunner(),
    )
    window = WindowSettings(window_s=0.3, warmup_s=0.05, settle_s=0.0)
    options = RunOptions(
        model="tiny-cnn",
        max_latency_ms=500,
        trials=2,
        knobs=["nvpmodel", "gpu_mhz"],
        batch_sizes=[1, 4],
        sampler="random",
        seed=seed,
        out=out,
        window=window,
    )
    late_term: list[float] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: late_term.append(time.monotonic()))
    url = f"sqlite:///{out / 'tune.db'}"

    started = time.monotonic()
    run_study(device, options)
    duration = time.monotonic() - started
    ignored = signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    print(json.dumps({"unsignalled_run_s": round(duration, 2), "sigint_ignored": ignored}))
    for i in range(moments):
        sig = signal.SIGINT if i % 2 == 0 else signal.SIGTERM
        delay = rng.uniform(0.0, 0.9 * duration)
        sent: list[float] = []

        def send(sig: int = sig, sent: list[float] = sent) -> None:
            sent.append(time.monotonic())
            os.kill(os.getpid(), sig)

        timer = threading.Timer(delay, send)
        timer.start()
        raised = None
        try:
            run_study(device, options)
        except KeyboardInterrupt as exc:
            raised = "SIGTERM" if isinstance(exc, Terminated) else "SIGINT"
        ended = time.monotonic()
        timer.join()
        time.sleep(0.05)  # a late signal's handler has run
        if raised is not None:
            outcome = "interrupted" if raised == sig.name else f"wrong signal {raised}"
        else:
            outcome = "late" if sent and sent[0] >= ended else "lost"
        study = optuna.load_study(study_name=optuna.get_all_study_names(url)[0], storage=url)
        running = len(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)))
        row = {
            "moment": i,
            "signal": sig.name,
            "delay_s": round(delay, 3),
            "outcome": outcome,
            "restored": board.snapshot() == original,
            "journals": len(pending_journals()),
            "running": running,
        }
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
