"""``tune bench`` as a separate process whose runs wait for the test, so a test can signal mid-run.

The sweeps run as usual (a twin sweeps through ``measure_many``); a trial's
window (``measure``) writes BENCH_MARKER and waits until BENCH_RELEASE
exists, in short steps with a safe point after each, as a real window's
batches are, then measures as the twin does. Without the release the command
can only end through a signal.
"""

import os
import sys
import time
from pathlib import Path

from tuner.cli import main
from tuner.devices.virtual.twin import TwinDevice
from tuner.plumbing import interrupts

_measure = TwinDevice.measure


def _waiting_measure(self, model, config, settings):
    Path(os.environ["BENCH_MARKER"]).write_text(str(os.getpid()))
    while not Path(os.environ["BENCH_RELEASE"]).exists():
        time.sleep(0.05)
        interrupts.check()
    return _measure(self, model, config, settings)


TwinDevice.measure = _waiting_measure

if __name__ == "__main__":
    sys.argv[0] = "tune"
    main()
