"""``python -m tuner`` is the same as the ``tune`` console script."""

from tuner.launch import main

main()
