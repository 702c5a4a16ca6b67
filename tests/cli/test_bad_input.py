"""Bad input across every command: exit 2, one line naming the fix, no traceback, nothing written.

Each row is a command line a user could type (or a file they could hand the
tool) that must be refused. The folder the command runs in (holding a real
study, an export and every hostile file) is compared byte for byte before
and after, so a refusal that creates tune.db, a results folder or a lock file
fails the row. Rows run the CLI in-process (``tuner.cli.main``, catching
SystemExit) because a process per row would cost minutes; a few marked
``proc`` go through a real ``python -m tuner`` to prove the same holds there.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest
import yaml
from clirun import folder_state, in_process, run_cli

from tuner.deploy import export_config, write_export
from tuner.devices.virtual.twin import TwinDevice
from tuner.study import RunOptions, run_study

SPACES = Path(__import__("search_spaces").__file__).parent
SPACE = yaml.safe_load((SPACES / "orin-agx.yaml").read_text())
H200 = yaml.safe_load((SPACES / "h200.yaml").read_text())


def _space(**changes) -> str:
    data = yaml.safe_load(yaml.safe_dump(SPACE))
    for key, value in changes.items():
        if key.startswith("knob_"):
            name, field = key[5:].split("__")
            data["knobs"][name][field] = value
        else:
            data[key] = value
    return yaml.safe_dump(data)


def _big_space() -> str:
    """About 921 million configurations (the probe's hand-edited file): refused at load, not enumerated."""
    data = yaml.safe_load(yaml.safe_dump(SPACE))
    data["mode_knob"], data["modes"], data["batch_sizes"] = None, {}, [1]
    data["knobs"]["nvpmodel"] = {"values": ["a"], "default": "a"}
    data["knobs"]["cpu_cores"] = {"values": [1], "default": 1}
    for name in ("gpu_mhz", "emc_mhz", "cpu_mhz"):
        data["knobs"][name]["values"] = [float(v) for v in range(1, 974)]
        data["knobs"][name]["default"] = 1.0
    return yaml.safe_dump(data)


BOMB = "\n".join(
    ["version: 1", 'a: &a ["x","x","x","x","x","x","x","x","x"]']
    + [f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 4)}]" for i in range(12)]
)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """A user's folder: a real twin study at 50 ms, its export, and every hostile file the rows hand in."""
    root = tmp_path_factory.mktemp("bad-input")
    os.environ.setdefault("TUNE_STATE_DIR", str(root / "state"))
    opts = RunOptions(model="resnet50", max_latency_ms=50.0, trials=4, seed=1, sampler="random", out=root / "studies")
    opts.knobs = ["gpu_mhz"]
    study, _ = run_study(TwinDevice("sim:orin"), opts)
    url = f"sqlite:///{root / 'studies' / 'tune.db'}"
    export = export_config(study, url)
    write_export(export, root / "best.yaml")
    storage = study._storage
    getattr(storage, "_backend", storage).engine.dispose()  # let go of the file before it is altered below
    # A study left in WAL mode makes SQLite itself create -wal/-shm files on every open; readers
    # then "create" files the tool never wrote. The rows check the tool, so the file is in rollback mode.
    with sqlite3.connect(root / "studies" / "tune.db") as conn:
        conn.execute("PRAGMA journal_mode=DELETE")
    good = export.model_dump(mode="json")
    files = {
        "v99.yaml": yaml.safe_dump({**good, "version": 99}),
        "vstr.yaml": yaml.safe_dump({**good, "version": "one"}),
        "v0.yaml": yaml.safe_dump({**good, "version": 0}),
        "h200.yaml": yaml.safe_dump({**good, "device_kind": "h200", "device": "sim:h200"}),
        "badknob.yaml": yaml.safe_dump({**good, "knobs": {**good["knobs"], "gpu_mhz": 999.0}}),
        "plugin.yaml": yaml.safe_dump({**good, "device": "py:os:system", "twin": False}),
        "missing-field.yaml": yaml.safe_dump({k: v for k, v in good.items() if k != "knobs"}),
        "bomb.yaml": BOMB,
        "python.yaml": "!!python/object/apply:os.system ['touch pwned']\n",
        "corrupt.yaml": "version: 1\nknobs: {gpu_mhz: [1, 2\n",
        "list.yaml": "- 1\n- 2\n",
        "empty.yaml": "",
        "binary.yaml": "",
        "space-v99.yaml": _space(version=99),
        "space-neg.yaml": _space(knob_gpu_mhz__values=[-5.0, 114.75], knob_gpu_mhz__default=114.75),
        "space-nan.yaml": _space(knob_gpu_mhz__values=[float("nan"), 114.75], knob_gpu_mhz__default=114.75),
        "space-inf.yaml": _space(knob_emc_mhz__values=[float("inf"), 204], knob_emc_mhz__default=204),
        "space-dup.yaml": _space(batch_sizes=[1, 1, 8]),
        "space-bs0.yaml": _space(batch_sizes=[0, 8]),
        "space-default.yaml": _space(knob_gpu_mhz__default=1.0),
        "space-extra.yaml": _space(warp=9),
        "space-big.yaml": _big_space(),
        "space-str.yaml": _space(knob_gpu_mhz__values=["fast", 114.75], knob_gpu_mhz__default=114.75),
        "space-noknob.yaml": yaml.safe_dump(
            {**H200, "knobs": {k: v for k, v in H200["knobs"].items() if k != "precision"}}
        ),
        "text.onnx": "this is not a model\n",
        "afile": "a file where a folder is expected\n",
    }
    for name, text in files.items():
        (root / name).write_text(text)
    (root / "binary.yaml").write_bytes(bytes(range(256)) * 4)
    with open(root / "huge.yaml", "wb") as fh:  # 60 MB, sparse: the size alone must refuse it
        fh.truncate(60 << 20)
    (root / "folder.onnx").mkdir()
    (root / "somedir").mkdir()
    return root


RUN = ("run", "-m", "resnet50", "-d", "sim:orin", "-l", "50ms")
SWEEP = ("sweep", "-m", "resnet50", "-d", "sim:orin", "--knobs", "gpu_mhz", "--batch-sizes", "1,8")
MEASURE = ("measure", "-m", "resnet50", "-d", "sim:orin", "-b", "8")
PARETO = ("pareto", "-m", "resnet50", "-d", "sim:orin")
EXPORT = ("export", "-m", "resnet50", "-d", "sim:orin", "-l", "50ms")
STATUS = ("status", "-m", "resnet50", "-d", "sim:orin")
ROOF = ("roofline", "-m", "resnet50", "-d", "sim:orin")

# (args, a piece of the one-line message that names the problem or the fix)
ROWS: list[tuple[tuple[str, ...], str]] = [
    # latency bounds
    (("run", "-m", "resnet50", "-d", "sim:orin", "-l", "1e9s"), "check the unit"),
    (("run", "-m", "resnet50", "-d", "sim:orin", "-l", "nan"), "give a number with a unit"),
    (("run", "-m", "resnet50", "-d", "sim:orin", "-l", "nanms"), "give a number with a unit"),
    (("run", "-m", "resnet50", "-d", "sim:orin", "-l", "infms"), "give a number with a unit"),
    (("run", "-m", "resnet50", "-d", "sim:orin", "-l", "-5ms"), "give a number with a unit"),
    (("run", "-m", "resnet50", "-d", "sim:orin", "-l", "50"), "e.g. 50ms"),
    (("run", "-m", "resnet50", "-d", "sim:orin", "-l", "fast"), "e.g. 50ms"),
    (("run", "-m", "resnet50", "-d", "sim:orin", "-l", "0ms"), "must be positive"),
    (("run", "-m", "resnet50", "-d", "sim:orin", "-l", "1e-9s"), "check the unit"),
    (("run", "-m", "resnet50", "-d", "sim:orin", "-l", "50 parsecs"), "e.g. 50ms"),
    (("run", "-m", "resnet50", "-d", "sim:orin", "-l", ""), "e.g. 50ms"),
    (("run", "-m", "resnet50", "-d", "sim:orin", "-l", "1e400ms"), "must be positive"),
    # trial counts and other numbers
    ((*RUN, "-n", "0"), "--trials must be an integer from 1"),
    ((*RUN, "-n", "-1"), "--trials must be an integer from 1"),
    ((*RUN, "-n", "1e20"), "see tune run --help"),
    ((*RUN, "-n", "100000000000000000000"), "--trials must be an integer from 1"),
    ((*RUN, "-n", "ten"), "see tune run --help"),
    ((*RUN, "--study-trials", "0"), "--study-trials must be"),
    ((*RUN, "--study-trials", "-3"), "--study-trials must be"),
    ((*RUN, "--heartbeat", "0"), "--heartbeat must be"),
    ((*RUN, "--heartbeat", "100000"), "--heartbeat must be"),
    ((*RUN, "--timeout", "-1"), "--timeout must be"),
    ((*RUN, "--timeout", "nan"), "--timeout must be"),
    ((*RUN, "--timeout", "inf"), "--timeout must be"),
    ((*RUN, "--window", "0"), "--window must be"),
    ((*RUN, "--window", "nan"), "--window must be"),
    ((*RUN, "--window", "1e9"), "--window must be"),
    ((*RUN, "--seed", "abc"), "see tune run --help"),
    # batch lists
    ((*RUN, "--batch-sizes", "1,,8"), "e.g. 1,8,32"),
    ((*RUN, "--batch-sizes", "0"), "e.g. 1,8,32"),
    ((*RUN, "--batch-sizes", "abc"), "e.g. 1,8,32"),
    ((*RUN, "--batch-sizes", "3"), "choose from 1,2,4,8,16,32,64"),
    ((*RUN, "--batch-sizes", "1,8,3"), "choose from 1,2,4,8,16,32,64"),
    ((*RUN, "--batch-sizes", ""), "e.g. 1,8,32"),
    ((*RUN, "--batch-sizes", "-1"), "e.g. 1,8,32"),
    ((*RUN, "--batch-sizes", "1.5"), "e.g. 1,8,32"),
    ((*RUN, "--batch-sizes", "99999999999"), "e.g. 1,8,32"),
    ((*RUN, "--batch-sizes", ",".join(["1"] * 100)), "at most"),
    # knobs, samplers, percentiles, meters
    ((*RUN, "--knobs", "warp"), "choose from nvpmodel"),
    ((*RUN, "--knobs", "gpu_mhx"), "did you mean gpu_mhz?"),
    ((*RUN, "--knobs", "", "--batch-sizes", "8"), "use tune measure"),
    ((*RUN, "--sampler", "magic"), "choose one of auto"),
    ((*RUN, "--sampler", "tpee"), "did you mean tpe?"),
    ((*RUN, "--percentile", "p95"), "did you mean p99?"),
    ((*RUN, "--meter", "wattmeter"), "choose one of nvml-energy"),
    ((*RUN, "--allow-clock-changes"), "drop it"),
    ((*RUN, "--sysfs-root", "somedir"), "drop it"),
    # models and devices
    (("run", "-m", "alexnet", "-d", "sim:orin", "-l", "50ms"), "known models are"),
    (("run", "-m", "resnet5", "-d", "sim:orin", "-l", "50ms"), "did you mean resnet50?"),
    (("run", "-m", "mobilenet-v2", "-d", "sim:orin", "-l", "50ms"), "did you mean mobilenet_v2?"),
    (("run", "-m", "text.onnx", "-d", "sim:orin", "-l", "50ms"), "not an ONNX model"),
    (("run", "-m", "missing.onnx", "-d", "sim:orin", "-l", "50ms"), "cannot be read"),
    (("run", "-m", "net.engine", "-d", "sim:orin-trt", "-l", "50ms"), "not a TensorRT engine"),
    (("run", "-m", "resnet50", "-d", "sim:gameboy", "-l", "50ms"), "known twins are"),
    (("run", "-m", "resnet50", "-d", "sim:orn", "-l", "50ms"), "did you mean sim:orin?"),
    (("run", "-m", "resnet50", "-d", "tpu:0", "-l", "50ms"), "known devices are"),
    (("run", "-m", "resnet50", "-d", "cuda9", "-l", "50ms"), "did you mean cuda:0?"),
    (("run", "-m", "resnet50", "-d", "orin-nan", "-l", "50ms"), "did you mean orin-nano?"),
    (("run", "-m", "resnet50", "-d", "py:nosuchmodule_xyz:Board", "-l", "50ms"), "check PYTHONPATH"),
    (("run", "-m", "resnet50", "-d", "py:broken", "-l", "50ms"), "py:package.module:Class"),
    (("run", "-m", "resnet50", "-d", "py:os:sep", "-l", "50ms"), "failed to start"),
    # paths
    ((*RUN, "--out", "afile"), "not a folder"),
    ((*RUN, "--out", "afile/sub"), "not a folder"),
    ((*RUN, "--storage", "sqlite:///afile/tune.db"), "not a folder"),
    ((*RUN, "--storage", "sqlite:///somedir"), "name the database file"),
    # search-space files
    ((*RUN, "--space", "nothere.yaml"), "check the path"),
    ((*RUN, "--space", "somedir"), "check the path"),
    ((*RUN, "--space", "corrupt.yaml"), "not valid YAML"),
    ((*RUN, "--space", "bomb.yaml"), "aliases"),
    ((*RUN, "--space", "python.yaml"), "not valid YAML"),
    ((*RUN, "--space", "huge.yaml"), "larger than 1 MiB"),
    ((*RUN, "--space", "binary.yaml"), "not UTF-8"),
    ((*RUN, "--space", "empty.yaml"), "must be a YAML mapping"),
    ((*RUN, "--space", "list.yaml"), "must be a YAML mapping"),
    ((*RUN, "--space", "space-v99.yaml"), "upgrade powertune"),
    ((*RUN, "--space", "space-neg.yaml"), "positive numbers"),
    ((*RUN, "--space", "space-nan.yaml"), "positive numbers"),
    ((*RUN, "--space", "space-inf.yaml"), "positive numbers"),
    ((*RUN, "--space", "space-dup.yaml"), "listed twice"),
    ((*RUN, "--space", "space-bs0.yaml"), "outside 1.."),
    ((*RUN, "--space", "space-default.yaml"), "is not one of the values"),
    ((*RUN, "--space", "space-extra.yaml"), "invalid at warp"),
    ((*RUN, "--space", "space-big.yaml"), "list fewer values"),
    # Click's own usage errors, in one line
    ((*RUN, "--tirals", "3"), "--trials"),
    (("run", "-d", "sim:orin", "-l", "50ms"), "Missing option '--model'"),
    (("nosuchcommand",), "No such command"),
    (("run", "--bogus"), "see tune run --help"),
    (("devices", "extra"), "unexpected extra argument"),
    # sweep
    ((*SWEEP, "-l", "fast"), "e.g. 50ms"),
    (("sweep", "-m", "resnet50", "-d", "sim:orin", "--batch-sizes", "abc"), "e.g. 1,8,32"),
    (("sweep", "-m", "resnet50", "-d", "sim:orin", "--knobs", "gpu"), "choose from nvpmodel"),
    ((*SWEEP, "--out", "afile"), "not a folder"),
    ((*SWEEP, "--window", "-2"), "--window must be"),
    (("sweep", "-m", "resnet50", "-d", "sim:orin", "--space", "space-big.yaml"), "list fewer values"),
    # measure
    ((*MEASURE, "--set", "gpu_mhz=fast"), "choose one of 306"),
    ((*MEASURE, "--space", "space-neg.yaml", "--set", "gpu_mhz=fast"), "positive numbers"),
    ((*MEASURE, "--space", "space-str.yaml", "--set", "gpu_mhz=fast"), "must be a number"),
    (("measure", "-m", "resnet50", "-d", "sim:h200", "-b", "8", "--space", "space-noknob.yaml"), "must list the knobs"),
    ((*MEASURE, "--set", "gpu_mhz=-5"), "choose one of 306"),
    ((*MEASURE, "--set", "gpu_mhz=nan"), "choose one of 306"),
    ((*MEASURE, "--set", "gpu_mhz=999"), "choose one of 306"),
    ((*MEASURE, "--set", "gpu_mhz"), "write knob=value"),
    ((*MEASURE, "--set", "gpu_mhx=930.75"), "did you mean gpu_mhz?"),
    ((*MEASURE, "--repeat", "0"), "--repeat must be"),
    ((*MEASURE, "--repeat", "1000000"), "--repeat must be"),
    (("measure", "-m", "resnet50", "-d", "sim:orin", "-b", "0"), "--batch-size must be"),
    (("measure", "-m", "resnet50", "-d", "sim:orin", "-b", "1e20"), "see tune measure --help"),
    (("measure", "-m", "bert-base", "-d", "sim:h200", "-b", "8", "--set", "precision=fp8"), "choose one of"),
    (("measure", "-m", "bert-base", "-d", "sim:h200", "-b", "8", "--set", "channels_last=maybe"), "choose one of"),
    # pareto
    ((*PARETO, "-l", "20ms"), "pick one with --scenario offline --max-latency 50ms"),
    ((*PARETO, "--out", "new"), "run tune run first"),
    ((*PARETO, "--out", "afile"), "not a folder"),
    (("pareto", "-m", "resnet5", "-d", "sim:orin", "--out", "studies"), "did you mean resnet50?"),
    (("pareto", "-m", "resnet50", "-d", "sim:orn", "--out", "studies"), "did you mean sim:orin?"),
    ((*PARETO, "-l", "nan"), "e.g. 50ms"),
    ((*PARETO, "--storage", "sqlite:///missing/dir/tune.db"), "run tune run first"),
    # export
    ((*EXPORT, "-o", "somedir"), "give a file name"),
    ((*EXPORT, "-o", "afile/best.yaml"), "not a folder"),
    ((*EXPORT, "-o", "x.yaml", "--out", "new"), "run tune run first"),
    (("export", "-m", "resnet50", "-d", "sim:orin", "-l", "-1ms", "-o", "x.yaml"), "e.g. 50ms"),
    (
        ("export", "-m", "resnet50", "-d", "sim:orin", "-l", "1us", "-o", "x.yaml", "--out", "studies"),
        "pick one with --scenario offline --max-latency 50ms",
    ),
    (("export", "-m", "bert-base", "-d", "sim:orin", "-l", "50ms", "-o", "x.yaml", "--out", "studies"), "no study"),
    # status
    (("status", "-m", "resnet50"), "give both --model and --device"),
    (("status", "--out", "new"), "run tune run first"),
    (("status", "--out", "new/deeper"), "run tune run first"),
    ((*STATUS, "--out", "studies", "-l", "20ms"), "pick one with --scenario offline --max-latency 50ms"),
    ((*STATUS, "--out", "studies", "-l", "soon"), "e.g. 50ms"),
    # dashboard
    (("dashboard", "--port", "70000"), "TCP port"),
    # apply
    (("apply", "nothere.yaml"), "check the path"),
    (("apply", "v99.yaml"), "upgrade powertune"),
    (("apply", "vstr.yaml"), "re-create it with tune export"),
    (("apply", "v0.yaml"), "re-create it with tune export"),
    (("apply", "corrupt.yaml"), "not valid YAML"),
    (("apply", "bomb.yaml"), "aliases"),
    (("apply", "python.yaml"), "not valid YAML"),
    (("apply", "huge.yaml"), "larger than 1 MiB"),
    (("apply", "binary.yaml"), "not UTF-8"),
    (("apply", "empty.yaml"), "must be a YAML mapping"),
    (("apply", "somedir"), "check the path"),
    (("apply", "missing-field.yaml"), "invalid at knobs"),
    (("apply", "h200.yaml", "-d", "sim:orin"), "this export is for h200"),
    (("apply", "badknob.yaml", "--dry-run"), "choose one of"),
    (("apply", "plugin.yaml", "--dry-run"), "no Jetson board"),
    (("apply", "best.yaml", "-d", "tpu:0"), "known devices are"),
    (("apply", "best.yaml", "--allow-clock-changes"), "drop it"),
    # restore
    (("restore", "-d", "tpu:0"), "known devices are"),
    (("restore", "-d", "sim:orn"), "did you mean sim:orin?"),
    # roofline and bench
    ((*ROOF, "--points", "1"), "at least 2"),
    ((*ROOF, "--points", "1e20"), "see tune roofline --help"),
    ((*ROOF, "--points", "100000"), "--points must be"),
    ((*ROOF, "--window", "0"), "--window must be"),
    ((*ROOF, "--out", "afile"), "not a folder"),
    (("roofline", "-m", "alexnet", "-d", "sim:orin"), "known models are"),
    (("bench", "--seeds", "0"), "--seeds must be"),
    (("bench", "--jobs", "0"), "--jobs must be"),
    (("bench", "--trials", "-1"), "--trials must be"),
    (("bench", "--out", "afile"), "not a folder"),
]
# Rows that also go through a real process (entry point, streams and exit code as a shell sees them).
PROC = {
    i
    for i, (args, _) in enumerate(ROWS)
    if args
    in (
        ("run", "-m", "resnet50", "-d", "sim:orin", "-l", "1e9s"),
        (*RUN, "-n", "1e20"),
        (*RUN, "--batch-sizes", "3"),
        (*RUN, "--space", "bomb.yaml"),
        ((*PARETO, "-l", "20ms")),
        (*RUN, "--tirals", "3"),
        ("apply", "v99.yaml"),
        ("status", "--out", "new"),
    )
}


def _in_process(args: tuple[str, ...]) -> tuple[int, str]:
    code, _, err = in_process(*args)
    return code, err


@pytest.mark.parametrize("index", range(len(ROWS)), ids=[" ".join(r[0])[:60] for r in ROWS])
def test_bad_input_refused_in_one_line_and_nothing_written(folder, monkeypatch, index):
    args, fix = ROWS[index]
    monkeypatch.chdir(folder)
    monkeypatch.delenv("TUNE_SYSFS_ROOT", raising=False)
    monkeypatch.setenv("TUNE_STATE_DIR", str(folder / "state"))
    before = folder_state(folder)
    code, err = _in_process(args)
    assert code == 2, (args, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), (args, err)
    assert "Traceback" not in err
    assert fix in lines[0], (args, lines[0])
    assert folder_state(folder) == before, f"{args} changed the folder"
    if index in PROC:
        r = run_cli(*args, cwd=folder, env={"TUNE_STATE_DIR": str(folder / "state")})
        assert r.returncode == 2 and r.stderr.strip() == lines[0] and r.stdout == "", (args, r.stderr)
        assert folder_state(folder) == before, f"{args} changed the folder (subprocess)"


def test_the_table_covers_every_command_and_enough_rows():
    commands = {r[0][0] for r in ROWS}
    assert len(ROWS) >= 100
    every = {"run", "sweep", "measure", "pareto", "export", "status", "apply", "restore", "roofline", "bench"}
    assert every | {"devices", "dashboard"} <= commands
