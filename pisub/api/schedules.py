"""Schedules: a workflow fired at a time or every interval (``spec/schedules.md``).

>>> pisub.schedule_create(workflow="review.js", every="6h")     # doctest: +SKIP
>>> pisub.schedule_tick()                                       # doctest: +SKIP

Nothing of pisub stays resident to fire them: ``pisub schedule tick`` (from cron, a systemd
timer, or anyone, any number of times at once) fires what is due. For each schedule, under its
lock, a tick first reconciles the fire in progress against its run's real state (read as
``pisub status`` reads it, which repairs a run whose runner provably died), then **claims** the
due slot — one durable write of ``schedule.json`` that advances the slot and names the run id
it will launch — and only then starts the detached workflow run with that id. A tick killed at
any point loses no slot and starts nothing twice: a claim whose run directory does not exist is
started, with the same id, by the next tick; one whose run exists is only reconciled.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pisub.core import fsio
from pisub.errors import (
    HomeUnusable,
    InvalidInput,
    LockBusy,
    PisubError,
    ProtocolError,
    RunNotFound,
    ScheduleNotFound,
)
from pisub.protocol.codec import now_iso
from pisub.protocol.schedule import (
    MAX_HISTORY,
    MAX_NAME,
    SESSION_KEY,
    CatchUp,
    DueReason,
    Fire,
    FireState,
    LastTick,
    Schedule,
    Target,
    Trigger,
    TriggerKind,
    check_id,
    due,
    epoch,
    first_slot,
    iso,
    next_after,
    parse_at,
    parse_every,
)
from pisub.protocol.status import RepairCause
from pisub.store.paths import open_home, open_home_to_read
from pisub.store.schedules import (
    LOCK_TIMEOUT_S,
    RESERVED,
    ScheduleStore,
    record_notice,
    session_present,
)

TICK_SOURCES = ("cron", "systemd", "manual")
PEEK_LOCK_S = 2.0
"""How long ``list``/``show`` wait for a schedule's lock to reconcile its fire (else they show
the record as it stands)."""

Clock = Callable[[], float]

_RUN_END = {
    "complete": FireState.COMPLETED,
    "failed": FireState.FAILED_RUN,
    "stopped": FireState.STOPPED,
    "paused": FireState.PAUSED,
}


@dataclass
class ScheduleDetail:
    """``schedule show``: the record and its newest fires."""

    schedule: Schedule
    recent: list[Fire]


@dataclass
class TickReport:
    """What one tick (or ``run-due``) did."""

    fired: list[Fire] = field(default_factory=list)
    """Fires launched (running, or ``failed_launch``)."""
    ended: list[Fire] = field(default_factory=list)
    """Fires whose run was found ended."""
    skipped: list[Fire] = field(default_factory=list)
    missed: list[Fire] = field(default_factory=list)
    waiting: list[str] = field(default_factory=list)
    """``sessionOnly`` schedules due while their session is not open (their slot stays due)."""
    busy: list[str] = field(default_factory=list)
    """Schedules whose lock another process held past the wait (it handles them)."""
    errors: list[str] = field(default_factory=list)
    """One line per schedule that could not be handled (quarantined files, ...)."""


# ---- create ---------------------------------------------------------------------------------


def schedule_create(
    *,
    workflow: str | Path | None = None,
    text: str | None = None,
    language: str | None = None,
    at: str | None = None,
    every: str | None = None,
    name: str | None = None,
    schedule_id: str | None = None,
    catch_up: str = "latest",
    quiet: bool = False,
    session_only: bool = False,
    session_key: str | None = None,
    cwd: str | Path | None = None,
    args: dict[str, Any] | None = None,
    timeout: float | None = None,
    base_ref: str | None = None,
    label: str | None = None,
    home: Path | None = None,
    now: float | None = None,
) -> Schedule:
    """Create a schedule of the workflow script file ``workflow`` (``.js``/``.py``; relative to
    ``cwd``) or the inline script ``text`` (JavaScript unless ``language="python"``), fired once
    ``at`` (``+10m``, or an ISO time with a zone) or ``every`` interval (``30m``, ``6h``, ``1d``,
    ``2w``; the first fire one interval from now). The script is checked as ``pisub workflow
    validate`` checks it and copied: later edits of the file do not change the schedule.

    ``session_key`` (a pi session's, 32 hex): its fires are recorded in that session's notices
    ledger; ``session_only``: a slot fires only while that session is open. ``quiet`` (intervals
    only): a successful automatic fire's notice does not start a turn.

    Raises:
        InvalidInput: a bad or missing argument (naming it), a script that does not validate,
            an id taken, :data:`~pisub.protocol.schedule.MAX_PENDING` schedules pending.
    """
    from pisub.api.admin import validate_workflow
    from pisub.api.client import _label, _script_source
    from pisub.runs.launch import outside_home, working_dir
    from pisub.store.shared_state import check_json

    moment = time.time() if now is None else now
    h = open_home(home)
    if (at is None) == (every is None):
        raise InvalidInput("give exactly one of at (+10m, or an ISO time with a zone) and every (N m|h|d|w)")
    if at is not None:
        trigger = Trigger(kind=TriggerKind.AT, at=iso(parse_at(at, moment)))
    else:
        seconds = parse_every(every)
        trigger = Trigger(
            kind=TriggerKind.EVERY, every=_every_text(str(every)), every_s=seconds, anchor_at=iso(moment)
        )
    if quiet and trigger.kind is TriggerKind.AT:
        raise InvalidInput(
            "quiet applies to intervals (every) only; a one-shot's notice always starts a turn"
        )
    try:
        chosen_catch_up = CatchUp(catch_up)
    except ValueError:
        raise InvalidInput(f"catch-up: {str(catch_up)[:20]!r} is not latest or none") from None
    if session_key is not None and not (isinstance(session_key, str) and SESSION_KEY.fullmatch(session_key)):
        raise InvalidInput("session-key must be the pi session's key of 32 hex digits")
    if session_only and session_key is None:
        raise InvalidInput("session-only needs the creating pi session (--session-key)")
    chosen_id = check_id(schedule_id) if schedule_id is not None else uuid.uuid4().hex[:8]
    if chosen_id in RESERVED:
        raise InvalidInput(
            f"id: {chosen_id!r} is the name of a file of pisub's in schedules/; give another --id"
        )
    workdir = working_dir(cwd)
    outside_home(workdir, h)
    if workflow is not None and not Path(workflow).is_absolute():
        workflow = workdir / workflow
    source, lang, path = _script_source(workflow, text, language)
    report = validate_workflow(text=source, language=lang.value, cwd=workdir, home=h.root)
    if not report.ok:
        shown = str(path) if path is not None else "the inline workflow script"
        first = "; ".join(f"line {e.line}: {e.message}" for e in report.errors[:5])
        raise InvalidInput(f"{shown} does not validate: {first}")
    spec_args = dict(args or {})
    if not isinstance(args or {}, dict):
        raise InvalidInput("args: give a JSON object")
    check_json(spec_args, "args")
    if timeout is not None and (not isinstance(timeout, int | float) or not 0 < timeout <= 366 * 86400):
        raise InvalidInput("timeout: give a number of seconds above 0 (at most a year)")
    if base_ref is not None and (not base_ref.strip() or base_ref.startswith("-") or "\n" in base_ref):
        raise InvalidInput(f"base-ref: {base_ref[:40]!r} is not a git ref")
    shown_name = _name(name, path, chosen_id)
    schedule = Schedule(
        id=chosen_id,
        name=shown_name,
        cwd=str(workdir),
        project=_project_of(workdir),
        trigger=trigger,
        target=Target(
            language=lang.value,
            source=str(path) if path is not None else None,
            args=spec_args,
            timeout_s=float(timeout) if timeout is not None else None,
            base_ref=base_ref,
            label=_label(label),
        ),
        catch_up=chosen_catch_up,
        quiet=quiet,
        session_only=session_only,
        owner_session=session_key,
        created_at=iso(moment),
        updated_at=iso(moment),
        next_run_at=iso(first_slot(trigger, moment)),
    )
    ScheduleStore(h).create(schedule, source.encode("utf-8", "surrogatepass"))
    return schedule


def schedule_create_from(data: object, *, home: Path | None = None) -> Schedule:
    """:func:`schedule_create` from the seed's ``schedule.create`` object (camelCase:
    ``workflowScript`` | ``workflowScriptPath``, ``at`` | ``every``, ``name``, ``id``,
    ``catchUp``, ``overlap: "skip"``, ``quiet``, ``sessionOnly``, ``sessionKey``, ``cwd``,
    ``args``, ``timeout`` (seconds), ``baseRef``, ``label``, ``language``). Strict: an unknown
    field (``agent``, ``on``, ``timezone``, mission fields) is an error naming it.

    Raises:
        InvalidInput: naming the field.
    """
    from pisub.protocol.codec import convert
    from pisub.protocol.schedule import CreateInput

    try:
        given = convert(data, CreateInput, "schedule")
    except ProtocolError as exc:
        raise InvalidInput(exc.message) from None
    if (given.workflow_script is None) == (given.workflow_script_path is None):
        raise InvalidInput("schedule: give workflowScript or workflowScriptPath, one of them")
    return schedule_create(
        workflow=given.workflow_script_path,
        text=given.workflow_script,
        language=given.language,
        at=given.at,
        every=given.every,
        name=given.name,
        schedule_id=given.id,
        catch_up=given.catch_up.value,
        quiet=given.quiet,
        session_only=given.session_only,
        session_key=given.session_key,
        cwd=given.cwd,
        args=given.args,
        timeout=given.timeout,
        base_ref=given.base_ref,
        label=given.label,
        home=home,
    )


def _every_text(given: str) -> str:
    """``every`` as it is shown: ``01m`` is ``1m`` (the number without leading zeros)."""
    value = given.strip()
    digits = value.rstrip("mhdwMHDW")
    return f"{int(digits)}{value[len(digits) :]}" if digits.isascii() and digits.isdigit() else value


def _name(name: str | None, path: Path | None, schedule_id: str) -> str:
    if name is None:
        return path.stem if path is not None else f"schedule {schedule_id}"
    if not isinstance(name, str) or not name.strip() or not name.isprintable() or len(name) > MAX_NAME:
        raise InvalidInput(f"name: give one printable line of at most {MAX_NAME} characters")
    return name.strip()


def _project_of(cwd: Path) -> str:
    """The project key of ``cwd`` (``pisub.store.missions.project_key``)."""
    from pisub.store.missions import project_key

    return project_key(cwd)


# ---- which schedule ---------------------------------------------------------------------------

MIN_PREFIX = 4
"""The shortest id prefix that names a schedule."""


def resolve_schedule(ref: str, *, home: Path | None = None) -> str:
    """The id of the schedule ``ref`` names: an id, else a unique name (as given at create),
    else a unique id prefix of at least :data:`MIN_PREFIX` characters.

    Raises:
        ScheduleNotFound: nothing matches (or an entry named like it is not a schedule).
        InvalidInput: ``ref`` is not text, or names several schedules (listing them).
    """
    return _resolve(ScheduleStore(open_home(home)), ref)


def _resolve(store: ScheduleStore, ref: object) -> str:
    from pisub.protocol.schedule import SCHEDULE_ID

    if not isinstance(ref, str) or not ref.strip():
        raise InvalidInput("give a schedule's id or name (pisub schedule list)")
    if SCHEDULE_ID.fullmatch(ref) and store.exists(ref):
        return ref
    ids = store.ids()
    named: list[tuple[str, str]] = []
    for schedule_id in ids:
        try:
            name = store.load(schedule_id).name
        except PisubError:
            continue
        named.append((schedule_id, name))
    for matches, how in (
        ([(i, n) for i, n in named if n == ref], "are named"),
        ([(i, n) for i, n in named if n == ref.strip()], "are named"),
        (
            [(i, n) for i, n in named if len(ref) >= MIN_PREFIX and i.startswith(ref)]
            if SCHEDULE_ID.fullmatch(ref)
            else [],
            "have ids starting with",
        ),
    ):
        if len(matches) == 1:
            return matches[0][0]
        if len(matches) > 1:
            shown = ", ".join(f"{i} ({n})" for i, n in matches[:10])
            more = f" and {len(matches) - 10} more" if len(matches) > 10 else ""
            raise InvalidInput(f"{len(matches)} schedules {how} {ref[:80]!r}: {shown}{more}; give its id")
    if SCHEDULE_ID.fullmatch(ref) and fsio.lexists(store.dir(ref)):
        raise store._not_found(ref)  # says what stands there
    if len(ref) < MIN_PREFIX and SCHEDULE_ID.fullmatch(ref) and any(i.startswith(ref) for i in ids):
        raise ScheduleNotFound(
            f"no schedule named {ref[:80]!r}; an id prefix needs at least {MIN_PREFIX} characters"
        )
    shown = ref[:80].encode("unicode_escape").decode("ascii")
    raise ScheduleNotFound(
        f"no schedule with the id or name {shown!r} (pisub schedule list --all shows them)"
    )


# ---- read -----------------------------------------------------------------------------------


def schedule_list(
    *, all_projects: bool = False, cwd: str | Path | None = None, home: Path | None = None
) -> list[Schedule]:
    """This project's schedules (``cwd``'s, default the current directory), or every one with
    ``all_projects``; ordered by their next fire. A fire whose run has ended is reconciled
    first; unreadable schedules are left out (a tick quarantines them)."""
    h = open_home_to_read(home)  # a reader: a home that does not exist has no schedules
    store = ScheduleStore(h)
    project = None if all_projects else _project_of(Path(cwd or os.getcwd()))
    found = []
    for schedule_id in store.ids():
        try:
            schedule = _refreshed(store, schedule_id)
        except PisubError:
            continue
        if project is None or schedule.project == project:
            found.append(schedule)
    return sorted(found, key=lambda s: (s.next_run_at is None, s.next_run_at or "", s.id))


def schedule_show(schedule_id: str, *, recent: int = 10, home: Path | None = None) -> ScheduleDetail:
    """Schedule ``schedule_id`` and its ``recent`` newest fires.

    Raises:
        ScheduleNotFound; ProtocolError: its record cannot be read.
    """
    store = ScheduleStore(open_home_to_read(home))
    schedule_id = _resolve(store, schedule_id)
    schedule = _refreshed(store, schedule_id)
    return ScheduleDetail(schedule, store.history(schedule_id)[: max(0, recent)])


def schedule_history(schedule_id: str, *, limit: int = MAX_HISTORY, home: Path | None = None) -> list[Fire]:
    """The schedule's fires, newest first (at most ``limit``; the history keeps 100).

    Raises:
        ScheduleNotFound.
    """
    if not isinstance(limit, int) or limit < 1:
        raise InvalidInput("limit: give a whole number of at least 1")
    store = ScheduleStore(open_home_to_read(home))
    schedule_id = _resolve(store, schedule_id)
    _refreshed(store, schedule_id)
    return store.history(schedule_id)[:limit]


def _refreshed(store: ScheduleStore, schedule_id: str) -> Schedule:
    """The record after reconciling a fire whose run exists (never launching anything); as it
    stands when another process holds the lock."""
    schedule = store.load(schedule_id)
    if schedule.active is None:
        return schedule
    try:
        with store.locked(schedule_id, PEEK_LOCK_S):
            schedule = store.load(schedule_id)
            _reconcile(store, schedule, TickReport(), launch_claims=False)
    except LockBusy:
        pass
    return schedule


# ---- change ---------------------------------------------------------------------------------


def schedule_pause(schedule_id: str, *, home: Path | None = None) -> Schedule:
    """Fire no slot of the schedule until :func:`schedule_resume` (a fire going on goes on)."""
    store = ScheduleStore(open_home(home))
    schedule_id = _resolve(store, schedule_id)
    with store.locked(schedule_id):
        schedule = store.load(schedule_id)
        _reconcile(store, schedule, TickReport(), launch_claims=True)
        if not schedule.paused:
            schedule.paused = True
            schedule.paused_at = now_iso()
            store.save(schedule)
            store.event(schedule_id, "schedule.paused")
        return schedule


def schedule_resume(schedule_id: str, *, home: Path | None = None, now: float | None = None) -> Schedule:
    """Fire the schedule's slots again. An interval goes on with its next slot after now: the
    slots that fell while it was paused are recorded ``missed`` (one row). A one-shot whose time
    passed while paused follows its ``catchUp`` at the next tick (``latest`` fires it)."""
    store = ScheduleStore(open_home(home))
    schedule_id = _resolve(store, schedule_id)
    with store.locked(schedule_id):
        moment = time.time() if now is None else now  # read holding the lock
        schedule = store.load(schedule_id)
        _reconcile(store, schedule, TickReport(), launch_claims=True)
        if not schedule.paused:
            return schedule
        schedule.paused = False
        schedule.paused_at = None
        every_s = schedule.trigger.every_s
        slot = due(_next(schedule), every_s, moment) if every_s is not None else None
        missed = None
        if slot is not None and every_s is not None:
            first = slot.first_older if slot.first_older is not None else slot.planned
            missed = _row(schedule, FireState.MISSED, first, DueReason.TIMER, moment)
            missed.count = slot.older + 1
            missed.last_planned_at = iso(slot.planned)
            missed.error = "fell while the schedule was paused"
            schedule.next_run_at = iso(next_after(slot.planned, every_s, moment))
            schedule.last = missed
        store.save(schedule)
        if missed is not None:
            store.record(schedule_id, missed)
            store.event(schedule_id, "fire.missed", missed, "while paused")
        store.event(schedule_id, "schedule.resumed")
        return schedule


def schedule_delete(schedule_id: str, *, force: bool = False, home: Path | None = None) -> str:
    """Delete the schedule (its history too); its id. Refused while one of its fires runs,
    unless ``force``: the run then goes on as an ordinary run (``pisub list`` shows it, labelled
    ``schedule:<name>``), no longer the schedule's — the way out when its runner is stuck and
    answers no stop.

    Raises:
        ScheduleNotFound; InvalidInput: a fire runs (the message says how to stop it).
    """
    store = ScheduleStore(open_home(home))
    schedule_id = _resolve(store, schedule_id)
    with store.locked(schedule_id):
        try:
            schedule: Schedule | None = store.load(schedule_id)
        except ProtocolError:
            schedule = None  # unreadable: nothing of it can run through us any more
        if schedule is not None:
            _reconcile(store, schedule, TickReport(), launch_claims=False)
            fire = schedule.active
            if fire is not None and not force:
                run = fire.run_id or "?"
                raise InvalidInput(
                    f"schedule {schedule_id} has a fire running (run {run}); stop it (pisub stop {run}) "
                    f"or wait for its end, then delete the schedule (pisub schedule pause {schedule_id} "
                    f"stops later fires now); --force deletes it now and leaves run {run} going on its own"
                )
        store.event(schedule_id, "schedule.deleted")
        store.delete(schedule_id)
    return schedule_id


# ---- fire -----------------------------------------------------------------------------------


def schedule_run(
    schedule_id: str, *, quiet: bool = False, home: Path | None = None, now: float | None = None
) -> Fire:
    """Fire the schedule now (``dueReason: manual``), paused or not. An interval's grid is
    re-anchored at this fire (its next slot one interval from now); a one-shot is used up.
    ``quiet``: a successful end's notice does not start a turn.

    Raises:
        ScheduleNotFound; InvalidInput: a fire of it runs (``overlap: skip``).
    """
    store = ScheduleStore(open_home(home))
    schedule_id = _resolve(store, schedule_id)
    report = TickReport()
    with store.locked(schedule_id):
        moment = time.time() if now is None else now  # read holding the lock, never before the wait
        schedule = store.load(schedule_id)
        _reconcile(store, schedule, report, launch_claims=True)
        if schedule.active is not None:
            run = schedule.active.run_id or "?"
            raise InvalidInput(
                f"schedule {schedule_id} has a fire running (run {run}); wait for its end or stop it "
                f"(pisub stop {run})"
            )
        if schedule.trigger.every_s is not None:
            schedule.trigger.anchor_at = iso(moment)
            schedule.next_run_at = iso(moment + schedule.trigger.every_s)
        else:
            schedule.next_run_at = None
            schedule.done = True
        return _claim_and_launch(store, schedule, iso(moment), DueReason.MANUAL, quiet, moment, None, report)


def schedule_run_due(*, home: Path | None = None, now: float | None = None) -> TickReport:
    """Fire what is due now (``dueReason: run-due``), like a tick (that writes no
    ``last-tick.json``)."""
    return _fire_all(ScheduleStore(open_home(home)), DueReason.RUN_DUE, now)


def schedule_tick(
    *, source: str = "manual", home: Path | None = None, now: float | None = None
) -> TickReport:
    """Fire what is due (``dueReason: timer``) and write ``schedules/last-tick.json``. Safe to
    call from anywhere, any number of times at once: each slot fires once.

    ``now`` (tests): the time the slots are compared with, instead of the clock.

    Raises:
        InvalidInput: an unknown ``source`` (cron, systemd, manual).
    """
    if source not in TICK_SOURCES:
        raise InvalidInput(f"from: {str(source)[:20]!r} is not cron, systemd or manual")
    # A timer's tick never makes a home again: a timer left behind by a removed home does nothing.
    given = open_home(home, create=False)
    if source != "manual" and not fsio.lexists(given.root):
        raise HomeUnusable(
            f"pisub home {given.root} does not exist: a timer of a removed home ticked; remove it "
            f"with PISUB_HOME={given.root} pisub schedule uninstall"
        )
    store = ScheduleStore(open_home(home))
    report = _fire_all(store, DueReason.TIMER, now)
    store.write_last_tick(LastTick(at=now_iso(), pid=os.getpid(), source=source, fired=len(report.fired)))
    return report


def schedule_last_tick(*, home: Path | None = None) -> LastTick | None:
    """The last tick's mark (``schedules/last-tick.json``), None when none is readable."""
    return ScheduleStore(open_home_to_read(home)).last_tick()


def _fire_all(store: ScheduleStore, reason: DueReason, now: float | None) -> TickReport:
    from pisub.store.schedules import check_root

    report = TickReport()
    check_root(store.home)  # another user's schedules/ is refused whole; ours open to others tightened
    # Every lock is tried at once first; those held by another process are waited for after,
    # all against one deadline: a few stuck holders cost one wait, not one each, and never
    # delay the schedules that are free.
    deadline = time.monotonic() + LOCK_TIMEOUT_S
    later: list[str] = []
    for schedule_id in store.ids():
        hostile = store.hostile(schedule_id)
        if hostile is not None:  # planted: never locked, read or fired — moved aside
            where = store.quarantine(schedule_id, store.dir(schedule_id), f"{hostile}: never fired")
            moved = f" (moved to {where})" if where is not None else " (could not be moved aside)"
            report.errors.append(f"{schedule_id}: not fired, quarantined{moved}: {hostile}")
            continue
        if not _fire_one(store, schedule_id, 0.0, reason, now, report):
            later.append(schedule_id)
    for schedule_id in later:
        if not _fire_one(store, schedule_id, max(0.0, deadline - time.monotonic()), reason, now, report):
            report.busy.append(schedule_id)
    return report


def _fire_one(
    store: ScheduleStore,
    schedule_id: str,
    wait: float,
    reason: DueReason,
    now: float | None,
    report: TickReport,
) -> bool:
    """Handle one schedule under its lock (waiting ``wait`` seconds for it); False when another
    process held the lock all that time."""
    try:
        with store.locked(schedule_id, wait):
            store.sweep_temps(schedule_id)  # left by a process killed mid-write (we hold the lock)
            try:
                schedule = store.load(schedule_id)
            except ProtocolError as exc:
                where = store.quarantine(schedule_id, store.dir(schedule_id), str(exc))
                moved = f" (moved to {where})" if where is not None else ""
                report.errors.append(f"{schedule_id}: unreadable, quarantined{moved}: {exc.message}")
                return True
            _reconcile(store, schedule, report, launch_claims=True)
            _fire_due(store, schedule, reason, time.time() if now is None else now, report)
    except ScheduleNotFound:
        return True  # deleted meanwhile
    except LockBusy:
        return False
    except PisubError as exc:
        report.errors.append(f"{schedule_id}: {exc.message} [{exc.code}]")
    return True


def _next(schedule: Schedule) -> float | None:
    return epoch(schedule.next_run_at) if schedule.next_run_at is not None and not schedule.done else None


def _row(schedule: Schedule, state: FireState, planned: float, reason: DueReason, now: float) -> Fire:
    return Fire(
        id=uuid.uuid4().hex[:12],
        schedule_id=schedule.id,
        planned_at=iso(planned),
        due_reason=reason,
        state=state,
        claimed_at=iso(now),
    )


def _fire_due(
    store: ScheduleStore, schedule: Schedule, reason: DueReason, now: float, report: TickReport
) -> None:
    """Handle the schedule's due slots (under its lock, after :func:`_reconcile`)."""
    if schedule.paused:
        return
    every_s = schedule.trigger.every_s
    if every_s is not None and not schedule.done and schedule.next_run_at is None:
        # An interval never runs out of slots: a record without its next one (edited by hand)
        # goes on with the grid's next slot after now, and says so — it is never left silent.
        anchor = schedule.trigger.anchor_at or schedule.created_at
        schedule.next_run_at = iso(next_after(epoch(anchor), every_s, now))
        store.save(schedule)
        note = f"nextRunAt was missing; the next slot is {schedule.next_run_at}"
        store.event(schedule.id, "schedule.repaired", None, note)
        report.errors.append(f"{schedule.id}: {note}")
        return
    slot = due(_next(schedule), every_s, now)
    if slot is None:
        return
    if schedule.session_only and not (
        schedule.owner_session is not None and session_present(store.home, schedule.owner_session)
    ):
        report.waiting.append(schedule.id)  # the slot stays due until the session is back
        return
    rows: list[tuple[Fire, str]] = []
    if slot.older and slot.first_older is not None and every_s is not None:
        missed = _row(schedule, FireState.MISSED, slot.first_older, reason, now)
        missed.count = slot.older
        missed.last_planned_at = iso(slot.planned - every_s)
        missed.error = "older than the newest due slot"
        rows.append((missed, "fire.missed"))
    schedule.next_run_at = iso(slot.next_at) if slot.next_at is not None else None
    schedule.done = slot.next_at is None
    outcome: Fire | None = None
    if schedule.active is not None:
        outcome = _row(schedule, FireState.SKIPPED, slot.planned, reason, now)
        outcome.error = f"the previous fire (run {schedule.active.run_id}) still runs (overlap: skip)"
        rows.append((outcome, "fire.skipped"))
    elif schedule.catch_up is CatchUp.NONE and not slot.on_time():
        outcome = _row(schedule, FireState.MISSED, slot.planned, reason, now)
        outcome.error = f"{int(slot.late)} s late (catchUp: none)"
        rows.append((outcome, "fire.missed"))
    if outcome is not None:
        schedule.last = outcome
        store.save(schedule)
        for row, kind in rows:
            store.record(schedule.id, row)
            store.event(schedule.id, kind, row, row.error)
            (report.skipped if row.state is FireState.SKIPPED else report.missed).append(row)
        return
    quiet = schedule.quiet and every_s is not None
    fire = _claim_and_launch(store, schedule, iso(slot.planned), reason, quiet, now, rows, report)
    report.fired.append(fire)
    report.missed.extend(row for row, _kind in rows)


def _claim_and_launch(
    store: ScheduleStore,
    schedule: Schedule,
    planned: str,
    reason: DueReason,
    quiet: bool,
    now: float,
    rows: list[tuple[Fire, str]] | None = None,
    report: TickReport | None = None,
) -> Fire:
    """Claim the slot (one durable write of ``schedule.json`` naming the run id), then launch."""
    run_id = str(uuid.uuid4())
    fire = Fire(
        id=run_id,
        schedule_id=schedule.id,
        planned_at=planned,
        due_reason=reason,
        state=FireState.CLAIMED,
        run_id=run_id,
        claimed_at=iso(now),
        quiet=quiet,
        claimer_pid=os.getpid(),
    )
    schedule.active = fire
    store.save(schedule)  # the claim
    for row, kind in rows or []:
        store.record(schedule.id, row)
        store.event(schedule.id, kind, row, row.error)
    store.record(schedule.id, fire)
    store.event(schedule.id, "fire.claimed", fire)
    _launch(store, schedule, fire, report)
    return fire


def fire_label(schedule: Schedule) -> str:
    """The label of a fire's run: the schedule's ``label``, else ``schedule:<name>`` (cut to a
    label's length), else ``schedule:<id>`` — so ``pisub list`` tells a fire apart."""
    from pisub.store.paths import MAX_LABEL, check_label

    if schedule.target.label:
        return schedule.target.label
    for candidate in (f"schedule:{schedule.name}", f"schedule:{schedule.id}"):
        candidate = candidate[:MAX_LABEL].rstrip()
        try:
            return check_label(candidate)
        except InvalidInput:
            continue
    return f"schedule:{schedule.id}"


def _launch(store: ScheduleStore, schedule: Schedule, fire: Fire, report: TickReport | None = None) -> None:
    """Start the claimed fire's run with its run id (none with that id exists), then record
    what became of it. The run is top-level whoever ticks (a tick started inside a run does
    not make the fire that run's child)."""
    from pisub.api.client import launch_workflow
    from pisub.errors import LaunchFailed

    assert fire.run_id is not None
    target = schedule.target
    error: str | None = None
    try:
        store.script(schedule)  # refused when it is not this user's own file
        launch_workflow(
            store.dir(schedule.id) / target.copy_name,  # the copy: the run's task names it
            language=target.language,
            args=dict(target.args),
            cwd=schedule.cwd,
            timeout=target.timeout_s,
            base_ref=target.base_ref,
            label=fire_label(schedule),
            home=store.home.root,
            run_id=fire.run_id,
            mission=False,  # the seed's: a fire has no mission
            top_level=True,
        )
    except LaunchFailed as exc:  # the run exists, marked failed
        error = exc.message
    except (PisubError, OSError) as exc:
        error = exc.message if isinstance(exc, PisubError) else f"{exc.strerror or exc}"
    exists = fsio.lexists(store.home.run(fire.run_id).root)
    if exists:
        _notice(store, schedule, fire, report)
    if error is not None:
        fire.state = FireState.FAILED_LAUNCH
        fire.error = error
        fire.ended_at = now_iso()
        _end(store, schedule, fire, "fire.failed_launch")
        return
    fire.state = FireState.RUNNING
    fire.started_at = now_iso()
    schedule.fires += 1
    store.save(schedule)
    store.record(schedule.id, fire)
    store.event(schedule.id, "fire.started", fire)


def _notice(store: ScheduleStore, schedule: Schedule, fire: Fire, report: TickReport | None) -> None:
    """Record the fire's run in its session's notices ledger; why not (or what was repaired on
    the way) is an event ``fire.notice`` and an ``errors`` line of the tick — never silent."""
    if schedule.owner_session is None or fire.run_id is None:
        return
    key, name = schedule.owner_session, schedule.name
    why = record_notice(store.home, key, fire.run_id, schedule.id, name, fire.quiet)
    if why is not None:
        store.event(schedule.id, "fire.notice", fire, why)
        if report is not None:
            report.errors.append(f"{schedule.id}: run {fire.run_id}: {why}")


def _end(store: ScheduleStore, schedule: Schedule, fire: Fire, kind: str) -> None:
    schedule.active = None
    schedule.last = fire
    store.save(schedule)
    store.record(schedule.id, fire)
    store.event(schedule.id, kind, fire, fire.error)


def _reconcile(store: ScheduleStore, schedule: Schedule, report: TickReport, *, launch_claims: bool) -> None:
    """Bring the schedule's fire in progress up to date with its run (under the lock): a claim
    whose run does not exist is launched (``launch_claims``: its tick died before); a run that
    ended ends the fire. Liveness is the run's own (a dead runner is repaired when read), never
    the wall clock."""
    from pisub.api.client import Run

    fire = schedule.active
    if fire is None:
        return
    if fire.run_id is None:  # (not written by this version)
        fire.state = FireState.FAILED_LAUNCH
        fire.error = "the claim names no run"
        _end(store, schedule, fire, "fire.ended")
        return
    exists = fsio.lexists(store.home.run(fire.run_id).root)
    if fire.state is FireState.CLAIMED and not exists:
        if launch_claims:
            _launch(store, schedule, fire, report)
            report.fired.append(fire)
        return
    try:
        status = Run(fire.run_id, home=store.home.root).status()
    except (RunNotFound, ProtocolError) as exc:  # (gone, or its folder damaged for good)
        from pisub.store.runs import status_lost

        if isinstance(exc, ProtocolError) and not status_lost(store.home.run(fire.run_id)):
            return  # (unreadable for now, or a runner that lives writes it again: read next time)
        fire.state = FireState.FAILED_RUN
        fire.error = "its run directory is gone" if isinstance(exc, RunNotFound) else exc.message
        fire.ended_at = now_iso()
        _end(store, schedule, fire, "fire.ended")
        report.ended.append(fire)
        return
    if (
        fire.state is FireState.CLAIMED
        and status.state.is_terminal
        and status.repaired is RepairCause.NEVER_STARTED
    ):
        # The tick died after creating the run and before its runner started: nothing of it
        # ever ran (the repair proved it), so the slot is still to fire — with a new run id.
        if launch_claims:
            store.event(schedule.id, "fire.relaunched", fire, f"run {fire.run_id} never started")
            fire.run_id = str(uuid.uuid4())
            store.save(schedule)  # the new claim
            store.record(schedule.id, fire)
            _launch(store, schedule, fire, report)
            report.fired.append(fire)
        return
    if fire.state is FireState.CLAIMED:  # launched by a tick that died before recording it
        _notice(store, schedule, fire, report)
        fire.state = FireState.RUNNING
        fire.started_at = status.started_at
        schedule.fires += 1
        store.save(schedule)
        store.record(schedule.id, fire)
        store.event(schedule.id, "fire.started", fire, "recorded by a later tick")
    if not status.state.is_terminal:
        return
    fire.state = _RUN_END.get(status.state.value, FireState.FAILED_RUN)
    fire.run_state = status.state.value
    fire.ended_at = status.ended_at or now_iso()
    if status.error is not None and fire.state is not FireState.COMPLETED:
        fire.error = status.error.message[:500]
    _end(store, schedule, fire, "fire.ended")
    report.ended.append(fire)
