"""``python -m pisub``."""

from pisub.cli.entry import main

main()
