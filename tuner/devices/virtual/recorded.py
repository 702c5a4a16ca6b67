"""A recorded board (``--device measured:h200``): a real card's space answered from windows measured on it.

It has no physics: it replays LoadGen windows measured on a real GPU
(benchmarks/h200_observe_space.py; every configuration in at least two
windows minutes apart). A noisy measurement returns one of those windows,
drawn with the settings' seed, so the noise a strategy sees is the card's
own; a noise-free one returns their mean, the ground truth the search
benchmark scores against. A knob that does nothing for a model
(channels_last for bert-base) was measured at one value and answers the
other. Not modelled: anything between the measured windows, drift beyond
the minutes of the measurement, and device knobs (observe-only: clocks and
power limit pinned, 120 configurations).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, Field

from tuner.devices.base import VirtualBoard
from tuner.errors import UserError
from tuner.measure.settings import WindowSettings
from tuner.measurement import Measurement
from tuner.space import Config, load_space

TABLE_VERSION = 1
DATA = Path(__file__).parent / "recordings"
SUFFIX = "-observe-space.json"
FIELDS = ("j_per_query", "p50_ms", "p90_ms", "p99_ms", "qps", "avg_w")


class MeasuredWindow(BaseModel):
    """One LoadGen window as the card produced it."""

    j_per_query: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    qps: float
    avg_w: float
    duration_s: float
    queries: int


class MeasuredConfig(BaseModel):
    """One configuration (runner knobs and batch) and every window measured for it."""

    knobs: dict[str, str | bool]
    batch_size: int
    windows: list[MeasuredWindow]


class MeasuredModel(BaseModel):
    model: str
    date_utc: str
    command: str
    source: str
    same_as: dict[str, str | bool] = Field(
        default_factory=dict, description="knobs that do nothing for this model and the one value measured"
    )
    configs: list[MeasuredConfig]


class MeasuredTable(BaseModel):
    """The file format of recordings/<name>-observe-space.json."""

    version: int = TABLE_VERSION
    kind: str
    gpu: str
    driver: str | None
    torch: str
    pinned: dict[str, float]
    window_s: float
    models: dict[str, MeasuredModel]


def table_from_raw(paths: list[Path]) -> MeasuredTable:
    """Build the board's table from benchmarks/h200_observe_space.py outputs (one file per model)."""
    models: dict[str, MeasuredModel] = {}
    head: dict[str, Any] = {}
    for path in paths:
        raw = json.loads(Path(path).read_text())
        space = raw["space"]
        pinned = {n: float(k["values"][0]) for n, k in space["knobs"].items() if k.get("group", "device") == "device"}
        runner = [n for n, k in space["knobs"].items() if k.get("group") == "runner"]
        head = {
            "kind": raw["device"]["kind"],
            "gpu": raw["device"]["gpu"],
            "driver": raw["device"]["driver"],
            "torch": raw["torch"],
            "pinned": pinned,
            "window_s": raw["settings"]["window_s"],
        }
        grouped: dict[tuple, MeasuredConfig] = {}
        for row in raw["rows"]:
            if row.get("error") or not row.get("valid"):
                continue
            knobs = {n: row["config"][n] for n in runner}
            key = (json.dumps(knobs, sort_keys=True), row["batch_size"])
            entry = grouped.setdefault(key, MeasuredConfig(knobs=knobs, batch_size=row["batch_size"], windows=[]))
            entry.windows.append(MeasuredWindow(**{k: row[k] for k in MeasuredWindow.model_fields}))
        measured_layouts = {c.knobs.get("channels_last") for c in grouped.values()}
        same_as = {"channels_last": measured_layouts.pop()} if len(measured_layouts) == 1 else {}
        models[raw["model"]] = MeasuredModel(
            model=raw["model"],
            date_utc=raw["date_utc"],
            command=raw["command"],
            source=f"benchmarks/results/h200-observe/{Path(path).name}",
            same_as=same_as,
            configs=list(grouped.values()),
        )
    return MeasuredTable(models=models, **head)


def table_names() -> list[str]:
    return sorted(p.name[: -len(SUFFIX)] for p in DATA.glob(f"*{SUFFIX}"))


def load_table(name: str) -> MeasuredTable:
    path = DATA / f"{name}{SUFFIX}"
    if not path.exists():
        raise UserError(f"no measured board {name!r}: choose one of {', '.join(table_names())}, e.g. measured:h200")
    return MeasuredTable.model_validate_json(path.read_text())


class RecordedBoard(VirtualBoard):
    """A real card's observe-only space, answered from its measured windows; touches no hardware."""

    def __init__(self, name: str = "measured:h200") -> None:
        table = name.split(":", 1)[1] if name.startswith("measured:") else "h200"
        self.table = load_table(table)
        self.name = f"measured:{table}"
        self.kind = self.table.kind
        self.slug = f"measured-{table}"
        self.simulated_note = f" [replayed: windows measured earlier on an {self.table.gpu}, not measured now]"
        space = load_space(self.table.kind)
        for knob, value in self.table.pinned.items():
            space = space.pin(knob, int(value) if float(value).is_integer() else value)
        self._space = space
        self._rows: dict[str, dict[tuple, MeasuredConfig]] = {
            model: {self._key(model, c.knobs, c.batch_size): c for c in entry.configs}
            for model, entry in self.table.models.items()
        }

    def _key(self, model: str, knobs: dict[str, Any], batch: int) -> tuple:
        same = self.table.models[model].same_as
        runner = [n for n, k in self._space.knobs.items() if k.group == "runner"]
        return (*(str(same.get(n, knobs[n])) for n in runner), batch)

    def _row(self, model: str, config: Config) -> MeasuredConfig:
        if model not in self._rows:
            raise UserError(f"{self.name} was measured for {', '.join(self._rows)} only: choose one of them")
        self._space.validate_config(config)
        key = self._key(model, config.knobs, config.batch_size)
        if key not in self._rows[model]:
            raise UserError(f"{self.name} has no measurement of {model} at {config.label()}: re-measure the table")
        return self._rows[model][key]

    def truth(self, model: str, config: Config) -> MeasuredWindow:
        """The mean of the measured windows: the ground truth."""
        windows = self._row(model, config).windows
        mean = {k: float(np.mean([getattr(w, k) for w in windows])) for k in (*FIELDS, "duration_s")}
        return MeasuredWindow(**mean, queries=round(float(np.mean([w.queries for w in windows]))))

    # -- the device protocol ----------------------------------------------------------------------
    def models(self) -> list[str]:
        """The models the table holds (a plugin's own models)."""
        return list(self._rows)

    def measure_many(self, model: str, configs: list[Config], settings: WindowSettings) -> list[Measurement]:
        """One measured window per configuration, drawn with the settings' seed; the mean if noise is off."""
        rng = np.random.default_rng(settings.seed) if settings.noise else None
        out = []
        for config in configs:
            if rng is None:
                w = self.truth(model, config)
            else:
                windows = self._row(model, config).windows
                w = windows[int(rng.integers(len(windows)))]
            out.append(
                Measurement(
                    **w.model_dump(),
                    energy_j=w.avg_w * w.duration_s,
                    meter="measured-table",
                    rails=[f"replayed:{self.table.gpu} board power"],
                    twin=True,
                )
            )
        return out

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "twin": True,
            "replayed": (
                f"{self.table.gpu} (driver {self.table.driver}): windows measured earlier, replayed (not measured now)"
            ),
            "title": (
                f"measured board: {self.table.gpu} (driver {self.table.driver}) windows replayed, "
                f"observe-only space, models {', '.join(self._rows)}"
            ),
        }
