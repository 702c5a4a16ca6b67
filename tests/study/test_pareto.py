import csv
import itertools
import json

from tuner.devices.virtual.twin import TwinDevice
from tuner.pareto import ParetoFile, front, write_results
from tuner.study import RunOptions, run_study


def test_front_keeps_only_non_dominated_points():
    points = [
        {"p99_ms": 10, "j_per_query": 5.0},
        {"p99_ms": 20, "j_per_query": 3.0},
        {"p99_ms": 15, "j_per_query": 6.0},  # dominated by the first
        {"p99_ms": 30, "j_per_query": 3.0},  # dominated by the second
        {"p99_ms": 40, "j_per_query": 1.0},
    ]
    kept = front(points, "p99_ms")
    assert [(p["p99_ms"], p["j_per_query"]) for p in kept] == [(10, 5.0), (20, 3.0), (40, 1.0)]


def test_results_files(tmp_path):
    study, summary = run_study(
        TwinDevice("sim:h200"),
        RunOptions(model="bert-base", max_latency_ms=20.0, trials=15, seed=1, sampler="tpe", out=tmp_path),
    )
    folder = tmp_path / "sim-h200" / "bert-base"
    pareto = write_results(study, folder)
    for name in ("pareto.json", "pareto.csv", "pareto.png", "trials.csv"):
        assert (folder / name).stat().st_size > 0
    loaded = ParetoFile.model_validate(json.loads((folder / "pareto.json").read_text()))
    assert loaded.twin and loaded.version == 2 and loaded.device == "sim:h200"
    assert set(loaded.fronts) >= {"global"} | {f"bs={p.batch_size}" for p in loaded.fronts["global"]}
    glob = loaded.fronts["global"]
    assert all(a.latency_ms <= b.latency_ms and a.j_per_query > b.j_per_query for a, b in itertools.pairwise(glob))
    assert pareto.best["trial"] == summary.best_trial
    with open(folder / "trials.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == len(study.trials)
    assert (folder / "pareto.png").read_bytes()[:4] == b"\x89PNG"
