"""report.md and report.html from one list of blocks, so the two pages always say the same.

The HTML page inlines its figures as base64 PNGs and needs no server or
network; the markdown page links the PNG files beside it.
"""

from __future__ import annotations

import base64
import html
from dataclasses import dataclass
from pathlib import Path

from tuner.plumbing import atomicfile


@dataclass(frozen=True)
class Heading:
    level: int
    text: str


@dataclass(frozen=True)
class Para:
    text: str


@dataclass(frozen=True)
class Table:
    columns: list[str]
    rows: list[list[str]]


@dataclass(frozen=True)
class Figure:
    file: str
    alt: str


Block = Heading | Para | Table | Figure


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown(blocks: list[Block]) -> str:
    out: list[str] = []
    for b in blocks:
        if isinstance(b, Heading):
            out.append(f"{'#' * b.level} {b.text}")
        elif isinstance(b, Para):
            out.append(b.text)
        elif isinstance(b, Table):
            out.append("| " + " | ".join(_md_cell(c) for c in b.columns) + " |")
            out.append("|" + "|".join("---" for _ in b.columns) + "|")
            out.extend("| " + " | ".join(_md_cell(c) for c in row) + " |" for row in b.rows)
        else:
            out.append(f"![{b.alt}]({b.file})")
        out.append("")
    return "\n".join(out)


STYLE = (
    "body{font-family:sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}"
    "table{border-collapse:collapse;margin:0.5em 0 1.5em;font-size:0.9em}"
    "th,td{border:1px solid #ccc;padding:3px 8px;text-align:right}th{background:#f2f2f2}"
    "td.t{text-align:left}img{max-width:100%}"
)


def _cell(text: str) -> str:
    """Numbers right-aligned, text left-aligned."""
    try:
        float(text)
    except ValueError:
        return f'<td class="t">{html.escape(text)}</td>'
    return f"<td>{html.escape(text)}</td>"


def html_page(blocks: list[Block], folder: Path, title: str) -> str:
    """A standalone page: figures read from ``folder`` and embedded."""
    body: list[str] = []
    for b in blocks:
        if isinstance(b, Heading):
            body.append(f"<h{b.level}>{html.escape(b.text)}</h{b.level}>")
        elif isinstance(b, Para):
            body.append(f"<p>{html.escape(b.text)}</p>")
        elif isinstance(b, Table):
            head = "".join(f"<th>{html.escape(c)}</th>" for c in b.columns)
            rows = "".join("<tr>" + "".join(_cell(c) for c in r) + "</tr>" for r in b.rows)
            body.append(f"<table><tr>{head}</tr>{rows}</table>")
        else:
            data = base64.b64encode((folder / b.file).read_bytes()).decode("ascii")
            body.append(f'<p><img alt="{html.escape(b.alt)}" src="data:image/png;base64,{data}"></p>')
    return (
        f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f"<style>{STYLE}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n"
    )


def write_pages(blocks: list[Block], folder: Path, title: str) -> None:
    atomicfile.write_text(folder / "report.md", markdown(blocks))
    atomicfile.write_text(folder / "report.html", html_page(blocks, folder, title))
