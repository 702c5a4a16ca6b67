"""Trials that end once their verdict is known, on twins: the same rules as a hardware window.

A hopeless Offline configuration (every batch past the bound) and an
overloaded Server one end early as COMPLETE trials that miss the bound; a
window that costs more than the best beyond its interval ends early too. None
of them is ever the recommended trial, and a resumed study keeps them as they
were. No assertion depends on how long anything took.
"""

from __future__ import annotations

from typing import Any

import optuna
import pytest
from locations import REPO

from tuner.devices.virtual.twin import TwinDevice
from tuner.measure.settings import WindowSettings
from tuner.measure.stopping import STOP_COSTLIER, STOP_TAIL
from tuner.records import recommended
from tuner.run_options import RunOptions
from tuner.space import Config
from tuner.storage import CONSTRAINTS_KEY
from tuner.study import run_study


def options(tmp_path, **kw: Any) -> RunOptions:
    base = dict(model="resnet50", max_latency_ms=20.0, trials=12, seed=1, sampler="tpe", out=tmp_path)
    base.update(kw)
    return RunOptions(**base)


def h200(**knobs: Any) -> Config:
    device = TwinDevice("sim:h200")
    space = device.space()
    values = {name: knob.default for name, knob in space.knobs.items()}
    values.update(knobs)
    return Config(knobs=values, batch_size=int(values.pop("batch_size", 1)) if "batch_size" in values else 1)


def test_a_hopeless_offline_configuration_ends_after_a_few_batches_as_a_miss():
    device = TwinDevice("sim:h200")
    config = h200(batch_size=512)
    full = device.measure("resnet50", config, WindowSettings(window_s=10.0, seed=0))
    assert full.p50_ms > 5.0 and "cut" not in full.extra
    cut = device.measure("resnet50", config, WindowSettings(window_s=10.0, seed=0, bound_ms=5.0))
    assert cut.extra["cut"] == cut.extra["stop_rule"] == STOP_TAIL
    assert cut.queries < full.queries and cut.duration_s < full.duration_s
    assert cut.extra["tail_over_queries"] == cut.queries  # every measured query is past the bound
    # the figures per query are the window's own: the sampler learns the same thing from a cut trial
    assert cut.j_per_query == pytest.approx(full.j_per_query) and cut.p99_ms == full.p99_ms
    within = device.measure("resnet50", config, WindowSettings(window_s=10.0, seed=0, bound_ms=full.p99_ms * 2))
    assert "cut" not in within.extra and within.queries == full.queries


def test_a_hopeless_window_beside_dla_lanes_is_proven_by_its_query_count_as_on_hardware():
    # The engines' batches differ in size and speed: the share of batches past the bound proves nothing there
    # (tuner.measure.loadgen_settings.tail_rule), so the twin cuts after about 1% of the queries, not 5 batches.
    device = TwinDevice("sim:orin-trt")
    values = {name: knob.default for name, knob in device.space().knobs.items()}
    gpu_only = Config(knobs={**values, "dla_cores": 0}, batch_size=64)
    with_dla = Config(knobs={**values, "dla_cores": 2}, batch_size=64)
    settings = WindowSettings(window_s=10.0, seed=0, bound_ms=1e-3)
    alone = device.measure("resnet50", gpu_only, settings)
    beside = device.measure("resnet50", with_dla, settings)
    assert alone.extra["cut"] == beside.extra["cut"] == STOP_TAIL
    assert alone.queries == 5 * 64  # five alike batches, every one past the bound
    assert beside.extra["tail_over_queries"] >= beside.extra["tail_over_needed"] > 5 * 64


def test_an_overloaded_server_window_is_cut_once_its_queue_proves_the_tail():
    device = TwinDevice("sim:h200")
    config = h200(batch_size=1, graph="eager")
    server = {"scenario": "server", "window_s": 10.0, "seed": 0, "options": {"server_target_qps": 3000.0}}
    full = device.measure("resnet50", config, WindowSettings(**server))
    assert full.extra["utilization"] > 0.99 and full.p99_ms > 1000.0  # arrivals exceed what batch 1 serves
    cut = device.measure("resnet50", config, WindowSettings(**server, bound_ms=10.0))
    assert cut.extra["cut"] == STOP_TAIL and cut.p99_ms > 10.0
    assert cut.extra["tail_over_queries"] >= cut.extra["tail_over_needed"]
    assert cut.duration_s < 0.5 < full.duration_s  # the evidence: about 1% of the schedule past 10 ms
    easy = device.measure("resnet50", h200(batch_size=64), WindowSettings(**server, bound_ms=1000.0))
    assert "cut" not in easy.extra


def test_cut_trials_are_complete_misses_or_costlier_and_never_recommended(tmp_path):
    study, summary = run_study(TwinDevice("sim:h200"), options(tmp_path))
    trials = [t for t in study.trials if "reused_from" not in t.user_attrs]
    cuts = {t.number: t.user_attrs["cut"] for t in trials if "cut" in t.user_attrs}
    assert STOP_TAIL in cuts.values() and STOP_COSTLIER in cuts.values()
    best = recommended(study)
    assert best is not None and best.number not in cuts and summary.best_trial == best.number
    for t in trials:
        assert t.state == optuna.trial.TrialState.COMPLETE
        if t.number not in cuts:
            continue
        assert t.user_attrs["measurements"] == 1 and len(t.intermediate_values) == 1
        # the list optuna-dashboard reads (and Optuna's GP sampler counts) is there for a cut trial too
        assert t.system_attrs[CONSTRAINTS_KEY] == [t.constraints["latency"]]
        if cuts[t.number] == STOP_TAIL:
            assert t.constraints["latency"] > 0 and t.user_attrs["verdict"].startswith("misses the bound")
        else:
            assert t.value > best.value and "costs more than" in t.user_attrs["verdict"]
    assert set(summary.trial_seconds) == {"setup_s", "windows_s", "search_s"}
    assert all(t.user_attrs["search_s"] >= 0 for t in trials)


def test_a_resumed_study_keeps_the_verdicts_of_its_cut_trials(tmp_path):
    device = TwinDevice("sim:h200")
    first, _ = run_study(device, options(tmp_path, trials=8))
    before = {
        t.number: (t.user_attrs.get("cut"), t.user_attrs["verdict"], t.constraints, t.value) for t in first.trials
    }
    assert any(cut for cut, *_ in before.values())
    study, _ = run_study(device, options(tmp_path, trials=4))
    after = {t.number: (t.user_attrs.get("cut"), t.user_attrs["verdict"], t.constraints, t.value) for t in study.trials}
    assert {n: after[n] for n in before} == before
    best = recommended(study)
    assert best is not None and "cut" not in best.user_attrs
    # a configuration proposed again reuses its cut verdict rather than measuring it anew
    for t in study.trials:
        source = t.user_attrs.get("reused_from")
        if source is not None:
            assert t.user_attrs.get("cut") == study.trials[source].user_attrs.get("cut")


def test_tune_run_says_where_the_time_went_and_which_trials_were_cut(tmp_path):
    import csv
    import json

    from clirun import in_process

    args = ("run", "--model", "resnet50", "--device", "sim:h200", "--max-latency", "20ms", "--trials", "6")
    code, out, err = in_process(*args, "--sampler", "tpe", "--seed", "1", "--out", str(tmp_path), "--json")
    assert code == 0, err
    payload = json.loads(out)
    assert set(payload["trial_seconds"]) == {"setup_s", "windows_s", "search_s"}
    rows = list(csv.DictReader(open(tmp_path / "sim-h200" / "resnet50" / "trials.csv")))
    assert {"cut", "setup_s", "windows_s", "search_s"} <= set(rows[0])
    assert {row["cut"] for row in rows} >= {STOP_TAIL}
    assert all(row["recommended"] == "no" for row in rows if row["cut"])


def test_every_constraint_is_set_through_the_one_mirror():
    """Only tuner/storage/constraints.py calls Optuna's set_constraint: every other writer uses storage.set_constraint,
    which keeps the list optuna-dashboard reads (a cut trial once had the named form only, and Optuna's
    GP sampler then refused the study for its uneven constraint counts)."""
    import ast

    root = REPO
    callers = []
    for path in sorted((root / "tuner").rglob("*.py")) + sorted((root / "runners").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                if node.func.attr == "set_constraint":
                    callers.append(str(path.relative_to(root)))
    assert set(callers) == {"tuner/storage/constraints.py"}
