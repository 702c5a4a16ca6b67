"""Measuring configurations directly: every one of a (narrowed) space, the ground truth a study is judged against,
or one configuration repeatedly."""

from __future__ import annotations

import csv
import math
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from tuner.devices.base import Device
from tuner.devices.hardware_session import hardware_session
from tuner.measure.settings import WindowSettings
from tuner.measurement import Measurement
from tuner.plumbing import atomicfile, interrupts
from tuner.space import Config, Grid, SearchSpace


class SweepRow(BaseModel):
    config: Config
    measurement: Measurement | None
    error: str = ""


PROGRESS_CHUNK = 2048  # configurations a vectorized device scores between two progress updates
LARGE_SWEEP = 20_000  # configurations: above this, `tune sweep` says how long it will take and how to narrow it
LONG_SWEEP_S = 600.0  # expected seconds: above this (hardware), the same
PROBE = 256  # configurations timed to estimate a vectorized sweep


def run_sweep(
    device: Device,
    space: SearchSpace,
    model: str,
    settings: WindowSettings,
    progress: Callable[[int, int], None] | None = None,
    configs: list[Config] | None = None,
) -> list[SweepRow]:
    """Measure every effective configuration once (or only ``configs``, some of the space's).

    Twins score the grid vectorized, in chunks so that ``progress`` advances
    (noise-free unless a seed is given; a seeded sweep draws chunk k's noise
    from seed + k); real devices apply and measure one point at a time under
    a hardware session, and a point that fails is kept with its error.
    """
    configs = space.grid() if configs is None else configs
    measure_many = getattr(device, "measure_many", None)
    if measure_many is not None:
        rows: list[SweepRow] = []
        for k, start in enumerate(range(0, len(configs), PROGRESS_CHUNK)):
            interrupts.check()
            chunk = configs[start : start + PROGRESS_CHUNK]
            seeded = settings.noise and settings.seed is not None
            chunk_settings = settings.model_copy(update={"seed": settings.seed + k}) if seeded else settings
            rows += [
                SweepRow(config=c, measurement=m)
                for c, m in zip(chunk, measure_many(model, chunk, chunk_settings), strict=True)
            ]
            if progress:
                progress(len(rows), len(configs))
        return rows
    rows = []
    with hardware_session(device):
        for i, config in enumerate(configs):
            try:
                interrupts.check()
                device.apply(config)
                interrupts.check()
                measurement = device.measure(model, config, settings)
                interrupts.check()
                rows.append(
                    SweepRow(
                        config=config, measurement=measurement, error="" if measurement.valid else measurement.reason
                    )
                )
            except Exception as exc:
                if isinstance(exc, KeyboardInterrupt):
                    raise
                rows.append(
                    SweepRow(
                        config=config,
                        measurement=None,
                        error=str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
                    )
                )
            if progress:
                progress(i + 1, len(configs))
    return rows


def expected_seconds(device: Device, space: SearchSpace, model: str, settings: WindowSettings) -> float:
    """About how long a sweep of ``space`` takes here: a timed probe on a vectorized device, the windows on hardware.

    On hardware it is a floor (every point is at least one window, plus the
    time to apply it); the probe scores the sweep's own first few hundred
    configurations (the default ones alone score faster than the average).
    """
    measure_many = getattr(device, "measure_many", None)
    if measure_many is None:
        return space.size() * settings.window_s
    grid = Grid(space)
    probe = [grid[i] for i in range(min(PROBE, len(grid)))]
    start = time.perf_counter()
    measure_many(model, probe, settings)
    return (time.perf_counter() - start) * len(grid) / len(probe)


def size_warning(space: SearchSpace, seconds: float, floor: bool = False) -> str | None:
    """One line for a sweep too large to start unannounced: its size, the time to expect and how to narrow it.

    ``floor``: ``seconds`` is a lower bound (hardware: one window per point), not an estimate.
    """
    size = space.size()
    if size <= LARGE_SWEEP and seconds <= LONG_SWEEP_S:
        return None
    minutes = seconds / 60
    if seconds < 1:
        when = "under a second"
    else:
        when = ("at least " if floor else "about ") + (f"{minutes:.0f} min" if minutes >= 1 else f"{seconds:.0f} s")
    knobs = ",".join(list(space.knobs)[:2])
    batches = ",".join(str(b) for b in space.batch_sizes[:: max(1, len(space.batch_sizes) // 3)][:3])
    return (
        f"sweeping {size:,} configurations: {when} here; narrow it with --knobs (e.g. --knobs {knobs}) "
        f"or --batch-sizes (e.g. --batch-sizes {batches}); Ctrl-C stops it"
    )


def optimum(rows: list[SweepRow], max_latency_ms: float | None, percentile: str = "p99") -> SweepRow | None:
    """The lowest energy per query among valid rows within the bound (any latency if no bound)."""
    valid = [r for r in rows if r.measurement is not None and r.measurement.valid]
    if max_latency_ms is not None:
        valid = [r for r in valid if r.measurement.latency_ms(percentile) <= max_latency_ms]
    return min(valid, key=lambda r: r.measurement.j_per_query) if valid else None


def write_sweep_csv(rows: list[SweepRow], path: Path, max_latency_ms: float | None, percentile: str = "p99") -> None:
    knob_names = list(rows[0].config.knobs) if rows else []
    with atomicfile.writing(path) as fh:
        writer = csv.writer(fh)
        writer.writerow(
            [
                "batch_size",
                *knob_names,
                "j_per_query",
                "p50_ms",
                "p90_ms",
                "p99_ms",
                "qps",
                "avg_w",
                "queries_per_joule",
                "feasible",
                "meter",
                "twin",
                "throttled",
                "error",
            ]
        )
        for r in rows:
            m = r.measurement
            if m is None:
                writer.writerow(
                    [
                        r.config.batch_size,
                        *[r.config.knobs[k] for k in knob_names],
                        *[""] * 7,
                        False,
                        "",
                        "",
                        "",
                        r.error,
                    ]
                )
                continue
            feasible = m.valid and (max_latency_ms is None or m.latency_ms(percentile) <= max_latency_ms)
            writer.writerow(
                [
                    r.config.batch_size,
                    *[r.config.knobs[k] for k in knob_names],
                    f"{m.j_per_query:.6g}",
                    f"{m.p50_ms:.4g}",
                    f"{m.p90_ms:.4g}",
                    f"{m.p99_ms:.4g}",
                    f"{m.qps:.6g}",
                    f"{m.avg_w:.4g}",
                    f"{1 / m.j_per_query:.6g}",
                    feasible,
                    m.meter,
                    m.twin,
                    m.throttled,
                    r.error,
                ]
            )


def plot_sweep(
    rows: list[SweepRow], path: Path, title: str, max_latency_ms: float | None, percentile: str = "p99"
) -> None:
    """Throughput, average power, energy per query and tail latency against batch size.

    One line per combination of the other knobs when there are few (a
    characterization); otherwise the per-batch-size best (lowest energy,
    within the bound) so a large grid stays readable.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    valid = [r for r in rows if r.measurement is not None and r.measurement.valid]
    groups: dict[str, list[SweepRow]] = {}
    for r in valid:
        groups.setdefault(" ".join(f"{k}={v}" for k, v in r.config.knobs.items()), []).append(r)
    if len(groups) > 8:
        best: dict[int, SweepRow] = {}
        for r in valid:
            if max_latency_ms is not None and r.measurement.latency_ms(percentile) > max_latency_ms:
                continue
            if (
                r.config.batch_size not in best
                or r.measurement.j_per_query < best[r.config.batch_size].measurement.j_per_query
            ):
                best[r.config.batch_size] = r
        groups = {"best per batch size": list(best.values())}
    fig, axes = plt.subplots(2, 2, figsize=(9, 6.5), dpi=110, sharex=True)
    panels = [
        ("queries/s", lambda m: m.qps),
        ("average power (W)", lambda m: m.avg_w),
        ("energy per query (J)", lambda m: m.j_per_query),
        (f"{percentile} latency (ms)", lambda m: m.latency_ms(percentile)),
    ]
    for ax, (label, value) in zip(axes.flat, panels, strict=True):
        for name, members in groups.items():
            members = sorted(members, key=lambda r: r.config.batch_size)
            ax.plot(
                [r.config.batch_size for r in members], [value(r.measurement) for r in members], "-o", ms=3, label=name
            )
        ax.set_xscale("log", base=2)
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    if max_latency_ms is not None:
        axes[1][1].axhline(max_latency_ms, color="crimson", ls="--", lw=1)
    for ax in axes[1]:
        ax.set_xlabel("batch size")
    axes[0][0].legend(fontsize=6)
    fig.suptitle(title)
    fig.tight_layout()
    atomicfile.write_figure(path, fig)
    plt.close(fig)


def characterization(rows: list[SweepRow], bound: float | None, percentile: str) -> list[list[Any]]:
    """Per batch size, the lowest-energy valid configuration (within the bound when one is given).

    Each row: batch, knobs, J/query, queries/J, latency, queries/s, average W.
    A batch size with no valid configuration within the bound keeps its row:
    no knobs, and its fastest latency (how far it is from the bound).
    """
    best: dict[int, Any] = {}
    fastest: dict[int, float] = {}
    for r in rows:
        m = r.measurement
        if m is None or not m.valid:
            continue
        b = r.config.batch_size
        fastest[b] = min(fastest.get(b, math.inf), m.latency_ms(percentile))
        if bound is not None and m.latency_ms(percentile) > bound:
            continue
        if b not in best or m.j_per_query < best[b].measurement.j_per_query:
            best[b] = r
    out: list[list[Any]] = []
    for b in sorted({r.config.batch_size for r in rows}):
        r = best.get(b)
        if r is None:
            out.append([b, {}, None, None, fastest.get(b), None, None])
            continue
        m = r.measurement
        out.append([b, r.config.knobs, m.j_per_query, 1 / m.j_per_query, m.latency_ms(percentile), m.qps, m.avg_w])
    return out


def measure_repeats(
    dev: Device, model: str, config: Config, settings: WindowSettings, repeat: int
) -> list[Measurement]:
    """Apply one configuration once, measure ``repeat`` windows, restore; each repeat draws its own noise on a twin."""
    results = []
    with hardware_session(dev):
        interrupts.check()
        dev.apply(config)
        for i in range(repeat):
            interrupts.check()
            seed = None if settings.seed is None else settings.seed + i
            results.append(dev.measure(model, config, settings.model_copy(update={"seed": seed})))
    return results


REPEAT_FIELDS = ("j_per_query", "p50_ms", "p90_ms", "p99_ms", "qps", "avg_w")


def repeat_summary(results: list[Measurement]) -> dict[str, Any] | None:
    """Mean and sample standard deviation of the valid repeats (None for fewer than two).

    The spread is what a study's confirmation margin is made of: a difference
    between configurations smaller than it is noise.
    """
    valid = [m for m in results if m.valid]
    if len(results) < 2 or len(valid) < 2:
        return None
    columns = {key: [float(getattr(m, key)) for m in valid] for key in REPEAT_FIELDS}
    return {
        "valid": len(valid),
        "mean": {key: statistics.fmean(values) for key, values in columns.items()},
        "sd": {key: statistics.stdev(values) for key, values in columns.items()},
    }
