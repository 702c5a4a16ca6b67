"""tune pareto, tune export, tune dashboard: reading studies back."""

from __future__ import annotations

from pathlib import Path

import optuna
import typer

from tuner.cli import common
from tuner.deploy import export_config, write_export
from tuner.errors import UserError, did_you_mean
from tuner.pareto import build_pareto, results_dir, write_results
from tuner.storage import driver_url, open_storage, scrub, storage_errors
from tuner.study import open_study, redact
from tuner.units import format_ms


def find_study(storage: str, model: str, device: str, bound_ms: float | None, exact: bool = True) -> optuna.Study:
    """The study of a model on a device, picked by bound when several exist.

    ``device`` may be what was typed at ``tune run`` (sim:orin, cuda:0), the
    results folder name (sim-orin, h200) or the device kind, so reading
    results never needs the hardware present. With ``exact`` a bound names a
    study and no other one is shown in its place; without (``tune export``) a
    bound with no study of its own reads the largest study, whose measured
    latencies are re-checked against it.
    """
    try:
        with storage_errors(storage):
            summaries = optuna.get_all_study_summaries(storage=open_storage(storage, None), include_best_trial=False)
    except UserError:
        raise
    except Exception as exc:
        raise UserError(
            f"cannot read study storage {redact(storage)}: {scrub(str(exc).splitlines()[0], storage)}"
        ) from None
    matches = [
        s
        for s in summaries
        if s.user_attrs.get("model") == model
        and device in (s.user_attrs.get("device"), s.user_attrs.get("device_slug"), s.user_attrs.get("device_kind"))
    ]
    if not matches:
        models = {str(s.user_attrs.get("model")) for s in summaries}
        devices = {str(s.user_attrs.get(k)) for s in summaries for k in ("device", "device_slug", "device_kind")}
        hint = did_you_mean(model, models) if model not in models else did_you_mean(device, devices)
        raise UserError(
            f"no study of {model} on {device} in {redact(storage)}{hint}: run tune run first, or pass --storage/--out"
        )
    if bound_ms is not None:
        same = [s for s in matches if abs(float(s.user_attrs.get("max_latency_ms", -1)) - bound_ms) < 1e-9]
        same.sort(key=lambda s: s.user_attrs.get("scenario", "offline") != "offline")  # Offline before Server
        if not same and exact:
            bounds = ", ".join(sorted({format_ms(float(s.user_attrs.get("max_latency_ms", 0))) for s in matches}))
            raise UserError(
                f"no study of {model} on {device} at {format_ms(bound_ms)} (bounds tuned: {bounds}): "
                f"pick one of those with --max-latency, or run tune run at {format_ms(bound_ms)}"
            )
        chosen = same[0] if same else max(matches, key=lambda s: s.n_trials)
    elif len(matches) == 1:
        chosen = matches[0]
    else:
        bounds = ", ".join(format_ms(float(s.user_attrs.get("max_latency_ms", 0))) for s in matches)
        raise UserError(f"{len(matches)} studies of {model} on {device} (bounds {bounds}): pick one with --max-latency")
    return open_study(chosen.study_name, storage)


def register(app: typer.Typer) -> None:
    @app.command()
    def pareto(
        model: str = common.ModelOpt,
        device: str = common.DeviceOpt,
        max_latency: str | None = typer.Option(
            None, "--max-latency", "-l", help="which study, when several bounds were tuned"
        ),
        storage: str | None = common.StorageOpt,
        out: Path = common.OutOpt,
        as_json: bool = common.JsonOpt,
    ) -> None:
        """Print the Pareto fronts (energy vs latency) of a study and rewrite its result files."""
        bound = common.latency(max_latency) if max_latency is not None else None
        common.check_out_dir(out)
        url = common.read_storage(storage, out)
        study = find_study(url, model, device, bound)
        folder = results_dir(out, study.user_attrs["device_slug"], model)
        result = write_results(study, folder) if not as_json else build_pareto(study)
        if as_json:
            common.emit_json(result.model_dump(mode="json"))
            return
        twin = " [digital twin]" if result.twin else ""
        points = [(name, p) for name, front in result.fronts.items() for p in front]
        pinned = common.pinned_knobs([p.config for _, p in points])
        if pinned:
            common.out_console.print(f"the same in every row: {common.fmt(pinned)}")
        rows = [
            [
                name,
                p.trial,
                p.batch_size,
                {k: v for k, v in p.config.items() if k not in pinned} or "-",
                p.j_per_query,
                p.latency_ms,
                "yes" if p.feasible else "no",
            ]
            for name, p in points
        ]
        common.out_console.print(
            common.table(
                f"Pareto fronts: {model} on {result.device}, bound {result.max_latency_ms:g} ms{twin}",
                ["front", "trial", "batch", "config", "J/query", f"{result.percentile} ms", "feasible"],
                rows,
            )
        )
        common.out_console.print(f"written: {folder}/pareto.json, pareto.csv, pareto.png, trials.csv")

    @app.command()
    def export(
        model: str = common.ModelOpt,
        device: str = common.DeviceOpt,
        max_latency: str = typer.Option(..., "--max-latency", "-l", help="the bound the exported mode must meet"),
        output: Path = typer.Option(Path("best.yaml"), "--output", "-o", help="YAML file to write"),
        storage: str | None = common.StorageOpt,
        out: Path = common.OutOpt,
        as_json: bool = common.JsonOpt,
    ) -> None:
        """Write the best measured configuration under a bound as versioned YAML, for tune apply."""
        bound = common.latency(max_latency)
        common.check_out_file(output, "--output")
        url = common.read_storage(storage, out)
        study = find_study(url, model, device, bound, exact=False)
        exported = export_config(study, url, bound)
        write_export(exported, output)
        if as_json:
            common.emit_json({"written": str(output), **exported.model_dump(mode="json")})
            return
        twin = " [digital twin]" if exported.twin else ""
        m = exported.metrics
        common.out_console.print(
            f"{output}: {model} on {exported.device_kind}, batch {exported.batch_size}, "
            f"{common.fmt(exported.knobs)}: {m['j_per_query']:.4g} J/query, "
            f"{exported.percentile} {m[exported.percentile + '_ms']:.4g} ms{twin}"
        )

    @app.command()
    def dashboard(
        storage: str | None = common.StorageOpt,
        out: Path = common.OutOpt,
        host: str = typer.Option("127.0.0.1", "--host", help="address to serve on (127.0.0.1: this machine only)"),
        port: int = typer.Option(8080, "--port", help="TCP port to serve on"),
    ) -> None:
        """Browse the studies in optuna-dashboard (optional extra: pip install 'powertune[dashboard]')."""
        if not 0 < port < 65536:
            raise UserError(f"--port {port} is not a TCP port: give 1..65535, e.g. 8080")
        try:
            import optuna_dashboard
        except ImportError:
            raise UserError("optuna-dashboard is not installed: pip install 'powertune[dashboard]'") from None
        url = common.read_storage(storage, out)
        common.err_console.print(f"dashboard for {redact(url)} on http://{host}:{port}/ (Ctrl-C to stop)")
        optuna_dashboard.run_server(driver_url(url), host=host, port=port)
