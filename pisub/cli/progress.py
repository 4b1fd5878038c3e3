"""Progress of long commands (``gc`` over many runs, ``wait --all``) on a terminal.

A bar on stderr, drawn by ``rich``, only when stderr is a terminal: piped, redirected or in
a script, the command prints exactly what it printed before (nothing on stderr).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

Update = Callable[[str, int, int], None]
"""``(what, done, total)``: ``what`` names the phase (``checking runs``, ``runs ended``)."""


@contextmanager
def progress() -> Iterator[Update | None]:
    """A callback drawing a bar (None when stderr is not a terminal: the caller reports nothing)."""
    if not sys.stderr.isatty():
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    bar = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    )
    tasks: dict[str, Any] = {}

    def update(what: str, done: int, total: int) -> None:
        if what not in tasks:
            tasks[what] = bar.add_task(what, total=total)
        bar.update(tasks[what], completed=done, total=total)

    with bar:
        yield update
