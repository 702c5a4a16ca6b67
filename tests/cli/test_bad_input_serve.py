"""Bad input to the serving commands (tune plan, govern, replay): exit 2, one line, no traceback, nothing written.

The same standard as tests/cli/test_bad_input.py, row by row: each row is a
command line (or a file handed in) that must be refused before anything is
written. The folder the command runs in is compared before and after, so a
refusal that leaves a tune.db, a plot or a temporary file fails its row.
Named pipes stand in for the special files that used to hang a command.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest
import yaml
from clirun import folder_state, in_process
from policies import two_band_policy

from tuner.devices.virtual.twin import TwinDevice
from tuner.errors import UserError
from tuner.plumbing import atomicfile
from tuner.serve.policy import Policy, load_policy, write_policy
from tuner.serve.trace import TRACES, shipped_traces, trace_path


def twin_policy() -> Policy:
    """Two bands of the AGX Orin twin: 15W below 100 q/s, MAXN above (batch 8, 5 ms timeout)."""
    space = TwinDevice("sim:orin").space()
    return two_band_policy(space, model="resnet50", device="sim:orin", device_kind="orin-agx", twin=True)


def _edited(changes: dict, band: dict | None = None) -> str:
    data = twin_policy().model_dump(mode="json")
    data.update(changes)
    if band is not None:
        data["bands"][0].update(band)
    return yaml.safe_dump(data)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("bad-serve")
    write_policy(twin_policy(), root / "policy.yaml")
    files = {
        "v2.yaml": _edited({"version": 2}),
        "v0.yaml": _edited({"version": 0}),
        "lat-neg.yaml": _edited({"max_latency_ms": -1}),
        "p999.yaml": _edited({"percentile": "p999"}),
        "inf-timeout.yaml": _edited({}, {"batch_timeout_ms": float("inf")}),
        "nan-energy.yaml": _edited({}, {"j_per_query": float("nan")}),
        "odd-timeout.yaml": _edited({}, {"batch_timeout_ms": 7.0}),
        "unknown-knob.yaml": _edited({}, {"knobs": {**twin_policy().bands[0].knobs, "warp": 9}}),
        "bad-gpu.yaml": _edited({}, {"knobs": {**twin_policy().bands[0].knobs, "gpu_mhz": 999.0}}),
        "bad-mode.yaml": _edited({}, {"knobs": {**twin_policy().bands[0].knobs, "nvpmodel": "99W"}}),
        "empty-knobs.yaml": _edited({}, {"knobs": {}}),
        "bs-huge.yaml": _edited({}, {"batch_size": 1_000_000_000}),
        "bs-odd.yaml": _edited({}, {"batch_size": 3}),
        "good.csv": "t_s,rate_qps\n0,50\n60,150\n",
        "nan-t.csv": "t_s,rate_qps\n0,50\nnan,150\n",
        "inf-t.csv": "t_s,rate_qps\n0,50\ninf,150\n",
        "e308.csv": "t_s,rate_qps\n-1e308,50\n1e308,150\n",
        "span.csv": "t_s,rate_qps\n0,50\n1e9,150\n",
        "rate-e12.csv": "t_s,rate_qps\n0,50\n60,1e12\n",
        "rate-e300.csv": "t_s,rate_qps\n0,50\n60,1e300\n",
        "rate": "50\n",
        "afile": "a file\n",
    }
    for name, text in files.items():
        (root / name).write_text(text)
    (root / "binary.csv").write_bytes(bytes(range(256)) * 8)
    (root / "binary-rate").write_bytes(bytes(range(256)) * 8)
    (root / "somedir").mkdir()
    for name in ("policy.fifo", "trace.fifo", "rate.fifo", "export.fifo"):
        os.mkfifo(root / name)
    return root


GOVERN = ("govern", "policy.yaml", "-d", "sim:orin", "--rate-source", "file:rate", "--duration", "0.2")
REPLAY = ("replay", "policy.yaml", "-d", "sim:orin", "--trace", "good.csv")
PLAN = ("plan", "-m", "resnet50", "-d", "sim:orin", "-l", "50ms", "--trials", "2")
LONG_SOCKET = "unix:" + "s" * 120

# every policy file govern and replay must refuse alike (one validator), with the fix each error names
BAD_POLICIES = (
    ("v2.yaml", "has version 2"),
    ("v0.yaml", "has version 0"),
    ("lat-neg.yaml", "invalid at max_latency_ms"),
    ("p999.yaml", "invalid at percentile"),
    ("inf-timeout.yaml", "invalid at bands.0.batch_timeout_ms"),
    ("nan-energy.yaml", "invalid at bands.0.j_per_query"),
    ("odd-timeout.yaml", "batch_timeout_ms 7 is not one of"),
    ("unknown-knob.yaml", "unknown knob 'warp'"),
    ("bad-gpu.yaml", "gpu_mhz=999.0 is not supported"),
    ("bad-mode.yaml", "nvpmodel=99W is not supported"),
    ("empty-knobs.yaml", "invalid at bands.0.knobs"),
    ("bs-huge.yaml", "batch size 1000000000"),
    ("bs-odd.yaml", "batch_size 3 is not one of"),
    ("policy.fifo", "not a regular file"),
)

ROWS: list[tuple[tuple[str, ...], str]] = [
    *[((command[0], name, *command[2:]), fix) for command in (GOVERN, REPLAY) for name, fix in BAD_POLICIES],
    # govern: rate sources, outputs, settings
    (("govern", "policy.yaml", "-d", "sim:orin", "--rate-source", "file:binary-rate"), "is not a rate"),
    (("govern", "policy.yaml", "-d", "sim:orin", "--rate-source", "file:rate.fifo"), "not a regular file"),
    (("govern", "policy.yaml", "-d", "sim:orin", "--rate-source", "file:nothere"), "no file nothere"),
    (("govern", "policy.yaml", "-d", "sim:orin", "--rate-source", "http://127.0.0.1:abc/metrics#m"), "rate source URL"),
    (("govern", "policy.yaml", "-d", "sim:orin", "--rate-source", "http://[::1/metrics#m"), "rate source URL"),
    (("govern", "policy.yaml", "-d", "sim:orin", "--rate-source", "http://10.0.0.1/metrics#m"), "loopback"),
    (("govern", "policy.yaml", "-d", "sim:orin", "--rate-source", LONG_SOCKET), "longer than 107 bytes"),
    (("govern", "policy.yaml", "-d", "sim:orin", "--rate-source", "unix:afile"), "something exists there"),
    ((*GOVERN, "--state-file", "somedir"), "is a folder"),
    ((*GOVERN, "--log", "somedir"), "is a folder"),
    ((*GOVERN, "--state-file", "afile/state.json"), "not a folder"),
    ((*GOVERN, "--log", "/proc/switches.jsonl"), "cannot write in /proc"),
    ((*GOVERN, "--state-file", "policy.fifo"), "not a regular file"),
    ((*GOVERN, "--interval", "0"), "--interval must be"),
    ((*GOVERN, "--interval", "inf"), "--interval must be"),
    ((*GOVERN, "--interval", "1e9"), "--interval must be"),
    ((*GOVERN, "--smoothing", "nan"), "--smoothing must be"),
    ((*GOVERN, "--min-dwell", "-1"), "--min-dwell must be"),
    ((*GOVERN, "--headroom", "1.5"), "--headroom must be"),
    (("govern", "policy.yaml", "-d", "sim:orin", "--rate-source", "file:rate", "--duration", "inf"), "--duration"),
    ((*GOVERN, "-m", "bert-base"), "this policy is for model resnet50"),
    # replay: traces and outputs
    (("replay", "policy.yaml", "-d", "sim:orin", "--trace", "nan-t.csv"), "finite, increasing t_s"),
    (("replay", "policy.yaml", "-d", "sim:orin", "--trace", "inf-t.csv"), "finite, increasing t_s"),
    (("replay", "policy.yaml", "-d", "sim:orin", "--trace", "e308.csv"), "finite, increasing t_s"),
    (("replay", "policy.yaml", "-d", "sim:orin", "--trace", "span.csv"), "more than 1000000 governor steps"),
    (("replay", "policy.yaml", "-d", "sim:orin", "--trace", "rate-e12.csv"), "from 0 to 100000 queries/s"),
    (("replay", "policy.yaml", "-d", "sim:orin", "--trace", "rate-e300.csv"), "from 0 to 100000 queries/s"),
    ((*REPLAY, "--rate-scale", "1e300"), "from 0 to 100000 queries/s"),
    ((*REPLAY, "--rate-scale", "inf"), "--rate-scale must be"),
    (("replay", "policy.yaml", "-d", "sim:orin", "--trace", "binary.csv"), "not UTF-8"),
    (("replay", "policy.yaml", "-d", "sim:orin", "--trace", "trace.fifo"), "not a regular file"),
    (("replay", "policy.yaml", "-d", "sim:orin", "--trace", "diurnl"), "diurnal"),
    (("replay", "policy.yaml", "-d", "sim:orin", "--trace", "somedir"), "not a regular file"),
    ((*REPLAY, "--plot", "somedir"), "is a folder"),
    ((*REPLAY, "--plot", "afile/x.png"), "not a folder"),
    ((*REPLAY, "--plot", "/proc/replay.png"), "cannot write in /proc"),
    ((*REPLAY, "--interval", "0"), "--interval must be"),
    (("replay", "policy.yaml", "-d", "sim:h200", "--trace", "good.csv"), "this policy is for orin-agx"),
    (("replay", "policy.yaml", "-d", "orin", "--trace", "good.csv"), "no Jetson board"),
    # plan: rates, outputs, counts
    ((*PLAN, "--rates", "inf"), "outside 0.01 to 100000"),
    ((*PLAN, "--rates", "1e308"), "outside 0.01 to 100000"),
    ((*PLAN, "--rates", "1e-300"), "outside 0.01 to 100000"),
    ((*PLAN, "--rates", "1:inf:1"), "outside 0.01 to 100000"),
    ((*PLAN, "--rates", "1:1e12:1"), "outside 0.01 to 100000"),
    ((*PLAN, "--rates", "1:90000:1"), "more than 200"),
    ((*PLAN, "--rates", "nan"), "outside 0.01 to 100000"),
    ((*PLAN, "--rates", "1:10:0"), "start:stop:step"),
    ((*PLAN, "--rates", "fast"), "start:stop:step"),
    ((*PLAN, "--rates", "50", "-o", "somedir"), "is a folder"),
    ((*PLAN, "--rates", "50", "-o", "/proc/policy.yaml"), "cannot write in /proc"),
    ((*PLAN, "--rates", "50", "-o", "afile/policy.yaml"), "not a folder"),
    ((*PLAN, "--rates", "50", "--out", "afile"), "not a folder"),
    ((*PLAN, "--rates", "50", "--trials", "0"), "--trials must be"),
    ((*PLAN, "--rates", "50", "--refine", "-1"), "--refine must be"),
    ((*PLAN, "--rates", "50", "--window", "nan"), "--window must be"),
    # apply reads the same way: a named pipe as an export never hangs it
    (("apply", "export.fifo", "--dry-run"), "not a regular file"),
]


def _in_process(args: tuple[str, ...]) -> tuple[int, str, str]:
    return in_process(*args)


@pytest.mark.parametrize("index", range(len(ROWS)), ids=[" ".join(r[0])[:70] for r in ROWS])
def test_serving_bad_input_refused_in_one_line_and_nothing_written(folder, monkeypatch, index):
    args, fix = ROWS[index]
    monkeypatch.chdir(folder)
    monkeypatch.delenv("TUNE_SYSFS_ROOT", raising=False)
    before = folder_state(folder)
    code, out, err = _in_process(args)
    assert code == 2, (args, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), (args, err)
    assert "Traceback" not in err and out == "", (args, out)
    assert fix in lines[0], (args, lines[0])
    assert folder_state(folder) == before, f"{args} changed the folder"


def test_the_serving_table_covers_the_three_commands():
    assert {"plan", "govern", "replay"} <= {r[0][0] for r in ROWS}
    assert len(ROWS) >= 80


# -- shipped traces by name ----------------------------------------------------------


def test_a_shipped_trace_is_found_by_its_bare_name_and_a_miss_lists_them(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert set(shipped_traces()) >= {"diurnal", "bursty"}
    assert trace_path("diurnal") == TRACES / "diurnal.csv"
    assert trace_path("diurnal.csv") == TRACES / "diurnal.csv"
    with pytest.raises(UserError, match=r"shipped trace by name: bursty, diurnal \(in "):
        trace_path("hourly")
    (tmp_path / "diurnal.csv").write_text("t_s,rate_qps\n0,1\n1,2\n")
    assert trace_path("diurnal.csv") == Path("diurnal.csv")  # a file of the user's wins


def test_replay_prints_its_savings_as_a_sentence_and_the_plot_where_help_says(folder, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = _in_process(
        ("replay", str(folder / "policy.yaml"), "-d", "sim:orin", "--trace", str(folder / "good.csv"))
    )
    assert code == 0, err
    assert "energy the governor saves: " in out and "% vs static" in out and "{" not in out
    assert (folder / "replay-good-sim-orin.png").is_file()
    assert list(tmp_path.iterdir()) == []
    code, out, _ = _in_process(("replay", "--help"))
    assert "replay-<trace>-<device>.png beside the policy" in " ".join(out.split())


# -- a full disk leaves the old file -------------------------------------------------


class _FullDisk:
    """A file object whose writes fail as on a full disk."""

    def __init__(self, fh):
        self.fh = fh

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.fh.close()

    def write(self, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _full_disk(real, fd, mode, *args, **kwargs):
    """``os.fdopen`` whose files opened for writing fail as on a full disk."""
    fh = real(fd, mode, *args, **kwargs)
    return _FullDisk(fh) if "w" in mode else fh


def test_a_full_disk_is_one_line_and_the_old_policy_is_intact(tmp_path, monkeypatch):
    path = tmp_path / "policy.yaml"
    write_policy(twin_policy(), path)
    old = path.read_bytes()
    real = os.fdopen
    monkeypatch.setattr(atomicfile.os, "fdopen", lambda fd, mode="r", *a, **k: _full_disk(real, fd, mode, *a, **k))
    with pytest.raises(UserError, match="No space left on device; free some space") as info:
        write_policy(twin_policy().model_copy(update={"max_latency_ms": 20.0}), path)
    assert "\n" not in str(info.value)
    assert path.read_bytes() == old and sorted(p.name for p in tmp_path.iterdir()) == ["policy.yaml"]
    assert load_policy(path).max_latency_ms == 50.0


def test_export_on_a_full_disk_is_one_line_and_the_old_export_is_intact(tmp_path, monkeypatch):
    from tuner.study import RunOptions, run_study

    opts = RunOptions(model="resnet50", max_latency_ms=50.0, trials=3, seed=1, sampler="random", out=tmp_path / "s")
    opts.knobs = ["gpu_mhz"]
    run_study(TwinDevice("sim:orin"), opts)
    monkeypatch.chdir(tmp_path)
    export = ("export", "-m", "resnet50", "-d", "sim:orin", "-l", "50ms", "--out", "s", "-o", "best.yaml")
    assert _in_process(export)[0] == 0
    old = (tmp_path / "best.yaml").read_bytes()
    before = folder_state(tmp_path)
    real = os.fdopen
    monkeypatch.setattr(atomicfile.os, "fdopen", lambda fd, mode="r", *a, **k: _full_disk(real, fd, mode, *a, **k))
    code, _out, err = _in_process(export)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "No space left on device" in err, err
    assert (tmp_path / "best.yaml").read_bytes() == old
    after = folder_state(tmp_path)
    assert {k for k in after if not k.startswith("s/")} == {k for k in before if not k.startswith("s/")}


# -- links another user planted ------------------------------------------------------


def _as_nobody(path: Path) -> None:
    os.chown(path, 65534, 65534)


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="planting files as another user needs root (chown)")


@needs_root
def test_writes_as_root_refuse_a_folder_another_user_can_write(folder, tmp_path, monkeypatch):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    _as_nobody(shared)
    victim, victim2 = tmp_path / "victim", tmp_path / "victim2"
    victim.write_text("precious\n")
    victim2.write_text("precious too\n")
    (shared / "band.json.tmp").symlink_to(victim)
    (shared / "switches.jsonl").symlink_to(victim2)
    os.lchown(shared / "band.json.tmp", 65534, 65534)
    os.lchown(shared / "switches.jsonl", 65534, 65534)
    monkeypatch.chdir(folder)
    before = folder_state(shared)
    for args in (
        (*GOVERN, "--state-file", str(shared / "band.json"), "--log", str(shared / "switches.jsonl")),
        (*GOVERN, "--state-file", str(shared / "band.json")),
        (*PLAN, "--rates", "50", "-o", str(shared / "policy.yaml")),
        (*REPLAY, "--plot", str(shared / "replay.png")),
    ):
        code, _out, err = _in_process(args)
        assert code == 2 and len(err.strip().splitlines()) == 1, (args, err)
        assert "refusing to write in the folder" in err or "is a link" in err, err
    assert victim.read_text() == "precious\n" and victim2.read_text() == "precious too\n"
    assert folder_state(shared) == before
    os.chown(shared, 0, 0)  # root's own folder, but writable by everyone (no sticky bit)
    code, _out, err = _in_process((*GOVERN, "--state-file", str(shared / "band.json")))
    assert code == 2 and "other users can write to it" in err, err
    assert victim.read_text() == "precious\n" and folder_state(shared) == before


@needs_root
def test_in_a_sticky_shared_folder_planted_links_are_never_followed(folder, tmp_path, monkeypatch):
    shared = tmp_path / "sticky"
    shared.mkdir()
    shared.chmod(0o1777)  # like /tmp: anyone may create files, nobody may rename another's
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    for name in ("band.json.tmp", ".band.json.tmp", ".band.json.tmp.json"):
        (shared / name).symlink_to(victim)
        os.lchown(shared / name, 65534, 65534)
    monkeypatch.chdir(folder)
    code, _out, err = _in_process(
        (*GOVERN, "--observe-only", "--interval", "0.05", "--state-file", str(shared / "band.json"))
    )
    assert code == 0, err
    assert victim.read_text() == "precious\n"
    info = os.lstat(shared / "band.json")
    assert stat.S_ISREG(info.st_mode) and info.st_uid == 0
    for name in ("log.jsonl", "other.json"):  # a link at the name itself is refused before anything runs
        (shared / name).symlink_to(victim)
    for flag, name in (("--log", "log.jsonl"), ("--state-file", "other.json")):
        code, _, err = _in_process((*GOVERN, "--observe-only", flag, str(shared / name)))
        assert code == 2 and "is a link" in err, err
    assert victim.read_text() == "precious\n"


def test_the_write_helper_never_follows_a_planted_temporary_name(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    out = tmp_path / "out"
    out.mkdir()
    (out / "state.json.tmp").symlink_to(victim)
    atomicfile.write_text(out / "state.json", "{}")
    assert victim.read_text() == "precious\n" and (out / "state.json").read_text() == "{}"
    (out / "log").symlink_to(victim)
    with pytest.raises(UserError, match="symbolic link"):
        atomicfile.append_line(out / "log", "x")
    assert victim.read_text() == "precious\n"
