"""How one configuration is measured: the settings every window and device share.

It lives in measure/ because the window reads it; devices/ depends on measure/,
never the other way round (devices.base re-exports it for the devices).
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

# A trial's window stops once the 95% confidence interval of energy per query
# is within +-1% of the estimate (and never before min_window_s).
DEFAULT_CI = 0.01
DEFAULT_MIN_WINDOW_S = 2.0
# LoadGen's minimum query count for an adaptive window: one pass over the 1024-sample QSL (fewer once the
# window's tail is known within the study's bound: tuner.measure.stopping.TailProof.within).
DEFAULT_MIN_QUERIES = 1024


class WindowSettings(BaseModel):
    """How long and how to measure one configuration.

    ``window_s`` is the longest window. With ``min_window_s`` below it the
    window is adaptive: it ends once the 95% confidence interval of energy per
    query is within ``ci`` (relative half-width) and at least ``min_queries``
    queries completed (or fewer once its tail is known within ``bound_ms``),
    but never before ``min_window_s`` nor after ``window_s``. ``min_window_s``
    None (or equal to ``window_s``) is a fixed window.

    ``bound_ms`` (the study's latency bound on ``percentile``) lets the window
    end as soon as enough queries are past it that the percentile is proven
    over; ``cut_j_per_query`` (the best feasible figure so far) lets it end
    once its energy per query is above that and its interval rules out its
    being cheaper by more than ``ci`` (tuner.measure.stopping). Either cut is recorded as ``stop_rule``.

    An LLM window (a runner that generates tokens) issues ``prompts``
    (tuner.measure.prompts.load_prompts: a built-in shape or a JSONL file) and
    runs LoadGen with token latencies; ``max_ttft_ms`` and ``max_tpot_ms``
    are the study's bounds on TTFT and TPOT at ``percentile`` (LoadGen's
    ``ttft_latency``/``tpot_latency`` in Server).
    """

    model_config = ConfigDict(extra="forbid")

    scenario: str = "offline"
    window_s: float = 10.0
    min_window_s: float | None = None
    ci: float = DEFAULT_CI
    min_queries: int = DEFAULT_MIN_QUERIES
    warmup_s: float = 1.0
    settle_s: float = 1.0
    percentile: str = "p99"
    seed: int | None = None
    noise: bool = True
    meter: str | None = None
    log_dir: str | None = None
    runtime: str = "auto"
    options: dict[str, Any] = Field(default_factory=dict)
    bound_ms: float | None = None
    cut_j_per_query: float | None = None
    prompts: str | None = None
    max_ttft_ms: float | None = Field(default=None, gt=0)
    max_tpot_ms: float | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _check_bounds(self) -> WindowSettings:
        if self.min_window_s is not None and not 0 < self.min_window_s <= self.window_s:
            raise ValueError(f"min_window_s {self.min_window_s} must lie in (0, window_s={self.window_s}]")
        if not 0 < self.ci < 1:
            raise ValueError(f"ci {self.ci} must be a fraction in (0, 1), e.g. 0.01 for 1%")
        return self

    @property
    def adaptive(self) -> bool:
        return self.min_window_s is not None and self.min_window_s < self.window_s


def sizes_to_warm(settings: WindowSettings, batch_size: int) -> int:
    """The batch sizes below the maximum a window runs often enough to prepare beforehand: 1 up to this.

    Offline runs full batches (none). A Server window that keeps its bound
    gathers about ``target x (bound + timeout)`` queries a batch; a batch
    twice that is one whose queries already waited past the bound, so sizes
    beyond are left to the runner's ladder: preparing a shape costs the
    runner its plans, so every size below the maximum would cost minutes.
    """
    scenario = settings.scenario.lower().replace("-", "").replace("_", "")
    if scenario == "offline":
        return 0
    target = float(settings.options.get("server_target_qps", 0.0))
    if scenario != "server" or settings.bound_ms is None or target <= 0:
        return batch_size - 1
    wait_s = (settings.bound_ms + float(settings.options.get("batch_timeout_ms", 0.0))) / 1000.0
    return min(batch_size - 1, math.ceil(2 * target * wait_s) + 1)
