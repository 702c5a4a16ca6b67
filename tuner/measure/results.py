"""What one measured window returns: LoadGen's verdict, every batch and query, and the window's bracket."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tuner.measure.meters import EnergyReading


@dataclass
class LoadGenSummary:
    """What LoadGen concluded, from mlperf_log_summary.txt and mlperf_log_detail.txt."""

    scenario: str = ""
    samples_per_second: float | None = None
    valid: bool = False
    invalid_reasons: list[str] = field(default_factory=list)
    query_count: int | None = None
    errors: int = 0
    latencies_ns: dict[str, float] = field(default_factory=dict)
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass
class BatchRecord:
    """One measured batch on the monotonic clock: when it started and ended, samples run and size executed."""

    start: float
    done: float
    size: int
    executed: int
    first_arrival: float


@dataclass
class WindowResult:
    """One window: per-query and per-batch latencies, queries done, its exact bracket and LoadGen's verdict.

    ``query_latencies_ms`` has one entry per measured query and ``arrivals``
    the monotonic time each arrived, in the same order; ``batch_records`` one
    entry per batch. ``batch_latencies_ms`` is each batch's latency from its
    earliest query (Offline: from its issue). ``waiting_ms``: the queries a
    Server window's tail cut found queued, and how long each had waited then.
    """

    batch_latencies_ms: list[float]
    queries: int
    batches: int
    start_monotonic: float
    end_monotonic: float
    start_wall: float
    end_wall: float
    warmup_qps: float
    summary: LoadGenSummary
    log_dir: Path
    energy: EnergyReading | None = None
    monitors: list[Any] = field(default_factory=list)
    error: str = ""
    attempts: int = 1
    stop: dict[str, Any] = field(default_factory=dict)
    lane_queries: dict[str, int] = field(default_factory=dict)
    query_latencies_ms: list[float] = field(default_factory=list)
    arrivals: list[float] = field(default_factory=list)
    batch_records: list[BatchRecord] = field(default_factory=list)
    waiting_ms: list[float] = field(default_factory=list)

    def batch_sizes(self) -> dict[str, dict[int, int]]:
        """How many batches ran each number of samples (``arrived``) and each executed size (``executed``)."""
        arrived: dict[int, int] = {}
        executed: dict[int, int] = {}
        for record in self.batch_records:
            arrived[record.size] = arrived.get(record.size, 0) + 1
            executed[record.executed] = executed.get(record.executed, 0) + 1
        return {"arrived": dict(sorted(arrived.items())), "executed": dict(sorted(executed.items()))}

    @property
    def padding(self) -> float:
        """The fraction of executed batch slots that held no sample."""
        slots = sum(r.executed for r in self.batch_records)
        return 1.0 - sum(r.size for r in self.batch_records) / slots if slots else 0.0

    @property
    def duration_s(self) -> float:
        return self.end_monotonic - self.start_monotonic

    @property
    def qps(self) -> float:
        return self.queries / self.duration_s if self.duration_s > 0 else 0.0
