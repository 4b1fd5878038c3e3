"""Noticing new requests: one inotify descriptor on ``inbox/new`` plus a fallback poll.

inotify events are only a hint (they can be lost on queue overflow or arrive before a
rename completes): the descriptor merely wakes the runner's loop (it sits in the loop's
selector; no thread), and the loop always lists the whole directory. A scan also runs at start
and on every poll tick, so a request is found even when no event reached the runner. When
inotify cannot be set up (this machine allows 128 inotify instances per user) the runner polls
more often and says so in ``status.json``.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from pisub.protocol.control import InboxInfo

POLL_WITH_INOTIFY_S = 2.0
"""Safety scan interval while inotify works."""

POLL_WITHOUT_INOTIFY_S = 0.2
"""Scan interval when inotify is unavailable."""

POLL_SHARED_S = 1.0
"""Safety scan interval of a runner placed by an engine (its inbox is on shared storage, where
inotify sees nothing written from another host; the doorbell makes a scan at once)."""


class InboxWatcher:
    """An inotify descriptor (:attr:`fd`) that becomes readable whenever a request arrives in
    ``directory`` (created, or renamed into it); :meth:`drain` it when it does."""

    def __init__(self, directory: Path, *, shared: bool = False) -> None:
        self.directory = directory
        self.shared = shared
        """The inbox is on shared storage: scan every :data:`POLL_SHARED_S` at least."""
        self.info = InboxInfo(watch="polling", reason="not started")
        self.fd: int | None = None
        """The descriptor to select on (None: polling)."""

    @property
    def poll_interval(self) -> float:
        if self.info.watch != "inotify":
            return POLL_WITHOUT_INOTIFY_S
        return POLL_SHARED_S if self.shared else POLL_WITH_INOTIFY_S

    def start(self) -> InboxInfo:
        """Start watching; falls back to polling (and says why) when inotify fails."""
        from pisub.core.inotify import watch_dir

        try:
            # Only arrivals: the kernel then reports no deletions, and no claims (link + unlink).
            self.fd = watch_dir(self.directory)
        except OSError as exc:
            self.info = InboxInfo(watch="polling", reason=f"inotify unavailable: {exc.strerror or exc}")
            return self.info
        self.info = InboxInfo(watch="inotify")
        return self.info

    def drain(self) -> None:
        """Read the pending events away (the caller then scans the whole directory)."""
        if self.fd is not None:
            from pisub.core.inotify import drain

            drain(self.fd)

    def stop(self) -> None:
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = None
