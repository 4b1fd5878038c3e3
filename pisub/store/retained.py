"""Retained children: finished child runs a later workflow (or person) may continue, each with
whether it can be resumed and, if not, why."""

from __future__ import annotations

from collections.abc import Iterable

from pisub.errors import PisubError
from pisub.protocol.codec import Record
from pisub.protocol.status import Status
from pisub.store.leases import describe, lease_paths, proven_dead, read_owner
from pisub.store.paths import Home

DEFAULT_LIMIT = 10


class Retained(Record, kw_only=True):
    """One finished child run (``pisub children list``)."""

    run_id: str
    key: str | None
    parent_run_id: str | None
    agent: str
    state: str
    ended_at: str | None
    resumable: bool
    reason: str | None = None
    """Why it cannot be resumed: ``not a pi run``, ``stopped``, ``no session``, ``session file
    missing``, ``lease held by run …``."""
    session_file: str | None = None


def retained(
    home: Home, statuses: Iterable[Status], parent: str | None = None, limit: int = DEFAULT_LIMIT
) -> list[Retained]:
    """The ``limit`` most recently ended child runs (of ``parent``, or of any run), newest first."""
    finished = [
        st
        for st in statuses
        if st.parent_run_id is not None
        and st.state.is_terminal
        and (parent is None or st.parent_run_id == parent)
    ]
    finished.sort(key=lambda st: st.ended_at or st.updated_at, reverse=True)
    return [_retained(home, st) for st in finished[:limit]]


def _retained(home: Home, status: Status) -> Retained:
    reason = why_not_resumable(home, status)
    return Retained(
        run_id=status.run_id,
        key=status.key,
        parent_run_id=status.parent_run_id,
        agent=status.agent,
        state=status.state.value,
        ended_at=status.ended_at,
        resumable=reason is None,
        reason=reason,
        session_file=status.session_file,
    )


def why_not_resumable(home: Home, status: Status) -> str | None:
    """None when a new run could continue ``status``'s pi session now, else the reason."""
    import os

    if status.runner != "pi":
        return f"not a pi run ({status.runner})"
    if status.state.value == "stopped":
        return "stopped"
    if not status.session_file:
        return "no session (pi writes it after its first reply)"
    if not os.path.isfile(status.session_file):
        return "session file missing"
    try:
        owner = read_owner(lease_paths(home.leases, status.session_file))
    except PisubError:
        return "lease unreadable (pisub lease list)"
    if owner is not None and not proven_dead(owner, home.leases):
        return f"lease held by {describe(owner)}"
    return None
