"""tune status: how far a (fleet's) study is, per worker."""

from __future__ import annotations

from pathlib import Path

import typer

from tuner.cli import common, options
from tuner.errors import UserError
from tuner.fleet import FleetStatus, StudyStatus, all_statuses, fleet_summary, study_status
from tuner.lookup import find_study

StatusModel = typer.Option(None, "--model", "-m", help="the study's model (default: every study)")
Fleet = typer.Option(
    False, "--fleet", help="every unit's tune verify verdict: verified, re-tuned and why, energy spread"
)
StatusDevice = typer.Option(
    None, "--device", "-d", help="the study's device, results folder or kind, e.g. sim:orin, orin-agx"
)


def status(
    model: str | None = StatusModel,
    device: str | None = StatusDevice,
    max_latency: str | None = options.StudyBound,
    scenario: str | None = options.StudyScenario,
    fleet: bool = Fleet,
    storage: str | None = options.Storage,
    out: Path = options.Out,
    as_json: bool = options.Json,
) -> None:
    """Progress of a study across workers: trials done, running, failed, recommended configuration so far."""
    if fleet:
        print_fleet(fleet_summary(common.read_storage(storage, out)), as_json)
        return
    if (model is None) != (device is None):
        raise UserError("give both --model and --device to pick a study, or neither to list every study")
    bound = common.latency(max_latency) if max_latency is not None else None
    url = common.read_storage(storage, out)
    if model is not None and device is not None:
        statuses = [study_status(find_study(url, model, device, bound, scenario), url)]
    else:
        statuses = all_statuses(url)
    if as_json:
        common.emit_json({"studies": [s.model_dump(mode="json") for s in statuses]})
        return
    if not statuses:
        common.out_console.print("no studies in this storage yet: start one with tune run")
    for s in statuses:
        print_status(s)


def print_status(s: StudyStatus) -> None:
    target = f"/{s.target}" if s.target else ""
    # A study's value is J per query, or per output token for an LLM (its records carry j_per_token).
    key, unit = ("j_per_token", "J/token") if s.best and "j_per_token" in s.best else ("j_per_query", "J/query")
    best = "-" if s.best is None else f"{s.best[key]:.4g} {unit} (trial {s.best['trial']})"
    common.out_console.print(
        f"{s.study}: {s.complete}{target} complete, {s.running} running, {s.waiting} queued, "
        f"{s.failed} failed, {s.retried} retries; recommended {best}"
    )
    table = common.table(
        f"workers of {s.study} ({s.storage})",
        ["worker", "device", "complete", "running", "failed", f"best {unit}", "last finished"],
        [
            [
                w.worker,
                w.device or "-",
                w.complete,
                w.running,
                w.failed,
                "-" if w.best_j_per_query is None else f"{w.best_j_per_query:.4g} (#{w.best_trial})",
                (w.last_finished or "-")[11:19] or "-",
            ]
            for w in s.workers
        ],
    )
    table.columns[0].no_wrap = True
    common.out_console.print(table)


def print_fleet(fleets: list[FleetStatus], as_json: bool) -> None:
    """``tune status --fleet``: per study, every unit's verdict and the energy spread across units."""
    if as_json:
        common.emit_json({"fleets": [f.model_dump(mode="json") for f in fleets]})
        return
    if not fleets:
        common.out_console.print("no unit has verified an export in this storage yet: run tune verify --storage URL")
    for f in fleets:
        line = f"{f.study}: {len(f.units)} units, {f.verified} verified, {f.retuned} re-tuned"
        if f.spread:
            s = f.spread
            line += (
                f"; energy as deployed {s['min']:.4g}..{s['max']:.4g} J/query "
                f"(median {s['median']:.4g}, spread {s['relative']:.1%})"
            )
        if f.unreadable:
            line += f"; unreadable verdicts: {', '.join(f.unreadable)}"
        common.out_console.print(line)
        rows = [
            [
                u.unit,
                u.verdict,
                u.windows,
                f"{u.j_per_query / u.study_j_per_query:.3f}",
                f"{u.deployed_j:.4g}",
                u.reason if not u.retune else f"re-tuned: {u.reason}",
            ]
            for u in f.units
        ]
        table = common.table(f"units of {f.study}", ["unit", "verdict", "win", "E/study", "J/query", "why"], rows)
        table.columns[0].no_wrap = True
        common.out_console.print(table)
