"""The runner's single writer of ``status.json`` and ``events.jsonl``.

State changes are written at once; activity-only changes (timestamps, byte counts)
are coalesced and written at most every :data:`~pisub.defaults.STATUS_COALESCE_S`.

A write that fails (full disk, quota, I/O error) never stops the runner: the status stays
dirty and is written again at the next chance, events that could not be appended are counted
and reported by one ``run.write_failed`` event once writing works again, and the failure is
told to :class:`WriteTrouble` (which notes it in ``runner.log``, where space is reserved).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections import Counter

from pisub.core.fsio import JsonlAppender
from pisub.defaults import STATUS_COALESCE_S
from pisub.protocol.codec import encode, now_iso
from pisub.protocol.events import Event
from pisub.protocol.status import Status, StepStatus
from pisub.store import fencing
from pisub.store.paths import RunPaths
from pisub.store.runs import write_status

RETRY_S = 1.0
"""How soon a failed status write is tried again."""


class WriteTrouble:
    """What the runner could not write, and why: noted at once in ``runner.log`` (one line per
    kind of failure; the runner's stderr, with space reserved at start), summarised in the event
    log as soon as it accepts writes again."""

    def __init__(self) -> None:
        self.failures: Counter[str] = Counter()
        self.last_error: dict[str, str] = {}
        self.since: str | None = None
        self._noted: set[tuple[str, int | None]] = set()

    def __call__(self, what: str, exc: OSError) -> None:
        self.failures[what] += 1
        self.last_error[what] = exc.strerror or str(exc)
        self.since = self.since or now_iso()
        if (what, exc.errno) not in self._noted:
            self._noted.add((what, exc.errno))
            note(f"cannot {what}: {exc.strerror or exc} (the runner goes on and retries)")

    def pending(self) -> bool:
        return bool(self.failures)

    def summary(self) -> dict[str, object]:
        """The ``run.write_failed`` event's data; resets the counts."""
        data: dict[str, object] = {
            "since": self.since,
            "failures": dict(self.failures),
            "errors": dict(self.last_error),
        }
        self.failures.clear()
        self.last_error.clear()
        self.since = None
        return data


_log_fd = 2
"""Where the runner's own lines go: ``runner.log`` (its stderr, unless a workflow script's
output took descriptor 2 over: :mod:`pisub.runner.script_output`)."""


def use_log_fd(fd: int) -> None:
    """The runner's own lines go to ``fd`` (a copy of ``runner.log``'s descriptor) from now on."""
    global _log_fd
    _log_fd = fd


def log_fd() -> int:
    return _log_fd


def note(text: str) -> None:
    """One line in ``runner.log`` (the runner's stderr), written directly: never raises."""
    with contextlib.suppress(OSError):
        os.write(_log_fd, f"{now_iso()} pisub runner: {text}\n".encode("utf-8", "backslashreplace"))


def note_raw(text: str) -> None:
    """Text as it is (a traceback) in ``runner.log``: never raises."""
    with contextlib.suppress(OSError):
        os.write(_log_fd, text.encode("utf-8", "backslashreplace"))


class Recorder:
    """Holds the live :class:`Status` and writes it and the event log."""

    def __init__(self, paths: RunPaths, status: Status, trouble: WriteTrouble | None = None) -> None:
        self.paths = paths
        self.status = status
        self.trouble = trouble or WriteTrouble()
        self._events = JsonlAppender(paths.events)
        self._dirty = False
        self._last_write = 0.0
        self._retry_at: float | None = None

    def step(self, index: int) -> StepStatus:
        return self.status.steps[index]

    def event(self, type_: str, child: int | None = None, **data: object) -> None:
        self.raw_line(encode(Event(v=1, ts=now_iso(), type=type_, child=child, data=data)))

    def raw_line(self, line: bytes) -> None:
        """Append an already-encoded event line; a failed append is counted, never raised."""
        fencing.check()
        try:
            self._events.append(line)
        except OSError as exc:
            self.trouble("append to events.jsonl", exc)
            return
        if self.trouble.pending():
            self._report_trouble()

    def _report_trouble(self) -> None:
        line = encode(Event(v=1, ts=now_iso(), type="run.write_failed", data=self.trouble.summary()))
        try:
            self._events.append(line)
        except OSError as exc:
            self.trouble("append to events.jsonl", exc)

    def touch(self) -> None:
        """Mark an activity-only change; it is written by the next :meth:`flush_due`."""
        self._dirty = True

    @property
    def dirty(self) -> bool:
        """Whether the status has changes not written yet."""
        return self._dirty

    def commit(self, *, required: bool = False, durable: bool = True) -> bool:
        """Write the status now (for state changes); whether it was written.

        A failed write leaves the status dirty (retried after :data:`RETRY_S`); with
        ``required`` the error is raised instead.
        """
        self.status.updated_at = now_iso()
        try:
            write_status(self.paths, self.status, durable=durable)
        except OSError as exc:
            if required:
                raise
            self.trouble("write status.json", exc)
            self._dirty = True
            self._retry_at = time.monotonic() + RETRY_S
            return False
        self._dirty = False
        self._retry_at = None
        self._last_write = time.monotonic()
        if self.trouble.pending():
            self._report_trouble()
        return True

    def next_flush_in(self) -> float | None:
        """Seconds until a coalesced (or retried) write is due, or None if nothing is pending."""
        if not self._dirty:
            return None
        due = self._retry_at if self._retry_at is not None else self._last_write + STATUS_COALESCE_S
        return max(0.0, due - time.monotonic())

    def flush_due(self) -> None:
        wait = self.next_flush_in()
        if wait is not None and wait <= 0:
            self.commit()

    def close(self) -> None:
        try:
            self._events.sync()
        except OSError as exc:
            self.trouble("sync events.jsonl", exc)
        self._events.close()
