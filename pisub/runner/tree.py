"""The runner's duties to the processes below it: it is their subreaper.

:class:`Subreaper` is what a real runner does — reap the orphans it adopts, and end every
process left of its child (its group and every descendant). Tests that run a supervisor
in-process with a scripted child use :class:`~pisub.testing.scripted_child.NoProcesses`, so
that nothing touches the test process's own children.
"""

from __future__ import annotations

import os
from collections.abc import Collection
from pathlib import Path
from typing import Protocol

from pisub.core.procs import cwd_of, environ_value, kill_all, reap_adopted
from pisub.protocol.env import ENV_RUNNER
from pisub.store.paths import is_run_id


class ProcessTree(Protocol):
    """The processes below the runner."""

    def reap(self, keep: int | None) -> None:
        """Reap exited orphans, except ``keep`` (the child, reaped by its own handle)."""

    def end_leftovers(self, group: int | None, grace: float) -> tuple[list[int], list[int]] | None:
        """End the child's group and every descendant left (TERM, ``grace``, KILL); the pids
        found and those that survived, or None when nothing was left."""


class Subreaper:
    """The real runner's tree (it made itself the child subreaper at start).

    A run started from inside this run — by the child (a pi that runs ``pisub run``) or by a
    workflow's coordinator — has its own runner, which the kernel re-parents to this one. It is
    not a leftover: it supervises its own child and ends on its own terms. It is recognised by
    its ``PISUB_RUNNER`` marker or its working directory (a run directory), checked against its
    run's files (that run's status names that pid, and this run as its parent), and spared with
    everything below it.
    """

    def __init__(self, run_id: str | None = None, runs: Path | None = None) -> None:
        self.run_id = run_id
        self.runs = runs

    def reap(self, keep: int | None) -> None:
        reap_adopted(keep)

    def end_leftovers(self, group: int | None, grace: float) -> tuple[list[int], list[int]] | None:
        strays = self.strays()
        found = None
        if strays or (group is not None and _group_alive(group)):
            found = strays, kill_all(strays, pgids=[group] if group else [], grace=grace)
        reap_adopted(None)
        return found

    def strays(self, spare: Collection[int] = ()) -> list[int]:
        """Every live descendant, except the runners of this run's child runs and their trees
        (and ``spare``, with theirs: runners known to have ended their runs). The tree is read in
        one pass over ``/proc`` (not one per process found, which is what a kernel without
        ``/proc/PID/task/TID/children`` costs psutil). A process already exiting is no stray:
        it cannot be ended any more, and a runner that is exiting no longer shows what run it
        is (its environment and working directory are gone from ``/proc``) — what it leaves
        below it is still looked at."""
        below, exiting = process_tree()
        found: list[int] = []
        todo = list(below.get(os.getpid(), ()))
        while todo:
            pid = todo.pop()
            if pid in spare or (pid not in exiting and self._is_child_runner(pid)):
                continue
            if pid not in exiting:
                found.append(pid)
            todo += below.get(pid, ())
        return found

    def _is_child_runner(self, pid: int) -> bool:
        if self.run_id is None or self.runs is None:
            return False
        return any(self._runs_child(pid, other) for other in _claimed_runs(pid) - {self.run_id})

    def _runs_child(self, pid: int, other: str) -> bool:
        """``pid`` is the runner of run ``other``, a child run of this one."""
        from pisub.errors import PisubError
        from pisub.protocol.status import RunState
        from pisub.store.paths import RunPaths
        from pisub.store.runs import load_manifest, load_status

        assert self.runs is not None
        paths = RunPaths(self.runs / other)
        try:
            manifest = load_manifest(paths)
            status = load_status(paths)
        except PisubError:
            return False
        if manifest.parent_run_id != self.run_id:
            return False
        # Before its startup commit a new runner's status has no pid yet; a process that says it
        # runs this run (its marker or its working directory) is spared then too: ending it would
        # kill a launch that is about to commit (the launcher, if it is this run's, still ends).
        return status.pid == pid or status.state is RunState.STARTING


PF_EXITING = 0x4
"""The kernel's flag (in ``/proc/PID/stat``) of a process that is exiting."""


def process_tree() -> tuple[dict[int, list[int]], set[int]]:
    """Every live process's children by parent pid, and the pids of those already exiting,
    from one pass over ``/proc`` (zombies are left out)."""
    found: dict[int, list[int]] = {}
    exiting: set[int] = set()
    try:
        names = os.listdir("/proc")
    except OSError:
        return found, exiting
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[1].split()
            state, parent, flags = fields[0], int(fields[1]), int(fields[6])
        except (OSError, IndexError, ValueError):
            continue
        if state in (b"Z", b"X"):
            continue
        found.setdefault(parent, []).append(int(name))
        if flags & PF_EXITING:
            exiting.add(int(name))
    return found, exiting


def _claimed_runs(pid: int) -> set[str]:
    """The run ids ``pid`` says it runs: its ``PISUB_RUNNER`` marker (a cold start's), and the
    run directory it works in (a warm runner is handed its run after it started, so its
    starting environment has no marker)."""
    claimed = {environ_value(pid, ENV_RUNNER) or "", os.path.basename(cwd_of(pid) or "")}
    return {run for run in claimed if is_run_id(run)}


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True
