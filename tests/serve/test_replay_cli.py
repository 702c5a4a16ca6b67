"""``tune replay`` as a user reads it: a trace beyond the policy is said, the plot lies beside the policy,
its band axis names the bands, and an absurd --rate-scale is one line with no NumPy warning."""

from __future__ import annotations

import json

import pytest
from clirun import folder_state, in_process, run_cli
from policies import two_band_policy

from tuner.devices.virtual.twin import TwinDevice
from tuner.plumbing import atomicfile
from tuner.serve.policy import write_policy


@pytest.fixture
def policy_dir(tmp_path):
    """A two-band policy (up to 100 and 300 q/s) in its own folder, and a working folder elsewhere."""
    space = TwinDevice("sim:orin").space()
    folder = tmp_path / "plans"
    folder.mkdir()
    policy = two_band_policy(space, model="resnet50", device="sim:orin", device_kind="orin-agx", twin=True)
    write_policy(policy, folder / "policy.yaml")
    work = tmp_path / "work"
    work.mkdir()
    (work / "trace.csv").write_text("t_s,rate_qps\n0,50\n60,150\n")
    (work / "hot.csv").write_text("t_s,rate_qps\n0,50\n60,900\n")
    return folder, work


def replay(work, folder, trace, *more):
    return run_cli("replay", str(folder / "policy.yaml"), "-d", "sim:orin", "--trace", trace, *more, cwd=work)


def test_a_trace_above_the_top_band_is_said_and_one_within_it_is_not(policy_dir):
    folder, work = policy_dir
    hot = replay(work, folder, "hot.csv")
    assert hot.returncode == 0, hot.stderr
    text = " ".join(hot.stdout.split())
    assert "above its top band (up to 300 q/s) for 60 s (50% of the trace)" in text, hot.stdout
    assert "plan with --rates up to 900" in text
    payload = json.loads(replay(work, folder, "hot.csv", "--json").stdout)
    assert payload["above_top_band"]["peak_qps"] == 900 and payload["above_top_band"]["seconds"] == 60
    calm = replay(work, folder, "trace.csv")
    assert calm.returncode == 0 and "top band" not in calm.stdout, calm.stderr
    assert json.loads(replay(work, folder, "trace.csv", "--json").stdout)["above_top_band"] is None


def test_the_plot_goes_beside_the_policy_not_into_the_working_folder(policy_dir):
    folder, work = policy_dir
    before = folder_state(work)
    r = replay(work, folder, "trace.csv")
    assert r.returncode == 0, r.stderr
    assert (folder / "replay-trace-sim-orin.png").is_file()
    assert folder_state(work) == before
    assert "replay-trace-sim-orin.png" in r.stdout


def test_the_band_axis_names_each_band_by_its_rates(policy_dir, monkeypatch):
    folder, work = policy_dir
    figures = []
    monkeypatch.setattr(atomicfile, "write_figure", lambda path, fig, **kw: figures.append(fig))
    monkeypatch.chdir(work)
    code, _, err = in_process("replay", str(folder / "policy.yaml"), "-d", "sim:orin", "--trace", "trace.csv")
    assert code == 0, err
    band_axis = figures[0].axes[1]
    assert [t.get_text() for t in band_axis.get_yticklabels()] == ["0-100 q/s", "100-300 q/s"]


@pytest.mark.parametrize("scale", ["1e308", "1e300", "1e10"])
def test_an_absurd_rate_scale_is_one_line_without_a_numpy_warning(policy_dir, scale):
    folder, work = policy_dir
    before = folder_state(folder.parent)
    r = replay(work, folder, "trace.csv", "--rate-scale", scale)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "--rate-scale" in lines[0], r.stderr
    assert "Warning" not in r.stderr and folder_state(folder.parent) == before
