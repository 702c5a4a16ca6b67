"""Safe by construction, the file classes: one way to write, one way to trust, hostile files.

Each table row is a case the tool once got wrong: a symbolic link planted as
a folder on the way to an output, an input another user can rewrite, a
hostile JSON file, a special storage path. Every row must end with exit
code 2 and one line, write nothing (the folders around it are compared
before and after), follow no link (the link's target is untouched), and
leave the fake board byte-identical where one is used.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import sqlite3
from pathlib import Path

import pytest
import yaml
from clirun import folder_state, in_process, run_cli
from fakeboard import board_export, make_fake_board
from policies import two_band_policy

from tuner.devices.virtual.twin import TwinDevice
from tuner.errors import UserError
from tuner.plumbing import atomicfile, readfile, trust
from tuner.serve.policy import write_policy

OTHER_UID = 12345  # a spare uid: no user database entry is needed to own a file
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="planting files as another user needs root (chown)")

RUN = ("run", "-m", "resnet50", "-d", "sim:orin", "-l", "50ms", "--trials", "2", "--knobs", "gpu_mhz")
SWEEP = ("sweep", "-m", "resnet50", "-d", "sim:orin", "--knobs", "gpu_mhz", "--batch-sizes", "1,8")
PARETO = ("pareto", "-m", "resnet50", "-d", "sim:orin")
EXPORT = ("export", "-m", "resnet50", "-d", "sim:orin", "-l", "50ms")
STATUS = ("status",)
PLAN = ("plan", "-m", "resnet50", "-d", "sim:orin", "-l", "50ms", "--trials", "2", "--rates", "50")
GOVERN = (
    "govern",
    "policy.yaml",
    "-d",
    "sim:orin",
    "--rate-source",
    "file:rate",
    "--duration",
    "0.2",
    "--observe-only",
)
REPLAY = ("replay", "policy.yaml", "-d", "sim:orin", "--trace", "trace.csv")


@pytest.fixture(scope="module")
def studies(tmp_path_factory) -> Path:
    """A folder holding a small twin study (tune.db), made once for the reading commands."""
    from tuner.run_options import RunOptions
    from tuner.study import run_study

    root = tmp_path_factory.mktemp("studies")
    opts = RunOptions(model="resnet50", max_latency_ms=50.0, trials=3, seed=1, sampler="random", out=root / "s")
    opts.knobs = ["gpu_mhz"]
    run_study(TwinDevice("sim:orin"), opts)
    with contextlib.closing(sqlite3.connect(root / "s" / "tune.db")) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # every trial in tune.db itself, which the cases copy
    return root / "s"


@pytest.fixture
def work(tmp_path, monkeypatch, studies) -> Path:
    """A working folder with a policy, a rate file, a trace, a copy of the study, and a victim folder."""
    space = TwinDevice("sim:orin").space()
    policy = two_band_policy(space, model="resnet50", device="sim:orin", device_kind="orin-agx", twin=True)
    write_policy(policy, tmp_path / "policy.yaml")
    (tmp_path / "rate").write_text("50\n")
    (tmp_path / "trace.csv").write_text("t_s,rate_qps\n0,50\n60,150\n")
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "tune.db").write_bytes((studies / "tune.db").read_bytes())
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious").write_text("precious\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def state(root: Path) -> dict[str, tuple]:
    """:func:`folder_state` without SQLite's own -wal/-shm files, which reading a WAL database may leave."""
    return {k: v for k, v in folder_state(root).items() if not k.endswith(("tune.db-wal", "tune.db-shm"))}


def one_line_exit_2(args: tuple[str, ...]) -> str:
    code, out, err = in_process(*args)
    lines = [line for line in err.strip().splitlines() if line.startswith("error: ")]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, (args, code, out, err)
    return lines[0]


# -- one way to write: a link planted as a folder, at each component --------------------------------------

# (name, where the link is planted relative to the work folder, the command with LINK in its paths)
LINKED_FOLDERS: list[tuple[str, str, tuple[str, ...]]] = [
    ("run --out", "lnk", (*RUN, "--out", "lnk")),
    ("run --out deeper", "lnk", (*RUN, "--out", "lnk/studies")),
    ("run <out>/<device>", "out/sim-orin", (*RUN, "--out", "out")),
    ("run <out>/<device>/<model>", "out/sim-orin/resnet50", (*RUN, "--out", "out")),
    ("run --storage folder", "lnk", (*RUN, "--out", "out", "--storage", "sqlite:///lnk/tune.db")),
    ("sweep --out", "lnk", (*SWEEP, "--out", "lnk")),
    ("sweep <out>/<device>", "out/sim-orin", (*SWEEP, "--out", "out")),
    ("pareto <out>/<device>", "s/sim-orin", (*PARETO, "--out", "s")),
    ("pareto <out>/<device>/<model>", "s/sim-orin/resnet50", (*PARETO, "--out", "s")),
    ("export -o folder", "lnk", (*EXPORT, "--out", "s", "-o", "lnk/best.yaml")),
    ("export -o deeper", "lnk", (*EXPORT, "--out", "s", "-o", "lnk/a/b/best.yaml")),
    ("plan -o folder", "lnk", (*PLAN, "--out", "out", "-o", "lnk/policy.yaml")),
    ("govern --state-file folder", "lnk", (*GOVERN, "--state-file", "lnk/band.json")),
    ("govern --log folder", "lnk", (*GOVERN, "--log", "lnk/switches.jsonl")),
    ("govern --log deeper", "lnk", (*GOVERN, "--log", "lnk/sub/switches.jsonl")),
    ("replay --plot folder", "lnk", (*REPLAY, "--plot", "lnk/replay.png")),
    ("roofline --out", "lnk", ("roofline", "-m", "resnet50", "-d", "sim:orin", "--out", "lnk")),
    (
        "report --out",
        "lnk",
        ("report", "-m", "resnet50", "-d", "sim:orin", "--modes", "MAXN", "--batch-sizes", "8", "--out", "lnk"),
    ),
]


@pytest.mark.parametrize(("where", "args"), [row[1:] for row in LINKED_FOLDERS], ids=[r[0] for r in LINKED_FOLDERS])
def test_a_link_planted_as_a_folder_is_refused_and_never_followed(work, where, args):
    link = work / where
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(work / "victim", target_is_directory=True)
    before = state(work)
    line = one_line_exit_2(args)
    assert "symbolic link" in line and "realpath" in line, line
    after = state(work)
    assert after == before, sorted(set(after.items()) ^ set(before.items()))


@pytest.mark.loadgen
def test_loadgen_logs_go_through_a_private_folder_never_a_planted_trial_folder(tmp_path):
    """LoadGen writes into mkdtemp (0700); the tool moves its logs, so a planted trial-0000 link is refused."""
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "mlperf_log_summary.txt").write_text("precious\n")
    os.chmod(victim / "mlperf_log_summary.txt", 0o600)
    loadgen = tmp_path / "out" / "orin" / "resnet50" / "loadgen"
    loadgen.mkdir(parents=True)
    (loadgen / "trial-0000").symlink_to(victim, target_is_directory=True)
    before = state(tmp_path)
    from tuner.measure.loadgen_run import run_window
    from tuner.measure.settings import WindowSettings

    with pytest.raises(UserError, match="symbolic link"):
        run_window(_NeverRun(), 1, WindowSettings(window_s=1.0, warmup_s=0.0), loadgen / "trial-0000")
    assert state(tmp_path) == before


class _NeverRun:
    """A runner the refused window must never reach."""

    def __getattr__(self, name):
        raise AssertionError(f"the window ran ({name}) although its log folder was refused")


def test_the_writer_walks_every_component_without_following_a_link(tmp_path):
    victim = tmp_path / "victim"
    victim.mkdir()
    parts = ["a", "b", "c"]
    for depth in range(len(parts)):
        root = tmp_path / f"case{depth}"
        real = root
        for name in parts[:depth]:
            real = real / name
        real.mkdir(parents=True)
        (real / parts[depth]).symlink_to(victim, target_is_directory=True)
        target = root.joinpath(*parts) / "file.json"
        for write in (
            lambda p: atomicfile.write_text(p, "{}"),
            lambda p: atomicfile.append_line(p, "{}"),
            lambda p: atomicfile.ensure_folder(p.parent),
            lambda p: atomicfile.create_file(p, "study storage"),
            lambda p: os.close(atomicfile.open_lock(p)),
            lambda p: atomicfile.check_target(p, "-o"),
        ):
            with pytest.raises(UserError, match="symbolic link"):
                write(target)
        assert list(victim.iterdir()) == []


def test_missing_folders_are_created_with_safe_modes_whatever_the_umask(tmp_path):
    old = os.umask(0)
    try:
        atomicfile.write_text(tmp_path / "a" / "b" / "x.json", "{}")
        atomicfile.ensure_folder(tmp_path / "p" / "q", private=True)
    finally:
        os.umask(old)
    assert {oct(os.stat(tmp_path / n).st_mode & 0o777) for n in ("a", "a/b")} == {"0o755"}
    assert {oct(os.stat(tmp_path / n).st_mode & 0o777) for n in ("p", "p/q")} == {"0o700"}


@needs_root
@pytest.mark.parametrize(
    ("mode", "owner", "refused"),
    [
        (0o755, OTHER_UID, "owned by another user"),
        (0o777, 0, "other users can write"),
        (0o775, 0, None),  # root's own group
        (0o1777, OTHER_UID, "owned by another user"),
        (0o1777, 0, None),  # sticky, like /tmp
    ],
)
def test_a_folder_on_the_way_that_another_user_controls_is_refused(tmp_path, mode, owner, refused):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(mode)
    os.chown(shared, owner, 0)
    target = shared / "deeper" / "x.json"
    if refused is None:
        atomicfile.write_text(target, "{}")
        assert target.read_text() == "{}"
        return
    with pytest.raises(UserError, match=refused) as info:
        atomicfile.write_text(target, "{}")
    assert "chmod" in str(info.value) or "chown" in str(info.value)
    assert list(shared.iterdir()) == []


@needs_root
def test_a_group_writable_folder_of_a_foreign_group_is_refused(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o775)
    os.chown(shared, 0, OTHER_UID)
    with pytest.raises(UserError, match="its group"):
        atomicfile.write_text(shared / "x.json", "{}")


def test_a_full_disk_mid_log_line_leaves_no_cut_line(tmp_path, monkeypatch):
    log = tmp_path / "switches.jsonl"
    atomicfile.append_line(log, json.dumps({"to": 1}))
    real = os.write

    def short(fd, data):
        real(fd, data[: len(data) // 2])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(atomicfile.os, "write", short)
    with pytest.raises(UserError, match="No space left on device; free some space") as info:
        atomicfile.append_line(log, json.dumps({"to": 2, "reason": "x" * 100}))
    assert "\n" not in str(info.value)
    assert [json.loads(line) for line in log.read_text().splitlines()] == [{"to": 1}]


def test_govern_log_on_a_full_disk_is_one_line_exit_2_and_no_cut_line(work, monkeypatch):
    log = work / "switches.jsonl"
    real = os.write

    def full(fd, data):
        if os.fstat(fd).st_ino == os.stat(log).st_ino:
            real(fd, data[:7])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd, data)

    monkeypatch.setattr(atomicfile.os, "write", full)
    args = ("govern", "policy.yaml", "-d", "sim:orin", "--rate-source", "file:rate", "--duration", "0.2")
    line = one_line_exit_2((*args, "--observe-only", "--log", str(log)))
    assert "No space left on device" in line
    assert log.read_text() == ""


# -- one way to trust -------------------------------------------------------------------------------------


def _untrust(path: Path, how: str) -> None:
    if how == "other-owner":
        os.chown(path, OTHER_UID, OTHER_UID)
    elif how == "world-writable":
        path.chmod(0o666)
    elif how == "group-writable":
        path.chmod(0o664)
    elif how == "other-owner-0666":
        os.chown(path, OTHER_UID, OTHER_UID)
        path.chmod(0o666)


UNTRUSTED = ["other-owner", "world-writable", "group-writable", "other-owner-0666"]

# (name, file to untrust, command)
TRUSTED_INPUTS: list[tuple[str, str, tuple[str, ...]]] = [
    ("govern policy", "policy.yaml", GOVERN),
    ("replay policy", "policy.yaml", REPLAY),
    ("pareto tune.db", "s/tune.db", (*PARETO, "--out", "s")),
    ("export tune.db", "s/tune.db", (*EXPORT, "--out", "s", "-o", "best.yaml")),
    ("status tune.db", "s/tune.db", (*STATUS, "--out", "s")),
    ("run tune.db", "s/tune.db", (*RUN, "--out", "s")),
]


@needs_root
@pytest.mark.parametrize("how", UNTRUSTED)
@pytest.mark.parametrize(("name", "args"), [(r[1], r[2]) for r in TRUSTED_INPUTS], ids=[r[0] for r in TRUSTED_INPUTS])
def test_an_input_another_user_could_rewrite_is_refused_naming_the_fix(work, name, args, how):
    _untrust(work / name, how)
    before = state(work)
    line = one_line_exit_2(args)
    assert "cannot be trusted" in line and ("chmod" in line or "chown" in line), line
    assert state(work) == before


@needs_root
@pytest.mark.parametrize("how", [*UNTRUSTED, "group-readable", "other-readable"])
def test_a_token_file_others_can_read_or_write_is_refused(tmp_path, how):
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    token.chmod(0o600)
    if how == "group-readable":
        token.chmod(0o640)
    elif how == "other-readable":
        token.chmod(0o604)
    else:
        _untrust(token, how)
    from tuner.devices.meters.remote import RemoteMeter, read_token

    with pytest.raises(UserError, match="cannot be trusted") as info:
        read_token(str(token))
    assert "chmod 600" in str(info.value) or "chown" in str(info.value)
    with pytest.raises(UserError, match="cannot be trusted"):
        RemoteMeter.from_url(f"remote://127.0.0.1:1?token_file={token}")
    serve = ("meter-serve", "--meter", "py:fakemeter:ConstantMeter", "--listen", "127.0.0.1:0")
    line = one_line_exit_2((*serve, "--token-file", str(token)))
    assert "cannot be trusted" in line


def test_a_private_token_file_is_read(tmp_path):
    from tuner.devices.meters.remote import read_token

    token = tmp_path / "token"
    token.write_text("s3cret\n")
    token.chmod(0o600)
    assert read_token(str(token)) == "s3cret"


@pytest.fixture
def board(tmp_path, monkeypatch):
    # MAXN: the policies' two modes (MAXN, 50W) share its TPC mask, so switching needs no reboot
    return make_fake_board(tmp_path / "board", "orin-agx", "l4t36", seed=1, start="MAXN").install(monkeypatch)


def _board_export(path: Path) -> None:
    path.write_text(yaml.safe_dump(board_export()))
    path.chmod(0o644)


@needs_root
@pytest.mark.parametrize("how", UNTRUSTED)
def test_apply_refuses_an_export_another_user_could_rewrite_and_the_board_is_untouched(board, tmp_path, how):
    best = tmp_path / "best.yaml"
    _board_export(best)
    original = board.snapshot()
    _untrust(best, how)
    r = run_cli("apply", str(best))
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "cannot be trusted" in r.stderr, r.stderr
    assert board.snapshot() == original


@needs_root
@pytest.mark.parametrize("how", UNTRUSTED)
def test_govern_refuses_a_policy_another_user_could_rewrite_on_the_board(board, tmp_path, how):
    from tuner.devices.registry import open_device

    policy = two_band_policy(
        open_device("orin").space(), model="resnet50", device="orin", device_kind="orin-agx", twin=False, low_mode="50W"
    )
    write_policy(policy, tmp_path / "policy.yaml")
    (tmp_path / "rate").write_text("250\n")
    original = board.snapshot()
    _untrust(tmp_path / "policy.yaml", how)
    r = run_cli("govern", "policy.yaml", "-d", "orin", "--rate-source", "file:rate", "--duration", "1", cwd=tmp_path)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "cannot be trusted" in r.stderr, r.stderr
    assert board.snapshot() == original


@needs_root
def test_a_study_file_of_the_sudo_user_is_trusted_as_root(tmp_path, monkeypatch):
    path = tmp_path / "policy.yaml"
    path.write_text("x: 1\n")
    os.chown(path, OTHER_UID, OTHER_UID)
    monkeypatch.setenv("SUDO_UID", str(OTHER_UID))
    readfile.check_trusted(path, "serving policy")
    monkeypatch.setenv("SUDO_UID", "nonsense")
    with pytest.raises(UserError, match="cannot be trusted"):
        readfile.check_trusted(path, "serving policy")


def test_the_trust_rule_is_one_function_for_files():
    info = os.stat_result((0o100644, 0, 0, 1, os.geteuid(), 0, 0, 0, 0, 0))
    assert trust.file_problem(info) is None
    assert "read" in (trust.file_problem(info, secret=True) or "")
    assert "write" in (trust.file_problem(os.stat_result((0o100646, *info[1:]))) or "")


# -- read-only commands never write ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [(*PARETO, "--out", "e"), (*EXPORT, "--out", "e", "-o", "best.yaml"), (*STATUS, "--out", "e"), ("status",)],
    ids=["pareto", "export", "status -m", "status"],
)
@pytest.mark.parametrize("content", [b"", b"not sqlite at all\n"], ids=["empty", "garbage"])
def test_a_reading_command_on_an_empty_study_file_leaves_it_as_it_was(work, args, content):
    (work / "e").mkdir()
    (work / "e" / "tune.db").write_bytes(content)
    if args == ("status",):
        args = ("status", "--out", "e")
    before = state(work)
    line = one_line_exit_2(args)
    assert "no study" in line or "not an SQLite database" in line, line
    assert (work / "e" / "tune.db").read_bytes() == content
    assert state(work) == before


# -- hostile files ---------------------------------------------------------------------------------------

HOSTILE_STATES = {
    "pid 1e999": '{"pid": 1e999, "running": true, "stale_after": 0}',
    "pid 2**70": '{"pid": ' + str(2**70) + ', "running": true, "stale_after": 0}',
    "pid -1e999": '{"pid": -1e999, "running": true}',
    "stale_after NaN": '{"pid": 1, "running": true, "stale_after": NaN}',
    "stale_after huge": '{"pid": 1, "running": true, "stale_after": 1e400}',
    "nested list": "[" * 100_000 + "]" * 100_000,
    "nested object": '{"a":' * 50_000 + "1" + "}" * 50_000,
    "nested, cut": "[" * 200_000,
    "a list": "[1, 2]",
    "pid string": '{"pid": "1", "running": true, "stale_after": 0}',
    "pid bool": '{"pid": true, "running": true, "stale_after": 0}',
    "pid huge": '{"pid": 99999999999, "running": true, "stale_after": 0}',
    "not json": "{pid: 1",
    "binary": "\udcff\x00\x01",
}


@pytest.mark.parametrize("text", HOSTILE_STATES.values(), ids=HOSTILE_STATES.keys())
def test_a_hostile_leftover_governor_state_is_one_line(work, text):
    (work / "band.json").write_bytes(text.encode(errors="surrogateescape"))
    before = state(work)
    line = one_line_exit_2((*GOVERN, "--state-file", "band.json"))
    assert "band.json" in line and "remove" in line, line
    assert state(work) == before


HOSTILE_JOURNALS = {
    "nested": "[" * 100_000,
    "pid 2**70": '{"version": 1, "device": "orin", "kind": "orin-agx", "pid": '
    + str(2**70)
    + ', "written_at": 0, "state": {}}',
    "written_at 1e999": '{"version": 1, "device": "orin", "kind": "orin-agx", "pid": 1, "written_at": 1e999, '
    '"state": {}}',
    "state deep": '{"version": 1, "device": "orin", "kind": "orin-agx", "pid": 1, "written_at": 0, "state": '
    + '{"a":' * 70
    + "1"
    + "}" * 70
    + "}",
}


@pytest.mark.parametrize("text", HOSTILE_JOURNALS.values(), ids=HOSTILE_JOURNALS.keys())
@pytest.mark.parametrize("args", [("restore",), ("restore", "-d", "orin")], ids=["restore", "restore -d"])
def test_a_hostile_journal_is_one_line_for_restore_and_the_board_untouched(board, tmp_path, text, args):
    folder = Path(os.environ["TUNE_STATE_DIR"]) / "journal"
    folder.mkdir(parents=True, mode=0o700)
    os.chmod(folder.parent, 0o700)
    journal = folder / "orin.json"
    journal.write_text(text)
    journal.chmod(0o600)
    original = board.snapshot()
    r = run_cli(*args)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr
    assert "journal" in r.stderr
    assert journal.read_text() == text and board.snapshot() == original


@pytest.mark.parametrize(
    "args",
    [
        (*RUN, "--storage", "sqlite:////proc/tune.db"),
        (*RUN, "--storage", "sqlite:////proc/self/tune.db"),
        (*RUN, "--storage", "sqlite:////sys/tune.db"),
        (*RUN, "--storage", "sqlite:////dev/null"),
        (*PLAN, "--storage", "sqlite:////proc/tune.db"),
        (*PARETO, "--storage", "sqlite:////proc/tune.db"),
        (*EXPORT, "--storage", "sqlite:////proc/tune.db"),
        (*STATUS, "--storage", "sqlite:////proc/tune.db"),
        (*PARETO, "--storage", "sqlite:////dev/null"),
    ],
)
def test_a_special_storage_path_is_one_line(work, args):
    before = state(work)
    one_line_exit_2(args)
    assert state(work) == before


def test_json_read_from_files_is_bounded_in_one_place(tmp_path):
    path = tmp_path / "x.json"
    for text, message in (
        ("[" * 65 + "]" * 65, "nested more than"),
        ('{"a": 1e999}', "out of range"),
        (f'{{"a": {2**64}}}', "out of range"),
        ('{"a": Infinity}', "not a number"),
    ):
        path.write_text(text)
        with pytest.raises(UserError, match=message):
            readfile.read_json(path, "file", 1 << 20, "remove it")
    path.write_text(f'{{"a": [1, 2.5, "[[[["], "b": {2**63 - 1}}}')
    assert readfile.read_json(path, "file", 1 << 20, "remove it") == {"a": [1, 2.5, "[[[["], "b": 2**63 - 1}


@needs_root
@pytest.mark.parametrize("mode", [0o777, 0o775])
@pytest.mark.parametrize("args", [("restore", "-d", "orin"), ("apply", "best.yaml")], ids=["restore", "apply"])
def test_a_journal_folder_under_a_folder_others_can_write_is_refused(board, tmp_path, monkeypatch, mode, args):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(mode)
    os.chown(shared, 0, OTHER_UID)
    _board_export(tmp_path / "best.yaml")
    original = board.snapshot()
    r = run_cli(*args, cwd=tmp_path, env={"TUNE_STATE_DIR": str(shared / "state")})
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "refusing the state folder" in r.stderr and "can write to it" in r.stderr, r.stderr
    assert list(shared.iterdir()) == [] and board.snapshot() == original
