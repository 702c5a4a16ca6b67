"""The learned strategy's cached and in-place arithmetic proposes exactly what it did before (fixed seed).

The caches (the roofline in cache-sized blocks, one storage read per proposal, the incumbent's box
kept, the GP's squared differences computed once per fit) were shown to propose what the code before
them did, trial for trial, on the twin of that time; the sequence below was recorded again once the
Orin twin took its per-rail power, and again once it took the GPU/SoC rail's load-time draw (the twin's
figures steer the proposals), so a cache that changes a
result still changes a proposal here. With
``switch_tie=0`` the strategy has no preference for the board's current mode, as then.
"""

from __future__ import annotations

import json

import numpy as np

from tuner.devices.virtual.recorded import RecordedBoard
from tuner.devices.virtual.twin import TwinDevice
from tuner.measure.settings import WindowSettings
from tuner.run_options import RunOptions
from tuner.strategies import LearnedSampler, space_table
from tuner.study import MEMORY_STORAGE, run_study

# sim:orin, resnet50, p99 <= 50 ms, seed 1: (batch, nvpmodel, gpu_mhz, emc_mhz, cpu_cores, cpu_mhz, proposed by)
RECORDED = [
    (64, "MAXN", "1300.5", "3199", "12", "2201.6", "baseline"),
    (1, "MAXN", "1300.5", "3199", "12", "2201.6", "baseline"),
    (8, "MAXN", "816", "665.6", "6", "1190.4", "design"),
    (8, "MAXN", "816", "3199", "2", "1958.4", "gp+roofline"),
    (8, "MAXN", "714", "3199", "2", "1958.4", "local(gp+roofline)"),
    (8, "MAXN", "612", "3199", "2", "2201.6", "gp+roofline"),
    (8, "MAXN", "510", "3199", "2", "2201.6", "local(gp+roofline)"),
    (8, "MAXN", "510", "3199", "2", "2112.0", "local(gp+roofline)"),
    (8, "MAXN", "612", "3199", "2", "2112.0", "local(gp+roofline)"),
    (8, "MAXN", "510", "3199", "2", "1958.4", "local(gp+roofline)"),
    (8, "MAXN", "612", "3199", "2", "1958.4", "local(gp+roofline)"),
    (8, "MAXN", "408", "3199", "2", "2201.6", "gp+roofline"),
]


def test_proposals_for_a_fixed_seed_are_those_recorded_before_the_caches() -> None:
    options = RunOptions(model="resnet50", max_latency_ms=50.0, trials=len(RECORDED), seed=1, storage=MEMORY_STORAGE)
    study, _ = run_study(TwinDevice("sim:orin"), options, sampler=LearnedSampler(seed=1, switch_tie=0.0))
    got = []
    for t in sorted(study.trials, key=lambda t: t.number):
        batch, *pairs = json.loads(t.user_attrs["effective_key"])
        k = dict(pairs)
        got.append(
            (
                batch,
                k["nvpmodel"],
                k["gpu_mhz"],
                k["emc_mhz"],
                k["cpu_cores"],
                k["cpu_mhz"],
                t.user_attrs["proposed_by"],
            )
        )
    assert got == RECORDED


def test_the_kept_box_is_the_box_of_the_current_incumbent() -> None:
    space = TwinDevice("sim:orin-nano").space()
    table = space_table(space)
    sampler = LearnedSampler(seed=0)
    sampler.bind(space, "resnet50", 30.0, "p99")
    steps = sampler.candidates.steps() * sampler.box_steps + 1e-9
    for row in (5, 5, 900, 5):
        fresh = np.flatnonzero(np.all(np.abs(table.x - table.x[row]) <= steps, axis=1))
        assert np.array_equal(sampler.candidates.box(table, row), fresh)


# measured:h200, bert-base, p99 <= 20 ms, seed 0: (batch, precision, graph, proposed by); recorded before the
# strategy was split into modules (design, table, candidates, models, acquisition, headroom), when every window that
# would become the best was confirmed in its trial (``confirm_within=None``).
RECORDED_H200 = [
    (512, "fp16", "eager", "baseline"),
    (1, "fp16", "eager", "baseline"),
    (16, "fp16", "eager", "design"),
    (128, "fp16", "eager", "gp+roofline"),
    (128, "fp16", "cudagraphs", "local(gp+roofline)"),
    (128, "bf16", "eager", "local(gp+roofline)"),
    (128, "bf16", "cudagraphs", "local(gp+roofline)"),
    (64, "bf16", "cudagraphs", "local(gp+roofline)"),
    (64, "fp16", "cudagraphs", "local(gp+roofline)"),
    (64, "fp16", "eager", "gp+roofline"),
    (64, "bf16", "eager", "local(gp+roofline)"),
    (256, "bf16", "cudagraphs", "local(gp+roofline)"),
]


# The same study with the default confirmation (``confirm_within=0.05``: close calls only), recorded when it became
# the default: the same configurations, the global step to fp16 eager at batch 64 two trials sooner (the early
# incumbents' values are their one window, not the mean of two or three).
RECORDED_H200_LAZY = [
    (512, "fp16", "eager", "baseline"),
    (1, "fp16", "eager", "baseline"),
    (16, "fp16", "eager", "design"),
    (128, "fp16", "eager", "gp+roofline"),
    (128, "fp16", "cudagraphs", "local(gp+roofline)"),
    (128, "bf16", "eager", "local(gp+roofline)"),
    (128, "bf16", "cudagraphs", "local(gp+roofline)"),
    (64, "fp16", "eager", "gp+roofline"),
    (64, "bf16", "cudagraphs", "local(gp+roofline)"),
    (64, "fp16", "cudagraphs", "local(gp+roofline)"),
    (64, "bf16", "eager", "local(gp+roofline)"),
    (256, "bf16", "cudagraphs", "local(gp+roofline)"),
]


def bert_on_the_recorded_board(sampler: LearnedSampler) -> list[tuple]:
    options = RunOptions(
        model="bert-base",
        max_latency_ms=20.0,
        trials=len(RECORDED_H200),
        seed=0,
        storage=MEMORY_STORAGE,
        early_stop=False,
        window=WindowSettings(seed=0),
    )
    study, _ = run_study(RecordedBoard("measured:h200"), options, sampler=sampler)
    got = []
    for t in sorted(study.trials, key=lambda t: t.number):
        batch, *pairs = json.loads(t.user_attrs["effective_key"])
        k = dict(pairs)
        got.append((batch, k["precision"], k["graph"], t.user_attrs["proposed_by"]))
    return got


def test_proposals_on_a_space_of_unordered_knobs_are_those_recorded_before_the_split() -> None:
    assert bert_on_the_recorded_board(LearnedSampler(seed=0, confirm_within=None)) == RECORDED_H200


def test_proposals_with_one_window_per_configuration_are_those_recorded_when_it_became_the_default() -> None:
    assert bert_on_the_recorded_board(LearnedSampler(seed=0)) == RECORDED_H200_LAZY
