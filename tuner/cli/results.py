"""tune pareto, tune export, tune dashboard: reading studies back."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import optuna
import typer

from tuner import baseline
from tuner.cli import common, options
from tuner.dashboard import dashboard_app, serve
from tuner.deploy import export_config
from tuner.deploy.formats import ALL_FORMATS, export_paths, write_exports
from tuner.errors import UserError
from tuner.llm import bounds_text
from tuner.lookup import find_study, study_label
from tuner.pareto import (
    build_pareto,
    completed_records,
    out_of_bound,
    results_dir,
    rows_left_out,
    summary_points,
    write_results,
)
from tuner.storage import redact, storage_errors

ExportBound = typer.Option(
    None, "--max-latency", "-l", help="the study's bound (which study, when several bounds were tuned)"
)
ShowAll = typer.Option(False, "--all", help="every measured configuration, not only the fronts")
ExportFile = typer.Option(
    Path("best.yaml"), "--output", "-o", help="file to write; each format takes its suffix (best.conf, best.pbtxt, ...)"
)
ExportFormat = typer.Option(
    ["yaml"],
    "--format",
    "-f",
    help=f"{'|'.join(ALL_FORMATS)}, repeat or comma-separate for several; each file's first lines say what it "
    "cannot hold",
)
Host = typer.Option("127.0.0.1", "--host", help="address to serve on (127.0.0.1: this machine only)")
Port = typer.Option(8080, "--port", help="TCP port to serve on")


def study_folder(out: Path, study: optuna.Study) -> Path:
    """Where ``tune run`` wrote this study's results: <out>/<device>/<model>/[<scenario>/]."""
    attrs = study.user_attrs
    folder = results_dir(out, attrs["device_slug"], attrs["model"])
    label = study_label(attrs)
    return folder if label == "offline" else folder / label.replace("@", "-")


def pareto(
    model: str = options.Model,
    device: str = options.Device,
    max_latency: str | None = options.StudyBound,
    scenario: str | None = options.StudyScenario,
    show_all: bool = ShowAll,
    storage: str | None = options.Storage,
    out: Path = options.Out,
    as_json: bool = options.Json,
) -> None:
    """Summarise a study: its recommended configuration, then each batch size's front; rewrite its files."""
    bound = common.latency(max_latency) if max_latency is not None else None
    common.check_out_dir(out)
    url = common.read_storage(storage, out)
    study = find_study(url, model, device, bound, scenario)
    folder = study_folder(out, study)
    result = write_results(study, folder) if not as_json else build_pareto(study)
    saved = baseline.saved_of(study)
    if as_json:
        common.emit_json({**result.model_dump(mode="json"), "saved": None if saved is None else saved.model_dump()})
        return
    twin = " [digital twin]" if result.twin else ""
    bounds = bounds_text(result.max_latency_ms or math.inf, result.percentile, result.max_ttft_ms, result.max_tpot_ms)
    title = f"{model} on {result.device}, {bounds}{twin}"
    lat = f"{result.percentile}_ms"
    shown = [] if show_all else summary_points(result)
    rows = completed_records(study) if show_all else [{**p.model_dump(), lat: p.latency_ms} for p in shown]
    pinned = common.pinned_knobs([r["config"] for r in rows + ([result.best] if result.best else [])])
    if pinned:
        common.out_console.print(f"the same in every row: {common.fmt(pinned)}")
    if result.best is None:
        common.out_console.print(f"{title}: no configuration meets the bound yet")
    else:
        common.out_console.print(
            common.recommended_table(result.best, f"recommended: {title}", result.percentile, pinned)
        )
        common.out_console.print(f"saved: {saved.line}{twin}" if saved else baseline.unmeasured_line(study))
    heading = "every measured configuration" if show_all else "per batch size, its front within the bound"
    common.out_console.print(common.configs_table(f"{heading} (* recommended)", rows, result.percentile, pinned))
    left = {} if show_all else rows_left_out(result, shown)
    if left:
        common.out_console.print(
            "rows shown of each front within the bound: "
            + "; ".join(f"batch {b}: {n} of {m}" for b, (n, m) in sorted(left.items()))
        )
    far = {} if show_all else out_of_bound(result)
    if far:
        common.out_console.print(
            "none within the bound at batch "
            + ", ".join(f"{b} (fastest {p.latency_ms:.4g} ms, trial {p.trial})" for b, p in sorted(far.items()))
        )
    common.out_console.print(
        f"{result.configurations} configurations in {result.trials_completed} completed trials; "
        f"{'' if show_all else '--all lists every one; '}written: {folder}/pareto.json, pareto.csv, pareto.png"
    )


def export(
    model: str = options.Model,
    device: str = options.Device,
    max_latency: str | None = ExportBound,
    scenario: str | None = options.StudyScenario,
    output: Path = ExportFile,
    formats: list[str] = ExportFormat,
    storage: str | None = options.Storage,
    out: Path = options.Out,
    sysfs_root: Path | None = options.SysfsRoot,
    as_json: bool = options.Json,
) -> None:
    """Write the study's recommended configuration: YAML for tune apply, or nvpmodel, Triton, trtexec, env, JSON,
    and an LLM study's vLLM or llama.cpp server command line."""
    bound = common.latency(max_latency) if max_latency is not None else None
    wanted = [f.strip() for item in formats for f in item.split(",") if f.strip()]
    for path in export_paths(output, wanted).values():
        common.check_out_file(path, "--output")
    url = common.read_storage(storage, out)
    study = find_study(url, model, device, bound, scenario)
    exported = export_config(study, url)
    board = None
    if "nvpmodel" in wanted:
        from tuner.devices.jetson import DEVICE_KINDS
        from tuner.devices.registry import device_name_for_kind, open_device

        if exported.device_kind not in DEVICE_KINDS.values():
            raise UserError(
                f"the nvpmodel format is a Jetson board's power mode; this study is of {exported.device_kind}: "
                "export triton, trtexec, env or json instead"
            )
        try:
            board = open_device(device_name_for_kind(exported.device_kind), sysfs_root=sysfs_root)
        except UserError as exc:
            if not exported.twin or sysfs_root is not None or "no Jetson board" not in str(exc):
                raise
            board = open_device(exported.device)  # no board here: the twin's model of NVIDIA's conf, said in the file
    written = write_exports(exported, output, wanted, board)
    if as_json:
        common.emit_json({"written": [str(p) for p in written.values()], **exported.sealed().model_dump(mode="json")})
        return
    twin = " [digital twin]" if exported.twin else ""
    m = exported.metrics
    files = ", ".join(map(str, written.values()))
    common.out_console.print(
        f"{files}: {model} on {exported.device_kind}, trial {exported.provenance.trial}, "
        f"batch {exported.batch_size}, {common.fmt(exported.knobs)}: {m['j_per_query']:.4g} J/query, "
        f"{exported.percentile} {m[exported.percentile + '_ms']:.4g} ms (mean of {m['windows']} windows){twin}"
    )
    common.out_console.print(
        f"saved: {exported.saved.line}{twin}" if exported.saved else baseline.unmeasured_line(study)
    )


def dashboard(
    storage: str | None = options.Storage,
    out: Path = options.Out,
    host: str = Host,
    port: int = Port,
) -> None:
    """Browse the studies in optuna-dashboard, read-only (optional extra: pip install 'powertune[dashboard]')."""
    if not 0 < port < 65536:
        raise UserError(f"--port {port} is not a TCP port: give 1..65535, e.g. 8080")
    if importlib.util.find_spec("optuna_dashboard") is None:
        raise UserError("optuna-dashboard is not installed: pip install 'powertune[dashboard]'")
    url = common.read_storage(storage, out)
    with storage_errors(url):
        app = dashboard_app(url)
    common.err_console.print(
        f"dashboard for {redact(url)} on http://{host}:{port}/, read-only; objective values are J per query "
        "(Ctrl-C to stop)"
    )
    try:
        serve(app, host, port)
    except OSError as exc:
        reason = exc.strerror or exc
        raise UserError(f"cannot serve on {host}:{port} ({reason}): give another --port or --host") from None
