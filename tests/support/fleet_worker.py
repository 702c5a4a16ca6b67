"""``tune`` as a separate process whose twin takes real time per trial, so a test can kill it mid-trial.

Twins answer in microseconds; a fleet test needs trials that overlap across
workers and a known moment inside a trial. FLEET_DELAY_S adds that many
seconds to every measurement. After FLEET_HANG_AFTER measured trials (a
trial applies its configuration once, then measures one window, or three
when it confirms a new best) the worker writes FLEET_MARKER and then blocks
inside the next trial's first window until it is killed, so SIGKILL or SIGINT always lands in the middle of a trial. It
blocks as a real measurement does: in short waits with a safe point after
each, where a recorded Ctrl-C or SIGTERM is acted on (see tuner.plumbing.interrupts).
"""

import os
import sys
import time
from pathlib import Path

from tuner.cli import main
from tuner.devices.virtual.twin import TwinDevice
from tuner.plumbing import interrupts

_measure = TwinDevice.measure
_apply = TwinDevice.apply
_applied = 0


def _counting_apply(self, config):
    global _applied
    _applied += 1
    return _apply(self, config)


def _slow_measure(self, model, config, settings):
    if "FLEET_HANG_AFTER" in os.environ and _applied > int(os.environ["FLEET_HANG_AFTER"]):
        Path(os.environ["FLEET_MARKER"]).write_text(str(os.getpid()))
        for _ in range(36000):
            time.sleep(0.1)
            interrupts.check()
    time.sleep(float(os.environ.get("FLEET_DELAY_S", "0")))
    return _measure(self, model, config, settings)


TwinDevice.apply = _counting_apply
TwinDevice.measure = _slow_measure

if __name__ == "__main__":
    sys.argv[0] = "tune"
    main()
