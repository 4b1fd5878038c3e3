"""The runner's duties to the processes below it: it is their subreaper.

:class:`Subreaper` is what a real runner does — reap the orphans it adopts, and end every
process left of its child (its group and every descendant). Tests that run a supervisor
in-process with a scripted child use :class:`~pisub.testing.scripted_child.NoProcesses`, so
that nothing touches the test process's own children.
"""

from __future__ import annotations

import os
from typing import Protocol

from pisub.procs import descendants, kill_all, reap_adopted


class ProcessTree(Protocol):
    """The processes below the runner."""

    def reap(self, keep: int | None) -> None:
        """Reap exited orphans, except ``keep`` (the child, reaped by its own handle)."""

    def end_leftovers(self, group: int | None, grace: float) -> tuple[list[int], list[int]] | None:
        """End the child's group and every descendant left (TERM, ``grace``, KILL); the pids
        found and those that survived, or None when nothing was left."""


class Subreaper:
    """The real runner's tree (it made itself the child subreaper at start)."""

    def reap(self, keep: int | None) -> None:
        reap_adopted(keep)

    def end_leftovers(self, group: int | None, grace: float) -> tuple[list[int], list[int]] | None:
        strays = descendants(os.getpid())
        found = None
        if strays or (group is not None and _group_alive(group)):
            found = strays, kill_all(strays, pgids=[group] if group else [], grace=grace)
        reap_adopted(None)
        return found


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True
