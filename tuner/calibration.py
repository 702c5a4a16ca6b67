"""Calibration rows (published or measured) and the twin's error against each.

Shared by scripts/calibrate_twin.py (which fits parameters), docs/twin.md and
the tests that hold the twin to its calibration.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from runners.profile import load_profile
from tuner.devices.twin import TwinDevice
from tuner.space import Config

CALIBRATION_DIR = Path(__file__).resolve().parent / "calibration_data"
DTYPES = {"float16": "fp16", "float32": "fp32", "bfloat16": "bf16"}


@dataclass
class Row:
    """One calibration point: a configuration and what was observed under it."""

    source: str
    twin: str
    model: str
    config: Config
    time_ms: float
    power_w: float | None
    label: str


def orin_rows(data: dict) -> list[Row]:
    block = data["orin_agx_maxn_pytorch_resnet50"]
    rows = []
    for r in block["rows"]:
        knobs = {"nvpmodel": "MAXN", "gpu_mhz": 1300.5, "emc_mhz": 3199, "cpu_cores": 12, "cpu_mhz": 2201.6}
        power = None if "glitch" in r.get("note", "") else r["power_W"]
        rows.append(
            Row(
                "orin_agx_maxn_pytorch_resnet50",
                "sim:orin",
                "resnet50",
                Config(knobs=knobs, batch_size=r["bs"]),
                r["time_ms"],
                power,
                f"MAXN bs{r['bs']}",
            )
        )
    return rows


def h200_rows(data: dict, key: str = "h200_default_clocks_pytorch_resnet50") -> list[Row]:
    """H200 rows at default clocks; a row without ``channels_last`` was measured with it (the reference's setup)."""
    block = data[key]
    rows = []
    for r in block["rows"]:
        precision = DTYPES[r["dtype"]]
        layout = r.get("channels_last", True)
        knobs = {"sm_mhz": 1980, "mem_mhz": 3201, "power_limit_w": 700, "precision": precision, "channels_last": layout}
        model = r.get("model", "resnet50")
        label = f"{model} {precision}{'' if layout else ' nchw'} bs{r['bs']}"
        rows.append(
            Row(
                key,
                "sim:h200",
                model,
                Config(knobs=knobs, batch_size=r["bs"]),
                1000 * r["bs"] / r["qps"],
                r["avg_W"],
                label,
            )
        )
    return rows


def load_rows(path: Path | None = None) -> list[Row]:
    """The published reference rows (../shared/reference/calibration.json)."""
    data = json.loads((path or CALIBRATION_DIR / "reference.json").read_text())
    return orin_rows(data) + h200_rows(data)


def measured_rows() -> list[Row]:
    """Rows this project measured on an H200 with its own runners (tuner/calibration_data/h200-measured.json)."""
    data = json.loads((CALIBRATION_DIR / "h200-measured.json").read_text())
    return h200_rows(data, "h200_measured_powertune")


def twin_errors(rows: list[Row], devices: dict[str, TwinDevice] | None = None) -> list[dict]:
    """Relative error of the noise-free twin on each row (time and, where known, power)."""
    devices = devices or {}
    out = []
    for row in rows:
        device = devices.get(row.twin) or TwinDevice(row.twin)
        result = device.model.evaluate(load_profile(row.model), [row.config])
        time_ms = float(result.time_s[0]) * 1000
        power = float(result.power_w[0])
        out.append(
            {
                "row": row.label,
                "source": row.source,
                "time_ms": row.time_ms,
                "twin_time_ms": time_ms,
                "time_err": time_ms / row.time_ms - 1,
                "power_w": row.power_w,
                "twin_power_w": power,
                "power_err": None if row.power_w is None else power / row.power_w - 1,
            }
        )
    return out
