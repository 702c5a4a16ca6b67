"""One loaded model runner per device, kept for the whole study.

Loading a model takes seconds on real hardware and consecutive trials often
differ only in clocks or batch size. The runner is built once per model and
runtime; a new configuration only calls prepare(), and the runner keeps its
prepared variants (CUDA graphs, compiled modules) so that coming back to a
configuration costs nothing. How long the last get() took is kept for the
trial's record.

What a window needs prepared depends on its scenario: an Offline window runs
only full batches, a Server window any number of samples up to the maximum,
so a runner that can (``warm_upto``) warms the sizes below the maximum the
window will run (tuner.measure.settings.sizes_to_warm; None: all of them).
The throughput a window ran at is kept too: a window that follows one of the
same prepared configuration skips its warm-up (nothing changed).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tuner.space import Config, SearchSpace


class RunnerCache:
    """Holds the runner for (model, runtime) on one torch device and the settings it was last prepared for."""

    def __init__(self, torch_device: str, default_precision: str = "fp32") -> None:
        self.torch_device = torch_device
        self.default_precision = default_precision
        self._runner: Any = None
        self._model_key: tuple[str, str] | None = None
        self._prepared: tuple | None = None
        self._measured: tuple | None = None
        self._qps = 0.0
        self.last_load_s = 0.0
        self.last_prepare_s = 0.0

    def get(
        self, model: str, config: Config, space: SearchSpace, runtime: str = "auto", warm_upto: int | None = None
    ) -> Any:
        """The runner for this configuration: runner-group knobs go to prepare(), device knobs do not."""
        runner_knobs = {k: v for k, v in config.knobs.items() if k in space.knobs and space.knobs[k].group == "runner"}
        precision = str(runner_knobs.pop("precision", self.default_precision))
        knobs = tuple(sorted((k, str(v)) for k, v in runner_knobs.items()))
        prepared = (config.batch_size, precision, knobs, warm_upto)
        self.last_load_s = self.last_prepare_s = 0.0
        if self._runner is None or self._model_key != (model, runtime):
            self.close()
            from runners import make_runner

            started = time.monotonic()
            self._runner = make_runner(model, self.torch_device, runtime=runtime)
            self._model_key = (model, runtime)
            self.last_load_s = time.monotonic() - started
        if self._prepared != prepared:
            started = time.monotonic()
            self._prepared = None
            if hasattr(self._runner, "warm_upto"):
                self._runner.warm_upto = warm_upto
            self._runner.prepare(config.batch_size, precision, runner_knobs)
            self._prepared = prepared
            self.last_prepare_s = time.monotonic() - started
        return self._runner

    def warm_qps(self) -> float | None:
        """The throughput the last window ran at, if it ran what is prepared now (else None: warm up)."""
        return self._qps if self._prepared is not None and self._measured == self._prepared and self._qps > 0 else None

    def ran(self, qps: float) -> None:
        """Record that a window of the prepared configuration ran at ``qps`` samples/s."""
        self._measured, self._qps = self._prepared, qps

    def close(self) -> None:
        if self._runner is not None:
            self._runner.close()
        self._runner, self._model_key, self._prepared, self._measured = None, None, None, None


@contextmanager
def releasing_runner(device: object) -> Iterator[None]:
    """Free the model a device keeps prepared, if it keeps one, when the block ends, however it ends.

    A library's generation thread still in native code when the interpreter
    exits aborts the process (an LLM study's SIGTERM on the H200 ended in SIGABRT).
    """
    try:
        yield
    finally:
        cache = getattr(device, "runners", None)
        if isinstance(cache, RunnerCache):
            cache.close()
