"""``python -m pisub``."""

from pisub.cli import main

main()
