"""The real measurement path end to end on the CPU: CLI -> torch runner -> MLPerf LoadGen -> RAPL meter."""

import json
from pathlib import Path

import optuna
import pytest
from clirun import tiny_cpu
from optuna.trial import TrialState

pytest.importorskip("torch", reason="needs torch (pip install torch==2.13.0)")
pytest.importorskip("mlperf_loadgen", reason="needs LoadGen (pip install mlcommons-loadgen)")

pytestmark = pytest.mark.slow  # LoadGen windows on this CPU


def test_tune_run_on_the_cpu_with_a_tiny_model(tmp_path, rapl_at_15w):
    out = tmp_path / "studies"
    r = tiny_cpu(
        "run",
        "--max-latency",
        "200ms",
        "--trials",
        "3",
        "--seed",
        "0",
        "--sampler",
        "random",
        "--out",
        str(out),
        "--json",
    )
    assert r.returncode == 0, r.stderr
    payload = json.loads(r.stdout)
    assert payload["measured"] == 3 and payload["twin"] is False
    best = payload["best"]
    assert best["meter"] == "rapl"
    assert best["avg_w"] == pytest.approx(15.0, rel=0.15)  # the fake package draws 15 W
    assert best["j_per_query"] == pytest.approx(best["avg_w"] / best["qps"], rel=0.05)
    folder = out / "cpu" / "tiny-cnn"
    assert (folder / "pareto.json").exists() and (folder / "trials.csv").exists()
    # A slow machine can make a window INVALID (LoadGen's minimum duration not met): that trial fails with
    # LoadGen's reason and a replacement is measured. What must hold either way: every trial that measured
    # left its LoadGen log, the three that count were VALID, and any other one says why it was rejected.
    study = optuna.load_study(study_name=payload["study"], storage=f"sqlite:///{out / 'tune.db'}")
    logged = [t for t in study.trials if "loadgen_logs" in t.user_attrs]
    summaries = sorted(folder.glob("loadgen/trial-[0-9][0-9][0-9][0-9]/mlperf_log_summary.txt"))
    assert len(summaries) == len(logged) >= 3  # each trial's first window
    confirmed = [t for t in logged if t.user_attrs.get("measurements", 1) > 1]
    more = list(folder.glob("loadgen/trial-*-window[23]/mlperf_log_summary.txt"))
    assert confirmed and len(more) >= sum(t.user_attrs["measurements"] - 1 for t in confirmed)
    for t in logged:
        text = (Path(t.user_attrs["loadgen_logs"]) / "mlperf_log_summary.txt").read_text()
        if t.state == TrialState.COMPLETE:
            assert "Result is : VALID" in text
        else:
            assert t.state == TrialState.FAIL and t.user_attrs.get("fail_reason")
    assert sum(t.state == TrialState.COMPLETE for t in logged) == 3


def test_tune_measure_on_the_cpu(tmp_path, rapl_at_15w):
    r = tiny_cpu(
        "measure",
        "--batch-size",
        "4",
        "--set",
        "precision=bf16",
        "--json",
    )
    assert r.returncode == 0, r.stderr
    m = json.loads(r.stdout)["measurements"][0]
    assert m["queries"] > 0 and m["p99_ms"] >= m["p50_ms"] > 0
    assert m["meter"] == "rapl" and not m["twin"]
    # A slow machine can leave LoadGen's minimum duration unmet: then the window is marked invalid, with why.
    assert m["valid"] or m["reason"]


def test_no_power_sensor_is_exit_2(tmp_path):
    r = tiny_cpu(
        "measure",
        "--batch-size",
        "1",
        env={"TUNE_POWERCAP_ROOT": str(tmp_path / "none")},
    )
    assert r.returncode == 2
    assert "RAPL" in r.stderr or "powercap" in r.stderr
    assert "Traceback" not in r.stderr
