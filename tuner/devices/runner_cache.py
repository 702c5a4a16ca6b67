"""One prepared model runner per device, rebuilt only when what it depends on changes.

Loading and preparing a model takes seconds on real hardware; consecutive
trials often differ only in clocks, which need no new runner.
"""

from __future__ import annotations

from typing import Any

from tuner.space import Config, SearchSpace


class RunnerCache:
    """Holds the runner for (model, batch size, precision, runner knobs) on one torch device."""

    def __init__(self, torch_device: str, default_precision: str = "fp32") -> None:
        self.torch_device = torch_device
        self.default_precision = default_precision
        self._runner: Any = None
        self._key: tuple | None = None

    def get(self, model: str, config: Config, space: SearchSpace) -> Any:
        """The runner for this configuration: runner-group knobs go to prepare(), device knobs do not."""
        runner_knobs = {k: v for k, v in config.knobs.items() if k in space.knobs and space.knobs[k].group == "runner"}
        precision = str(runner_knobs.pop("precision", self.default_precision))
        key = (model, config.batch_size, precision, tuple(sorted((k, str(v)) for k, v in runner_knobs.items())))
        if self._runner is not None and self._key == key:
            return self._runner
        self.close()
        from runners import make_runner

        runner = make_runner(model, self.torch_device)
        runner.prepare(config.batch_size, precision, runner_knobs)
        self._runner, self._key = runner, key
        return runner

    def close(self) -> None:
        if self._runner is not None:
            self._runner.close()
        self._runner, self._key = None, None
