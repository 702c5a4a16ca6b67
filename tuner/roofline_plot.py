"""The roofline figure: time and energy rooflines of each mode, with the model's layers by arithmetic intensity."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from runners.profile import ModelProfile
from tuner.plumbing import atomicfile
from tuner.roofline import Roofline, features, layer_intensity
from tuner.space import Config, SearchSpace, knob_roles


def plot(
    roofline: Roofline,
    profile: ModelProfile,
    space: SearchSpace,
    modes: list[Config],
    path: Path,
    twin: bool = False,
) -> None:
    """Time and energy rooflines of each mode, with the model's layers placed by arithmetic intensity."""
    import matplotlib.pyplot as plt

    fig = figure(roofline, profile, space, modes, twin)
    atomicfile.write_figure(path, fig, bbox_inches="tight")
    plt.close(fig)


def figure(
    roofline: Roofline, profile: ModelProfile, space: SearchSpace, modes: list[Config], twin: bool = False
) -> Any:
    """The figure :func:`plot` writes (a matplotlib Figure, left open for the caller)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tuner.pareto import log_ticks

    f = features(space, modes)
    params = roofline.mode_parameters(f)
    fig, (ax_t, ax_e) = plt.subplots(1, 2, figsize=(11, 5), dpi=110)
    ai = np.logspace(-2, 4, 200)
    batch = modes[0].batch_size
    intensity = layer_intensity(profile, batch, float(f.byte_scale[0]))
    for config, p in zip(modes, params, strict=True):
        label = " ".join(
            f"{k}={v}" for k, v in config.knobs.items() if k in knob_roles(space).values() or k == space.mode_knob
        )[:80]
        flops_s = np.minimum(1 / p["tau_flop_s"], ai / p["tau_mop_s"])
        ax_t.plot(ai, flops_s / 1e12, label=label)
        t_per_flop = np.maximum(p["tau_flop_s"], p["tau_mop_s"] / ai)
        joule_per_flop = p["eps_flop_j"] + p["eps_mop_j"] / ai + p["pi0_w"] * t_per_flop
        ax_e.plot(ai, 1 / joule_per_flop / 1e9, label=label)
    for ax in (ax_t, ax_e):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("arithmetic intensity (FLOP/byte)")
        ax.grid(alpha=0.3, which="both")
        for x in intensity[intensity > 0]:
            ax.axvline(x, color="grey", alpha=0.08, lw=0.8)
        ax.set_xlim(ai[0], ai[-1])
        log_ticks(ax)
    ax_t.set_ylabel("attainable TFLOP/s")
    ax_e.set_ylabel("attainable GFLOP/J")
    ax_t.set_title(f"time roofline ({profile.model}, bs {batch}; grey: layers)", fontsize=10)
    ax_e.set_title("energy roofline (fitted)", fontsize=10)
    if twin:
        fig.suptitle("[digital twin] fitted on simulated measurements, not hardware", fontsize=10)
    handles, labels = ax_t.get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=2, fontsize=7, frameon=False)
    fig.tight_layout(rect=(0, 0.06 + 0.035 * ((len(labels) + 1) // 2), 1, 1))
    return fig
