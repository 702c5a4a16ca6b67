"""``tune`` as a separate process whose Jetson trials wait for the test, so a test can act mid-run.

The fake board takes the real writes (apply, restore, journal); the measurement
itself is replaced by a wait: after RUN_MARKER is written the measurement
waits until RUN_RELEASE exists, then returns a plausible window. The wait is
in short steps with a safe point after each, as a real window's batches are.
"""

import os
import sys
import time
from pathlib import Path

from tuner.cli import main
from tuner.devices.jetson import JetsonDevice
from tuner.measurement import Measurement
from tuner.plumbing import interrupts


def _waiting_measure(self, model, config, settings):
    Path(os.environ["RUN_MARKER"]).write_text(str(os.getpid()))
    while not Path(os.environ["RUN_RELEASE"]).exists():
        time.sleep(0.05)
        interrupts.check()
    ms = 2.0 + config.batch_size
    return Measurement(
        j_per_query=0.01 * config.batch_size,
        p50_ms=ms,
        p90_ms=ms,
        p99_ms=ms,
        qps=1000 * config.batch_size / ms,
        avg_w=10.0,
        energy_j=1.0,
        queries=100,
        duration_s=1.0,
        meter="ina3221",
    )


JetsonDevice.measure = _waiting_measure

if __name__ == "__main__":
    sys.argv[0] = "tune"
    main()
