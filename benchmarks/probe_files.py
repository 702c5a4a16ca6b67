"""Probe the file classes of the safety rules as an attacker would: links, other users, hostile files, a full disk.

Runs several hundred cases against the CLI, as root with a second local
user (files and folders are chowned to a spare uid, 12345: no user database
entry is needed). Every case is one the tool must refuse, and it passes
only when the command exits 2 with exactly one ``error:`` line and no
traceback, and nothing changed: the case's work folder (every file's type,
size, mtime and hash, SQLite's -wal/-shm files aside), the folder a planted
link points to, and, for board cases, the fake AGX Orin's sysfs tree
(tests/fakes/fakeboard.py) byte for byte.

Classes:
- ``link``: a symbolic link planted as a folder at each component of every
  output path (``-o``, ``--out``, ``--storage``, ``--state-file``, ``--log``,
  ``--plot``, the results folder under ``--out``, the state folder), pointing
  at a root folder, another user's open folder, or nowhere;
- ``folder``: a folder on the way owned by another user, writable by all
  (not sticky), writable by a foreign group, or another user's sticky folder;
- ``trust``: an input that decides what root does (policy, export, tune.db,
  token, governor state, journal) owned by another user or writable by
  group/others (a token also readable by them);
- ``hostile``: a leftover governor state or a journal with huge numbers or
  deep nesting, special storage paths, an empty or foreign tune.db given to
  a reading command;
- ``disk``: a full disk (a 64 KiB tmpfs, filled) under ``govern --log``,
  ``export -o`` and ``run --out`` (skipped where tmpfs cannot be mounted).

Twin commands run in this process through ``tuner.cli.main`` (the CLI's
entry point), board and full-disk commands as real processes.

    sudo python benchmarks/probe_files.py --out benchmarks/results/probe_files.json
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import io
import json
import os
import platform
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "tests" / "fakes"), str(REPO / "tests" / "support")]

from clirun import folder_state  # noqa: E402
from fakeboard import board_export, make_fake_board  # noqa: E402
from policies import two_band_policy  # noqa: E402

OTHER = 12345
TWIN = ("-d", "sim:orin")
RUN = ("run", "-m", "resnet50", *TWIN, "-l", "50ms", "--trials", "2", "--knobs", "gpu_mhz")
SWEEP = ("sweep", "-m", "resnet50", *TWIN, "--knobs", "gpu_mhz", "--batch-sizes", "1,8")
PARETO = ("pareto", "-m", "resnet50", *TWIN)
EXPORT = ("export", "-m", "resnet50", *TWIN, "-l", "50ms")
PLAN = ("plan", "-m", "resnet50", *TWIN, "-l", "50ms", "--trials", "2", "--rates", "50")
GOVERN = ("govern", "policy.yaml", *TWIN, "--rate-source", "file:rate", "--duration", "0.2", "--observe-only")
REPLAY = ("replay", "policy.yaml", *TWIN, "--trace", "trace.csv")
ROOF = ("roofline", "-m", "resnet50", *TWIN)
REPORT = ("report", "-m", "resnet50", *TWIN, "--modes", "MAXN", "--batch-sizes", "8")


@dataclass
class Case:
    cls: str
    name: str
    args: tuple[str, ...]
    setup: Callable[[Path], None] = lambda work: None
    expect: str = ""
    board: bool = False
    env: dict[str, str] = field(default_factory=dict)


# -- the work folder ---------------------------------------------------------------------------------------


def make_template(root: Path) -> Path:
    """Policy, rate, trace and a small twin study, copied into each case's work folder."""
    from tuner.devices.virtual.twin import TwinDevice
    from tuner.run_options import RunOptions
    from tuner.serve.policy import write_policy
    from tuner.study import run_study

    template = root / "template"
    template.mkdir()
    space = TwinDevice("sim:orin").space()
    policy = two_band_policy(space, model="resnet50", device="sim:orin", device_kind="orin-agx", twin=True)
    write_policy(policy, template / "policy.yaml")
    (template / "rate").write_text("50\n")
    (template / "trace.csv").write_text("t_s,rate_qps\n0,50\n60,150\n")
    opts = RunOptions(
        model="resnet50", max_latency_ms=50.0, trials=3, seed=1, sampler="random", out=template / "s", knobs=["gpu_mhz"]
    )
    run_study(TwinDevice("sim:orin"), opts)
    with contextlib.closing(sqlite3.connect(template / "s" / "tune.db")) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # every trial in tune.db itself, which the cases copy
    for name in ("tune.db-wal", "tune.db-shm"):
        (template / "s" / name).unlink(missing_ok=True)
    return template


def snapshot(root: Path) -> dict[str, tuple]:
    return {k: v for k, v in folder_state(root).items() if not k.endswith(("tune.db-wal", "tune.db-shm"))}


def contents(root: Path) -> dict[str, tuple]:
    """:func:`snapshot` without times: a log cut back to where it was holds the same bytes, at a new mtime."""
    return {k: (v[0], v[1], v[3]) if len(v) == 4 else v for k, v in snapshot(root).items()}


# -- case families -------------------------------------------------------------------------------------------

# (command, the path option, how the path is given: a file "F" or a folder "D", extra args)
WRITERS: list[tuple[str, tuple[str, ...], str, str]] = [
    ("run --out", RUN, "--out", "D"),
    ("run --storage", RUN, "--storage", "S"),
    ("sweep --out", SWEEP, "--out", "D"),
    ("export -o", (*EXPORT, "--out", "s"), "-o", "F"),
    ("plan -o", (*PLAN, "--out", "out"), "-o", "F"),
    ("plan --out", PLAN, "--out", "D"),
    ("govern --state-file", GOVERN, "--state-file", "F"),
    ("govern --log", GOVERN, "--log", "F"),
    ("replay --plot", REPLAY, "--plot", "F"),
    ("roofline --out", ROOF, "--out", "D"),
    ("report --out", REPORT, "--out", "D"),
]
# folders planted inside an --out folder the command writes its results under
RESULT_FOLDERS: list[tuple[str, tuple[str, ...], list[str]]] = [
    ("run", (*RUN, "--out", "out"), ["out/sim-orin", "out/sim-orin/resnet50"]),
    ("sweep", (*SWEEP, "--out", "out"), ["out/sim-orin", "out/sim-orin/resnet50"]),
    ("pareto", (*PARETO, "--out", "s"), ["s/sim-orin", "s/sim-orin/resnet50"]),
    ("roofline", (*ROOF, "--out", "out"), ["out/sim-orin", "out/sim-orin/resnet50"]),
]
SUFFIX = {"--state-file": "band.json", "--log": "switches.jsonl", "--plot": "replay.png", "-o": "best.yaml"}
COMPONENTS = ["a", "a/b", "a/b/c"]


def _target(option: str, kind: str) -> str:
    if kind == "D":
        return "a/b/c"
    if kind == "S":
        return "sqlite:///a/b/c/tune.db"
    return f"a/b/c/{SUFFIX[option]}"


def _plant_link(where: str, target: str) -> Callable[[Path], None]:
    def setup(work: Path) -> None:
        link = work / where
        link.parent.mkdir(parents=True, exist_ok=True)
        aim = {"root": work / "victim", "other": work / "open", "dangling": work / "victim" / "nothing"}[target]
        link.symlink_to(aim, target_is_directory=True)

    return setup


def _plant_folder(where: str, how: str) -> Callable[[Path], None]:
    def setup(work: Path) -> None:
        folder = work / where
        folder.mkdir(parents=True, exist_ok=True)
        mode, uid, gid = {
            "other-owned": (0o755, OTHER, OTHER),
            "world-writable": (0o777, 0, 0),
            "foreign-group-writable": (0o775, 0, OTHER),
            "other-sticky": (0o1777, OTHER, OTHER),
        }[how]
        os.chown(folder, uid, gid)
        folder.chmod(mode)

    return setup


def link_cases() -> list[Case]:
    cases = []
    for name, base, option, kind in WRITERS:
        for where in COMPONENTS:
            for target in ("root", "other", "dangling"):
                cases.append(
                    Case(
                        "link",
                        f"{name}: link at {where} -> {target}",
                        (*base, option, _target(option, kind)),
                        _plant_link(where, target),
                        "symbolic link",
                    )
                )
    for name, args, folders in RESULT_FOLDERS:
        for where in folders:
            for target in ("root", "other", "dangling"):
                cases.append(
                    Case(
                        "link",
                        f"{name}: link at {where} -> {target}",
                        args,
                        _plant_link(where, target),
                        "symbolic link",
                    )
                )
    return cases


def folder_cases() -> list[Case]:
    cases = []
    for name, base, option, kind in WRITERS:
        for where in ("a", "a/b"):
            for how in ("other-owned", "world-writable", "foreign-group-writable", "other-sticky"):
                cases.append(
                    Case(
                        "folder",
                        f"{name}: {where} {how}",
                        (*base, option, _target(option, kind)),
                        _plant_folder(where, how),
                        "refusing to write in the folder",
                    )
                )
    return cases


def _untrust(rel: str, how: str) -> Callable[[Path], None]:
    def setup(work: Path) -> None:
        path = work / rel
        if not path.exists():
            path.write_text("s3cret\n" if "token" in rel else "{}\n")
            path.chmod(0o600)
        uid, mode = {
            "other-owned": (OTHER, 0o644),
            "other-owned-0600": (OTHER, 0o600),
            "world-writable": (0, 0o666),
            "group-writable": (0, 0o664),
            "other-owned-0666": (OTHER, 0o666),
            "group-readable": (0, 0o640),
            "other-readable": (0, 0o604),
        }[how]
        os.chown(path, uid, uid)
        path.chmod(mode)

    return setup


TRUSTED_INPUTS: list[tuple[str, str, tuple[str, ...]]] = [
    ("govern policy", "policy.yaml", GOVERN),
    ("replay policy", "policy.yaml", REPLAY),
    ("pareto tune.db", "s/tune.db", (*PARETO, "--out", "s")),
    ("export tune.db", "s/tune.db", (*EXPORT, "--out", "s", "-o", "best.yaml")),
    ("status tune.db", "s/tune.db", ("status", "--out", "s")),
    ("status -m tune.db", "s/tune.db", ("status", "-m", "resnet50", *TWIN, "--out", "s")),
    ("run tune.db", "s/tune.db", (*RUN, "--out", "s")),
    ("plan tune.db", "s/tune.db", (*PLAN, "--out", "s", "-o", "p.yaml")),
    ("govern state file", "band.json", (*GOVERN, "--state-file", "band.json")),
]
TOKEN = ("meter-serve", "--meter", "py:fakemeter:ConstantMeter", "--listen", "127.0.0.1:0", "--token-file", "token")


def trust_cases() -> list[Case]:
    cases = []
    for name, rel, args in TRUSTED_INPUTS:
        for how in ("other-owned", "world-writable", "group-writable", "other-owned-0666"):
            cases.append(Case("trust", f"{name}: {how}", args, _untrust(rel, how), "cannot be trusted"))
    for how in (
        "other-owned",
        "other-owned-0600",
        "world-writable",
        "group-writable",
        "group-readable",
        "other-readable",
    ):
        cases.append(Case("trust", f"meter-serve token: {how}", TOKEN, _untrust("token", how), "cannot be trusted"))
    for how in ("other-owned", "world-writable", "group-writable", "other-owned-0666"):
        cases.append(
            Case(
                "trust",
                f"apply export: {how}",
                ("apply", "best.yaml"),
                _board_export(how),
                "cannot be trusted",
                board=True,
            )
        )
        cases.append(
            Case(
                "trust",
                f"govern board policy: {how}",
                ("govern", "board.yaml", "-d", "orin", "--rate-source", "file:rate", "--duration", "1"),
                _board_policy(how),
                "cannot be trusted",
                board=True,
            )
        )
        cases.append(
            Case(
                "trust",
                f"restore journal: {how}",
                ("restore",),
                _journal('{"version": 1}', how),
                "cannot be trusted",
                board=True,
            )
        )
    return cases


def _board_export(how: str | None) -> Callable[[Path], None]:
    def setup(work: Path) -> None:
        import yaml

        (work / "best.yaml").write_text(yaml.safe_dump(board_export()))
        if how is not None:
            _untrust("best.yaml", how)(work)

    return setup


def _board_policy(how: str) -> Callable[[Path], None]:
    def setup(work: Path) -> None:
        from tuner.devices.registry import open_device
        from tuner.serve.policy import write_policy

        space = open_device("orin").space()
        write_policy(
            two_band_policy(space, model="resnet50", device="orin", device_kind="orin-agx", twin=False),
            work / "board.yaml",
        )
        _untrust("board.yaml", how)(work)

    return setup


def _journal(text: str, how: str | None) -> Callable[[Path], None]:
    def setup(work: Path) -> None:
        folder = work / "state" / "journal"
        folder.mkdir(parents=True, mode=0o700)
        (work / "state").chmod(0o700)
        (folder / "orin.json").write_text(text)
        (folder / "orin.json").chmod(0o600)
        if how is not None:
            _untrust("state/journal/orin.json", how)(work)

    return setup


HOSTILE_STATES = {
    "pid 1e999": '{"pid": 1e999, "running": true, "stale_after": 0}',
    "pid -1e999": '{"pid": -1e999, "running": true, "stale_after": 0}',
    "pid 2**70": '{"pid": ' + str(2**70) + ', "running": true, "stale_after": 0}',
    "pid 2**64": '{"pid": ' + str(2**64) + ', "running": true, "stale_after": 0}',
    "pid 10**4000": '{"pid": 1' + "0" * 4000 + ', "running": true}',
    "pid NaN": '{"pid": NaN, "running": true}',
    "pid Infinity": '{"pid": Infinity, "running": true}',
    "pid string": '{"pid": "1", "running": true, "stale_after": 0}',
    "pid list": '{"pid": [1], "running": true, "stale_after": 0}',
    "pid huge": '{"pid": 99999999999, "running": true, "stale_after": 0}',
    "stale_after 1e400": '{"pid": 1, "running": true, "stale_after": 1e400}',
    "stale_after string": '{"pid": 1, "running": true, "stale_after": "x"}',
    "nested 100k lists": "[" * 100_000 + "]" * 100_000,
    "nested 200k open": "[" * 200_000,
    "nested objects": '{"a":' * 50_000 + "1" + "}" * 50_000,
    "nested in a key": '{"pid": 1, "x": ' + "[" * 5_000 + "]" * 5_000 + "}",
    "a list": "[1, 2]",
    "a number": "7",
    "not json": "{pid: 1",
    "binary": "\x00\x01\x02\xff",
    "empty": "",
}
HOSTILE_JOURNALS = {
    "nested": "[" * 100_000,
    "nested objects": '{"a":' * 50_000 + "1" + "}" * 50_000,
    "pid 2**70": '{"version": 1, "device": "orin", "kind": "orin-agx", "pid": '
    + str(2**70)
    + ', "written_at": 0, "state": {}}',
    "written_at 1e999": '{"version": 1, "device": "orin", "kind": "orin-agx", "pid": 1, "written_at": 1e999, '
    '"state": {}}',
    "state 70 deep": '{"version": 1, "device": "orin", "kind": "orin-agx", "pid": 1, "written_at": 0, "state": '
    + '{"a":' * 70
    + "1"
    + "}" * 70
    + "}",
    "NaN": '{"version": 1, "device": "orin", "kind": "orin-agx", "pid": NaN, "written_at": 0, "state": {}}',
}
SPECIAL_STORAGES = [
    "sqlite:////proc/tune.db",
    "sqlite:////proc/self/tune.db",
    "sqlite:////sys/tune.db",
    "sqlite:////dev/null",
]


def _write(rel: str, text: str) -> Callable[[Path], None]:
    def setup(work: Path) -> None:
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        (work / rel).write_bytes(text.encode("latin-1", errors="replace"))

    return setup


def hostile_cases() -> list[Case]:
    cases = []
    for name, text in HOSTILE_STATES.items():
        cases.append(
            Case("hostile", f"govern state: {name}", (*GOVERN, "--state-file", "band.json"), _write("band.json", text))
        )
    for name, text in HOSTILE_JOURNALS.items():
        for args in (("restore",), ("restore", "-d", "orin"), ("apply", "best.yaml")):
            setup = _both(_journal(text, None), _board_export(None))
            cases.append(Case("hostile", f"{' '.join(args[:2])} journal: {name}", args, setup, "journal", board=True))
    for storage in SPECIAL_STORAGES:
        for base in (RUN, PLAN, PARETO, EXPORT, ("status",)):
            cases.append(Case("hostile", f"{base[0]} --storage {storage}", (*base, "--storage", storage)))
    for content, label in (
        (b"", "empty"),
        (b"not sqlite\n", "garbage"),
        (b"SQLite format 3\x00" + b"\x00" * 84, "cut header"),
    ):
        for base in ((*PARETO, "--out", "e"), (*EXPORT, "--out", "e", "-o", "b.yaml"), ("status", "--out", "e")):
            cases.append(Case("hostile", f"{base[0]} on a {label} tune.db", base, _write_bytes("e/tune.db", content)))
    return cases


def _write_bytes(rel: str, data: bytes) -> Callable[[Path], None]:
    def setup(work: Path) -> None:
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        (work / rel).write_bytes(data)

    return setup


def _both(*steps: Callable[[Path], None]) -> Callable[[Path], None]:
    def setup(work: Path) -> None:
        for step in steps:
            step(work)

    return setup


@contextlib.contextmanager
def full_disk(work: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs under ``work/full``: an old export and a log filling its page, then filled to the last byte."""
    mount = work / "full"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,mode=0755", "tmpfs", str(mount)], check=True)
    try:
        (mount / "best.yaml").write_text("old export\n")
        line = '{"old": 1}\n'
        (mount / "switches.jsonl").write_text(line * (4096 // len(line)) + "x" * (4096 % len(line) - 1) + "\n")
        with contextlib.suppress(OSError), open(mount / "filler", "wb") as fh:
            while True:
                fh.write(b"\0" * 4096)
                fh.flush()
        with contextlib.suppress(OSError), open(mount / "filler", "ab") as fh:
            while True:
                fh.write(b"\0")
                fh.flush()
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=False)


DISK_CASES = [
    (
        "govern --log",
        (
            "govern",
            "policy.yaml",
            *TWIN,
            "--rate-source",
            "file:rate",
            "--duration",
            "0.2",
            "--observe-only",
            "--log",
            "full/switches.jsonl",
        ),
    ),
    ("export -o", (*EXPORT, "--out", "s", "-o", "full/best.yaml")),
    ("run --out", (*RUN, "--out", "full/s")),
    ("plan -o", (*PLAN, "--out", "out", "-o", "full/policy.yaml")),
    ("replay --plot", (*REPLAY, "--plot", "full/replay.png")),
]


def can_mount() -> bool:
    with tempfile.TemporaryDirectory() as folder:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs", folder], capture_output=True)
        if done.returncode == 0:
            subprocess.run(["umount", folder], check=False)
            return True
    return False


# -- running -------------------------------------------------------------------------------------------------


def in_process(args: tuple[str, ...]) -> tuple[int, str]:
    from tuner.cli import main

    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        try:
            main(list(args))
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException as exc:  # a crash is a failed case, reported as such
            return 1, f"Traceback: {type(exc).__name__}: {exc}"
    return code, err.getvalue()


def verdict(code: int, err: str, expect: str) -> str | None:
    errors = [line for line in err.strip().splitlines() if line.startswith("error: ")]
    if "Traceback" in err:
        return "traceback: " + err.strip().splitlines()[-1][:200]
    if code != 2:
        return f"exit {code}: {err.strip()[-200:]}"
    if len(errors) != 1:
        return f"{len(errors)} error lines: {err.strip()[-200:]}"
    if expect and expect not in errors[0]:
        return f"message lacks {expect!r}: {errors[0][:200]}"
    return None


def run_case(case: Case, template: Path, root: Path, board_env: dict[str, str], board) -> tuple[bool, str]:
    work = Path(tempfile.mkdtemp(dir=root))
    shutil.copytree(template, work, dirs_exist_ok=True)
    for name in ("victim", "open"):
        (work / name).mkdir()
        (work / name / "precious").write_text("precious\n")
    (work / "victim").chmod(0o700)
    os.chown(work / "open", OTHER, OTHER)
    (work / "open").chmod(0o777)
    env = {"TUNE_STATE_DIR": str(work / "state"), **case.env}
    if case.board:  # the setup reads the board's space in this process
        env.update({k: v for k, v in board_env.items() if k != "PYTHONPATH"})
    old_env = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    cwd = os.getcwd()
    os.chdir(work)
    try:
        case.setup(work)
        before = snapshot(work)
        original = board.snapshot() if case.board else None
        if case.board:
            done = subprocess.run(
                [sys.executable, "-m", "tuner", *case.args],
                cwd=work,
                env={**os.environ, **board_env, **env, "COLUMNS": "200"},
                capture_output=True,
                text=True,
                timeout=300,
            )
            code, err = done.returncode, done.stderr
        else:
            code, err = in_process(case.args)
        problem = verdict(code, err, case.expect)
        if problem is None and snapshot(work) != before:
            changed = sorted(set(snapshot(work).items()) ^ set(before.items()))
            problem = f"wrote: {[c[0] for c in changed][:5]}"
        if problem is None and case.board and board.snapshot() != original:
            problem = "the board changed"
        return problem is None, problem or ""
    finally:
        os.chdir(cwd)
        for key, value in old_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        shutil.rmtree(work, ignore_errors=True)


def run_disk_cases(template: Path, root: Path) -> list[dict]:
    results = []
    for name, args in DISK_CASES:
        work = Path(tempfile.mkdtemp(dir=root))
        shutil.copytree(template, work, dirs_exist_ok=True)
        os.environ["TUNE_STATE_DIR"] = str(work / "state")
        cwd = os.getcwd()
        os.chdir(work)
        try:
            with full_disk(work) as mount:
                before = contents(mount)
                done = subprocess.run(
                    [sys.executable, "-m", "tuner", *args], cwd=work, capture_output=True, text=True, timeout=300
                )
                code, err = done.returncode, done.stderr
                problem = verdict(code, err, "")
                after = contents(mount)
                if problem is None and after != before:
                    problem = f"the full disk changed: {sorted(set(after.items()) ^ set(before.items()))}"
        finally:
            os.chdir(cwd)
            shutil.rmtree(work, ignore_errors=True)
        if problem is not None:
            print(f"FAIL [disk] {name} on a full disk: {problem}", flush=True)
        results.append(
            {"class": "disk", "case": f"{name} on a full disk", "passed": problem is None, "why": problem or ""}
        )
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    parser.add_argument("--only", help="run only the cases whose class or name contains this")
    parsed = parser.parse_args()
    if os.geteuid() != 0:
        print("run as root: the probe plants files as another user (chown)", file=sys.stderr)
        return 2
    started = time.monotonic()
    root = Path(tempfile.mkdtemp(prefix="probe-files-"))
    try:
        template = make_template(root)
        board = make_fake_board(root / "board", "orin-agx", "l4t36", seed=1)
        board_env = board.env()
        cases = [*link_cases(), *folder_cases(), *trust_cases(), *hostile_cases()]
        if parsed.only:
            cases = [c for c in cases if parsed.only in c.cls or parsed.only in c.name]
        results = []
        for number, case in enumerate(cases, 1):
            passed, why = run_case(case, template, root, board_env, board)
            results.append({"class": case.cls, "case": case.name, "passed": passed, "why": why})
            if not passed:
                print(f"FAIL [{case.cls}] {case.name}: {why}", flush=True)
            if number % 50 == 0:
                print(f"{number}/{len(cases)} cases", file=sys.stderr, flush=True)
        if (not parsed.only or "disk" in parsed.only) and can_mount():
            results += run_disk_cases(template, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    by_class: dict[str, list[int]] = {}
    for r in results:
        by_class.setdefault(r["class"], [0, 0])[0 if r["passed"] else 1] += 1
    for cls, (ok, bad) in by_class.items():
        print(f"{cls:8s} {ok:4d} passed {bad:4d} failed")
    total_ok = sum(ok for ok, _ in by_class.values())
    print(f"total    {total_ok:4d} passed {len(results) - total_ok:4d} failed ({time.monotonic() - started:.0f} s)")
    if parsed.out:
        payload = {
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "machine": f"{platform.machine()}, {os.cpu_count()} cores, python {platform.python_version()}",
            "command": " ".join(["python", "benchmarks/probe_files.py", *sys.argv[1:]]),
            "counts": {cls: {"passed": ok, "failed": bad} for cls, (ok, bad) in by_class.items()},
            "cases": results,
        }
        parsed.out.write_text(json.dumps(payload, indent=1) + "\n")
    return 0 if total_ok == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
