"""The options of one tuning run (``tune run`` fills them in; tests and benchmarks build them directly).

Kept apart from the run loop so the trial objective can read them without
importing the loop.
"""

from __future__ import annotations

import math
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from tuner.measure.settings import WindowSettings
from tuner.storage import DEFAULT_HEARTBEAT_S

DEFAULT_SAMPLER = "auto"  # the learned strategy, or its stock fallback (tuner.sampling)


class RunOptions(BaseModel):
    """Everything ``tune run`` needs; the CLI only fills this in."""

    model_config = ConfigDict(extra="forbid")

    model: str
    max_latency_ms: float
    trials: int = 40
    early_stop: bool = True
    warm_start: bool = True
    timeout_s: float | None = None
    seed: int | None = None
    batch_sizes: list[int] | None = None
    knobs: list[str] | None = None
    modes: list[str] | None = None
    sampler: str = DEFAULT_SAMPLER
    storage: str | None = None
    study_trials: int | None = None
    worker_id: str | None = None
    heartbeat_s: int = DEFAULT_HEARTBEAT_S
    out: Path = Path("studies")
    window: WindowSettings = Field(default_factory=WindowSettings)
    baseline: str | None = None
    """What the answer is compared against (tuner.baseline): ``default``, a mode, ``knob=value,...``; None: nothing."""

    def bounds(self) -> dict[str, tuple[str, float]]:
        """The study's constraints, as Optuna names them: the trial attribute each bounds and its bound (ms).

        ``latency`` (the per-query percentile) unless the bound is infinite (an
        LLM study bounded by its token latencies only), then ``ttft`` and
        ``tpot`` where the window bounds them, at the same percentile.
        """
        percentile = self.window.percentile
        found: dict[str, tuple[str, float]] = {}
        if math.isfinite(self.max_latency_ms):
            found["latency"] = (f"{percentile}_ms", self.max_latency_ms)
        if self.window.max_ttft_ms is not None:
            found["ttft"] = (f"ttft_{percentile}_ms", self.window.max_ttft_ms)
        if self.window.max_tpot_ms is not None:
            found["tpot"] = (f"tpot_{percentile}_ms", self.window.max_tpot_ms)
        return found
