"""Noticing new requests: watchdog (inotify) on ``inbox/new`` plus a fallback poll.

inotify events are only a hint (they can be lost on queue overflow or arrive before a
rename completes): the watcher merely wakes the runner's loop through a pipe, and the
loop always lists the whole directory. A scan also runs at start and on every poll tick,
so a request is found even when no event reached the runner. When inotify cannot be set
up (this machine allows 128 inotify instances per user) the runner polls more often and
says so in ``status.json``.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

from pisub.protocol.control import InboxInfo

POLL_WITH_INOTIFY_S = 2.0
"""Safety scan interval while inotify works."""

POLL_WITHOUT_INOTIFY_S = 0.2
"""Scan interval when inotify is unavailable."""

POLL_SHARED_S = 1.0
"""Safety scan interval of a runner placed by an engine (its inbox is on shared storage, where
inotify sees nothing written from another host; the doorbell makes a scan at once)."""


class InboxWatcher:
    """Writes a byte to ``wake_fd`` whenever something happens in ``directory``."""

    def __init__(self, directory: Path, wake_fd: int, *, shared: bool = False) -> None:
        self.directory = directory
        self.wake_fd = wake_fd
        self.shared = shared
        """The inbox is on shared storage: scan every :data:`POLL_SHARED_S` at least."""
        self.info = InboxInfo(watch="polling", reason="not started")
        self._observer: Any = None

    @property
    def poll_interval(self) -> float:
        if self.info.watch != "inotify":
            return POLL_WITHOUT_INOTIFY_S
        return POLL_SHARED_S if self.shared else POLL_WITH_INOTIFY_S

    def start(self) -> InboxInfo:
        """Start watching; falls back to polling (and says why) when inotify fails."""
        try:
            from watchdog.events import (
                FileCreatedEvent,
                FileMovedEvent,
                FileSystemEvent,
                FileSystemEventHandler,
            )
            from watchdog.observers.inotify import InotifyObserver
        except ImportError as exc:  # not Linux, or watchdog without inotify
            self.info = InboxInfo(watch="polling", reason=f"inotify unavailable: {exc}")
            return self.info
        wake_fd = self.wake_fd

        class Wake(FileSystemEventHandler):
            def on_any_event(self, event: FileSystemEvent) -> None:
                with contextlib.suppress(BlockingIOError, OSError):
                    os.write(wake_fd, b"i")

        observer = None
        try:
            observer = InotifyObserver()
            # Only arrivals: the kernel then reports no deletions, and no claims (link + unlink).
            observer.schedule(
                Wake(), str(self.directory), recursive=False, event_filter=[FileCreatedEvent, FileMovedEvent]
            )
            observer.start()
        except OSError as exc:
            if observer is not None:
                with contextlib.suppress(Exception):
                    observer.stop()
            self.info = InboxInfo(watch="polling", reason=f"inotify unavailable: {exc.strerror or exc}")
            return self.info
        self._observer = observer
        self.info = InboxInfo(watch="inotify")
        return self.info

    def stop(self) -> None:
        if self._observer is not None:
            with contextlib.suppress(Exception):
                self._observer.stop()
                self._observer.join(timeout=2)
            self._observer = None
