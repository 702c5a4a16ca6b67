"""Pareto fronts (energy per query vs tail latency; an LLM's energy per token vs TPOT) and a study's result files.

Per <out>/<device>/<model>/: pareto.json and pareto.csv (per batch size the
non-dominated configurations, and the global front), pareto.png, trials.csv.
Each configuration appears once, as the trial that holds most of its windows
(the recommended trial for its own configuration), and the recommended
configuration (tuner.records) is marked wherever it appears.
"""

from __future__ import annotations

import csv
import datetime as dt
import math
from pathlib import Path
from typing import Any

import optuna
from pydantic import BaseModel, ConfigDict, Field

from tuner import __version__
from tuner.measurement import TOKEN_KEYS
from tuner.plumbing import atomicfile
from tuner.records import recommended, trial_record, windows
from tuner.trials_csv import write_trials_csv

PARETO_VERSION = 2
LLM_OBJECTIVE = "J per output token"
"""The study attribute ``objective`` of an LLM study (tuner.study stamps it): its fronts are J/token vs TPOT."""


class FrontPoint(BaseModel):
    model_config = ConfigDict(extra="allow")

    trial: int
    batch_size: int
    config: dict[str, Any]
    j_per_query: float
    latency_ms: float
    feasible: bool
    windows: int = 1
    recommended: bool = False


class ParetoFile(BaseModel):
    """pareto.json: what a user reads back.

    ``trials_completed`` counts every completed trial (a trial that reused an
    earlier measurement too); ``configurations`` the distinct configurations
    measured, one row each in the fronts. ``max_latency_ms`` is None for an
    LLM study bounded by its token latencies only. The fronts trade
    ``energy_key`` against ``latency_key`` (J/query and the bounded query
    percentile; an LLM's J per output token and TPOT), whose bound is
    ``latency_bound_ms``.
    """

    model_config = ConfigDict(extra="forbid")

    version: int = PARETO_VERSION
    tool_version: str = __version__
    generated_at: str
    study: str
    device: str
    device_kind: str
    twin: bool
    model: str
    max_latency_ms: float | None
    percentile: str
    trials_completed: int
    configurations: int
    best: dict[str, Any] | None
    fronts: dict[str, list[FrontPoint]] = Field(default_factory=dict)
    meters: list[str] = Field(default_factory=list)
    provenance: dict[str, Any] | None = None
    energy_key: str = "j_per_query"
    latency_key: str = ""
    latency_bound_ms: float | None = None
    max_ttft_ms: float | None = None
    max_tpot_ms: float | None = None


def _finite(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(float(value)) else float(value)


def front_axes(study: optuna.Study) -> tuple[str, str, float | None]:
    """The energy and latency a study's fronts trade, and the bound on that latency (None: unbounded).

    A CNN study: J/query against the bounded percentile of query latency; an
    LLM study: J per output token against TPOT at that percentile.
    """
    attrs = study.user_attrs
    percentile = attrs.get("percentile", "p99")
    if attrs.get("objective") == LLM_OBJECTIVE:
        return "j_per_token", f"tpot_{percentile}_ms", attrs.get("max_tpot_ms")
    bound = attrs.get("max_latency_ms")
    return "j_per_query", f"{percentile}_ms", None if bound is None or not math.isfinite(bound) else float(bound)


def completed_records(study: optuna.Study) -> list[dict[str, Any]]:
    """One record per measured configuration: the recommended trial, else the one with most windows."""
    best = recommended(study)
    chosen: dict[str, optuna.trial.FrozenTrial] = {}
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
        if "j_per_query" not in t.user_attrs:
            continue
        key = t.user_attrs.get("effective_key", str(t.number))
        held = chosen.get(key)
        is_best = best is not None and t.number == best.number
        if held is None or is_best or ((best is None or held.number != best.number) and windows(t) > windows(held)):
            chosen[key] = t
    records = []
    for t in sorted(chosen.values(), key=lambda t: t.number):
        record = trial_record(t)
        record["recommended"] = best is not None and t.number == best.number
        records.append(record)
    return records


def front(points: list[dict[str, Any]], latency_key: str, energy_key: str = "j_per_query") -> list[dict[str, Any]]:
    """Non-dominated points, minimizing both energy (per query, or per token) and latency, sorted by latency."""
    ordered = sorted(points, key=lambda p: (p[latency_key], p[energy_key]))
    result: list[dict[str, Any]] = []
    best_energy = float("inf")
    for p in ordered:
        if p[energy_key] < best_energy:
            result.append(p)
            best_energy = p[energy_key]
    return result


def bound_front(
    points: list[dict[str, Any]], latency_key: str, energy_key: str = "j_per_query"
) -> list[dict[str, Any]]:
    """The front of the configurations that meet the bound, and beside it the front of those that miss it.

    A trial that misses the bound never pushes one that meets it off the
    front: the recommended configuration (the cheapest that meets it) is
    always a row, and a confirmed trial judged with its noise margin can miss
    the bound at a lower mean latency than the answer's.
    """
    feasible = front([p for p in points if p["feasible"]], latency_key, energy_key)
    missing = [
        p
        for p in front([p for p in points if not p["feasible"]], latency_key, energy_key)
        if not any(f[latency_key] <= p[latency_key] and f[energy_key] <= p[energy_key] for f in feasible)
    ]
    return sorted(feasible + missing, key=lambda p: (p[latency_key], p[energy_key]))


def build_pareto(study: optuna.Study) -> ParetoFile:
    attrs = study.user_attrs
    percentile = attrs.get("percentile", "p99")
    energy_key, latency_key, latency_bound = front_axes(study)
    records = [r for r in completed_records(study) if r.get(energy_key) is not None]
    fronts: dict[str, list[FrontPoint]] = {}

    def points(subset: list[dict[str, Any]]) -> list[FrontPoint]:
        return [
            FrontPoint(
                trial=r["trial"],
                batch_size=r["batch_size"],
                config=r["config"],
                j_per_query=r["j_per_query"],
                latency_ms=r[latency_key],
                feasible=r["feasible"],
                windows=r["windows"],
                recommended=r["recommended"],
                qps=r["qps"],
                avg_w=r["avg_w"],
                **{key: r[key] for key in TOKEN_KEYS if key in r},
            )
            for r in bound_front(subset, latency_key, energy_key)
        ]

    fronts["global"] = points(records)
    for batch in sorted({r["batch_size"] for r in records}):
        fronts[f"bs={batch}"] = points([r for r in records if r["batch_size"] == batch])
    best = recommended(study)
    done = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    return ParetoFile(
        generated_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        study=study.study_name,
        device=attrs.get("device", ""),
        device_kind=attrs.get("device_kind", ""),
        twin=bool(attrs.get("twin", False)),
        model=attrs.get("model", ""),
        max_latency_ms=_finite(attrs.get("max_latency_ms", 0.0)),
        percentile=percentile,
        trials_completed=len(done),
        configurations=len(records),
        best=trial_record(best) if best else None,
        fronts=fronts,
        meters=sorted({str(r["meter"]) for r in records if r.get("meter")}),
        provenance=attrs.get("provenance"),
        energy_key=energy_key,
        latency_key=latency_key,
        latency_bound_ms=latency_bound,
        max_ttft_ms=attrs.get("max_ttft_ms"),
        max_tpot_ms=attrs.get("max_tpot_ms"),
    )


def summary_points(pareto: ParetoFile, per_batch: int = 4) -> list[FrontPoint]:
    """What ``tune pareto`` shows by default: per batch size its front within the bound, a few rows each.

    Each batch size keeps its fastest and its cheapest configuration that
    meet the bound (and the recommended one); a batch size with none that
    meets it has no row (see ``out_of_bound``).
    """
    rows: list[FrontPoint] = []
    for name, points in pareto.fronts.items():
        feasible = [p for p in points if p.feasible]
        if name == "global" or not feasible:
            continue
        keep = {0, len(feasible) - 1, *(i for i, p in enumerate(feasible) if p.recommended)}
        step = max(1, (len(feasible) - 1) // max(per_batch - 1, 1))
        keep |= set(range(0, len(feasible), step))
        while len(keep) > per_batch:
            keep.remove(max(i for i in keep if i not in (0, len(feasible) - 1) and not feasible[i].recommended))
        rows.extend(feasible[i] for i in sorted(keep))
    return rows


def rows_left_out(pareto: ParetoFile, shown: list[FrontPoint]) -> dict[int, tuple[int, int]]:
    """Per batch size whose front within the bound has more points than ``shown`` holds: (shown, on the front)."""
    counts: dict[int, tuple[int, int]] = {}
    for name, points in pareto.fronts.items():
        feasible = [p for p in points if p.feasible]
        if name == "global" or not feasible:
            continue
        kept = sum(1 for p in shown if p.batch_size == feasible[0].batch_size)
        if kept < len(feasible):
            counts[feasible[0].batch_size] = (kept, len(feasible))
    return counts


def out_of_bound(pareto: ParetoFile) -> dict[int, FrontPoint]:
    """Per batch size with no configuration within the bound, its fastest (how far it is from the bound)."""
    return {
        points[0].batch_size: points[0]
        for name, points in pareto.fronts.items()
        if name != "global" and points and not any(p.feasible for p in points)
    }


def results_dir(out: Path, device_slug: str, model: str) -> Path:
    """<out>/<device>/<model>; less when --out already is the device's folder (studies/h200, not h200/h200)
    or the study's own folder (h1/sim-orin/resnet50, not h1/sim-orin/resnet50/sim-orin/resnet50)."""
    from tuner.models import model_slug

    out = Path(out)
    if out.name == model_slug(model) and out.parent.name == device_slug:
        return out
    base = out if out.name == device_slug else out / device_slug
    return base / model_slug(model)


def write_results(study: optuna.Study, folder: Path) -> ParetoFile:
    """Write pareto.json, pareto.csv, trials.csv and pareto.png into ``folder``, each atomically."""
    atomicfile.ensure_folder(folder)
    pareto = build_pareto(study)
    atomicfile.write_text(folder / "pareto.json", pareto.model_dump_json(indent=2) + "\n")
    knob_names = sorted({k for pts in pareto.fronts.values() for p in pts for k in p.config})
    tokens = [k for k in TOKEN_KEYS if any(k in (p.model_extra or {}) for pts in pareto.fronts.values() for p in pts)]
    with atomicfile.writing(folder / "pareto.csv") as fh:
        writer = csv.writer(fh)
        writer.writerow(
            [
                "front",
                "trial",
                "batch_size",
                *knob_names,
                "j_per_query",
                "latency_ms",
                "qps",
                "avg_w",
                *tokens,
                "feasible",
                "windows",
                "recommended",
                "twin",
            ]
        )
        for name, pts in pareto.fronts.items():
            for p in pts:
                extra = p.model_extra or {}
                writer.writerow(
                    [
                        name,
                        p.trial,
                        p.batch_size,
                        *[p.config.get(k, "") for k in knob_names],
                        f"{p.j_per_query:.6g}",
                        f"{p.latency_ms:.4g}",
                        f"{extra.get('qps', 0):.6g}",
                        f"{extra.get('avg_w', 0):.4g}",
                        *[f"{extra.get(k, 0):.6g}" for k in tokens],
                        "yes" if p.feasible else "no",
                        p.windows,
                        "yes" if p.recommended else "no",
                        "yes" if pareto.twin else "no",
                    ]
                )
    write_trials_csv(study, folder / "trials.csv")
    plot_front(pareto, completed_records(study), folder / "pareto.png")
    return pareto


def log_ticks(ax: Any) -> None:
    """Readable base-10 log axes: three to about ten labelled ticks in view, as plain numbers, minor ones unlabelled.

    Matplotlib labels the powers of ten, so an axis spanning less than a
    decade carries one label or none. Here: powers of ten alone over more
    than three decades, 1, 2 and 5 x 10^k over one to three, every 1-9 x 10^k
    below one, and evenly spaced round numbers where even those leave fewer
    than three in view (an axis from 90 to 130). Call it once the data (or
    the limits) are set: the ticks follow the axis's span at that moment.
    """
    from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter

    for axis in (ax.xaxis, ax.yaxis):
        if axis.get_scale() != "log" or getattr(axis.get_transform(), "base", 10) != 10:
            continue
        low, high = sorted(axis.get_view_interval())
        decades = math.log10(high / low) if low > 0 and high > low else 0.0
        subs = (1.0,) if decades > 3 else (1.0, 2.0, 5.0) if decades >= 1 else tuple(float(k) for k in range(1, 10))
        powers = range(math.floor(math.log10(low)), math.ceil(math.log10(high)) + 1) if decades > 0 else range(0)
        in_view = sum(low <= k * 10.0**e <= high for e in powers for k in subs)
        locator: Any = LogLocator(base=10, subs=subs, numticks=12)
        if in_view < 3:
            locator = MaxNLocator(nbins=5, steps=[1, 2, 2.5, 5, 10], min_n_ticks=3)
        axis.set_major_locator(locator)
        axis.set_major_formatter(FuncFormatter(lambda value, _pos: f"{value:g}"))
        axis.set_minor_formatter(NullFormatter())


def plot_front(pareto: ParetoFile, records: list[dict[str, Any]], path: Path) -> None:
    """Energy per query against tail latency: every trial, each batch size's front, the bound, the best.

    A front's line joins only its points within the bound; the points past it are open markers, so no line
    suggests a configuration beyond the bound is an option.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    energy_key = pareto.energy_key
    latency_key = pareto.latency_key or f"{pareto.percentile}_ms"
    llm = energy_key == "j_per_token"
    records = [r for r in records if r.get(energy_key) is not None and r.get(latency_key) is not None]
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
    ax.scatter([r[latency_key] for r in records], [r[energy_key] for r in records], s=10, c="0.75", label="trials")
    cmap = plt.get_cmap("viridis")
    batch_fronts = [(k, v) for k, v in pareto.fronts.items() if k != "global"]
    for i, (name, pts) in enumerate(batch_fronts):
        color = cmap(i / max(len(batch_fronts) - 1, 1))
        within = [p for p in pts if p.feasible]
        past = [p for p in pts if not p.feasible]
        ax.plot([p.latency_ms for p in within], [_energy(p, llm) for p in within], "-o", ms=3, color=color, label=name)
        ax.scatter(
            [p.latency_ms for p in past], [_energy(p, llm) for p in past], s=14, facecolors="none", edgecolors=[color]
        )
    if any(not p.feasible for _, pts in batch_fronts for p in pts):
        ax.scatter([], [], s=14, facecolors="none", edgecolors="0.3", label="front past the bound")
    bound = pareto.latency_bound_ms if pareto.latency_key else pareto.max_latency_ms
    if bound is not None and math.isfinite(bound):
        ax.axvline(bound, color="crimson", ls="--", lw=1, label=f"{'TPOT ' if llm else ''}bound {bound:g} ms")
    if pareto.best and pareto.best.get(energy_key) is not None:
        ax.scatter(
            [pareto.best[latency_key]],
            [pareto.best[energy_key]],
            marker="*",
            s=160,
            c="gold",
            edgecolors="k",
            zorder=5,
            label=f"recommended (trial {pareto.best['trial']})",
        )
    if records:
        ax.set_xscale("log")
        ax.set_yscale("log")
        log_ticks(ax)
    else:  # every trial failed (a throttled board): log axes have nothing to scale
        ax.text(0.5, 0.5, "no completed trial", transform=ax.transAxes, ha="center", va="center")
    if llm:
        ax.set_xlabel(f"time per output token, {pareto.percentile} (ms)")
        ax.set_ylabel("energy per output token (J)")
    else:
        ax.set_xlabel(f"{pareto.percentile} latency per batch (ms)")
        ax.set_ylabel("energy per query (J)")
    twin = " [digital twin]" if pareto.twin else ""
    ax.set_title(f"{pareto.model} on {pareto.device}{twin}")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    atomicfile.write_figure(path, fig)
    plt.close(fig)


def _energy(point: FrontPoint, llm: bool) -> float:
    """A front point's energy as its plot shows it: J per output token for an LLM, else J per query."""
    return float((point.model_extra or {}).get("j_per_token", point.j_per_query)) if llm else point.j_per_query
