"""sim:h200's graph knob and Server semantics, checked against committed H200 windows (observe-only hardware)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest

from runners.profile import load_profile
from tuner.devices.virtual.twin import TwinDevice
from tuner.measure.settings import WindowSettings
from tuner.space import Config

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
MODELS = ("resnet50", "bert-base")


def _card_and_twin(model: str) -> list[dict]:
    """Every committed Offline window of the observe-only space beside the twin's time and energy for it."""
    rows = json.loads((RESULTS / "h200-observe" / f"observe-{model}.json").read_text())["rows"]
    rows = [r for r in rows if r["valid"]]
    twin = TwinDevice("sim:h200")
    configs = [Config(knobs=dict(r["config"]), batch_size=r["batch_size"]) for r in rows]
    result = twin.model.evaluate(load_profile(model), configs)
    out = []
    for i, r in enumerate(rows):
        card_s = r["batch_size"] / r["qps"]
        twin_s = float(result.time_s[i])
        out.append(
            {
                **r["config"],
                "model": model,
                "batch": r["batch_size"],
                "card_s": card_s,
                "twin_s": twin_s,
                "time_err": twin_s / card_s - 1,
                "energy_err": float(result.power_w[i]) * twin_s / r["batch_size"] / r["j_per_query"] - 1,
            }
        )
    return out


@pytest.fixture(scope="module")
def windows() -> list[dict]:
    return [row for model in MODELS for row in _card_and_twin(model)]


def test_the_twin_runs_captured_graphs_as_the_card_does(windows):
    graphed = [w for w in windows if w["graph"] == "cudagraphs"]
    time_err = np.abs([w["time_err"] for w in graphed])
    # 180 windows, batch 1-512, both models, every precision: the graph replay is within 15% at the median ...
    assert np.median(time_err) <= 0.15
    big = [w for w in graphed if w["batch"] >= 16]
    assert np.median(np.abs([w["time_err"] for w in big])) <= 0.10
    assert np.median(np.abs([w["energy_err"] for w in big])) <= 0.15
    # ... and where the card gains most from graphs (launch-bound small batches) the twin gains too:
    # eager / cudagraphs time per batch, card against twin, for every configuration at batch <= 8.
    eager = {(w["model"], w["precision"], w["channels_last"], w["batch"]): w for w in windows if w["graph"] == "eager"}
    ratios = []
    for w in graphed:
        key = (w["model"], w["precision"], w["channels_last"], w["batch"])
        if w["batch"] <= 8 and key in eager:
            ratios.append((eager[key]["card_s"] / w["card_s"], eager[key]["twin_s"] / w["twin_s"]))
    card, twin = np.array(ratios).T
    assert card.min() > 1.0 and twin.min() > 1.0 and np.median(card) > 3.0
    # within a factor of 2: the eager side overestimates launch-bound small batches (docs/twin.md)
    assert np.median(np.abs(np.log(twin / card))) < np.log(2.0)


def test_the_graph_knob_changes_the_twins_serving_profile_to_the_ladder():
    twin = TwinDevice("sim:h200")
    knobs = twin.space().default_config().knobs
    profile = load_profile("resnet50")
    eager = twin.model.serving(profile, Config(knobs={**knobs, "graph": "eager"}, batch_size=32))
    graphs = twin.model.serving(profile, Config(knobs={**knobs, "graph": "cudagraphs"}, batch_size=32))
    assert graphs.service_s[1] < eager.service_s[1] / 2
    # eager runs the arrived size; a graph runs the smallest captured ladder size that holds it
    assert eager.service_s[17] < eager.service_s[32]
    assert graphs.service_s[3] == graphs.service_s[4] and graphs.busy_w[3] == graphs.busy_w[4]
    assert graphs.service_s[17] == graphs.service_s[32] and graphs.service_s[16] < graphs.service_s[17]


SERVER = RESULTS / "serve-batching-h200" / "call2" / "serve-batching.json"


def test_twin_server_figures_follow_the_cards_with_rate_and_maximum_batch():
    """The card's Server windows (resnet50 fp16 channels_last, CUDA graphs, maximum batch 32, batches as they
    arrived): energy per query falls with the rate and p99 does not fall; the twin must agree, and run the
    batches that arrived (not the maximum) like the card, within a factor of the card's figures."""
    rows = json.loads(SERVER.read_text())["rows"]
    card = {
        r["target_qps"]: r
        for r in rows
        if (r["model"], r["graph"], r["mode"], r["scenario"]) == ("resnet50", "cudagraphs", "after", "server")
    }
    twin = TwinDevice("sim:h200")
    knobs = {**twin.space().default_config().knobs, "precision": "fp16", "channels_last": True, "graph": "cudagraphs"}
    sim = {}
    for rate in sorted(card):
        settings = WindowSettings(scenario="server", window_s=4.0, noise=False, options={"server_target_qps": rate})
        sim[rate] = twin.measure("resnet50", Config(knobs=knobs, batch_size=32), settings)
    rates = sorted(card)
    for low, high in itertools.pairwise(rates):
        assert card[high]["j_per_query"] < card[low]["j_per_query"] and sim[high].j_per_query < sim[low].j_per_query
        assert card[high]["p99_ms"] >= 0.9 * card[low]["p99_ms"] and sim[high].p99_ms >= 0.9 * sim[low].p99_ms
    for rate in rates:
        assert 0.5 < sim[rate].j_per_query / card[rate]["j_per_query"] < 2.0
        assert 0.5 < sim[rate].p50_ms / card[rate]["p50_ms"] < 2.0
    # At the lowest rate the card ran almost only batches of one or two: a twin that padded to 32 would
    # cost several times the energy per query the card measured.
    padded = twin.model.evaluate(load_profile("resnet50"), [Config(knobs=knobs, batch_size=32)])
    assert float(padded.power_w[0] * padded.time_s[0]) > 2 * card[rates[0]]["j_per_query"]
