"""The background thread every sampled meter runs during a window.

Why one class: a meter that samples a sensor (power, rails, RAPL counters,
temperatures) needs the same guarantees, and each copy of the thread code got
one of them wrong. The last periodic sample happens before ``stop()`` returns,
so the caller's closing sample is the last one and none lands after it. A
sensor that fails on the thread raises on the caller's thread in ``stop()``:
otherwise the thread dies quietly and the meter integrates over fewer samples
than the window had, a wrong figure with nothing to show for it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable


class Poller:
    """Calls ``sample()`` every ``period_s`` seconds on a daemon thread between ``start()`` and ``stop()``.

    The first call comes one period after ``start()``: a meter takes its own
    samples at the window's two ends (often with extra readings, such as
    temperatures), and the poller fills in between them.
    """

    def __init__(self, sample: Callable[[], None], period_s: float, name: str) -> None:
        self._sample = sample
        self.period_s = period_s
        self.name = name
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def _loop(self) -> None:
        try:
            while not self._stop.wait(self.period_s):
                self._sample()
        except BaseException as exc:  # re-raised in stop() on the caller's thread
            self._error = exc

    def start(self) -> None:
        self._error = None
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name=f"powertune-{self.name}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Join the thread; raise what the sensor raised on it, if anything."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise error
