"""Mission records (``spec/missions.md``): a goal, its runs, decisions and state across
workflows. (Stub for issue 28: the missions helper completes it.)"""

from __future__ import annotations

import enum

from pisub.protocol.codec import Record


class MissionStatus(enum.StrEnum):
    """The seed's mission states."""

    PLANNED = "planned"
    ACTIVE = "active"
    WAITING = "waiting"
    NEEDS_DECISION = "needs_decision"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


class Mission(Record, kw_only=True):
    """``<home>/missions/<project key>/<id>.json``."""

    v: int = 1
    id: str
    title: str
    status: MissionStatus = MissionStatus.PLANNED
