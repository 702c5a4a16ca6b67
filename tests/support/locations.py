"""Where the tests' folders are, for paths a test hands to a child process or reads from the repository.

One place for them, so a test file moved to a deeper folder needs no ``parents[N]`` of its own.
"""

from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]  # tests/
REPO = TESTS.parent  # the checkout: tuner/, runners/, studies/, search_spaces/
FAKES = TESTS / "fakes"  # fake boards, drivers, meters and hostile peers (importable as top-level modules)
SUPPORT = TESTS / "support"  # helpers and the scripts tests run as child processes
