"""``tune --version`` and ``tune --help`` answer without importing the heavy libraries; other
commands import their own module only (no plotting, no twins where none is used)."""

import json
import subprocess
import sys
from pathlib import Path

import typer.main

from tuner import __version__
from tuner.cli import app
from tuner.cli.catalog import COMMANDS, SUMMARY, root_help

HEAVY = ("optuna", "numpy", "typer", "click", "rich", "pydantic", "yaml", "torch", "scipy", "matplotlib")
EXTRAS = ("matplotlib", "PIL", "torch", "onnxruntime", "scipy", "psycopg", "optuna_dashboard")
# What ``tune status`` has no use for: the twins, Jetson boards, serving policies, reports, other commands,
# the search loop (tuner.study, its samplers, strategies and objective), exports and Pareto fronts.
UNUSED_BY_STATUS = (
    "tuner.devices.virtual",
    "tuner.devices.jetson",
    "tuner.serve",
    "tuner.report",
    "tuner.cli.serve",
    "tuner.cli.results",
    "tuner.study",
    "tuner.sampling",
    "tuner.strategies",
    "tuner.objective",
    "tuner.deploy",
    "tuner.pareto",
)


def _imported(*args: str) -> tuple[str, set[str]]:
    """stdout of ``python -X importtime -m tuner ARGS`` and the top-level packages it imported."""
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "tuner", *args], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    names = {line.split("|")[-1].strip().split(".")[0] for line in proc.stderr.splitlines() if "import time:" in line}
    return proc.stdout, names


def test_version_imports_nothing_heavy():
    out, names = _imported("--version")
    assert out.strip() == f"powertune {__version__}"
    assert not names & set(HEAVY), sorted(names & set(HEAVY))


def test_help_lists_every_command_and_imports_nothing_heavy():
    out, names = _imported("--help")
    assert not names & set(HEAVY), sorted(names & set(HEAVY))
    for name, _ in COMMANDS:
        assert f"\n  {name} " in out
    assert "Usage: tune [OPTIONS] COMMAND" in out


def test_the_catalog_is_the_registered_commands_with_their_docstrings():
    group = typer.main.get_command(app)
    registered = [(name, " ".join((cmd.help or "").split("\n\n")[0].split())) for name, cmd in group.commands.items()]
    assert list(COMMANDS) == registered, "tuner/cli/catalog.py must list every command with its docstring's summary"
    assert " ".join((group.help or "").split()) == SUMMARY


def test_help_wraps_summaries_instead_of_cutting_them():
    text = root_help(width=80)
    assert all(len(line) <= 80 for line in text.splitlines())
    flat = " ".join(text.split())
    for _, summary in COMMANDS:
        assert summary in flat


def _modules_after(code: str, cwd: Path) -> tuple[str, set[str]]:
    """The last line CODE prints and every module imported by then, in a fresh interpreter in CWD."""
    script = f"import json, sys\n{code}\nprint(json.dumps(sorted(sys.modules)))"
    proc = subprocess.run([sys.executable, "-c", script], cwd=cwd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    *said, modules = proc.stdout.strip().splitlines()
    return "\n".join(said), set(json.loads(modules))


def test_importing_the_cli_imports_no_command_and_no_library(tmp_path):
    _, modules = _modules_after("import tuner.cli.root", tmp_path)
    assert not {m.split(".")[0] for m in modules} & (set(HEAVY) - {"typer", "click"})
    commands = sorted(m for m in modules if m.startswith("tuner.cli.") and m != "tuner.cli.root")
    assert not commands, f"tuner.cli.root imported command modules: {commands}"


def _status_modules(cwd: Path, *args: str) -> tuple[str, set[str]]:
    run_status = (
        f"sys.argv = ['tune', 'status', *{list(args)!r}]\n"
        "from tuner.launch import main\n"
        "try:\n    main()\nexcept SystemExit as exc:\n    print('exit', exc.code or 0)\nelse:\n    print('exit', 0)"
    )
    return _modules_after(run_status, cwd)


def _unused(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if m.startswith(UNUSED_BY_STATUS) or m.split(".")[0] in EXTRAS)


def test_status_imports_neither_plotting_nor_extras_nor_the_twins_nor_the_search(tmp_path):
    said, modules = _status_modules(tmp_path)
    assert said.endswith("exit 2")  # no study here: the one-line error, after the command's imports
    assert "tuner.cli.fleet" in modules and "optuna" in modules
    assert not _unused(modules), f"tune status imported {_unused(modules)}"


def test_status_of_one_study_reads_it_without_the_search_machinery(tmp_path):
    from tuner.study import open_study

    study = open_study("resnet50-sim-orin", f"sqlite:///{tmp_path / 'studies' / 'tune.db'}")
    for key, value in {"model": "resnet50", "device": "sim:orin", "device_slug": "sim-orin"}.items():
        study.set_user_attr(key, value)
    said, modules = _status_modules(tmp_path, "-m", "resnet50", "-d", "sim-orin", "--json")
    assert said.endswith("exit 0"), said
    assert json.loads(said.rsplit("\n", 1)[0])["studies"][0]["study"] == "resnet50-sim-orin"
    assert "tuner.lookup" in modules
    assert not _unused(modules), f"tune status -m -d imported {_unused(modules)}"
