"""tune report: the characterization study as one self-contained folder."""

import re

import pytest
from clirun import in_process, run_cli
from locations import REPO

from tuner.devices.registry import open_device
from tuner.measure.settings import WindowSettings
from tuner.measurement import Measurement
from tuner.report.analysis import front, recommended
from tuner.report.collect import make_report, plans_for
from tuner.report.data import REPORT_VERSION, Point, ReportData
from tuner.space import Config


def test_report_of_two_twins_is_one_self_contained_folder(tmp_path):
    out = tmp_path / "rep"
    args = ["report", "--model", "resnet50", "--device", "sim:orin", "--device", "sim:h200"]
    result = run_cli(*args, "--modes", "MAXN,15W", "--batch-sizes", "1,8,64", "--out", str(out))
    assert result.returncode == 0, result.stderr
    data = ReportData.model_validate_json((out / "report.json").read_text())
    assert data.version == REPORT_VERSION
    groups = {(p.device, p.group) for p in data.points}
    assert groups == {("sim:orin", "MAXN"), ("sim:orin", "15W"), ("sim:h200", "default")}
    assert len(data.points) == 9 and all(p.ok for p in data.points)
    assert {p.source for p in data.points} == {"digital twin"}
    assert data.command.startswith("tune report --model resnet50")
    md = (out / "report.md").read_text()
    # Every figure and every device heading of a twin says so.
    for alt, file in re.findall(r"!\[([^\]]*)\]\(([^)]+)\)", md):
        assert "digital twin" in alt, alt
        assert (out / file).stat().st_size > 1000
    headings = [line for line in md.splitlines() if line.startswith(("### resnet50 on", "#### "))]
    assert headings and all("[digital twin]" in h for h in headings)
    assert "| sim:orin | digital twin |" in md
    html = (out / "report.html").read_text()
    sources = re.findall(r'src="([^"]*)"', html)
    assert len(sources) == md.count("![") and all(s.startswith("data:image/png;base64,") for s in sources)
    assert "http" not in html.split("<body>")[1]
    # The table's J/query is the point's figure.
    p = next(p for p in data.points if p.device == "sim:orin" and p.group == "15W" and p.config.batch_size == 8)
    assert f"| 8 | {p.measurement.j_per_query:.4g} |" in md
    assert len(data.traces) == 2 and all(t.kind == "twin-mean" for t in data.traces)


def test_report_refuses_an_unknown_mode_and_writes_nothing(tmp_path):
    out = tmp_path / "rep"
    code, _, err = in_process("report", "-m", "resnet50", "-d", "sim:orin", "--modes", "MAXN,16W", "--out", str(out))
    assert code == 2
    assert err.count("\n") == 1 and "16W" in err and "15W" in err
    assert not out.exists()


def test_runner_knobs_make_the_groups_of_a_device_without_modes():
    dev = open_device("sim:h200")
    plans = plans_for([dev], WindowSettings(), knobs=["precision"], batch_sizes=[1, 32])
    data = make_report(plans, ["bert-base"], WindowSettings(), "test")
    assert {p.group for p in data.points} == {"precision=fp32", "precision=fp16", "precision=bf16"}
    assert data.devices[0].twin and "twin" in data.devices[0].provenance["hardware"]


def test_a_study_s_trials_are_reused_not_measured_again(twin_study, tmp_path):
    """In-process (the test above runs tune report as a process)."""
    study = twin_study(knobs=["nvpmodel"], batch_sizes=[1, 8], max_latency_ms=1000.0, trials=8, seed=3).out
    out = tmp_path / "rep"
    code, _, err = in_process(
        "report", "--model", "resnet50", "--device", "sim:orin", "--modes", "MAXN,15W", "--batch-sizes", "1,8",
        "--from-study", str(study), "--out", str(out),
    )  # fmt: skip
    assert code == 0, err
    data = ReportData.model_validate_json((out / "report.json").read_text())
    reused = [p for p in data.points if p.source.startswith("study ")]
    assert reused, "no point reused from the study"
    trials = {row["trial"]: row for row in _trials(study)}
    for p in reused:
        number = int(p.source.rsplit(" ", 1)[1])
        assert trials[number]["j_per_query"] == p.measurement.j_per_query
        assert trials[number]["batch_size"] == p.config.batch_size


def _trials(folder):
    import optuna

    from tuner.study import open_study, trial_record

    url = f"sqlite:///{folder / 'tune.db'}"
    rows = []
    for summary in optuna.get_all_study_summaries(url):
        rows += [trial_record(t) for t in open_study(summary.study_name, url).get_trials()]
    return rows


def _point(batch, j, p99):
    m = Measurement(
        j_per_query=j, p50_ms=p99, p90_ms=p99, p99_ms=p99, qps=1.0, avg_w=j, energy_j=j, queries=1,
        duration_s=1.0, meter="t",
    )  # fmt: skip
    return Point(device="d", model="m", group="g", config=Config(knobs={}, batch_size=batch), measurement=m, source="x")


def test_front_and_recommendation():
    points = [_point(1, 3.0, 5.0), _point(2, 2.0, 10.0), _point(4, 2.5, 20.0), _point(8, 1.0, 40.0)]
    assert [p.config.batch_size for p in front(points, "p99")] == [1, 2, 8]
    assert recommended(points, "p99", 30.0).config.batch_size == 2
    assert recommended(points, "p99", None).config.batch_size == 8
    assert recommended(points, "p99", 1.0) is None


class _PoweredDevice:
    """A hardware device (not a twin) that reads instantaneous power: what the report's trace samples."""

    name, kind, slug, simulated = "fake:0", "fake", "fake-0", False

    def __init__(self):
        self.reads, self.applied, self.restored = 0, [], 0

    def read_power_w(self):
        self.reads += 1
        return 250.0

    def read_state(self):
        return {"mode": "before"}

    def apply(self, config):
        self.applied.append(config)

    def restore(self, state):
        self.restored += 1

    def measure(self, model, config, settings):
        return _point(config.batch_size, 1.0, 5.0).measurement


def test_hardware_trace_is_sampled_power_over_one_window_and_the_state_is_restored():
    from tuner.report.collect import power_trace

    dev = _PoweredDevice()
    trace = power_trace(dev, "m", _point(8, 1.0, 5.0), WindowSettings())
    assert trace.kind == "sampled" and len(trace.t_s) >= 2 and set(trace.watts) == {250.0}
    assert trace.t_s == sorted(trace.t_s) and "digital twin" not in trace.note
    assert dev.applied[0].batch_size == 8 and dev.restored == 1


def test_every_committed_hardware_result_names_its_gpu_and_driver():

    import yaml

    root = REPO / "studies"
    files = list(root.rglob("pareto.json")) + list(root.rglob("best.yaml")) + list(root.rglob("*-run.json"))
    assert files
    for path in files:
        data = yaml.safe_load(path.read_text())
        if data.get("twin"):
            continue
        record = data["provenance"].get("measured_on", data["provenance"])
        assert record["hardware"] and record["driver"] and record["twin"] is False, path
    reports = list(root.rglob("report.json"))
    assert reports
    for path in reports:
        for device in ReportData.model_validate_json(path.read_text()).devices:
            p = device.provenance
            assert device.twin or (p["hardware"] and (p.get("driver") or p.get("l4t"))), path


@pytest.mark.slow  # LoadGen windows of the tiny CNN on this CPU
def test_report_on_hardware_runs_real_windows_and_says_hardware(rapl_at_15w, tmp_path):
    out = tmp_path / "rep"
    result = run_cli(
        "report", "--model", "tiny-cnn", "--device", "cpu", "--batch-sizes", "1,4", "--window", "1", "--out", str(out),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    data = ReportData.model_validate_json((out / "report.json").read_text())
    assert [p.source for p in data.points] == ["measured", "measured"] and all(p.ok for p in data.points)
    assert data.devices[0].meters == ["rapl"] and not data.devices[0].twin
    md = (out / "report.md").read_text()
    assert "digital twin" not in md and "| cpu | hardware |" in md
    assert "no instantaneous power" in md  # the CPU device has no power reading to trace


@pytest.mark.slow  # LoadGen windows of the tiny CNN on this CPU
def test_report_with_wall_power_names_the_analyzer_and_the_rails_read_beside_it(rapl_at_15w, tmp_path):
    from fakeptd import FakePtd

    fake = FakePtd(watts=80.0)
    out = tmp_path / "rep"
    result = run_cli(
        "report", "--model", "tiny-cnn", "--device", "cpu", "--batch-sizes", "2", "--window", "1", "--out", str(out),
        "--meter", f"ptd://127.0.0.1:{fake.port}?interval_ms=50&settle_s=0",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    data = ReportData.model_validate_json((out / "report.json").read_text())
    assert data.points[0].measurement.avg_w == 80.0 and data.devices[0].meters == ["ptd"]
    details = data.devices[0].meter_details
    assert details["analyzer"] == "YokogawaWT310" and details["objective"] == "ptd" and details["also"] == "rapl"
    assert "analyzer YokogawaWT310" in (out / "report.md").read_text()


def test_server_scenario_rows_are_one_per_maximum_batch_size_at_the_given_timeout():
    from tuner.scenario import window_for

    settings = window_for(WindowSettings(), "server", 50.0)
    settings.options["batch_timeout_ms"] = 2.0
    plans = plans_for([open_device("sim:orin")], settings, modes=["MAXN", "15W"], batch_sizes=[1, 8])
    data = make_report(plans, ["resnet50"], settings, "test")
    assert sorted((p.group, p.config.batch_size) for p in data.points) == [
        ("15W", 1),
        ("15W", 8),
        ("MAXN", 1),
        ("MAXN", 8),
    ]
    assert data.scenario == "server@50qps"
    single = window_for(WindowSettings(), "singlestream", None)
    plans = plans_for([open_device("sim:orin")], single, modes=["MAXN"])
    points = make_report(plans, ["resnet50"], single, "test").points
    assert [(p.group, p.config.batch_size) for p in points] == [("MAXN", 1)]


def test_modes_with_a_device_that_has_none_is_said_not_silently_one_group():
    devices = [open_device("sim:orin"), open_device("sim:h200")]
    plans = plans_for(devices, WindowSettings(), modes=["MAXN"], batch_sizes=[1])
    assert plans[0].note == "" and plans[1].note.startswith("sim:h200 has no power modes: --modes does not apply")
    data = make_report(plans[1:], ["resnet50"], WindowSettings(), "test")
    assert data.devices[0].notes == [plans[1].note]
