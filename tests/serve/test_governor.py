"""The governor's switching rules, the policy file and the rate sources (no hardware, no timing)."""

import http.server
import json
import math
import socket
import threading

import pytest
import yaml

from tuner.errors import UserError
from tuner.serve.estimate import RateEstimate
from tuner.serve.governor import Governor, run_governor, write_state
from tuner.serve.policy import Band, BandProvenance, Policy, check_policy, load_policy, write_policy
from tuner.serve.rates import FileRate, RateUnavailable, open_rate_source

EDGES = [(0, 50, "15W"), (50, 150, "30W"), (150, 250, "MAXN")]


def make_policy(kind: str = "orin-agx", model: str = "resnet50") -> Policy:
    bands = [
        Band(
            min_qps=lo,
            max_qps=hi,
            knobs={"nvpmodel": mode},
            batch_size=8,
            batch_timeout_ms=10.0,
            j_per_query=0.1,
            latency_ms=40.0,
            avg_w=20.0,
            provenance=BandProvenance(study="s", storage="x", trial=1, measured_by_plan=True),
        )
        for lo, hi, mode in EDGES
    ]
    return Policy(
        model=model,
        device="sim:orin",
        device_kind=kind,
        twin=True,
        percentile="p99",
        max_latency_ms=50.0,
        bands=bands,
    )


def governed(**kwargs):
    """A governor on raw readings (no smoothing) unless a test asks for it."""
    applied = []
    kwargs.setdefault("smoothing_s", 0.0)
    gov = Governor(make_policy(), apply=applied.append, headroom=0.0, hysteresis=0.1, min_dwell_s=30.0, **kwargs)
    return gov, applied


def test_up_at_once_down_only_after_dwell_and_past_the_hysteresis():
    gov, applied = governed()
    assert gov.observe(100, now=0).to_band == 1
    assert gov.observe(200, now=1).to_band == 2  # up: at once, though the dwell has not passed
    assert gov.observe(140, now=2) is None  # below the band's edge (150) but within 10% of it
    assert gov.observe(120, now=10) is None  # far enough below, but held only 9 s
    switch = gov.observe(120, now=31.5)
    assert switch.from_band == 2 and switch.to_band == 1 and switch.reason == "rate fell below the band"
    assert [b.knobs["nvpmodel"] for b in applied] == ["30W", "MAXN", "30W"]
    assert [s.to_band for s in gov.switches] == [1, 2, 1]


def test_headroom_picks_the_band_for_a_higher_rate():
    gov = Governor(make_policy(), apply=None, headroom=0.1)
    assert gov.observe(46, now=0).to_band == 1  # 46 x 1.1 = 50.6 > 50


def test_unknown_rate_and_a_rate_above_every_band_fall_back_to_the_top_band():
    warnings = []
    gov = Governor(make_policy(), apply=None, headroom=0.0, warn=warnings.append)
    gov.observe(10, now=0)
    assert gov.observe(float("nan"), now=1).to_band == 2
    gov2 = Governor(make_policy(), apply=None, headroom=0.0, warn=warnings.append)
    switch = gov2.observe(900, now=0)
    assert switch.to_band == 2 and "above every band" in switch.reason
    assert any("above every band" in w for w in warnings) and any("unreadable" in w for w in warnings)


def test_observe_only_changes_nothing_and_says_would():
    gov = Governor(make_policy(), apply=None)
    switch = gov.observe(100, now=0)
    assert gov.observe_only and not switch.applied and switch.line().startswith("would switch")


def test_policy_round_trip_and_refusals(tmp_path):
    path = tmp_path / "policy.yaml"
    write_policy(make_policy(), path)
    assert load_policy(path) == make_policy()
    assert "digital twin" in path.read_text().splitlines()[0]
    with pytest.raises(UserError, match="for orin-agx, but the device is h200"):
        check_policy(load_policy(path), "h200")
    with pytest.raises(UserError, match="for model resnet50, not bert-base"):
        check_policy(load_policy(path), "orin-agx", "bert-base")
    data = yaml.safe_load(path.read_text())
    data["bands"][1]["min_qps"] = 60
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(UserError, match="contiguous"):
        load_policy(path)


def test_file_source_and_its_failures(tmp_path):
    path = tmp_path / "rate"
    with pytest.raises(UserError, match="no file"):
        open_rate_source(f"file:{path}")
    path.write_text("12\n120.5\n")
    source = open_rate_source(str(path))
    assert isinstance(source, FileRate) and source.read() == 120.5
    path.write_text("lots\n")
    with pytest.raises(RateUnavailable, match="not a rate"):
        source.read()


def test_file_source_reads_again_a_file_caught_between_truncation_and_write(tmp_path):
    path = tmp_path / "rate"
    path.write_text("")
    waits = []

    def writer_finishes(seconds):
        waits.append(seconds)
        path.write_text("250\n")

    assert FileRate(path, sleep=writer_finishes).read() == 250.0
    assert waits == [0.01]
    path.write_text("")
    waits.clear()
    with pytest.raises(RateUnavailable, match="is empty"):
        FileRate(path, retries=2, sleep=waits.append).read()
    assert waits == [0.01, 0.01]


def test_unix_socket_source_keeps_the_newest_datagram(tmp_path):
    path = tmp_path / "rate.sock"
    source = open_rate_source(f"unix:{path}")
    try:
        with pytest.raises(RateUnavailable, match="nothing received"):
            source.read()
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as client:
            client.sendto(b"80\n", str(path))
            client.sendto(b"95.5\n", str(path))
        assert source.read() == 95.5
    finally:
        source.close()
    assert not path.exists()


class _Metrics(http.server.BaseHTTPRequestHandler):
    body = b""

    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(type(self).body)

    def log_message(self, *args):
        pass


def test_prometheus_gauge_on_loopback_only():
    _Metrics.body = b'# TYPE qps gauge\nqps{model="a"} 40\nqps{model="b"} 2.5\nother 7\n'
    server = http.server.HTTPServer(("127.0.0.1", 0), _Metrics)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/metrics"
        assert open_rate_source(f"{url}#qps").read() == pytest.approx(42.5)
        with pytest.raises(UserError, match="no metric missing"):
            open_rate_source(f"{url}#missing")
    finally:
        server.shutdown()
    with pytest.raises(UserError, match="loopback"):
        open_rate_source("http://10.0.0.1:9090/metrics#qps")
    with pytest.raises(UserError, match="unreadable rate source"):
        open_rate_source(f"http://127.0.0.1:{server.server_port}/metrics#qps")


def test_the_loop_falls_back_when_the_source_fails_and_writes_the_state(tmp_path):
    rate = tmp_path / "rate"
    rate.write_text("100\n")
    source = FileRate(rate)
    gov = Governor(make_policy(), apply=None, headroom=0.0)
    state = tmp_path / "state.json"
    reads = iter(["100\n", "garbage\n"])

    def sleep(_s):
        rate.write_text(next(reads, "garbage\n"))

    ticks = []
    with pytest.raises(KeyboardInterrupt):  # what Ctrl-C raises in the loop's sleep
        run_governor(gov, source, 1.0, duration_s=math.inf, sleep=sleep, on_tick=lambda: _tick(ticks, gov, state))
    assert [s.to_band for s in gov.switches] == [1, 2]
    assert "highest-throughput band" in gov.switches[1].reason
    assert json.loads(state.read_text())["band"] == 2


def _tick(ticks, gov, state):
    write_state(state, gov, 1.0)
    ticks.append(gov.current)
    if len(ticks) >= 3:
        raise KeyboardInterrupt


def test_the_estimate_averages_noise_and_follows_a_burst_at_once():
    est = RateEstimate(smoothing_s=10.0, burst_sigmas=4.0)
    assert est.update(100.0, now=0.0) == 100.0
    # a reading 20% high after 1 s is within Poisson noise of 100/s (sd 10): it moves the mean by a tenth
    assert est.update(120.0, now=1.0) == pytest.approx(100 + 20 * (1 - math.exp(-0.1)))
    assert est.update(100.0, now=2.0) < 102.0
    # 200/s read over 1 s is 10 sd above: taken at once
    assert est.update(200.0, now=3.0) == 200.0
    # falls are averaged: after 10 s of 50/s the estimate is about 50 + 150 / e
    for t in range(4, 14):
        value = est.update(50.0, now=float(t))
    assert value == pytest.approx(50 + 150 * math.exp(-1.0), rel=1e-6)
    raw = RateEstimate(smoothing_s=0.0)
    assert [raw.update(r, now=float(i)) for i, r in enumerate([10.0, 90.0, 5.0])] == [10.0, 90.0, 5.0]
    with pytest.raises(ValueError):
        RateEstimate(smoothing_s=-1.0)


def test_a_smoothed_governor_ignores_a_blip_but_switches_up_for_a_burst():
    gov, applied = governed(smoothing_s=10.0)
    assert gov.observe(40, now=0).to_band == 0
    assert gov.observe(58, now=1) is None  # 40/s read as 58 over 1 s: noise (under 4 sd + 1), held in band 0
    switch = gov.observe(200, now=2)
    assert switch.to_band == 2 and switch.rate_qps == 200  # a real burst: the top band at once
    assert [b.knobs["nvpmodel"] for b in applied] == ["15W", "MAXN"]
    raw, _ = governed()
    raw.observe(40, now=0)
    assert raw.observe(58, now=1).to_band == 1  # the same blip switches a governor on raw readings
