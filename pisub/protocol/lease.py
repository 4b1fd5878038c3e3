"""Session leases (``<home>/leases/<key>.json``) and briefs (``<run>/briefs/<id>.json``)."""

from __future__ import annotations

from typing import Literal

from pisub.protocol.codec import Record


class LeaseOwner(Record, kw_only=True):
    """Who drives a session right now. Replaced only by renaming a complete candidate."""

    v: Literal[1]
    token: str
    """Random; release and fenced writes must present it."""
    generation: int
    """Monotonic per session (kept in ``<key>.gen``); a fencing token."""
    session_file: str
    """Canonical path of the session the lease guards."""
    run_id: str
    """The run whose runner holds the lease."""
    source_run_id: str | None = None
    """The run whose session it continues (resume), or None for a first run."""
    pid: int
    pid_start_time: float | None
    pid_start_ticks: int | None = None
    """The owner's start in clock ticks since boot; compared instead of ``pidStartTime``
    (which moves with the wall clock) when present."""
    host: str
    boot_id: str | None
    acquired_at: str


class Brief(Record, kw_only=True):
    """A follow-up for a finished run, delivered by the next resume."""

    v: Literal[1]
    id: str
    message: str
    created_at: str
    generation: int
    """The session's lease generation when the brief was written."""
