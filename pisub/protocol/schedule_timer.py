"""``<home>/schedules/timer.json``: which real timer ``pisub schedule install`` installed for the
home (``spec/schedule-timer.md``)."""

from __future__ import annotations

import enum
from typing import Literal

from pisub.protocol.codec import Record


class TimerKind(enum.StrEnum):
    """The machine's timer that runs ``pisub schedule tick`` every minute."""

    CRON = "cron"
    """One line in the user's crontab."""
    SYSTEMD = "systemd"
    """A systemd user timer and its service in ``~/.config/systemd/user``."""


class TimerRecord(Record, kw_only=True):
    """What ``pisub schedule install`` last installed for this home (``pisub schedule timer``
    compares it with the crontab or the unit files, which stay the truth)."""

    v: Literal[1] = 1
    kind: TimerKind
    installed_at: str
    """When it was installed (ISO 8601 UTC): a timer that never ticked 3 minutes later is named."""
    entry: str
    """The crontab line, or the path of the ``.timer`` unit."""
    pisub: list[str]
    """The command of the pisub the timer runs (``<python> -m pisub``), absolute."""
