"""The learned strategy's local step: a knob direction no trial has tried is looked at before noise is chased."""

import json

import numpy as np

from tuner.space import Config, Knob, SearchSpace
from tuner.strategies import LearnedSampler, space_table


def _space() -> SearchSpace:
    return SearchSpace(
        kind="k",
        knobs={
            "clock": Knob(values=[100, 200, 300, 400, 500], default=500),
            "mem": Knob(values=[1, 2], default=2),
            "mode": Knob(values=["a", "b"], default="a", ordered=False),
        },
        batch_sizes=[1, 2, 4],
    )


def _row(table, clock: int, mem: int, mode: str, batch: int) -> int:
    key = json.dumps(Config(knobs={"clock": clock, "mem": mem, "mode": mode}, batch_size=batch).key())
    return table.grid.position(key)


def _sampler(measured: list[int], **settings) -> tuple[LearnedSampler, object]:
    space = _space()
    sampler = LearnedSampler(seed=0, **settings)
    sampler.bind(space, "no-such-model", 10.0, "p99")
    sampler.models.scored = set(measured)
    return sampler, space_table(space)


def _untested(sampler: LearnedSampler, table, cand, is_local, here: int) -> np.ndarray:
    return sampler.acquisition.untested(table, cand, is_local, here, sampler.models.scored)


def _acquire(sampler: LearnedSampler, table, cand, local, feasible, mu_e, sd_e, mu_l, sd_l, why: str) -> Config:
    """One choice of the acquisition step (no latency fit yet: no noise margin), its reason kept on the sampler."""
    predicted = (mu_e, sd_e, mu_l, sd_l)
    picked, sampler.reason = sampler.acquisition.choose(
        table, cand, local, feasible, predicted, sampler.bound_ms, 0.0, sampler.models.scored, "gp", why
    )
    return picked


def test_untried_directions_are_those_no_trial_at_the_incumbents_batch_went():
    space = _space()
    table = space_table(space)
    here = _row(table, 300, 1, "a", 1)
    measured = [here, _row(table, 400, 1, "a", 1), _row(table, 300, 2, "a", 4), _row(table, 200, 1, "a", 2)]
    sampler, table = _sampler(measured)
    neighbours = [r for r in sampler.candidates.neighbours(table, [here]) if r not in measured]
    cand = np.array(neighbours)
    priority = _untested(sampler, table, cand, np.ones(len(cand), dtype=bool), here)
    untried = {table.grid[int(r)].label() for r, p in zip(cand, priority, strict=True) if np.isfinite(p)}
    # A faster clock was tried at this batch size (400), a slower one at the next (200 at batch 2), and
    # the batch size is not a direction; the other memory clock (tried only two batch steps away, at
    # batch 4) was not. The unordered mode has no direction: its other value is never a probe.
    assert untried == {"clock=300 mem=2 mode=a bs=1"}
    sampler, table = _sampler(measured, probe_batches=2)
    priority = _untested(sampler, table, cand, np.ones(len(cand), dtype=bool), here)
    assert not np.isfinite(priority).any()


def test_the_least_explored_knob_is_probed_first():
    space = _space()
    table = space_table(space)
    here = _row(table, 300, 1, "a", 1)
    measured = [here, _row(table, 400, 1, "a", 1), _row(table, 500, 1, "a", 1)]
    sampler, table = _sampler(measured)
    cand = np.array([_row(table, 200, 1, "a", 1), _row(table, 300, 2, "a", 1)])
    priority = _untested(sampler, table, cand, np.ones(2, dtype=bool), here)
    # Memory (one value measured) comes before the clock (three values measured).
    assert priority[1] > priority[0] > -np.inf


def test_the_local_step_probes_an_untried_direction_even_when_the_model_prefers_a_tried_one():
    """A prior wrong about a direction (the roofline on the H200 twin's memory clock) is corrected by one trial."""
    space = _space()
    table = space_table(space)
    here = _row(table, 300, 1, "a", 1)
    tried = _row(table, 400, 1, "a", 1)
    measured = [here, tried, _row(table, 200, 1, "a", 1), _row(table, 300, 1, "b", 1)]
    sampler, table = _sampler(measured)
    sampler.acquisition.steps = 1  # the next step is a local one
    local = set(sampler.candidates.neighbours(table, [here])) - set(measured)
    cand = np.array(sorted(local))
    mem_up = _row(table, 300, 2, "a", 1)
    # The model predicts the untried memory clock 30% worse than every other candidate.
    mu_e = np.where(cand == mem_up, np.log(1.3), 0.0)
    ones = np.ones(len(cand))
    args = (table, cand, local, [(1.0, here)], mu_e, 0.05 * ones, np.log(5.0) * ones, 0.05 * ones, "test")
    picked = _acquire(sampler, *args)
    assert picked.label() == table.grid[mem_up].label()
    assert sampler.reason[1].startswith("untried direction of a knob")

    sampler, table = _sampler(measured, probe=False)
    sampler.acquisition.steps = 1
    assert _acquire(sampler, *args).label() != table.grid[mem_up].label()


def test_an_untried_direction_the_latency_model_expects_to_miss_the_bound_is_not_probed():
    space = _space()
    table = space_table(space)
    here = _row(table, 300, 1, "a", 1)
    measured = [here, _row(table, 400, 1, "a", 1), _row(table, 200, 1, "a", 1), _row(table, 300, 1, "b", 1)]
    sampler, table = _sampler(measured)
    sampler.acquisition.steps = 1
    local = set(sampler.candidates.neighbours(table, [here])) - set(measured)
    cand = np.array(sorted(local))
    mem_up = _row(table, 300, 2, "a", 1)
    mu_l = np.where(cand == mem_up, np.log(20.0), np.log(5.0))  # bound 10 ms: far over it
    ones = np.ones(len(cand))
    picked = _acquire(sampler, table, cand, local, [(1.0, here)], 0 * ones, 0.05 * ones, mu_l, 0.05 * ones, "t")
    assert picked.label() != table.grid[mem_up].label()
    assert sampler.reason[1].startswith("neighbour of")
