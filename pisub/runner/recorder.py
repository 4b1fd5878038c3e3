"""The runner's single writer of ``status.json`` and ``events.jsonl``.

State changes are written at once; activity-only changes (timestamps, byte counts)
are coalesced and written at most every :data:`~pisub.defaults.STATUS_COALESCE_S`.
"""

from __future__ import annotations

import time

from pisub.defaults import STATUS_COALESCE_S
from pisub.fsio import JsonlAppender
from pisub.paths import RunPaths
from pisub.protocol.codec import encode, now_iso
from pisub.protocol.events import Event
from pisub.protocol.status import Status, StepStatus
from pisub.store import write_status


class Recorder:
    """Holds the live :class:`Status` and writes it and the event log."""

    def __init__(self, paths: RunPaths, status: Status) -> None:
        self.paths = paths
        self.status = status
        self._events = JsonlAppender(paths.events)
        self._dirty = False
        self._last_write = 0.0

    def step(self, index: int) -> StepStatus:
        return self.status.steps[index]

    def event(self, type_: str, child: int | None = None, **data: object) -> None:
        self._events.append(encode(Event(v=1, ts=now_iso(), type=type_, child=child, data=data)))

    def raw_line(self, line: bytes) -> None:
        """Append an already-encoded event line."""
        self._events.append(line)

    def touch(self) -> None:
        """Mark an activity-only change; it is written by the next :meth:`flush_due`."""
        self._dirty = True

    def commit(self) -> None:
        """Write the status now (for state changes)."""
        self.status.updated_at = now_iso()
        write_status(self.paths, self.status)
        self._dirty = False
        self._last_write = time.monotonic()

    def next_flush_in(self) -> float | None:
        """Seconds until a coalesced write is due, or None if nothing is pending."""
        if not self._dirty:
            return None
        return max(0.0, self._last_write + STATUS_COALESCE_S - time.monotonic())

    def flush_due(self) -> None:
        wait = self.next_flush_in()
        if wait is not None and wait <= 0:
            self.commit()

    def close(self) -> None:
        self._events.sync()
        self._events.close()
