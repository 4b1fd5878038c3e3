"""The console script's former entry (``pisub.cli.entry:main``), kept for scripts installed
before it moved to :mod:`pisub.__main__`: importing it imports the ``pisub.cli`` package first,
so a launch's warm runner starts later than through the new entry."""

from __future__ import annotations

from pisub.__main__ import LAUNCHING, main
from pisub.__main__ import launching as _launching

__all__ = ["LAUNCHING", "_launching", "main"]
