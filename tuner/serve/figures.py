"""The figures of ``tune plan`` (energy per query against rate, by band) and ``tune replay`` (power over the trace)."""

from __future__ import annotations

from pathlib import Path

from tuner.plumbing import atomicfile
from tuner.serve.policy import Policy
from tuner.serve.replay_report import ReplayReport


def plot_policy(policy: Policy, path: Path) -> None:
    """Energy per query against arrival rate: the planned points, coloured by band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    feasible = [p for p in policy.points if p.feasible]
    for i, band in enumerate(policy.bands):
        pts = [p for p in feasible if band.min_qps < p.rate_qps <= band.max_qps]
        ax.plot(
            [p.rate_qps for p in pts],
            [p.j_per_query for p in pts],
            "o-",
            label=f"band {i}: <= {band.max_qps:g} q/s",
        )
    missed = [p.rate_qps for p in policy.points if not p.feasible]
    if missed:
        ax.axvspan(min(missed), max(missed), color="0.9", label="no feasible configuration")
    ax.set_xlabel("arrival rate (queries/s)")
    ax.set_ylabel("energy per query (J)")
    twin = " [digital twin]" if policy.twin else ""
    ax.set_title(f"{policy.model} on {policy.device}, {policy.percentile} <= {policy.max_latency_ms:g} ms{twin}")
    ax.legend(fontsize=7)
    fig.tight_layout()
    atomicfile.write_figure(path, fig, dpi=120)
    plt.close(fig)


def plot_replay(report: ReplayReport, path: Path) -> None:
    """Rate, the governor's band and the power of each strategy over the trace."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    hours = report.trace.times / 3600.0
    fig, axes = plt.subplots(3, 1, figsize=(9, 7), sharex=True)
    axes[0].step(hours, report.trace.rates, where="post", color="k")
    axes[0].set_ylabel("rate (q/s)")
    axes[1].step(hours, report.results["governor"].bands, where="post", color="tab:green", label="governor")
    axes[1].axhline(report.results["static"].bands[0], color="tab:orange", ls="--", label="static (peak)")
    bands = report.policy.bands
    axes[1].set_yticks(range(len(bands)), [f"{b.min_qps:g}-{b.max_qps:g} q/s" for b in bands], fontsize=7)
    axes[1].set_ylim(-0.5, len(bands) - 0.5)
    axes[1].set_ylabel("band (its rates)")
    axes[1].legend(fontsize=7)
    colours = {"default": "tab:red", "default_locked": "tab:purple", "static": "tab:orange", "governor": "tab:green"}
    for name, colour in colours.items():
        axes[2].step(hours, report.results[name].power_w, where="post", color=colour, label=name)
    axes[2].set_ylabel("power (W)")
    axes[2].set_xlabel("time (h)")
    axes[2].legend(fontsize=7)
    p = report.policy
    axes[0].set_title(
        f"{p.model} on {report.device} [digital twin], {p.percentile} <= {p.max_latency_ms:g} ms, "
        f"trace {report.trace.name}"
    )
    fig.tight_layout()
    atomicfile.write_figure(path, fig, dpi=120)
    plt.close(fig)
