"""Search spaces: which knobs a device kind has, their allowed values, and mode caps.

Spaces live in search_spaces/<kind>.yaml (installed with the package) and are
validated by :class:`SearchSpace`. A space can be narrowed (``--knobs``,
``--batch-sizes``) and pinned (a knob the device may not change in this run).
``effective()`` maps a configuration to what the hardware will really run, so
two configurations the hardware treats alike are measured once.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from tuner.errors import ConfigurationError, did_you_mean
from tuner.knobs import (
    Config,
    Knob,
    KnobValue,
    Mode,
    capped,
    distinct,
    index_of,
    is_numeric,
    same_value,
    spelling,
    spells,
    within_one,
)
from tuner.plumbing.units import MAX_BATCH
from tuner.plumbing.yamlfile import load_yaml_model

SPACE_VERSION = 1
# Bounds on a space file, so a hand-edited or hostile one is refused at load instead of hanging
# the tool in a grid of a billion points; the packaged spaces are far inside them (h200: 145,200).
MAX_SPACE_POINTS = 10_000_000


class SearchSpace(BaseModel):
    """A device kind's knobs, batch sizes and (optionally) power modes."""

    model_config = ConfigDict(extra="forbid")

    version: Literal[1] = SPACE_VERSION
    kind: str
    description: str = ""
    source: str = ""
    knobs: dict[str, Knob]
    batch_sizes: list[int] = Field(min_length=1)
    mode_knob: str | None = None
    modes: dict[str, Mode] = Field(default_factory=dict)
    tuned: list[str] | None = None

    @model_validator(mode="after")
    def _bounded(self) -> SearchSpace:
        bad = [b for b in self.batch_sizes if not 0 < b <= MAX_BATCH]
        if bad:
            raise ValueError(f"batch size {bad[0]} is outside 1..{MAX_BATCH}")
        if len(set(self.batch_sizes)) != len(self.batch_sizes):
            raise ValueError("batch sizes are listed twice")
        points = math.prod(len(k.values) for k in self.knobs.values()) * len(self.batch_sizes)
        if points > MAX_SPACE_POINTS:
            raise ValueError(f"{points:,} configurations, more than {MAX_SPACE_POINTS:,}: list fewer values")
        unknown = [k for k in self.tuned or [] if k not in self.knobs]
        if unknown:
            raise ValueError(f"tuned names unknown knob {unknown[0]!r}")
        return self

    @model_validator(mode="after")
    def _modes_consistent(self) -> SearchSpace:
        if self.mode_knob is None:
            return self
        if self.mode_knob not in self.knobs:
            raise ValueError(f"mode_knob {self.mode_knob!r} is not a knob")
        missing = [v for v in self.knobs[self.mode_knob].values if str(v) not in self.modes]
        if missing:
            raise ValueError(f"modes missing for {missing}")
        for name, mode in self.modes.items():
            unknown = set(mode.caps) - set(self.knobs)
            if unknown:
                raise ValueError(f"mode {name} caps unknown knobs {sorted(unknown)}")
        return self

    @property
    def tuned_knobs(self) -> list[str]:
        """Knobs the study varies: all with more than one value unless narrowed."""
        names = self.tuned if self.tuned is not None else list(self.knobs)
        return [n for n in names if len(self.knobs[n].values) > 1]

    def narrow(self, knobs: list[str] | None = None, batch_sizes: list[int] | None = None) -> SearchSpace:
        """Keep only the named knobs tuned (others at their default) and the given batch sizes."""
        space = self.model_copy(deep=True)
        if knobs is not None:
            unknown = [k for k in knobs if k not in self.knobs]
            if unknown:
                raise ConfigurationError(
                    f"unknown knob(s) {', '.join(unknown)} for {self.kind}{did_you_mean(unknown[0], self.knobs)}: "
                    f"choose from {', '.join(self.knobs)}"
                )
            space.tuned = list(dict.fromkeys(knobs))
        if batch_sizes is not None:
            missing = [b for b in batch_sizes if b not in self.batch_sizes]
            if missing:
                raise ConfigurationError(
                    f"--batch-sizes {','.join(map(str, missing))} not in the {self.kind} space: "
                    f"choose from {','.join(map(str, self.batch_sizes))} (or give a --space file that lists it)"
                )
            space.batch_sizes = sorted(set(batch_sizes))
        return space

    def only_modes(self, modes: list[str]) -> SearchSpace:
        """Keep only the named power modes (``--modes``), the first named one the default."""
        if self.mode_knob is None:
            raise ConfigurationError(f"--modes names power modes, and {self.kind} has none: leave it out")
        knob = self.knobs[self.mode_knob]
        names = [str(v) for v in knob.values]
        unknown = [m for m in modes if m not in names]
        if unknown:
            raise ConfigurationError(
                f"unknown mode(s) {', '.join(unknown)} for {self.kind}{did_you_mean(unknown[0], names)}: "
                f"choose from {', '.join(names)}"
            )
        kept = list(dict.fromkeys(modes))
        default = knob.default if knob.default in kept else kept[0]
        space = self.model_copy(deep=True)
        space.knobs[self.mode_knob] = knob.model_copy(update={"values": kept, "default": default})
        space.modes = {name: mode for name, mode in space.modes.items() if name in kept}
        return space

    def pin(self, knob: str, value: KnobValue) -> SearchSpace:
        """Fix a knob to one value (the device's current one in observe-only mode)."""
        space = self.model_copy(deep=True)
        old = space.knobs[knob]
        space.knobs[knob] = old.model_copy(update={"values": [value], "default": value})
        return space

    def for_runtime(self, runtime: str | None, drop: tuple[str, ...] = ()) -> SearchSpace:
        """The space less the knobs meant for another runtime only, and less ``drop``; modes lose their caps on them."""
        gone = {n for n, k in self.knobs.items() if k.runtime is not None and k.runtime != runtime}
        gone |= set(drop) & set(self.knobs)
        if not gone:
            return self
        knobs = {n: k for n, k in self.knobs.items() if n not in gone}
        modes = {
            name: m.model_copy(update={"caps": {k: v for k, v in m.caps.items() if k not in gone}})
            for name, m in self.modes.items()
        }
        tuned = [n for n in self.tuned if n not in gone] if self.tuned is not None else None
        return self.model_copy(update={"knobs": knobs, "modes": modes, "tuned": tuned})

    def default_config(self, batch_size: int | None = None) -> Config:
        """Every knob at its default: the baseline a user gets without tuning."""
        return Config(
            knobs={n: k.default for n, k in self.knobs.items()},
            batch_size=batch_size if batch_size is not None else self.batch_sizes[-1],
        )

    def validate_config(self, config: Config) -> None:
        """Refuse knobs or values the space does not allow, before anything is applied."""
        for name, value in config.knobs.items():
            if name not in self.knobs:
                raise ConfigurationError(
                    f"unknown knob {name!r} for {self.kind}{did_you_mean(name, self.knobs)}: "
                    f"choose from {', '.join(self.knobs)}"
                )
            allowed = self.knobs[name].values
            if not any(same_value(value, a) for a in allowed):
                shown = ", ".join(str(a) for a in allowed)
                raise ConfigurationError(f"{name}={value} is not supported by {self.kind}: choose one of {shown}")
        missing = set(self.knobs) - set(config.knobs)
        if missing:
            raise ConfigurationError(f"configuration lacks knob(s) {', '.join(sorted(missing))} for {self.kind}")
        if not 0 < config.batch_size <= MAX_BATCH:
            raise ConfigurationError(f"batch size {config.batch_size} must be an integer from 1 to {MAX_BATCH}")

    def mode_of(self, config: Config) -> Mode | None:
        if self.mode_knob is None:
            return None
        return self.modes[str(config.knobs[self.mode_knob])]

    def effective(self, config: Config) -> Config:
        """What the hardware runs under the chosen mode.

        A value above the mode's cap is lowered to the highest allowed value
        at or under the cap (the lowest value if none is), so the effective
        configuration is itself a point of the space: what is applied is
        exactly what is measured, and every request the mode folds together
        maps to one key.
        """
        mode = self.mode_of(config)
        if mode is None:
            return config
        knobs = dict(config.knobs)
        for name, cap in mode.caps.items():
            if name in knobs:  # a configuration written before a knob existed (a DLA cap) keeps working
                knobs[name] = capped(self.knobs[name].values, knobs[name], cap)
        return Config(knobs=knobs, batch_size=config.batch_size)

    def suggest(self, trial: Any) -> Config:
        """Draw a configuration from an Optuna trial.

        Every knob is a parameter named after it and stored by its real value
        (``gpu_mhz`` = 1300.5, ``batch_size`` = 32), so the study reads in its
        units wherever it is opened (optuna-dashboard included). Samplers that
        need the order of an ordered knob see it through tuner.indexed.
        """
        knobs: dict[str, KnobValue] = {}
        for name, knob in self.knobs.items():
            if name in self.tuned_knobs:
                knobs[name] = trial.suggest_categorical(name, knob.values)
            else:
                knobs[name] = knob.default
        batch = trial.suggest_categorical("batch_size", self.batch_sizes) if len(self.batch_sizes) > 1 else None
        return Config(knobs=knobs, batch_size=self.batch_sizes[0] if batch is None else batch)

    def distributions(self) -> dict[str, Any]:
        """The Optuna distributions :meth:`suggest` draws from (same names and choices)."""
        from optuna.distributions import CategoricalDistribution

        out = {name: CategoricalDistribution(self.knobs[name].values) for name in self.tuned_knobs}
        if len(self.batch_sizes) > 1:
            out["batch_size"] = CategoricalDistribution(self.batch_sizes)
        return out

    def ordered_params(self) -> dict[str, list[KnobValue]]:
        """The parameters whose values have an order (ordered knobs and the batch size), with their values."""
        out = {name: list(self.knobs[name].values) for name in self.tuned_knobs if self.knobs[name].ordered}
        if len(self.batch_sizes) > 1:
            out["batch_size"] = list(self.batch_sizes)
        return out

    def params_for(self, config: Config) -> dict[str, Any]:
        """The Optuna parameters that make :meth:`suggest` return ``config`` (for enqueue_trial)."""
        params: dict[str, Any] = {}
        for name in self.tuned_knobs:
            knob = self.knobs[name]
            params[name] = knob.values[index_of(knob.values, config.knobs[name])]
        if len(self.batch_sizes) > 1:
            params["batch_size"] = config.batch_size
        return params

    def config_of(self, params: dict[str, Any]) -> Config:
        """The configuration a trial's parameters stand for (the inverse of :meth:`params_for`)."""
        knobs = {n: params[n] if n in self.tuned_knobs else k.default for n, k in self.knobs.items()}
        batch = params["batch_size"] if len(self.batch_sizes) > 1 else self.batch_sizes[0]
        return Config(knobs=knobs, batch_size=batch)

    def grid(self) -> list[Config]:
        """Every distinct effective configuration of the (narrowed) space, in a stable order (see :class:`Grid`)."""
        grid = Grid(self)
        return [grid[i] for i in range(len(grid))]

    def size(self) -> int:
        """Number of distinct effective configurations: a sum of products, nothing enumerated."""
        return len(Grid(self))


class Grid:
    """The distinct effective configurations of a space, as tables rather than a list.

    Under a power mode every knob folds onto the mode's cap on its own, so
    the distinct effective configurations of one mode are the product of each
    knob's distinct capped values, and two modes never share one (they differ
    in the mode knob). Per batch size and mode the grid is a product of small
    per-knob tables: its size is a sum of products, its i-th configuration
    and a configuration's position are mixed-radix arithmetic, and a column
    of per-configuration values (what the roofline needs) is built with
    numpy from a knob's table. Orin AGX's 47,516 configurations were once
    built one by one, seconds of start-up per run.

    Order: batch size, then mode (in the mode knob's order), then the
    product of the knobs in space order, each knob's values in table order
    (first occurrence after capping). With the mode knob listed first, as in
    the packaged spaces, that is the order of enumerating the raw product
    and keeping each effective configuration's first appearance.
    """

    def __init__(self, space: SearchSpace) -> None:
        self.names = list(space.knobs)
        self.batch_sizes = list(space.batch_sizes)
        tuned = set(space.tuned_knobs)
        axes = [space.knobs[n].values if n in tuned else [space.knobs[n].default] for n in self.names]
        self.modes: list[Mode | None] = []
        self.tables: list[list[list[KnobValue]]] = []
        if space.mode_knob is None:
            self.modes.append(None)
            self.tables.append([list(axis) for axis in axes])
        else:
            where = self.names.index(space.mode_knob)
            for value in axes[where]:
                mode = space.modes[str(value)]
                tables = []
                for name, axis in zip(self.names, axes, strict=True):
                    if name == space.mode_knob:
                        axis = [value]
                    elif name in mode.caps:
                        axis = [capped(space.knobs[name].values, v, mode.caps[name]) for v in axis]
                    tables.append(distinct(axis))
                self.modes.append(mode)
                self.tables.append(tables)
        self.block_sizes = [math.prod(len(t) for t in tables) for tables in self.tables]
        self.per_batch = sum(self.block_sizes)
        self._lookup = [[{str(v): i for i, v in enumerate(t)} for t in tables] for tables in self.tables]

    def __len__(self) -> int:
        return self.per_batch * len(self.batch_sizes)

    def __getitem__(self, index: int) -> Config:
        if not 0 <= index < len(self):
            raise IndexError(index)
        batch, rest = divmod(index, self.per_batch)
        block = 0
        while rest >= self.block_sizes[block]:
            rest -= self.block_sizes[block]
            block += 1
        knobs: dict[str, KnobValue] = {}
        for name, table in reversed(list(zip(self.names, self.tables[block], strict=True))):
            rest, i = divmod(rest, len(table))
            knobs[name] = table[i]
        # Values straight from the validated space's tables: no need to validate them again.
        return Config.model_construct(knobs={n: knobs[n] for n in self.names}, batch_size=self.batch_sizes[batch])

    def position(self, key: str) -> int | None:
        """Where the configuration with this effective key (JSON of Config.key()) sits, or None if not here."""
        batch, *pairs = json.loads(key)
        values = dict(pairs)
        if batch not in self.batch_sizes or set(values) != set(self.names):
            return None
        offset = self.batch_sizes.index(batch) * self.per_batch
        for lookups, size in zip(self._lookup, self.block_sizes, strict=True):
            digits = [lookup.get(values[name]) for name, lookup in zip(self.names, lookups, strict=True)]
            if None not in digits:
                index = 0
                for digit, lookup in zip(digits, lookups, strict=True):
                    index = index * len(lookup) + digit
                return offset + index
            offset += size
        return None

    def column(self, name: str, value: Callable[[KnobValue], float] = float) -> np.ndarray:
        """``value`` of knob ``name`` for every configuration, in grid order."""
        where = self.names.index(name)
        blocks = []
        for tables in self.tables:
            sizes = [len(t) for t in tables]
            values = np.array([value(v) for v in tables[where]], dtype=float)
            inner = math.prod(sizes[where + 1 :])
            blocks.append(np.tile(np.repeat(values, inner), math.prod(sizes[:where])))
        return np.tile(np.concatenate(blocks), len(self.batch_sizes))

    def mode_column(self, value: Callable[[Mode | None], float]) -> np.ndarray:
        """``value`` of each configuration's mode (None in a space without modes), in grid order."""
        per_batch = np.concatenate(
            [np.full(size, value(mode), dtype=float) for mode, size in zip(self.modes, self.block_sizes, strict=True)]
        )
        return np.tile(per_batch, len(self.batch_sizes))

    def batch_column(self) -> np.ndarray:
        return np.repeat(np.array(self.batch_sizes, dtype=float), self.per_batch)


def parse_assignments(items: list[str], space: SearchSpace) -> dict[str, KnobValue]:
    """Parse ``--set knob=value`` items, typed after the knob's allowed values.

    A number names a value as the space file writes it, or the one value less
    than one unit away: clocks are often fractional MHz (1300.5), and users
    write them whole.
    """
    result: dict[str, KnobValue] = {}
    for item in items:
        if "=" not in item:
            raise ConfigurationError(f"cannot read --set {item!r}: write knob=value, e.g. gpu_mhz=930.75")
        name, raw = (s.strip() for s in item.split("=", 1))
        if name not in space.knobs:
            raise ConfigurationError(
                f"unknown knob {name!r} for {space.kind}{did_you_mean(name, space.knobs)}: "
                f"choose from {', '.join(space.knobs)}"
            )
        allowed = space.knobs[name].values
        matches = [a for a in allowed if spells(a, raw)] or within_one(allowed, raw)
        if not matches:
            shown = ", ".join(spelling(a) for a in allowed)
            raise ConfigurationError(f"{name}={raw} is not supported by {space.kind}: choose one of {shown}")
        result[name] = matches[0]
    return result


def load_space_file(path: Path) -> SearchSpace:
    """Load and validate a user's space file; a corrupt file is a one-line user error.

    A file for a kind the package knows must keep that kind's knobs and their
    types (a clock stays a number): the device decodes values by knob, so
    ``gpu_mhz: [fast]`` would otherwise pass here and fail inside a trial.
    """
    space = _load_file(path)
    if space.kind in available_kinds():
        _check_like(space.for_runtime(None), load_space(space.kind), path)
    return space


def _load_file(path: Path) -> SearchSpace:
    return load_yaml_model(
        path, SearchSpace, "search space", "fix the file or restore it from the package", version=SPACE_VERSION
    )


def _family(value: KnobValue) -> str:
    return "a number" if is_numeric(value) else "true/false" if isinstance(value, bool) else "a name"


def _check_like(space: SearchSpace, packaged: SearchSpace, path: Path) -> None:
    if set(space.knobs) != set(packaged.knobs):
        raise ConfigurationError(
            f"search space {path} must list the knobs of {space.kind} ({', '.join(packaged.knobs)}), "
            f"not {', '.join(space.knobs)}: fix the file or restore it from the package"
        )
    for name, knob in space.knobs.items():
        want = {_family(v) for v in packaged.knobs[name].values}
        wrong = [v for v in knob.values if _family(v) not in want]
        if wrong:
            raise ConfigurationError(
                f"search space {path}: {name} value {wrong[0]!r} must be {' or '.join(sorted(want))}: fix the file"
            )


def available_kinds() -> list[str]:
    return sorted(p.name[:-5] for p in resources.files("search_spaces").iterdir() if p.name.endswith(".yaml"))


def load_space(kind: str, runtime: str | None = None) -> SearchSpace:
    """Load the packaged space for a device kind, or a user's YAML file when given a path.

    A packaged space comes as ``runtime`` can use it: knobs meant for another
    runtime only (a Jetson's DLA knobs are TensorRT's) are left out unless
    that runtime is named.
    """
    if kind.endswith((".yaml", ".yml")) or "/" in kind:
        return load_space_file(Path(kind))
    resource = resources.files("search_spaces") / f"{kind}.yaml"
    if not resource.is_file():
        raise ConfigurationError(
            f"no search space for device kind {kind!r}: known kinds are {', '.join(available_kinds())}"
        )
    with resources.as_file(resource) as path:
        return _load_file(path).for_runtime(runtime)


ROLE_NAMES = {
    "gpu_mhz": ("gpu_mhz", "sm_mhz", "gpu_clock_mhz", "graphics_mhz"),
    "mem_mhz": ("emc_mhz", "mem_mhz", "memory_mhz"),
    "cpu_mhz": ("cpu_mhz",),
    "cpu_cores": ("cpu_cores",),
    "power_limit_w": ("power_limit_w", "power_limit"),
    "precision": ("precision",),
}


def knob_roles(space: SearchSpace) -> dict[str, str]:
    """Map physical roles to this space's knob names (roles without a knob are left out)."""
    roles = {}
    for role, names in ROLE_NAMES.items():
        for name in names:
            if name in space.knobs:
                roles[role] = name
                break
    return roles
