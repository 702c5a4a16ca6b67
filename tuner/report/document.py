"""The report folder: report.json, the figures, report.md and report.html, drawn from ReportData alone."""

from __future__ import annotations

import re
from pathlib import Path

from tuner.plumbing import atomicfile
from tuner.plumbing.units import figure
from tuner.report import plots
from tuner.report.analysis import best_per_batch, recommended
from tuner.report.data import TWIN_LABEL, DeviceInfo, Point, ReportData, write_data
from tuner.report.render import Block, Figure, Heading, Para, Table, write_pages
from tuner.space import spelling


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.-]+", "-", text).strip("-") or "x"


def _g(value: float) -> str:
    return figure(value)


def _tag(info: DeviceInfo) -> str:
    return f" [{TWIN_LABEL}]" if info.twin else ""


def provenance_table(data: ReportData) -> Table:
    rows = []
    for d in data.devices:
        p = d.provenance
        software = p.get("software") or {}
        versions = ", ".join(f"{k} {v}" for k, v in software.items() if v)
        driver = p.get("l4t") or p.get("driver") or "-"
        rows.append(
            [
                d.device,
                TWIN_LABEL if d.twin else "hardware",
                str(p.get("hardware") or "-"),
                str(driver),
                str(p.get("host") or "-"),
                ", ".join(d.meters) + "".join(f"; {k} {v}" for k, v in d.meter_details.items()) or "-",
                ", ".join(d.rails) or "-",
                versions,
            ]
        )
    return Table(
        ["device", "twin or hardware", "GPU or board", "driver or L4T", "host", "meter", "rails", "versions"], rows
    )


def group_table(points: list[Point], percentile: str) -> Table:
    """Per batch size: J/query first (the primary unit), then throughput, power and latency percentiles."""
    rows = []
    for p in sorted(points, key=lambda p: p.config.batch_size):
        m = p.measurement
        if m is None or not p.ok:
            reason = p.error or (m.reason if m is not None else "") or "invalid"
            rows.append([str(p.config.batch_size), "-", "-", "-", "-", "-", "-", "-", f"not measured: {reason}"])
            continue
        rows.append(
            [
                str(p.config.batch_size),
                _g(m.j_per_query),
                _g(m.qps),
                _g(m.avg_w),
                _g(m.qps / m.avg_w) if m.avg_w > 0 else "-",
                _g(m.p50_ms),
                _g(m.p90_ms),
                _g(m.p99_ms),
                p.source,
            ]
        )
    columns = ["batch", "J/query", "queries/s", "avg W", "queries/s/W", "p50 ms", "p90 ms", "p99 ms", "source"]
    return Table(columns, rows)


def _config_text(p: Point) -> str:
    return " ".join(f"{k}={spelling(v)}" for k, v in p.config.knobs.items())


def device_section(data: ReportData, info: DeviceInfo, model: str, points: list[Point], folder: Path) -> list[Block]:
    title = f"{model} on {info.device}"
    stem = f"{_slug(info.device)}-{_slug(model)}"
    answer = data.answer(info.device, model)
    best = answer.point() if answer is not None else recommended(points, data.percentile, data.max_latency_ms)
    blocks: list[Block] = [Heading(3, f"{title}{_tag(info)}")]
    if info.twin:
        blocks.append(
            Para(f"Every figure in this section is from a {TWIN_LABEL} (simulated, not measured on hardware).")
        )
    blocks += [Para(f"Note: {note}.") for note in info.notes]
    bound = "" if data.max_latency_ms is None else f" within {data.max_latency_ms:g} ms {data.percentile}"
    if best is None:
        blocks.append(Para(f"Recommended configuration: none{bound or ' (no valid measurement)'}."))
    else:
        m = best.measurement
        where = (
            f"trial {answer.trial} of study {answer.study}, its recommended configuration (what tune export names)"
            if answer is not None
            else best.group
        )
        blocks.append(
            Para(
                f"Recommended configuration{bound}: {where}: batch {best.config.batch_size}, "
                f"{_g(m.j_per_query)} J/query, {_g(m.qps)} queries/s, {_g(m.avg_w)} W, "
                f"{data.percentile} {_g(m.latency_ms(data.percentile))} ms ({_config_text(best)})."
            )
        )
        said = answer.saved if answer is not None else data.saved.get(f"{info.device}|{model}")
        if said is not None:
            blocks.append(Para(f"What it saves: {said.line}."))
    for other in data.answers:
        if (other.device, other.model) == (info.device, model) and other is not answer:
            m = other.measurement
            blocks.append(
                Para(
                    f"Study {other.study} ({other.percentile} <= {other.max_latency_ms:g} ms, another bound than "
                    f"this report's) recommends trial {other.trial}: batch {other.config.batch_size}, "
                    f"{_g(m.j_per_query)} J/query, {other.percentile} {_g(m.latency_ms(other.percentile))} ms "
                    f"({_config_text(other.point())}); give --max-latency {other.max_latency_ms:g}ms to report on it."
                )
            )
    groups: dict[str, list[Point]] = {}
    for p in points:
        groups.setdefault(p.group, []).append(p)
    for group, members in groups.items():
        blocks += [Heading(4, f"{group}{_tag(info)}"), group_table(members, data.percentile)]
    plots.plot_batch(points, folder / f"{stem}-batch.png", title, info.twin)
    plots.plot_front(points, folder / f"{stem}-front.png", title, info.twin, data.percentile, best, data.max_latency_ms)
    blocks += [
        Figure(f"{stem}-batch.png", f"{title}: throughput and queries per joule against batch size{_tag(info)}"),
        Figure(f"{stem}-front.png", f"{title}: energy per query against {data.percentile} latency{_tag(info)}"),
    ]
    trace = next((t for t in data.traces if t.device == info.device and t.model == model), None)
    if trace is None:
        blocks.append(Para("Power over time: this device reads no instantaneous power, so no trace is shown."))
    else:
        plots.plot_trace(trace, folder / f"{stem}-power.png", title, info.twin)
        blocks += [
            Para(f"Power over one window ({trace.group}, batch {trace.batch_size}): {trace.note}."),
            Figure(f"{stem}-power.png", f"{title}: power over time of one window{_tag(info)}"),
        ]
    return blocks


def compare_section(data: ReportData, model: str, folder: Path) -> list[Block]:
    """Devices side by side on one model: per batch size, each device's best mode."""
    by_device = {
        d.device: ([p for p in data.points if p.device == d.device and p.model == model], d.twin) for d in data.devices
    }
    rows = []
    for name, (points, twin) in by_device.items():
        for batch, p in best_per_batch(points).items():
            m = p.measurement
            rows.append(
                [
                    f"{name}{' (' + TWIN_LABEL + ')' if twin else ''}",
                    str(batch),
                    p.group,
                    _g(m.j_per_query),
                    _g(m.qps),
                    _g(m.avg_w),
                    _g(m.latency_ms(data.percentile)),
                ]
            )
    file = f"{_slug(model)}-devices.png"
    plots.plot_devices(by_device, folder / file, f"{model}: devices compared")
    twins = [name for name, (_, twin) in by_device.items() if twin]
    tag = f" [{TWIN_LABEL}: {', '.join(twins)}]" if twins else ""
    return [
        Heading(3, f"Devices compared on {model}{tag}"),
        Table(["device", "batch", "best mode", "J/query", "queries/s", "avg W", f"{data.percentile} ms"], rows),
        Figure(file, f"{model}: devices compared{tag}"),
    ]


def write_report(data: ReportData, folder: Path) -> None:
    """Write the whole folder; report.json last but one, the pages last (they embed the figures)."""
    atomicfile.ensure_folder(folder)
    any_twin = any(d.twin for d in data.devices)
    title = f"Characterization: {', '.join(data.models)} on {', '.join(d.device for d in data.devices)}"
    blocks: list[Block] = [
        Heading(1, title),
        Para(
            f"Created {data.created}; scenario {data.scenario}; latency percentile {data.percentile}"
            + ("" if data.max_latency_ms is None else f"; bound {data.max_latency_ms:g} ms")
            + ". Energy per query (J/query) is the primary figure; queries/s/W is its inverse."
        ),
        Para(f"Command: {data.command}"),
    ]
    if any_twin:
        blocks.append(Para(f"Figures marked [{TWIN_LABEL}] are simulated by a {TWIN_LABEL}, not measured on hardware."))
    blocks += [Heading(2, "Provenance"), provenance_table(data)]
    for model in data.models:
        blocks.append(Heading(2, model))
        if len(data.devices) > 1:
            blocks += compare_section(data, model, folder)
        for info in data.devices:
            points = [p for p in data.points if p.device == info.device and p.model == model]
            blocks += device_section(data, info, model, points, folder)
    write_data(data, folder / "report.json")
    write_pages(blocks, folder, title)
