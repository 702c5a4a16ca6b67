"""Argument checks and output helpers shared by the commands (their shared options: tuner.cli.options).

Every check here runs before a command touches disk or hardware: a command
that fails on bad input leaves the folder exactly as it found it.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import typer
from rich import box
from rich.console import Console, Group
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from tuner.devices.base import Device
from tuner.devices.registry import open_device
from tuner.errors import UserError, did_you_mean
from tuner.plumbing import atomicfile, readfile
from tuner.plumbing.units import figure, parse_int_list, parse_latency_ms
from tuner.provenance import twin_note as twin_note
from tuner.storage import redact, sqlite_path

out_console = Console(markup=False)
err_console = Console(stderr=True, markup=False)


def ci_fraction(text: str) -> float:
    """``1%`` or ``0.01`` -> 0.01; anything else is a one-line error."""
    raw = text.strip()
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        value = -1.0
    if not 0 < value < 1:
        raise UserError(f"--ci {text!r} is not a relative width: pass e.g. 1% or 0.01")
    return value


def latency(text: str) -> float:
    return parse_latency_ms(text)


def batch_list(text: str | None) -> list[int] | None:
    return None if text is None else parse_int_list(text, "--batch-sizes")


def knob_list(text: str | None) -> list[str] | None:
    return None if text is None else [k.strip() for k in text.split(",") if k.strip()]


def choice(value: str, choices: tuple[str, ...] | list[str], flag: str) -> str:
    """``value`` if it is one of ``choices`` (case-insensitive), else a one-line error with a suggestion."""
    if value.lower() not in choices:
        raise UserError(
            f"unknown {flag.lstrip('-')} {value!r}{did_you_mean(value.lower(), choices)}: "
            f"choose one of {', '.join(choices)}"
        )
    return value.lower()


def _nearest_existing(path: Path) -> Path:
    for candidate in (path, *path.parents):
        if os.path.lexists(candidate):
            return candidate
    return Path("/")


STUDY_SPACE = 1 << 20  # a new study file's schema and first trials
FILE_SUFFIXES = (".yaml", ".yml", ".json", ".csv", ".png")


def check_results_folder(out: Path) -> Path:
    """``--out`` is the results folder in every command; one that names a file (best.yaml) meant ``-o``."""
    if Path(out).suffix.lower() == ".db" and not Path(out).is_dir():
        raise UserError(
            f"--out {out} looks like a database, but --out is the results folder (default studies): "
            f"name the study storage with --storage sqlite:///{Path(out).as_posix()}"
        )
    if Path(out).suffix.lower() in FILE_SUFFIXES and not Path(out).is_dir():
        raise UserError(
            f"--out {out} looks like a file name, but --out is the results folder (default studies): "
            f"use -o {out} to name the export or policy file, and --out for the folder of your studies"
        )
    return Path(out)


def check_out_dir(path: Path, flag: str = "--out") -> Path:
    """A folder that exists, or can be created where it is named; nothing is created here."""
    if flag == "--out":
        check_results_folder(path)
    path = Path(path)
    atomicfile.check_writable(path, flag)
    found = _nearest_existing(path.absolute())
    if not found.is_dir():
        what = "is a file" if found == path.absolute() else f"is under {found}, which is a file"
        raise UserError(f"{flag} {path} {what}, not a folder: give a folder")
    if not os.access(found, os.W_OK | os.X_OK):
        raise UserError(f"{flag} {path}: {found} is not writable by this user: give a folder you can write to")
    return path


def check_out_file(path: Path, flag: str = "--output") -> Path:
    """A file path that can be written: not a folder, in a folder that exists or can be created."""
    path = Path(path)
    if path.is_dir():
        raise UserError(f"{flag} {path} is a folder, not a file: give a file name, e.g. {path / 'best.yaml'}")
    if path.exists() and not os.access(path, os.W_OK):
        raise UserError(f"{flag} {path} is not writable by this user: give another file name")
    check_out_dir(path.parent, flag)
    return path


def run_storage(storage: str | None, out: Path) -> str:
    """The storage a measuring command will write, checked (not created) up front."""
    check_out_dir(out)
    url = storage if storage is not None else f"sqlite:///{(Path(out) / 'tune.db').as_posix()}"
    path = sqlite_path(url)
    if path is not None:
        flag = "--storage" if storage is not None else "--out"
        if path.is_dir():
            raise UserError(f"--storage {storage}: {path} is a folder: name the database file, e.g. {path}/tune.db")
        if storage is not None and not os.path.lexists(path.parent):
            raise UserError(
                f"--storage {storage}: the folder {path.parent} does not exist: create it (mkdir -p {path.parent}) "
                "or name a file in a folder that does"
            )
        check_out_dir(path.parent, flag)
        atomicfile.check_target(path, flag)
        if not path.exists():
            atomicfile.check_space(path, STUDY_SPACE, flag)
        for name in (path, path.with_name(path.name + ".lock")):
            if name.exists():
                readfile.check_trusted(name, "study storage" if name == path else "study lock")
    return url


def read_storage(storage: str | None, out: Path) -> str:
    """The storage a reading command opens; a missing SQLite file is an error, never created."""
    check_results_folder(out)
    url = storage if storage is not None else f"sqlite:///{(Path(out) / 'tune.db').as_posix()}"
    path = sqlite_path(url)
    if path is not None and not path.is_file():
        where = "--storage" if storage is not None else "--out"
        raise UserError(
            f"no study storage at {redact(url)}: run tune run first, or point {where} at the folder of your studies"
        )
    return url


def device(name: str, **options: Any) -> Device:
    return open_device(name, **options)


def emit_json(obj: Any) -> None:
    """The whole stdout of a --json command: one JSON document, strict (a missing figure is null, never NaN)."""
    typer.echo(json.dumps(_strict(obj), indent=2, default=str, allow_nan=False))


def _strict(obj: Any) -> Any:
    """``obj`` with every non-finite float as None: bare NaN or Infinity is not JSON, and strict parsers refuse it."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {key: _strict(value) for key, value in obj.items()}
    if isinstance(obj, list | tuple):
        return [_strict(value) for value in obj]
    return obj


def table(title: str, columns: list[str], rows: list[list[Any]], compact: bool = False) -> Table:
    """A table of formatted cells (see fmt); ``compact`` draws no lines, for many columns at 80 characters."""
    t = Table(title=title, box=None, pad_edge=False) if compact else Table(title=title)
    for c in columns:
        t.add_column(c, justify="left" if c in _TEXT_COLUMNS else "right")
    for r in rows:
        t.add_row(*[fmt(v) for v in r])
    return t


_TEXT_COLUMNS = (
    "config",
    "front",
    "name",
    "kind",
    "title",
    "measures here",
    "worker",
    "device",
    "mode",
    "strategy",
    "scope",
)


def fmt(value: Any) -> str:
    """A table cell: 4 significant digits, yes/no for booleans, - for nothing, a dict as exact knob=value pairs."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if value is None:
        return "-"
    if isinstance(value, float):
        return figure(value)
    if isinstance(value, dict):
        return " ".join(f"{k}={knob_value(v)}" for k, v in value.items())
    return str(value)


def pinned_knobs(configs: list[dict[str, Any]]) -> dict[str, Any]:
    """Knobs with one value in every configuration shown (an observe-only GPU's clocks, say): shown once."""
    if len(configs) < 2:
        return {}
    first = configs[0]
    return {k: v for k, v in first.items() if all(c.get(k) == v for c in configs[1:])}


def clock(seconds: float) -> str:
    """Elapsed time or an ETA in a progress line: h:mm:ss."""
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{secs:02d}"


def count_progress(label: str, unit: str, quiet: bool) -> Progress:
    """A transient progress bar on stderr that counts ``unit`` done out of a total, with ETA."""
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}" + (f" {unit}" if unit else "")),
        TimeRemainingColumn(),
        console=err_console,
        disable=quiet,
        transient=True,
    )


def configs_table(
    title: str, rows: list[dict[str, Any]], percentile: str, pinned: dict[str, Any], verdict: bool = True
) -> Group:
    """Configurations as rows, a column per knob that varies (those that never vary are ``pinned``).

    Each row is a trial record (tuner.records.trial_record) with ``recommended``
    set on the study's answer, which is marked ``*``; ``verdict`` adds whether
    each meets the bound. The title is a line of its own above the table (it
    may be wider than the table). Compact, so that five knobs fit in 80 columns:
    headers wrap at their underscores, values never.
    """
    knobs = [k for k in dict.fromkeys(k for r in rows for k in r["config"]) if k not in pinned]
    llm = any("j_per_token" in r for r in rows)
    figures = figure_columns(percentile, llm)
    # An LLM row's five figures leave no room for the window count in 80 columns (trials.csv has it).
    windows = [] if llm else ["windows"]
    t = Table(box=box.SIMPLE_HEAD, padding=(0, 0), pad_edge=False, show_edge=False)
    for name in ["", "trial", "batch", *knobs, *figures, *(["ok"] if verdict else []), *windows]:
        t.add_column(column_head(name), justify="left" if name in ("", "nvpmodel") else "right", no_wrap=True)
    for r in rows:
        cells = [
            "*" if r.get("recommended") else "",
            r["trial"],
            r["batch_size"],
            *[knob_value(r["config"].get(k, "-")) for k in knobs],
            *[r.get(key) for key in figures.values()],
            *(["yes" if r["feasible"] else "no"] if verdict else []),
            *([r.get("windows", 1)] if windows else []),
        ]
        t.add_row(*[fmt(v) for v in cells])
    return Group(Text(title), t)


def figure_columns(percentile: str, llm: bool) -> dict[str, str]:
    """A table's figure columns, heading to record key: J/query and the latency; an LLM's J/token, tok/s, TTFT, TPOT."""
    if not llm:
        return {"J/query": "j_per_query", f"{percentile}_ms": f"{percentile}_ms"}
    return {
        "J/tok": "j_per_token",
        "J/query": "j_per_query",
        "tok/s": "tokens_per_s",
        f"ttft_{percentile}_ms": f"ttft_{percentile}_ms",
        f"tpot_{percentile}_ms": f"tpot_{percentile}_ms",
    }


UNITS = {"mhz": "MHz", "w": "W", "ms": "ms", "qps": "q/s", "c": "C"}


def column_head(name: str) -> str:
    """A knob or figure as a column heading, a line per word, its unit spelt as one (power_limit_w: power limit W)."""
    words = name.split("_")
    if len(words) > 1 and words[-1] in UNITS:
        words[-1] = UNITS[words[-1]]
    return "\n".join(words)


def knob_value(value: Any) -> str:
    """A knob's value as the space file writes it (1300.5 MHz stays 1300.5; 2112.0 reads 2112)."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if value is None:
        return "-"
    return f"{value:g}" if isinstance(value, float) else str(value)


def recommended_table(best: dict[str, Any], title: str, percentile: str, pinned: dict[str, Any] | None = None) -> Group:
    """The recommended configuration as one table row, as tune run and tune pareto print it."""
    return configs_table(title, [{**best, "recommended": True}], percentile, pinned or {}, verdict=False)
