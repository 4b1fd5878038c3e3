"""``python -m pisub``."""

from pisub.entry import main

main()
