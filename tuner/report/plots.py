"""The report's figures, as PNG files beside report.md; every twin figure's title says "digital twin"."""

from __future__ import annotations

from pathlib import Path

from tuner.plumbing import atomicfile
from tuner.report.analysis import best_per_batch, front, usable
from tuner.report.data import TWIN_LABEL, Point, Trace

DPI = 100


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> None:
    fig.tight_layout()
    atomicfile.write_figure(path, fig, dpi=DPI)
    _plt().close(fig)


def _plain(ax) -> None:
    """Plain numbers on every axis (64, not 2^6; 0.1, not 10^-1), and base-10 log axes ticked by their span.

    A base-10 axis spanning less than a decade has one power of ten or none
    in view, so it would carry one labelled tick (tuner.pareto.log_ticks).
    """
    from matplotlib.ticker import FuncFormatter

    from tuner.pareto import log_ticks

    plain = FuncFormatter(lambda v, _pos: f"{v:g}")
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_formatter(plain)
        axis.set_minor_formatter(FuncFormatter(lambda _v, _pos: ""))
    log_ticks(ax)


def _title(text: str, twin: bool) -> str:
    return f"{text} [{TWIN_LABEL}]" if twin else text


def _groups(points: list[Point]) -> dict[str, list[Point]]:
    out: dict[str, list[Point]] = {}
    for p in usable(points):
        out.setdefault(p.group, []).append(p)
    return {g: sorted(ps, key=lambda p: p.config.batch_size) for g, ps in out.items()}


def plot_batch(points: list[Point], path: Path, title: str, twin: bool) -> None:
    """Throughput and queries per joule against batch size, one line per mode (or knob combination)."""
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    panels = [
        ("throughput (queries/s)", lambda p: p.measurement.qps),
        ("queries per joule", lambda p: 1 / p.measurement.j_per_query),
    ]
    for ax, (label, value) in zip(axes, panels, strict=True):
        for group, members in _groups(points).items():
            ax.plot([p.config.batch_size for p in members], [value(p) for p in members], "-o", ms=3, label=group)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch size")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        _plain(ax)
    axes[0].legend(fontsize=7)
    fig.suptitle(_title(title, twin))
    _save(fig, path)


def plot_front(
    points: list[Point], path: Path, title: str, twin: bool, percentile: str, best: Point | None, bound_ms: float | None
) -> None:
    """Energy per query against tail latency: every point, the front, and the recommended configuration."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for group, members in _groups(points).items():
        ax.scatter(
            [p.measurement.latency_ms(percentile) for p in members],
            [p.measurement.j_per_query for p in members],
            s=14,
            label=group,
        )
    edge = front(points, percentile)
    if edge:
        ax.step(
            [p.measurement.latency_ms(percentile) for p in edge],
            [p.measurement.j_per_query for p in edge],
            where="post",
            color="black",
            lw=1,
            label="front",
        )
    if best is not None:
        m = best.measurement
        ax.scatter(
            [m.latency_ms(percentile)],
            [m.j_per_query],
            marker="*",
            s=180,
            color="crimson",
            zorder=5,
            label=f"recommended: {best.group} batch {best.config.batch_size}",
        )
    if bound_ms is not None:
        ax.axvline(bound_ms, color="crimson", ls="--", lw=1, label=f"bound {bound_ms:g} ms")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(f"{percentile} latency (ms)")
    ax.set_ylabel("energy per query (J)")
    ax.grid(alpha=0.3, which="both")
    _plain(ax)
    ax.legend(fontsize=7)
    ax.set_title(_title(title, twin))
    _save(fig, path)


def plot_trace(trace: Trace, path: Path, title: str, twin: bool) -> None:
    """Power over time of one window."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 3.2))
    ax.plot(trace.t_s, trace.watts, lw=1, ls="--" if trace.kind == "twin-mean" else "-")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("power (W)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.set_title(_title(f"{title}: {trace.group}, batch {trace.batch_size}", twin), fontsize=10)
    fig.text(0.01, 0.01, trace.note, fontsize=7)
    _save(fig, path)


def plot_devices(by_device: dict[str, tuple[list[Point], bool]], path: Path, title: str) -> None:
    """Devices side by side on one model: the best mode's queries per joule and throughput per batch size."""
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for name, (points, twin) in by_device.items():
        best = best_per_batch(points)
        label = f"{name} ({TWIN_LABEL})" if twin else name
        axes[0].plot(list(best), [1 / p.measurement.j_per_query for p in best.values()], "-o", ms=3, label=label)
        axes[1].plot(list(best), [p.measurement.qps for p in best.values()], "-o", ms=3, label=label)
    for ax, label in zip(axes, ("queries per joule (best mode)", "throughput of that mode (queries/s)"), strict=True):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("batch size")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3, which="both")
        _plain(ax)
    axes[0].legend(fontsize=7)
    any_twin = any(twin for _, twin in by_device.values())
    fig.suptitle(_title(title, any_twin))
    _save(fig, path)
