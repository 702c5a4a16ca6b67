"""``python -m tuner`` is the same as the ``tune`` console script."""

from tuner.cli import main

main()
