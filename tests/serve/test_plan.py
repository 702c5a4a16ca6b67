"""The twin's queueing model, tune plan and tune replay on sim:orin (small spaces, in-process where it can be)."""

import json

import numpy as np
import pytest
import yaml
from clirun import run_cli
from typer.testing import CliRunner

from tuner.cli import app
from tuner.devices.virtual.queueing import ServingProfile, simulate
from tuner.devices.virtual.twin import TwinDevice
from tuner.measure.settings import WindowSettings
from tuner.scenario import window_for
from tuner.serve.plan import PlanOptions, neighbours, parse_rates, plan_rates
from tuner.serve.policy import load_policy
from tuner.serve.trace import load_trace
from tuner.space import Config

runner = CliRunner()


def fixed_profile(seconds_per_batch=0.010, max_batch=4):
    return ServingProfile(
        service_s=np.array([np.inf] + [seconds_per_batch] * max_batch),
        busy_w=np.array([0.0] + [30.0] * max_batch),
        idle_w=10.0,
    )


def test_dynamic_batching_waits_for_a_full_batch_or_the_timeout():
    arrivals = np.array([0.0, 0.001, 0.002, 0.003, 0.100])
    out = simulate(arrivals, fixed_profile(), max_batch=4, timeout_s=0.005, duration_s=0.2)
    # the first four fill a batch at 3 ms and finish at 13 ms; the fifth waits its 5 ms timeout alone
    assert out.latencies_s == pytest.approx([0.013, 0.012, 0.011, 0.010, 0.015])
    assert out.batches == 2 and out.busy_s == pytest.approx(0.020)
    assert out.energy_j == pytest.approx(30.0 * 0.020 + 10.0 * (0.2 - 0.020))
    greedy = simulate(arrivals, fixed_profile(), max_batch=4, timeout_s=0.0, duration_s=0.2)
    assert greedy.batches == 3  # the first alone at 0, then the three that queued behind it, then the fifth


def test_the_twins_server_window_follows_the_rate():
    dev = TwinDevice("sim:orin")
    config = dev.space().default_config(8)
    settings = WindowSettings(window_s=5.0, noise=False)

    def at(rate, timeout=0.0):
        window = window_for(settings, "server", rate)
        window.options["batch_timeout_ms"] = timeout
        return dev.measure("resnet50", config, window)

    low, high, over = at(20), at(200), at(600)
    assert low.twin and low.extra["scenario"] == "server"
    assert low.qps == pytest.approx(20, rel=0.2) and high.qps == pytest.approx(200, rel=0.1)
    assert low.j_per_query > 2 * high.j_per_query  # idle power spread over few queries
    assert over.p99_ms > 10 * high.p99_ms  # past the capacity the queue grows through the window
    assert at(20, timeout=30).extra["mean_batch"] > low.extra["mean_batch"]


def test_rates_parse_and_refuse():
    assert parse_rates("25:100:25") == [25, 50, 75, 100]
    assert parse_rates("200,50") == [50, 200]
    for bad in ("a:b", "0,5", "10:5:1"):
        with pytest.raises(Exception, match="--rates"):
            parse_rates(bad)


PLAN = ("--model", "resnet50", "--device", "sim:orin", "--max-latency", "50ms")
# No refine walk here: test_refine_walks_from_the_default_to_a_cheaper_neighbourhood checks it.
SMALL = ("--knobs", "nvpmodel", "--batch-sizes", "1,8", "--trials", "8", "--refine", "0", "--seed", "0")


def test_plan_then_replay_on_the_twin(tmp_path):
    policy_file = tmp_path / "policy.yaml"
    out = tmp_path / "studies"
    args = ["plan", *PLAN, *SMALL, "--rates", "30,120", "--out", str(out), "-o", str(policy_file), "--json"]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    policy = load_policy(policy_file)
    assert policy.twin and policy.device_kind == "orin-agx" and policy.bands[0].min_qps == 0
    assert policy.bands[-1].max_qps == 120 and all(b.latency_ms <= 50 for b in policy.bands)
    assert all(b.provenance.measured_by_plan for b in policy.bands)
    # each band carries its configuration's measurements, at least at its own top rate, for the governor
    assert all(b.max_qps in {p.rate_qps for p in b.measured} for b in policy.bands)
    assert policy.points[0].j_per_query > policy.points[1].j_per_query
    assert policy_file.with_suffix(".png").stat().st_size > 0
    assert "digital twin" in policy_file.read_text().splitlines()[0]

    again = runner.invoke(app, args)  # every rate is now covered by a study: nothing is measured
    assert again.exit_code == 0
    assert not any(b.provenance.measured_by_plan for b in load_policy(policy_file).bands)

    trace = tmp_path / "trace.csv"
    trace.write_text("t_s,rate_qps\n" + "".join(f"{60 * i},{rate}\n" for i, rate in enumerate([20] * 5 + [110] * 2)))
    plot = tmp_path / "replay.png"
    r = runner.invoke(
        app, ["replay", str(policy_file), "--trace", str(trace), "--device", "sim:orin", "--plot", str(plot), "--json"]
    )
    assert r.exit_code == 0, r.output
    report = json.loads(r.output)
    rows = {s["strategy"]: s for s in report["strategies"]}
    assert set(rows) == {"default", "default_locked", "static", "governor"} and report["twin"] is True
    # the default mode with free governors idles lower than with its clocks locked, and serves the same
    assert rows["default"]["energy_kj"] < rows["default_locked"]["energy_kj"]
    assert rows["default"]["queries"] == rows["default_locked"]["queries"]
    assert rows["governor"]["queries"] == pytest.approx(20 * 300 + 110 * 120, rel=0.1)
    assert rows["governor"]["energy_kj"] < rows["default"]["energy_kj"]
    assert rows["static"]["switches"] == 0 and plot.stat().st_size > 0
    if len(policy.bands) > 1:
        assert rows["governor"]["switches"] >= 1


def test_replay_refuses_hardware_a_foreign_policy_and_a_bad_trace(tmp_path):
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text(
        yaml.safe_dump(
            {
                "version": 1,
                "model": "resnet50",
                "device": "sim:orin",
                "device_kind": "orin-agx",
                "twin": True,
                "percentile": "p99",
                "max_latency_ms": 50,
                "bands": [
                    {
                        "min_qps": 0,
                        "max_qps": 100,
                        "knobs": TwinDevice("sim:orin").space().default_config().knobs,
                        "batch_size": 8,
                        "batch_timeout_ms": 5,
                        "j_per_query": 0.2,
                        "latency_ms": 30,
                        "avg_w": 20,
                        "provenance": {"study": "s", "storage": "x", "trial": 0, "measured_by_plan": True},
                    }
                ],
            }
        )
    )
    trace = tmp_path / "trace.csv"
    trace.write_text("t_s,rate_qps\n0,10\n60,20\n")
    r = run_cli("replay", str(policy_file), "--trace", str(trace), "--device", "sim:h200")
    assert r.returncode == 2 and "for orin-agx, but the device is h200" in r.stderr
    bad = tmp_path / "bad.csv"
    bad.write_text("time,qps\n0,1\n")
    r = run_cli("replay", str(policy_file), "--trace", str(bad), "--device", "sim:orin")
    assert r.returncode == 2 and "t_s,rate_qps" in r.stderr and "Traceback" not in r.stderr


def test_the_shipped_traces_load():
    from importlib import resources

    folder = resources.files("tuner.serve") / "traces"
    day = load_trace(folder / "diurnal.csv")
    hour = load_trace(folder / "bursty.csv")
    assert day.durations.sum() == 24 * 3600 and day.rates.max() == pytest.approx(150, rel=0.01)
    assert hour.durations.sum() == 3600 and hour.rates.min() < 25 < 100 < hour.rates.max()


def test_singlestream_on_the_twin_is_batch_one_bounded_on_p90():
    from tuner.scenario import serving_space

    settings = window_for(WindowSettings(), "singlestream", None)
    assert settings.percentile == "p90"
    space = serving_space(TwinDevice("sim:orin").space(), settings)
    assert space.batch_sizes == [1]
    server = serving_space(TwinDevice("sim:orin").space(), window_for(WindowSettings(), "server", 100))
    assert "batch_timeout_ms" in server.knobs and server.knobs["batch_timeout_ms"].group == "runner"
    assert Config(knobs={}, batch_size=1).batch_size == 1


def test_neighbours_are_one_step_of_one_knob_or_another_mode():
    from tuner.scenario import serving_space

    space = serving_space(TwinDevice("sim:orin").space(), window_for(WindowSettings(), "server", 10.0))
    centre = space.effective(
        Config(
            knobs={
                "nvpmodel": "MAXN",
                "gpu_mhz": 306,
                "emc_mhz": 2133,
                "cpu_cores": 4,
                "cpu_mhz": 1497.6,
                "batch_timeout_ms": 0.1,
            },
            batch_size=8,
        )
    )
    near = {c.key() for c in neighbours(space, centre)}

    def moved(batch=8, **change):
        return space.effective(Config(knobs={**centre.knobs, **change}, batch_size=batch)).key()

    assert moved(gpu_mhz=408) in near and moved(emc_mhz=665.6) in near and moved(emc_mhz=3199) in near
    assert moved(cpu_cores=2) in near and moved(cpu_cores=6) in near and moved(batch_timeout_ms=1.0) in near
    assert moved(batch=4) in near and moved(batch=16) in near and moved(nvpmodel="15W") in near
    assert moved(gpu_mhz=510) not in near and moved(cpu_cores=8) not in near  # two steps away
    assert centre.key() not in near and moved(gpu_mhz=306) not in near  # the lowest clock has no step down
    assert len(near) == len(neighbours(space, centre))


def test_refine_walks_from_the_default_to_a_cheaper_neighbourhood(tmp_path):
    device = TwinDevice("sim:orin")
    common = {
        "model": "resnet50",
        "max_latency_ms": 50.0,
        "rates": [30.0],
        "knobs": ["nvpmodel", "cpu_cores"],
        "batch_sizes": [1, 8],
        "seed": 0,
        "out": tmp_path,
    }
    # 4 trials: exactly the seeded defaults (MAXN, full clocks, 12 cores) at each batch size and timeout
    plain = plan_rates(device, PlanOptions(**common, trials=4, refine_trials=0))[0].record
    walked = plan_rates(device, PlanOptions(**common, trials=4, refine_trials=12, storage=f"sqlite:///{tmp_path}/b.db"))
    record = walked[0].record
    # A band is chosen on the mean of its verified windows (band_trial): on the Orin twin with its sourced static
    # rails the cheaper neighbour (50W at batch 8) serves 30 q/s at about 48 ms, inside the bound on its mean but not
    # with tune run's one-window margin, so the record's strict "feasible" is not what the walk is held to.
    assert plain["config"]["cpu_cores"] == 12 and record["p99_ms"] <= common["max_latency_ms"]
    assert record["j_per_query"] < plain["j_per_query"] and record["config"] != plain["config"]


def test_the_replayed_governor_reads_the_rate_every_interval():
    import numpy as np

    from tuner.serve.policy import Band, BandProvenance, Policy
    from tuner.serve.replay import GovernorRules, Replayer
    from tuner.serve.trace import Trace

    device = TwinDevice("sim:orin")
    default = device.space().default_config().knobs

    def band(lo, hi, mode):
        return Band(
            min_qps=lo, max_qps=hi, knobs={**default, "nvpmodel": mode}, batch_size=8, batch_timeout_ms=10.0,
            j_per_query=0.1, latency_ms=40.0, avg_w=10.0,
            provenance=BandProvenance(study="s", storage="x", trial=0, measured_by_plan=True),
        )  # fmt: skip

    policy = Policy(
        model="resnet50", device="sim:orin", device_kind="orin-agx", twin=True, percentile="p99",
        max_latency_ms=50.0, bands=[band(0, 50, "15W"), band(50, 250, "MAXN")],
    )  # fmt: skip
    trace = Trace(times=np.array([0.0, 60.0, 120.0, 180.0]), rates=np.array([200.0, 20.0, 20.0, 20.0]))
    replayer = Replayer(device, policy, seed=0)
    result = replayer.governed(trace, 1.0, GovernorRules(smoothing_s=10.0, min_dwell_s=30.0))
    # the fall at 60 s is followed within that row (after the smoothed estimate has settled), not at a row's start
    assert result.bands == [1, 0, 0, 0] and result.switches == 1
    low = replayer.piece(policy.bands[0].config(), 10.0, 20.0, 60.0)[0]
    high = replayer.piece(policy.bands[1].config(), 10.0, 20.0, 60.0)[0]
    assert low < result.power_w[1] * 60.0 < high


def test_a_band_is_chosen_on_a_verified_mean_not_one_lucky_window(tmp_path):
    from tuner.study import open_study

    device = TwinDevice("sim:orin")
    options = PlanOptions(
        model="resnet50", max_latency_ms=50.0, rates=[30.0], knobs=["nvpmodel"], batch_sizes=[1, 8],
        trials=8, refine_trials=0, verify_repeats=2, seed=0, out=tmp_path,
    )  # fmt: skip
    result = plan_rates(device, options)[0]
    study = open_study(result.study, f"sqlite:///{tmp_path}/tune.db")
    repeats = [t for t in study.trials if t.user_attrs.get("proposed_by") == "plan-verify"]
    assert 2 <= len(repeats) <= 6 and all("repeat_of" in t.user_attrs for t in repeats)
    best = study.best_trial  # the band is the study's answer, what export, pareto and status name
    assert best.user_attrs["measurements"] >= 3 and all(v <= 0 for v in best.constraints.values())
    assert best.user_attrs["p99_ms"] <= 50.0  # the mean of its windows meets the bound
    assert result.record["trial"] == best.number
