"""LoadGen's verdict on a window, read from the logs it wrote (mlperf_log_summary.txt and _detail.txt)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tuner.measure.results import LoadGenSummary

_SUMMARY_LATENCY = re.compile(r"^([\w. ]*latency) \(ns\)\s*:\s*([\d.]+)", re.MULTILINE)


def mllog_entries(detail_file: Path) -> Iterator[dict[str, Any]]:
    """Each ``:::MLLOG`` JSON entry of LoadGen's detail log, in order; lines that do not parse are skipped."""
    for line in detail_file.read_text(errors="replace").splitlines():
        if not line.startswith(":::MLLOG"):
            continue
        try:
            entry = json.loads(line[len(":::MLLOG") :])
        except ValueError:
            continue
        if isinstance(entry, dict):
            yield entry


def parse_logs(log_dir: str | Path) -> LoadGenSummary:
    """Read LoadGen's verdict from the summary (human text) and detail (:::MLLOG JSON) logs.

    The detail log is authoritative where both say the same thing; the summary
    supplies the latency percentiles and the reasons it gives for INVALID.
    """
    log_path = Path(log_dir)
    summary = LoadGenSummary()
    summary_file = log_path / "mlperf_log_summary.txt"
    detail_file = log_path / "mlperf_log_detail.txt"
    if summary_file.is_file():
        text = summary_file.read_text(errors="replace")
        for line in text.splitlines():
            key, _, value = (part.strip() for part in line.partition(":"))
            if key == "Scenario":
                summary.scenario = value
            elif key.startswith("Samples per second") or key.startswith("Completed samples per second"):
                summary.samples_per_second = _number(value)
            elif key == "Result is":
                summary.valid = value.upper() == "VALID"
            elif key.endswith("satisfied") and value.upper().startswith("NO"):
                summary.invalid_reasons.append(f"{key}: NO")
        summary.latencies_ns = {m.group(1).strip(): float(m.group(2)) for m in _SUMMARY_LATENCY.finditer(text)}
    if detail_file.is_file():
        for entry in mllog_entries(detail_file):
            if str(entry.get("key", "")).startswith("result_") or entry.get("key") == "num_errors":
                summary.detail[entry["key"]] = entry.get("value")
        detail = summary.detail
        if "result_validity" in detail:
            summary.valid = str(detail["result_validity"]).upper() == "VALID"
        if detail.get("result_samples_per_second") is not None:
            summary.samples_per_second = float(detail["result_samples_per_second"])
        if detail.get("result_invalid_reason"):
            reason = str(detail["result_invalid_reason"])
            if reason not in summary.invalid_reasons:
                summary.invalid_reasons.append(reason)
        if detail.get("result_query_count") is not None:
            summary.query_count = int(detail["result_query_count"])
        summary.errors = int(detail.get("num_errors") or 0)
    if not summary_file.is_file() and not detail_file.is_file():
        summary.invalid_reasons.append(f"LoadGen wrote no logs under {log_path}")
    return summary


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None
