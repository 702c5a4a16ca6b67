"""tune bench, tune roofline and tune devices: how fast strategies find the optimum, the fitted rooflines, and
what can be measured here."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from tuner.cli import common, options
from tuner.devices.base import Device
from tuner.devices.registry import check_meter
from tuner.errors import UserError
from tuner.models import check_model
from tuner.pareto import results_dir
from tuner.plumbing import atomicfile, interrupts
from tuner.plumbing.units import check_count, check_seconds
from tuner.roofline_report import roofline_report

if TYPE_CHECKING:
    from tuner.bench import BenchReport, BenchSettings


def _names(text: str | None, default: list[str]) -> list[str]:
    return default if text is None else [x.strip() for x in text.split(",") if x.strip()]


BenchDevices = typer.Option(None, "--devices", help="comma list (default sim:orin,sim:h200,sim:orin-nano)")
BenchModels = typer.Option(None, "--models", help="comma list (default the five zoo models)")
Bounds = typer.Option(None, "--bounds", help="tight,medium,loose (latency quantiles of the sweep) or q25,q50,q75")
Strategies = typer.Option(
    None,
    "--strategies",
    "--sampler",
    help="comma list of random, tpe, gp, two-phase, learned [default: every one this install can run]",
)
TuneBoards = typer.Option(
    None,
    "--tune-boards",
    help="generated boards (gen:SEED) the strategy was tuned on, e.g. 0-19, or none [default: 0-19, or none "
    "when --devices or --models is given]",
)
JudgeBoards = typer.Option(
    None,
    "--judge-boards",
    help="generated boards it is judged on (never used to tune it), e.g. 1000-1059, or none "
    "[default: 1000-1059, or none when --devices or --models is given]",
)
Seeds = typer.Option(3, "--seeds", help="repetitions per twin or measured-board landscape")
BoardRuns = typer.Option(
    1, "--board-runs", help="runs per generated board, each at its own run seed (one run is a noisy figure)"
)
BenchTrials = typer.Option(40, "--trials", help="measured trials per run")
RandomTrials = typer.Option(200, "--random-trials", help="budget of random search (its reach is slow)")
Jobs = typer.Option(2, "--jobs", help="parallel worker processes")
Quick = typer.Option(False, "--quick", help="one twin landscape, one tuning and one judged board, one seed, 12 trials")
Points = typer.Option(12, "--points", help="configurations to measure for the fit")
RooflineSeed = typer.Option(0, "--seed", help="seed of the measured design (and of the twins' noise)")


@interrupts.deferring
def bench(
    devices: str | None = BenchDevices,
    models: str | None = BenchModels,
    bounds: str | None = Bounds,
    strategies: str | None = Strategies,
    tune_boards: str | None = TuneBoards,
    judge_boards: str | None = JudgeBoards,
    seeds: int = Seeds,
    board_runs: int = BoardRuns,
    trials: int = BenchTrials,
    random_trials: int = RandomTrials,
    jobs: int = Jobs,
    quick: bool = Quick,
    out: Path = options.Out,
    as_json: bool = options.Json,
) -> None:
    """Benchmark search strategies against the noise-free sweep optimum (trials to within 2%/5%).

    Ctrl-C, SIGTERM or SIGHUP ends it within about a trial, with exit code 128 + the signal.
    """
    from tuner.bench import BenchSettings, default_strategies, quick_settings
    from tuner.devices.virtual.generated import board_seeds

    check_count(seeds, "--seeds", 3, maximum=1000)
    check_count(board_runs, "--board-runs", 1, maximum=1000)
    check_count(trials, "--trials", 40, maximum=10_000)
    check_count(random_trials, "--random-trials", 200, maximum=100_000)
    check_count(jobs, "--jobs", 2, maximum=256)
    common.check_out_dir(out)
    base = quick_settings() if quick else BenchSettings()
    update: dict = {"strategies": _names(strategies, default_strategies())}
    for key, text in (("devices", devices), ("models", models), ("bounds", bounds)):
        if text is not None:
            update[key] = _names(text, [])
    named = devices is not None or models is not None
    for key, text in (("tune_boards", tune_boards), ("judge_boards", judge_boards)):
        if text is not None:
            update[key] = [] if text.strip().lower() == "none" else board_seeds(text)
        elif named:
            update[key] = []
    if not quick:
        update.update(seeds=seeds, board_runs=board_runs, trials=trials, random_trials=random_trials, jobs=jobs)
    settings = base.model_copy(update=update)
    for model in settings.models:
        check_model(model)
    report = _run_with_progress(settings, as_json)
    _bench_results(report, out / "bench", as_json)


def _run_with_progress(settings: BenchSettings, as_json: bool) -> BenchReport:
    """run_bench with progress on stderr: a bar on a terminal, otherwise a line per sweep and per run with an ETA."""
    from tuner.bench import run_bench

    lines = not as_json and not common.err_console.is_terminal
    current, began, last = "", time.monotonic(), time.monotonic()
    with common.count_progress("bench", "", as_json or lines) as bar:
        task = bar.add_task("bench: starting", total=None)

        def progress(done: int, total: int, stage: str) -> None:
            nonlocal current, began, last
            bar.update(task, completed=done, total=total, description=f"bench: {stage}")
            if not lines:
                return
            if stage != current:  # a stage begins where the one before ended
                current, began = stage, last
            last = time.monotonic()
            spent = last - began
            left = common.clock(spent / done * (total - done))
            typer.echo(f"bench: {stage} {done}/{total}, elapsed {common.clock(spent)}, ETA {left}", err=True)

        return run_bench(settings, progress=progress)


def _bench_results(report: BenchReport, folder: Path, as_json: bool) -> None:
    """Write the benchmark's search.json and search.md, and print its summary table (or one JSON object)."""
    from tuner.bench import markdown, text_rows

    atomicfile.write_text(folder / "search.json", report.model_dump_json(indent=1))
    atomicfile.write_text(folder / "search.md", markdown(report))
    if as_json:
        common.emit_json(
            {
                "summary": report.summary,
                "landscapes": len(report.landscapes),
                "runs": len(report.runs),
                "seconds": report.seconds,
                "results": str(folder),
            }
        )
        return
    columns, rows = text_rows(report)
    budgets = sorted({row["budget"] for row in report.summary})
    common.out_console.print(
        common.table(f"search benchmark (trials per run: {', '.join(map(str, budgets))})", columns, rows, compact=True)
    )
    common.out_console.print(
        "to 2%, to 5%: median trials to within 2% / 5% of the sweep optimum (>N: not within the N trials run); "
        "reached: runs within 2%; final regret: median over the optimum at the end; violates: share of fresh "
        "re-measurements of the exported best over the bound"
    )
    common.out_console.print(
        f"{len(report.runs)} runs ({len({r.strategy for r in report.runs})} strategies on "
        f"{len(report.landscapes)} landscapes; a row per strategy and suite) in {report.seconds:.0f} s "
        f"-> {folder}/search.json, search.md (every column)"
    )


def roofline(
    model: str = options.Model,
    device: str = options.Device,
    points: int = Points,
    seed: int = RooflineSeed,
    window: float = options.window("point", adaptive=False),
    out: Path = options.Out,
    as_json: bool = options.Json,
) -> None:
    """Fit time and energy rooflines (Pagoda's form) from measurements; print per-mode parameters, plot them."""
    check_count(points, "--points", 12, maximum=10_000)
    if points < 2:
        raise UserError("--points must be at least 2, e.g. 12")
    check_seconds(window, "--window", "10", maximum=3600.0)
    common.check_out_dir(out)
    check_meter(None, device)
    dev = common.device(device)
    check_model(model, simulated=dev.simulated, device=dev)
    payload = roofline_report(dev, model, points, seed, window, results_dir(out, dev.slug, model))
    if as_json:
        common.emit_json(payload)
    else:
        _print_roofline(dev, model, payload)


def _print_roofline(dev: Device, model: str, payload: dict[str, Any]) -> None:
    """What tune roofline prints: each mode's fitted parameters, the fit error and the model's intensity."""
    pinned = common.pinned_knobs([m["config"] for m in payload["modes"]])
    rows = [
        [
            m["name"],
            m["tau_flop_s"] * 1e12,
            m["tau_mop_s"] * 1e9,
            m["eps_flop_j"] * 1e12,
            m["eps_mop_j"] * 1e9,
            m["pi0_w"],
            m["ridge_flop_per_byte"],
        ]
        for m in payload["modes"]
    ]
    common.out_console.print(
        common.table(
            f"roofline of {model} on {dev.name} ({payload['points']} measurements){common.twin_note(dev)}",
            ["mode", "tau_flop ps", "tau_mop ns", "eps_flop pJ", "eps_mop nJ", "pi0 W", "ridge FLOP/B"],
            rows,
        )
    )
    batch = payload["modes"][0]["batch_size"]
    common.out_console.print(f"every mode at batch {batch}" + (f", {common.fmt(pinned)}" if pinned else ""))
    for m in payload["modes"]:
        varying = {k: v for k, v in m["config"].items() if k not in pinned}
        if varying:
            common.out_console.print(f"  {m['name']}: {common.fmt(varying)}")
    common.out_console.print(
        f"fit error: time {payload['fit']['residual_time']:.1%}, energy {payload['fit']['residual_energy']:.1%}"
    )
    lay = payload["layers"]
    common.out_console.print(
        f"arithmetic intensity at bs {lay['batch']}: whole graph {lay['graph_flop_per_byte']:.3g} FLOP/B; "
        f"median of conv/matmul layers {lay['median_matmul_flop_per_byte']:.3g}, of element-wise layers "
        f"{lay['median_elementwise_flop_per_byte']:.3g} (1 FLOP per 8 bytes moved)"
    )
    if any(m["eps_mop_j"] == 0 for m in payload["modes"]):
        common.out_console.print(
            "eps_mop 0: the fit found no energy per byte beyond what the memory-clock power term already "
            "explains (the two are nearly collinear on these points); more --points can separate them"
        )
    common.out_console.print(f"results: {payload['results']}/ (roofline.json, roofline.png)")


def devices(as_json: bool = options.Json) -> None:
    """List every device kind, and for each whether it can measure here (and why not)."""
    from tuner.devices.registry import known_devices

    found = known_devices()
    if as_json:
        common.emit_json({"devices": found})
        return
    rows, notes = [], []
    for d in found:
        here = {True: "yes", False: "no", None: "-"}[d["usable"]]
        if d["why"]:
            notes.append(f"({len(notes) + 1}) {d['name']}: {d['why']}")
            here += f" ({len(notes)})"
        rows.append([d["name"], here, d["title"]])
    common.out_console.print(common.table("devices", ["name", "measures here", "title"], rows))
    for line in notes:
        common.out_console.print(line)
