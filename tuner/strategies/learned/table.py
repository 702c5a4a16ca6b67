"""The space as the learned strategy sees it: its grid, every configuration's encoding and power mode, built once."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tuner.space import Grid, SearchSpace
from tuner.surrogate import encode_grid

_TABLES: dict[str, Table] = {}


@dataclass
class Table:
    """What the learned strategy needs of a space, built once: its grid, every configuration's encoding and mode.

    ``modes`` holds each configuration's power mode as an index into
    ``mode_names`` (None in a space without a mode knob). ``rows`` and
    ``around`` remember each effective key's grid row and each row's
    neighbours once looked up: every proposal asks again for the same ones.
    """

    grid: Grid
    x: np.ndarray
    modes: np.ndarray | None = None
    mode_names: list[str] | None = None
    features: Any = None
    rows: dict[str, int | None] = field(default_factory=dict)
    around: dict[int, list[int]] = field(default_factory=dict)

    def row(self, key: str | None) -> int | None:
        """The grid row of an effective key (None if it is not in the grid)."""
        if key is None:
            return None
        if key not in self.rows:
            self.rows[key] = self.grid.position(key)
        return self.rows[key]


def space_table(space: SearchSpace) -> Table:
    """The space's Grid and encoding (tuner.surrogate.encode_grid), cached per space; no Config per point."""
    key = space.model_dump_json()
    if key not in _TABLES:
        grid = Grid(space)
        table = Table(grid, encode_grid(space, grid))
        if space.mode_knob is not None:
            names = [str(v) for v in space.knobs[space.mode_knob].values]
            table.mode_names = names
            table.modes = grid.column(space.mode_knob, lambda v: names.index(str(v))).astype(int)
        _TABLES[key] = table
    return _TABLES[key]
