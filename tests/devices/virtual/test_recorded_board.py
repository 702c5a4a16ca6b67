"""The measured board (measured:h200): the committed H200 windows replayed, and the default strategy run on it."""

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from tuner.bench import BenchSettings, build_landscapes, run_one
from tuner.cli import app
from tuner.devices.registry import open_device
from tuner.devices.virtual.recorded import RecordedBoard
from tuner.errors import UserError
from tuner.measure.settings import WindowSettings
from tuner.records import recommended
from tuner.run_options import RunOptions
from tuner.space import Config
from tuner.study import MEMORY_STORAGE, run_study
from tuner.sweep import optimum, run_sweep


def config(board, batch, **knobs):
    return Config(knobs={**board.space().default_config(batch).knobs, **knobs}, batch_size=batch)


def test_board_opens_both_ways_with_the_observe_only_space():
    board = open_device("measured:h200")
    assert open_device("py:tuner.devices.virtual.recorded:RecordedBoard").name == "measured:h200"
    assert board.simulated and board.describe()["twin"]
    space = board.space()
    assert {n: k.values for n, k in space.knobs.items() if k.group == "device"} == {
        "sm_mhz": [1980],
        "mem_mhz": [3201],
        "power_limit_w": [700],
    }
    rows = run_sweep(board, space, "resnet50", WindowSettings(noise=False))
    assert len(rows) == 120 and all(r.measurement is not None and r.measurement.valid for r in rows)
    assert set(board.models()) == {"resnet50", "bert-base"}
    with pytest.raises(UserError, match="measured:h200"):
        RecordedBoard("measured:nope")
    with pytest.raises(UserError, match="resnet50"):
        board.measure("vgg16", config(board, 8), WindowSettings())


def test_noise_is_the_cards_own_windows_and_truth_is_their_mean():
    board = RecordedBoard()
    c = config(board, 1, precision="bf16", channels_last=True, graph="eager")
    windows = board._row("resnet50", c).windows
    assert len(windows) >= 2
    drawn = {board.measure("resnet50", c, WindowSettings(seed=s)).j_per_query for s in range(20)}
    assert drawn == {w.j_per_query for w in windows}
    truth = board.measure("resnet50", c, WindowSettings(noise=False))
    assert truth.j_per_query == pytest.approx(np.mean([w.j_per_query for w in windows]))
    assert truth.p99_ms == pytest.approx(np.mean([w.p99_ms for w in windows]))
    # bert-base has no 4-D float input: channels_last does nothing there and was measured once.
    cl = board.measure("bert-base", config(board, 32, channels_last=True), WindowSettings(noise=False))
    nhwc = board.measure("bert-base", config(board, 32, channels_last=False), WindowSettings(noise=False))
    assert cl == nhwc


def test_default_strategy_on_the_measured_board_gets_near_the_measured_optimum():
    """15 trials of the default strategy at a 5 ms p99 bound (where no eager batch is feasible), scored on the mean."""
    board = RecordedBoard()
    rows = run_sweep(board, board.space(), "resnet50", WindowSettings(noise=False))
    best_j = optimum(rows, 5.0, "p99").measurement.j_per_query
    options = RunOptions(
        model="resnet50", max_latency_ms=5.0, trials=15, seed=3, storage=MEMORY_STORAGE, window=WindowSettings(seed=3)
    )
    study, _ = run_study(board, options)
    best = recommended(study)
    assert best is not None
    chosen = Config(knobs=best.user_attrs["effective"], batch_size=best.user_attrs["batch_size"])
    truth = board.measure("resnet50", chosen, WindowSettings(noise=False))
    assert truth.p99_ms <= 5.0
    assert truth.j_per_query <= 1.05 * best_j


def test_bench_scores_the_measured_board_at_quantile_bounds():
    settings = BenchSettings(
        devices=["measured:h200"], models=["resnet50"], bounds=["q25", "q75"], tune_boards=[], judge_boards=[]
    )
    lands = build_landscapes(settings)
    assert [land.suite for land in lands] == ["measured", "measured"]
    assert lands[0].feasible_fraction == pytest.approx(0.25, abs=0.03)
    assert lands[1].feasible_fraction == pytest.approx(0.75, abs=0.03)
    result = run_one(lands[1], 1, "learned", 0, 12, "p99")
    assert result.measured == 12 and result.final_regret is not None and 0 <= result.violation <= 1


def test_tune_run_on_the_measured_board_cli(tmp_path):
    result = CliRunner().invoke(
        app,
        [
            "run",
            "--device",
            "measured:h200",
            "--model",
            "bert-base",
            "--max-latency",
            "10ms",
            "--trials",
            "8",
            "--seed",
            "1",
            "--out",
            str(tmp_path),
        ],
    )
    assert result.exit_code == 0, result.output
    # Its results are neither fresh hardware measurements nor a twin's simulation: it says which.
    assert "replayed: windows measured earlier on an NVIDIA H200" in " ".join(result.output.split())
    assert "simulated" not in result.output
    pareto = json.loads(next(tmp_path.rglob("pareto.json")).read_text())
    assert pareto["best"]["p99_ms"] <= 10.0
    hardware = pareto["provenance"]["hardware"]
    assert hardware.startswith("NVIDIA H200 (driver 580.") and "replayed" in hardware and "twin" not in hardware
    assert pareto["provenance"]["twin"] is True
