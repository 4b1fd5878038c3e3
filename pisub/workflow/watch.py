"""Noticing changes in the workflow's child runs: one inotify descriptor for all of them.

Each live child gets two watches — its run directory (``status.json`` and ``result.json`` are
replaced by rename) and its outbox (receipts of forwarded requests). Events are hints, as for
the inbox: the coordinator re-reads the files of a child it is told about, and checks every
live child on a slower poll anyway (a child runner killed -9 writes nothing; a reader's check
repairs its run). Without inotify, the poll is all there is, and it is faster.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

POLL_WITH_INOTIFY_S = 1.0
POLL_WITHOUT_INOTIFY_S = 0.2

_MASK = 0x00000080 | 0x00000008  # IN_MOVED_TO | IN_CLOSE_WRITE


class ChildWatch:
    """inotify watches on child runs; :meth:`changed` says which children something happened to."""

    def __init__(self) -> None:
        self._inotify: Any = None
        self._owner: dict[int, tuple[str, bool]] = {}
        """Watch descriptor → the child's run id, and whether it watches the outbox."""
        self._watches: dict[str, list[int]] = {}
        self.reason: str | None = None
        try:
            from inotify_simple import INotify

            self._inotify = INotify(nonblocking=True)
        except (ImportError, OSError) as exc:
            self.reason = f"inotify unavailable: {getattr(exc, 'strerror', None) or exc}"

    @property
    def fd(self) -> int | None:
        """The descriptor to select on, or None when polling."""
        return self._inotify.fileno() if self._inotify is not None else None

    @property
    def poll_interval(self) -> float:
        return POLL_WITH_INOTIFY_S if self._inotify is not None else POLL_WITHOUT_INOTIFY_S

    def add(self, run_id: str, run_dir: Path) -> None:
        """Watch a child's run directory and outbox (best effort: the poll covers a failure)."""
        if self._inotify is None or run_id in self._watches:
            return
        wds = []
        for path, outbox in ((run_dir, False), (run_dir / "outbox", True)):
            try:
                wd = self._inotify.add_watch(os.fspath(path), _MASK | 0x02000000)  # IN_DONT_FOLLOW
            except OSError:
                continue
            self._owner[wd] = (run_id, outbox)
            wds.append(wd)
        self._watches[run_id] = wds

    def remove(self, run_id: str) -> None:
        for wd in self._watches.pop(run_id, []):
            self._owner.pop(wd, None)
            if self._inotify is not None:
                with contextlib.suppress(OSError):
                    self._inotify.rm_watch(wd)

    def changed(self) -> tuple[set[str], set[str]]:
        """The run ids of the children something happened to since the last call: those whose
        run directory changed (status, result), and those with only new receipts."""
        if self._inotify is None:
            return set(), set()
        runs: set[str] = set()
        receipts: set[str] = set()
        try:
            events = self._inotify.read(timeout=0)
        except (BlockingIOError, OSError):
            return runs, receipts
        for event in events:
            if event.mask & 0x00004000:  # IN_Q_OVERFLOW: events were lost, look at everyone
                return set(self._watches), set()
            owner = self._owner.get(event.wd)
            if owner is not None:
                (receipts if owner[1] else runs).add(owner[0])
        return runs, receipts - runs

    def close(self) -> None:
        if self._inotify is not None:
            with contextlib.suppress(OSError):
                self._inotify.close()
            self._inotify = None
