"""Schedules (``spec/schedules.md``): a workflow fired at one time (``at``) or every interval
(``every``) by ``pisub schedule tick``. The records of ``<home>/schedules/<id>/`` and the timing
rules, as pure functions of "now" (seconds since the epoch) so they are tested without a clock.

Timing:

* ``at``: ``+N(s|m|h|d)`` from now, or an ISO 8601 time with a zone; in the future.
* ``every``: ``N(m|h|d|w)`` (at least a minute), anchored at creation: the first slot is
  ``created + every``, each next one ``planned + every`` — slots that passed unfired are skipped
  without drift (the grid never moves, except that a manual fire re-anchors it at its launch).
* A due slot fires once. With ``catchUp: latest`` the newest due slot fires however late it is
  and the older ones are recorded ``missed``; with ``none`` a slot later than
  :data:`ON_TIME_S` is recorded ``missed`` too, and nothing fires until the next slot.
"""

from __future__ import annotations

import datetime as _dt
import enum
import math
import re
from dataclasses import dataclass
from typing import Any, Literal

from pisub.errors import InvalidInput
from pisub.protocol.codec import Record, StrictRecord

SCHEDULE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
"""The seed's schedule id pattern (the default id is 8 hex digits)."""
SESSION_KEY = re.compile(r"[0-9a-f]{32}")
"""A pi session's key (the extension's ``sessionKey``: 32 hex digits)."""
MAX_PENDING = 20
"""At most this many pending schedules per home (not yet used up: an interval, or a one-shot
that has not fired)."""
MAX_HISTORY = 100
"""``history.json`` keeps this many newest fires."""
MIN_EVERY_S = 60
"""The shortest interval (``every: 1m``)."""
MAX_EVERY_S = 366 * 86400 * 10
"""The longest interval (about ten years)."""
MAX_AT_AHEAD_S = 366 * 86400 * 100
"""How far ahead ``at`` may lie."""
ON_TIME_S = 180.0
"""How late a slot may fire and still count as on time (``catchUp: none``): three ticks of a
timer that ticks every minute."""
MAX_NAME = 120

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_AT_REL = re.compile(r"\+([0-9]{1,9})([smhd])")
_EVERY = re.compile(r"([0-9]{1,9})([mhdw])")


class TriggerKind(enum.StrEnum):
    AT = "at"
    """Once, at a time."""
    EVERY = "every"
    """Every interval."""


class CatchUp(enum.StrEnum):
    LATEST = "latest"
    """Fire the newest missed slot once (the older ones are recorded ``missed``)."""
    NONE = "none"
    """Fire only on time; a late slot is recorded ``missed``."""


class DueReason(enum.StrEnum):
    TIMER = "timer"
    """``pisub schedule tick`` (cron, a systemd timer, or by hand)."""
    RUN_DUE = "run-due"
    """``pisub schedule run-due``."""
    MANUAL = "manual"
    """``pisub schedule run ID``: now, whatever the trigger says."""


class FireState(enum.StrEnum):
    CLAIMED = "claimed"
    """The slot is taken and its run id chosen; the run is being started (a claim whose run
    directory does not exist is started — with the same run id — by the next tick)."""
    RUNNING = "running"
    """Its workflow run exists and has not ended."""
    SKIPPED = "skipped"
    """Due while the previous fire still ran (``overlap: skip``)."""
    MISSED = "missed"
    """Not fired: too late (``catchUp``), older than the newest due slot, or fell while paused."""
    COMPLETED = "completed"
    FAILED_LAUNCH = "failed_launch"
    """The run could not be started (the script no longer validates, an agent is gone, ...)."""
    FAILED_RUN = "failed_run"
    STOPPED = "stopped"
    PAUSED = "paused"
    """The run ended paused (interrupted; ``pisub resume`` goes on)."""

    @property
    def is_active(self) -> bool:
        return self in (FireState.CLAIMED, FireState.RUNNING)


class Trigger(Record, kw_only=True):
    kind: TriggerKind
    at: str | None = None
    """``at``: the time (ISO UTC)."""
    every: str | None = None
    """``every``: as given (``6h``)."""
    every_s: int | None = None
    """``every`` in seconds."""
    anchor_at: str | None = None
    """``every``: where the grid of slots starts (creation; a manual fire re-anchors it)."""


class Target(Record, kw_only=True):
    """What a fire launches: the script's copy beside ``schedule.json`` and its options."""

    language: str
    """``javascript`` (``workflow.js``) or ``python`` (``workflow.py``)."""
    source: str | None = None
    """The file the script was copied from (None: an inline script)."""
    args: dict[str, Any] = {}
    timeout_s: float | None = None
    base_ref: str | None = None
    label: str | None = None

    @property
    def copy_name(self) -> str:
        return "workflow.py" if self.language == "python" else "workflow.js"


class Fire(Record, kw_only=True):
    """One row of a schedule's history (``schedule-fire.json``): a slot and what became of it."""

    v: int = 1
    id: str
    """The fire's id: the run id it first claimed when it launches one, else a fresh id."""
    schedule_id: str
    planned_at: str
    """The slot (ISO UTC); a manual fire's is its time."""
    due_reason: DueReason
    state: FireState
    run_id: str | None = None
    """Chosen before the launch (written in the claim); a new one when the claimed run was
    created but its runner never started (the tick died between the two)."""
    claimed_at: str | None = None
    started_at: str | None = None
    ended_at: str | None = None
    run_state: str | None = None
    """The run's end state (``complete``, ``failed``, ...)."""
    error: str | None = None
    quiet: bool = False
    """A notice of a successful end does not start a turn (``spec/schedules.md``, notices)."""
    count: int = 1
    """``missed``: how many slots this row stands for (from ``plannedAt`` to ``lastPlannedAt``)."""
    last_planned_at: str | None = None
    claimer_pid: int | None = None


class Schedule(Record, kw_only=True):
    """``<home>/schedules/<id>/schedule.json``: written under ``<id>/lock`` only."""

    v: int = 1
    id: str
    name: str
    cwd: str
    project: str
    """The project key of ``cwd`` (``list`` shows this project's schedules)."""
    trigger: Trigger
    target: Target
    overlap: Literal["skip"] = "skip"
    catch_up: CatchUp = CatchUp.LATEST
    quiet: bool = False
    session_only: bool = False
    owner_session: str | None = None
    """The pi session key that created it: its fires are recorded in that session's notices
    ledger; with ``sessionOnly`` a slot fires only while that session is open."""
    paused: bool = False
    paused_at: str | None = None
    created_at: str
    updated_at: str
    next_run_at: str | None = None
    """The next slot (ISO UTC); None once a one-shot has fired (``done``)."""
    done: bool = False
    active: Fire | None = None
    """The fire claimed or running (at most one: ``overlap: skip``)."""
    last: Fire | None = None
    """The last fire that ended (or was skipped, missed)."""
    fires: int = 0
    """How many runs it launched."""

    @property
    def pending(self) -> bool:
        """It may still fire (counts against :data:`MAX_PENDING`)."""
        return not self.done


class History(Record, kw_only=True):
    """``<id>/history.json``: the newest :data:`MAX_HISTORY` fires, newest first."""

    v: int = 1
    fires: list[Fire] = []


class ScheduleEvent(Record, kw_only=True):
    """One line of ``<id>/events.jsonl``."""

    v: int = 1
    at: str
    type: str
    """``schedule.created|paused|resumed|deleted``,
    ``fire.claimed|relaunched|started|ended|skipped|missed|failed_launch``."""
    fire_id: str | None = None
    run_id: str | None = None
    state: str | None = None
    detail: str | None = None


class LastTick(Record, kw_only=True):
    """``<home>/schedules/last-tick.json``: the last ``pisub schedule tick``."""

    v: int = 1
    at: str
    pid: int
    source: str
    fired: int


class Presence(Record, kw_only=True):
    """``<home>/notices/<session key>/presence/<pid>.json``, written by the pi extension while
    that session is open."""

    v: int = 1
    pid: int
    start_ticks: int | None = None


class CreateInput(StrictRecord, kw_only=True):
    """What ``schedule.create`` takes (strict: an unknown field is an error naming it)."""

    workflow_script: str | None = None
    workflow_script_path: str | None = None
    language: str | None = None
    at: str | None = None
    every: str | None = None
    name: str | None = None
    id: str | None = None
    catch_up: CatchUp = CatchUp.LATEST
    overlap: Literal["skip"] = "skip"
    quiet: bool = False
    session_only: bool = False
    session_key: str | None = None
    cwd: str | None = None
    args: dict[str, Any] = {}
    timeout: float | None = None
    base_ref: str | None = None
    label: str | None = None


# ---- timing: pure functions of "now" -------------------------------------------------------


def iso(ts: float) -> str:
    """Seconds since the epoch as ISO UTC with milliseconds and a ``Z``."""
    moment = _dt.datetime.fromtimestamp(ts, _dt.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def epoch(value: str) -> float:
    """An ISO time written by :func:`iso` as seconds since the epoch."""
    return _dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def check_id(value: object, field: str = "id") -> str:
    if not isinstance(value, str) or not SCHEDULE_ID.fullmatch(value):
        shown = str(value)[:70].encode("unicode_escape").decode("ascii")
        raise InvalidInput(
            f"{field}: {shown!r} is not a schedule id (1-64 of letters, digits, '.', '_', '-', "
            "starting with a letter or digit)"
        )
    return value


def parse_at(text: object, now: float) -> float:
    """``at``: ``+N(s|m|h|d)`` or an ISO 8601 time with a zone, in the future; its epoch time.

    Raises:
        InvalidInput: anything else, a time without a zone, one not in the future.
    """
    if not isinstance(text, str) or not text.strip():
        raise InvalidInput("at: give +N(s|m|h|d) (e.g. +10m) or an ISO time with a zone")
    value = text.strip()
    rel = _AT_REL.fullmatch(value)
    if rel is not None:
        amount = int(rel[1]) * _UNITS[rel[2]]
        if amount <= 0:
            raise InvalidInput(f"at: {value!r} is not in the future")
        if amount > MAX_AT_AHEAD_S:
            raise InvalidInput(f"at: {value!r} lies too far ahead (at most 100 years)")
        return now + amount
    try:
        moment = _dt.datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise InvalidInput(
            f"at: {value[:60]!r} is neither +N(s|m|h|d) nor an ISO 8601 time (2026-12-04T09:00:00+01:00)"
        ) from None
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise InvalidInput(f"at: {value[:60]!r} has no zone; add one (Z, +01:00)")
    when = moment.timestamp()
    if when <= now:
        raise InvalidInput(f"at: {value[:60]!r} is not in the future (now is {iso(now)})")
    if when - now > MAX_AT_AHEAD_S:
        raise InvalidInput(f"at: {value[:60]!r} lies too far ahead (at most 100 years)")
    return when


def parse_every(text: object) -> int:
    """``every``: ``N(m|h|d|w)``, at least a minute; in seconds.

    Raises:
        InvalidInput: anything else (calendar words such as ``day`` are not taken).
    """
    value = text.strip() if isinstance(text, str) else ""
    found = _EVERY.fullmatch(value)
    if found is None:
        raise InvalidInput(f"every: {str(text)[:40]!r} is not N(m|h|d|w) (e.g. 30m, 6h, 1d, 2w)")
    seconds = int(found[1]) * _UNITS[found[2]]
    if seconds < MIN_EVERY_S:
        raise InvalidInput(f"every: {value!r} is shorter than a minute")
    if seconds > MAX_EVERY_S:
        raise InvalidInput(f"every: {value!r} is longer than ten years")
    return seconds


@dataclass(frozen=True)
class Due:
    """The slots due at some "now": the newest (``planned``) and the older ones passed unfired."""

    planned: float
    """The newest due slot."""
    older: int
    """How many older slots passed unfired (always 0 for a one-shot)."""
    first_older: float | None
    """The oldest of them."""
    next_at: float | None
    """The next slot after ``planned`` (None: a one-shot, used up)."""
    late: float
    """How late ``planned`` is."""

    def on_time(self) -> bool:
        return self.late <= ON_TIME_S


def due(next_run_at: float | None, every_s: int | None, now: float) -> Due | None:
    """What is due at ``now`` for a schedule whose next slot is ``next_run_at`` (None: a
    one-shot used up) and whose interval is ``every_s`` (None: a one-shot); None: nothing."""
    if next_run_at is None or next_run_at > now:
        return None
    if every_s is None:
        return Due(planned=next_run_at, older=0, first_older=None, next_at=None, late=now - next_run_at)
    passed = math.floor((now - next_run_at) / every_s)
    planned = next_run_at + passed * every_s
    return Due(
        planned=planned,
        older=passed,
        first_older=next_run_at if passed else None,
        next_at=planned + every_s,
        late=now - planned,
    )


def first_slot(trigger: Trigger, created: float) -> float:
    """The first slot of a new schedule."""
    if trigger.kind is TriggerKind.AT:
        assert trigger.at is not None
        return epoch(trigger.at)
    assert trigger.every_s is not None
    return created + trigger.every_s


def next_after(grid: float, every_s: int, now: float) -> float:
    """The first slot of the grid through ``grid`` (step ``every_s``) that lies after ``now``."""
    if grid > now:
        return grid
    return grid + (math.floor((now - grid) / every_s) + 1) * every_s


def describe_every(seconds: int) -> str:
    for unit, size in (("w", 7 * 86400), ("d", 86400), ("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"
