"""Server and SingleStream windows for real on the CPU: CLI -> torch runner -> MLPerf LoadGen -> RAPL meter."""

import json

import optuna
import pytest
from clirun import run_cli, tiny_cpu
from loadgen_logs import check_trial_logs

pytest.importorskip("torch", reason="needs torch (pip install torch==2.13.0)")
pytest.importorskip("mlperf_loadgen", reason="needs LoadGen (pip install mlcommons-loadgen)")

pytestmark = pytest.mark.slow  # LoadGen Server windows on this CPU


def test_a_server_study_on_the_cpu_runs_loadgen_server_with_dynamic_batching(tmp_path, rapl_at_15w):
    out = tmp_path / "studies"
    r = tiny_cpu(
        "run",
        "--scenario",
        "server",
        "--target-qps",
        "150",
        "--max-latency",
        "500ms",
        "--batch-sizes",
        "1,4",
        "--trials",
        "2",
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
    assert payload["measured"] == 2 and payload["scenario"] == "server@150qps"
    assert payload["study"] == "tiny-cnn|cpu|server@150qps|500ms"
    best = payload["best"]
    assert "batch_timeout_ms" in best["config"]
    assert best["qps"] == pytest.approx(150, rel=0.3)  # arrivals at the target rate, not as fast as it can
    folder = out / "cpu" / "tiny-cnn"
    # one folder per trial's first window, and one or two more for a trial that confirmed a new best
    summaries = sorted(folder.glob("loadgen/server-150qps/trial-[0-9][0-9][0-9][0-9]/mlperf_log_summary.txt"))
    assert len(summaries) == 2
    more = sorted(folder.glob("loadgen/server-150qps/trial-*-window[23]/mlperf_log_summary.txt"))
    assert payload["best"]["windows"] >= 2 and 1 <= len(more) <= 4  # the answer is confirmed; so may be one other
    assert "Scenario : Server" in summaries[0].read_text()
    study = optuna.load_study(study_name=payload["study"], storage=f"sqlite:///{out / 'tune.db'}")
    check_trial_logs([t for t in study.trials if "loadgen_logs" in t.user_attrs])
    assert (folder / "server-150qps" / "pareto.json").exists()


def test_singlestream_measure_on_the_cpu_reports_loadgen_per_query_latency(tmp_path, rapl_at_15w):
    r = tiny_cpu(
        "measure",
        "--scenario",
        "singlestream",
        "--batch-size",
        "1",
        "--json",
    )
    assert r.returncode == 0, r.stderr
    payload = json.loads(r.stdout)
    assert payload["scenario"] == "singlestream"
    m = payload["measurements"][0]
    assert m["valid"] and m["extra"]["loadgen_scenario"] == "SingleStream" and m["extra"]["percentile"] == "p90"
    assert m["p99_ms"] >= m["p90_ms"] >= m["p50_ms"] > 0 and m["meter"] == "rapl"


def test_scenario_mistakes_are_one_line_and_exit_2():
    base = ("run", "--model", "tiny-cnn", "--device", "sim:orin", "--max-latency", "50ms", "--trials", "1")
    r = run_cli(*base, "--scenario", "server")
    assert r.returncode == 2 and "--target-qps" in r.stderr and "Traceback" not in r.stderr
    r = run_cli(*base, "--scenario", "bogus")
    assert r.returncode == 2 and "unknown scenario" in r.stderr
