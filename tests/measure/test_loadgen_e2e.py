"""The real measurement path end to end on the CPU: CLI -> torch runner -> MLPerf LoadGen -> RAPL meter."""

import json
import os

import optuna
import pytest
from clirun import tiny_cpu
from loadgen_logs import check_trial_logs
from locations import FAKES
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
    # LoadGen's reason and a replacement is measured; a window cut once its verdict was known leaves an INVALID
    # log by design. What must hold either way: every trial that measured left its LoadGen log, and each says
    # what it was (tests/support/loadgen_logs.py).
    study = optuna.load_study(study_name=payload["study"], storage=f"sqlite:///{out / 'tune.db'}")
    logged = [t for t in study.trials if "loadgen_logs" in t.user_attrs]
    completed = [t for t in logged if t.state == TrialState.COMPLETE]
    summaries = sorted(folder.glob("loadgen/trial-[0-9][0-9][0-9][0-9]/mlperf_log_summary.txt"))
    assert len(summaries) >= len(completed) == 3  # each completed trial's first window (a failed one may have none)
    confirmed = [t for t in logged if t.user_attrs.get("measurements", 1) > 1]
    more = list(folder.glob("loadgen/trial-*-window[23]/mlperf_log_summary.txt"))
    assert confirmed and len(more) >= sum(t.user_attrs["measurements"] - 1 for t in confirmed)
    check_trial_logs(logged)
    assert payload["saved"]["baseline"] == "the default configuration"  # measured like a trial, logged beside them
    assert (folder / f"loadgen/baseline-b{best['batch_size']}/mlperf_log_summary.txt").is_file()


def test_a_trial_cut_early_completes_with_the_cut_said_whatever_its_loadgen_log_reads(tmp_path):
    """A bound no window can meet: every trial's window is cut once its tail is proven past it (by design).

    Metered by a constant-power plugin alone (no RAPL fixture): a window cut after a few milliseconds is
    shorter than the fake RAPL counter's 10 ms update, which would read 0 J.
    """
    out = tmp_path / "studies"
    path = os.pathsep.join([str(FAKES), *filter(None, [os.environ.get("PYTHONPATH")])])
    env = {"PYTHONPATH": path, "TUNE_POWERCAP_ROOT": str(tmp_path / "no-rapl")}
    bound = ("--max-latency", "0.001ms", "--meter", "py:fakemeter:ConstantMeter")
    r = tiny_cpu("run", *bound, "--trials", "2", "--seed", "0", "--out", str(out), "--json", env=env)
    assert r.returncode == 3, r.stderr
    payload = json.loads(r.stdout)
    assert payload["best"] is None and "no configuration met p99 <= 0.001 ms" in payload["unmet"]
    study = optuna.load_study(study_name=payload["study"], storage=f"sqlite:///{out / 'tune.db'}")
    done = [t for t in study.trials if t.state == TrialState.COMPLETE]
    assert len(done) == 2 and all(t.user_attrs.get("cut") == "tail-over-bound" for t in done)
    check_trial_logs(done)


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
