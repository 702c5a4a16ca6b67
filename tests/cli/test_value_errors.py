"""Values at the door: every numeric option is checked for range and finiteness before a command writes anything.

Each row is a command line that used to get past the option parsing (a
traceback from numpy's seeding after tune.db was written, a MemoryError from a
billion boards, a NaN batching timeout taken as is, an inverted window, a
database under /proc). Each must now exit 2 with one line naming the fix,
and leave the folder it ran in byte-identical. The checks live in one place
(tuner.cli.options.CheckedCommand and the validators of tuner.plumbing.units), so a
command that declares the option again gets them too: the table spans commands.
"""

from __future__ import annotations

import pytest
from clirun import folder_state, in_process

from tuner.cli.options import CheckedCommand
from tuner.cli.root import COMMANDS, app
from tuner.devices.virtual.generated import board_seeds
from tuner.errors import UserError
from tuner.measure.settings import WindowSettings
from tuner.plumbing.units import check_rate, check_seed
from tuner.scenario import window_for

RUN = ("run", "-m", "tiny-cnn", "-d", "sim:orin", "-l", "50ms", "-n", "2")
MEASURE = ("measure", "-m", "tiny-cnn", "-d", "sim:orin", "-b", "1")
SERVER = (*MEASURE, "--scenario", "server")
PLAN = ("plan", "-m", "tiny-cnn", "-d", "sim:orin", "-l", "50ms", "--rates", "10,20", "-n", "2")

ROWS: list[tuple[tuple[str, ...], str]] = [
    ((*RUN, "--seed", "-1"), "--seed must be an integer from 0 to 4294967295"),
    ((*RUN, "--seed", "4294967296"), "--seed must be an integer from 0 to 4294967295"),
    ((*PLAN, "--seed", "4294967296"), "--seed must be an integer from 0"),
    (("sweep", "-m", "tiny-cnn", "-d", "sim:orin", "--seed", "-5"), "--seed must be an integer from 0"),
    ((*MEASURE, "--seed", "99999999999"), "--seed must be an integer from 0"),
    (("roofline", "-m", "tiny-cnn", "-d", "sim:orin", "--seed", "-1"), "--seed must be an integer from 0"),
    (("report", "-m", "tiny-cnn", "-d", "sim:orin", "--seed", "4294967296"), "--seed must be an integer from 0"),
    (("replay", "policy.yaml", "--trace", "diurnal", "-d", "sim:orin", "--seed", "-1"), "--seed must be an integer"),
    ((*SERVER, "--target-qps", "inf"), "--target-qps must be a finite number"),
    ((*SERVER, "--target-qps", "nan"), "--target-qps must be a finite number"),
    ((*SERVER, "--target-qps", "1e308"), "--target-qps 1e+308 q/s is outside 0.01 to 100000"),
    ((*SERVER, "--target-qps", "1e9"), "--target-qps 1e+09 q/s is outside"),
    ((*SERVER, "--target-qps", "-3"), "--target-qps -3 q/s is outside"),
    ((*RUN, "--scenario", "server", "--target-qps", "1e308"), "--target-qps 1e+308 q/s is outside"),
    ((*SERVER, "--target-qps", "10", "--batch-timeout", "nan"), "--batch-timeout must be a finite number"),
    ((*SERVER, "--target-qps", "10", "--batch-timeout", "1e12"), "--batch-timeout must be a number from 0 to 60000"),
    ((*SERVER, "--target-qps", "10", "--batch-timeout", "-1"), "--batch-timeout must be a number from 0"),
    ((*MEASURE, "--min-window", "5", "--window", "1"), "--min-window 5 is longer than --window 1"),
    ((*RUN, "--min-window", "20"), "--min-window 20 is longer than --window 10"),
    (("bench", "--judge-boards", "5-1"), "board seeds '5-1': write LOW-HIGH with 0 <= LOW <= HIGH"),
    (("bench", "--tune-boards", "0-1000000000"), "name more than 10000 boards"),
    (("bench", "--tune-boards", "0-99999999999999999999"), "board seeds"),
    (("bench", "--judge-boards", "1,2,-3"), "cannot read board seeds"),
    ((*RUN, "--storage", "sqlite:////proc/tune.db"), "/proc holds the kernel's files, not a database"),
    ((*RUN, "--storage", "sqlite:////sys/tune.db"), "/sys holds the kernel's files"),
]


@pytest.fixture
def folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TUNE_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.delenv("TUNE_SYSFS_ROOT", raising=False)
    return tmp_path


@pytest.mark.parametrize(("args", "fix"), ROWS, ids=[" ".join(r[0])[-50:] for r in ROWS])
def test_a_value_out_of_range_is_one_line_exit_2_and_nothing_written(folder, args, fix):
    before = folder_state(folder)
    code, _, err = in_process(*args)
    lines = err.strip().splitlines()
    assert code == 2, (args, err[-2000:])
    assert len(lines) == 1 and lines[0].startswith("error: ") and fix in lines[0], (args, err[-2000:])
    assert folder_state(folder) == before, f"{args} wrote something"


def test_every_command_checks_its_values_in_the_one_place():
    import typer

    group = typer.main.get_command(app)
    assert set(group.commands) == set(COMMANDS)
    assert all(isinstance(command, CheckedCommand) for command in group.commands.values())


@pytest.mark.parametrize(
    ("call", "fix"),
    [
        (lambda: check_seed(-1), "from 0 to 4294967295"),
        (lambda: check_seed(2**32), "from 0 to 4294967295"),
        (lambda: check_rate(float("nan")), "outside"),
        (lambda: check_rate(0.0), "outside"),
        (lambda: board_seeds("3-1"), "LOW <= HIGH"),
        (lambda: board_seeds("0-4294967296"), "HIGH <= 4294967295"),
        (lambda: board_seeds("0-9999,10000-20000"), "more than 10000 boards"),
        (lambda: window_for(WindowSettings(window_s=1.0), "server", float("inf")), "outside"),
    ],
)
def test_the_library_validators_refuse_the_same_values(call, fix):
    with pytest.raises(UserError, match=fix):
        call()


def test_values_in_range_still_pass():
    assert check_seed(0) == 0 and check_seed(2**32 - 1) == 2**32 - 1 and check_seed(None) is None
    assert check_rate(300) == 300.0
    assert board_seeds("0-2,5") == [0, 1, 2, 5]
