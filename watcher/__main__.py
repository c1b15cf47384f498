"""`python -m watcher ...`: the watcher without the rest of the CLI (the lab starts it so)."""

from watcher.cli import main

main()
