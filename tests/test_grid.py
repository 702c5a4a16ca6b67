"""The space's grid as tables: the same configurations, in the same order, as enumerating the product."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from tuner.roofline import features
from tuner.space import Config, Grid, SearchSpace, load_space


def enumerated(space: SearchSpace) -> list[Config]:
    """The definition: every raw combination made effective, first appearance kept."""
    names = list(space.knobs)
    axes = [space.knobs[n].values if n in space.tuned_knobs else [space.knobs[n].default] for n in names]
    seen: set[tuple] = set()
    out = []
    for batch in space.batch_sizes:
        for combo in itertools.product(*axes):
            eff = space.effective(Config(knobs=dict(zip(names, combo, strict=True)), batch_size=batch))
            if eff.key() not in seen:
                seen.add(eff.key())
                out.append(eff)
    return out


SPACES = [
    ("orin-agx", None, [8]),
    ("orin-agx", ["nvpmodel", "gpu_mhz", "emc_mhz"], None),
    ("orin-agx", ["gpu_mhz", "cpu_cores"], [4]),
    ("orin-nano", None, [2]),
    ("h200", None, [1, 8]),
]


@pytest.mark.parametrize(("kind", "knobs", "batches"), SPACES)
def test_grid_tables_match_the_enumerated_product(kind, knobs, batches):
    space = load_space(kind).narrow(knobs=knobs, batch_sizes=batches)
    expected = enumerated(space)
    grid = Grid(space)
    assert space.size() == len(grid) == len(expected)
    assert [c.key() for c in space.grid()] == [c.key() for c in expected]
    for i in (0, len(expected) // 3, len(expected) - 1):
        assert grid.position(json.dumps(expected[i].key())) == i
    outside = expected[0].model_copy(update={"batch_size": 3})
    assert grid.position(json.dumps(outside.key())) is None


@pytest.mark.parametrize(("kind", "knobs", "batches"), SPACES)
def test_grid_features_match_features_of_each_configuration(kind, knobs, batches):
    space = load_space(kind).narrow(knobs=knobs, batch_sizes=batches)
    configs = Grid(space)
    feats = features(space, configs)
    one_by_one = features(space, enumerated(space))
    for name in ("gpu", "tpcs", "mem", "cpu", "cores", "batch", "byte_scale", "power_limit"):
        assert np.array_equal(getattr(feats, name), getattr(one_by_one, name)), name
    assert (feats.gpu_max, feats.mem_max, feats.cpu_max) == (one_by_one.gpu_max, one_by_one.mem_max, one_by_one.cpu_max)
    assert len(configs) == len(one_by_one.batch)


def test_full_orin_space_is_counted_not_built():
    """Tens of thousands of configurations, counted from the tables (issue 13 measured 5 s of CPU to build them)."""
    space = load_space("orin-agx")
    one_batch = space.narrow(batch_sizes=[8]).size()  # checked against the enumeration above
    assert space.size() == len(space.batch_sizes) * one_batch > 10_000
    grid = Grid(space)
    last = grid[len(grid) - 1]
    assert grid.position(json.dumps(last.key())) == len(grid) - 1
    assert space.effective(last).key() == last.key()
