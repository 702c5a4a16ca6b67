"""Which unmeasured configurations a proposal scores: a sample of the grid, a box and the neighbours of the best.

Also the grid's geometry the other steps ask about: a knob's encoded
columns, one step of each, a configuration's neighbours, the power mode a
trial ran in and the modes a study may not propose again.
"""

from __future__ import annotations

import json

import numpy as np
import optuna

from tuner.space import Config, SearchSpace
from tuner.strategies.learned.table import Table


class Candidates:
    """Each step scores ``sample`` random configurations plus up to ``box_sample`` within ``box_steps`` of the best.

    ``rng`` draws the samples (the strategy's one generator, so a seed
    fixes every proposal); the incumbent's box is kept while it stays.
    """

    def __init__(
        self, space: SearchSpace, rng: np.random.Generator, sample: int, box_steps: int, box_sample: int
    ) -> None:
        self.space = space
        self.rng = rng
        self.sample = sample
        self.box_steps = box_steps
        self.box_sample = box_sample
        self.kept: tuple[int, np.ndarray] | None = None

    def pick(self, table: Table, seen: set[int], around: list[int]) -> tuple[np.ndarray, set[int]]:
        """Unmeasured rows to score: a random sample of the grid, a box around the incumbent, its neighbours."""
        n = len(table.grid)
        if n <= self.sample + self.box_sample:
            pool = np.arange(n)
        else:
            pool = self.rng.choice(n, size=self.sample, replace=False)
        parts = [pool]
        if around:
            box = self.box(table, around[0])
            if len(box) > self.box_sample:
                box = self.rng.choice(box, size=self.box_sample, replace=False)
            parts.append(box)
        local = set(self.neighbours(table, around)) - seen
        parts.append(np.array(sorted(local), dtype=int))
        cand = np.unique(np.concatenate(parts).astype(int))
        if seen:
            cand = cand[~np.isin(cand, np.fromiter(seen, dtype=int))]
        return cand, local

    def box(self, table: Table, row: int) -> np.ndarray:
        """Grid rows within ``box_steps`` steps of ``row`` in every encoded column, kept while the incumbent stays."""
        if self.kept is None or self.kept[0] != row:
            steps = self.steps()
            inside = np.all(np.abs(table.x - table.x[row]) <= steps * self.box_steps + 1e-9, axis=1)
            self.kept = (row, np.flatnonzero(inside))
        return self.kept[1]

    def steps(self) -> np.ndarray:
        """Width of one step of each encoded column (one-hot columns: any value is one step)."""
        widths: list[float] = []
        for name in self.space.tuned_knobs:
            knob = self.space.knobs[name]
            if knob.ordered:
                widths.append(1.0 / max(len(knob.values) - 1, 1))
            else:
                widths += [1.0] * len(knob.values)
        if len(self.space.batch_sizes) > 1:
            widths.append(1.0 / (len(self.space.batch_sizes) - 1))
        return np.array(widths)

    def groups(self) -> list[list[int]]:
        """Encoded columns of each tuned knob (one for an ordered knob, one-hot for others), then the batch size."""
        groups: list[list[int]] = []
        col = 0
        for name in self.space.tuned_knobs:
            knob = self.space.knobs[name]
            width = 1 if knob.ordered else len(knob.values)
            groups.append(list(range(col, col + width)))
            col += width
        if len(self.space.batch_sizes) > 1:
            groups.append([col])
        return groups

    def neighbours(self, table: Table, rows: list[int]) -> list[int]:
        """Grid rows one step away from the given ones in every ordered knob and the batch size."""
        out: list[int] = []
        for row in rows:
            if row not in table.around:
                table.around[row] = self._neighbours_of(table, row)
            out += [i for i in table.around[row] if i not in out]
        return out

    def _neighbours_of(self, table: Table, row: int) -> list[int]:
        """:meth:`neighbours` of one row, in the order of the knobs and then the batch size."""
        out: list[int] = []
        base = table.grid[row]
        moves: list[Config] = []
        for name in self.space.tuned_knobs:
            knob = self.space.knobs[name]
            values = knob.values
            at = next((i for i, v in enumerate(values) if str(v) == str(base.knobs[name])), 0)
            steps = (at - 1, at + 1) if knob.ordered else range(len(values))
            for j in steps:
                if 0 <= j < len(values) and j != at:
                    moves.append(Config(knobs={**base.knobs, name: values[j]}, batch_size=base.batch_size))
        for move in moves:
            i = table.row(json.dumps(self.space.effective(move).key()))
            if i is not None and i not in out:
                out.append(i)
        return out + [i for i in self.batch_neighbours(table, row) if i not in out]

    def batch_neighbours(self, table: Table, row: int) -> list[int]:
        """Grid rows one batch size either way of ``row``, every knob kept (the batch ladder's neighbours)."""
        batches = self.space.batch_sizes
        base = table.grid[row]
        at = batches.index(base.batch_size) if base.batch_size in batches else 0
        out: list[int] = []
        for j in (at - 1, at + 1):
            if 0 <= j < len(batches):
                moved = base.model_copy(update={"batch_size": batches[j]})
                i = table.row(json.dumps(self.space.effective(moved).key()))
                if i is not None and i not in out:
                    out.append(i)
        return out

    def mode_of(self, table: Table, trial: optuna.trial.FrozenTrial) -> int | None:
        """The power mode (index into table.mode_names) a trial ran in: the board's mode after it."""
        if table.mode_names is None or self.space.mode_knob is None:
            return None
        value = str(trial.user_attrs.get("effective", {}).get(self.space.mode_knob))
        return table.mode_names.index(value) if value in table.mode_names else None

    def refused(self, table: Table, trials: list[optuna.trial.FrozenTrial]) -> set[int]:
        """Every configuration in a mode whose switch asked for a reboot in this study: none is proposed."""
        refused = {t.user_attrs["needs_reboot"] for t in trials if t.user_attrs.get("needs_reboot")}
        if not refused or table.modes is None or table.mode_names is None:
            return set()
        index = [i for i, name in enumerate(table.mode_names) if name in refused]
        return {int(r) for r in np.flatnonzero(np.isin(table.modes, index))}
