"""``tune --version`` and ``tune --help`` answer without importing the heavy libraries."""

import subprocess
import sys

import typer.main

from tuner import __version__
from tuner.cli import app
from tuner.cli.catalog import COMMANDS, SUMMARY, root_help

HEAVY = ("optuna", "numpy", "typer", "click", "rich", "pydantic", "yaml", "torch", "scipy", "matplotlib")


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
