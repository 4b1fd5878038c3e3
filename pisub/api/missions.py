"""Missions as ``pisub mission`` and the pi tool manage them (``spec/missions.md``).

A mission holds a goal across workflows: its runs (and a workflow's children), decisions,
artifacts, receipts and a shared ``state``. Every read (:func:`mission_show`,
:func:`mission_list`, :func:`mission_next`) first brings its linked runs up to date the way
``pisub status`` reads a run (a run whose runner provably died is repaired), under the
mission's lock, so what it says is never stale.

>>> m = pisub.api.missions.mission_create(title="ship the parser")          # doctest: +SKIP
>>> pisub.api.missions.mission_attach_run(m.id, run.id)                      # doctest: +SKIP
>>> pisub.api.missions.mission_show(m.id).mission.status                     # doctest: +SKIP
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pisub.errors import InvalidInput, LockBusy, PisubError, RunNotFound
from pisub.protocol.codec import now_iso
from pisub.protocol.mission import (
    DecisionStatus,
    Mission,
    MissionRun,
    MissionStatus,
    MissionUpdate,
    MissionUsage,
    NoticeMark,
    RunMode,
    WorkflowChild,
    check_mission_id,
    check_one_line,
    check_session_key,
    parse_mission_update,
)
from pisub.protocol.workflow import SharedState
from pisub.store.missions import (
    TERMINAL_RUN,
    MissionStore,
    RunSeen,
    find,
    project_keys,
    project_of,
)
from pisub.store.paths import Home, open_home, open_home_to_read

NOTICE_MAX = 180
"""Longest goal continuation notice (characters)."""
READ_LOCK_TIMEOUT = 1.0
"""How long a read (``list``, ``next``) waits for a mission's lock before it shows the record as
last stored (``show`` waits :data:`SHOW_LOCK_TIMEOUT`): one held lock never stalls a listing."""
SHOW_LOCK_TIMEOUT = 5.0


def shown(mission: Mission) -> Mission:
    """A copy of ``mission`` as it leaves pisub (``show``, ``list``, ``--json``, the pi tool):
    every text a person or a tool gave — title, objective, labels, decisions, artifacts,
    receipts, summary, children's keys, the last notice — redacted like a run's output
    (:func:`pisub.core.redact.redact`). The record itself keeps what was given (a private 0600
    file, as a run's own logs are): nothing is lost, and a secret typed by mistake can still be
    replaced by an update."""
    import msgspec

    from pisub.api.text import redact

    m = msgspec.structs.replace(
        mission,
        title=redact(mission.title),
        objective=None if mission.objective is None else redact(mission.objective),
        summary=None if mission.summary is None else redact(mission.summary),
        labels=[redact(label) for label in mission.labels],
        decisions=[
            msgspec.structs.replace(
                d, title=redact(d.title), resolution=None if d.resolution is None else redact(d.resolution)
            )
            for d in mission.decisions
        ],
        artifacts=[
            msgspec.structs.replace(a, kind=redact(a.kind), path=redact(a.path)) for a in mission.artifacts
        ],
        receipts=[
            msgspec.structs.replace(r, status=redact(r.status), url=_redact_url(r.url))
            for r in mission.receipts
        ],
        workflow_children=[
            msgspec.structs.replace(c, key=None if c.key is None else redact(c.key))
            for c in mission.workflow_children
        ],
        last_notice=None
        if mission.last_notice is None
        else msgspec.structs.replace(mission.last_notice, text=redact(mission.last_notice.text)),
    )
    return m


def _redact_url(url: str) -> str:
    """A receipt's url redacted, its ``user:password@`` part masked too."""
    import re

    from pisub.api.text import redact

    return redact(re.sub(r"^(https?://)[^/@\s]*@", r"\1[REDACTED]@", url))


def redacted_values(value: Any) -> Any:
    """A mission state's values with every text in them redacted (for what leaves pisub)."""
    from pisub.api.text import redact

    if isinstance(value, str):
        return redact(value)
    if isinstance(value, list):
        return [redacted_values(v) for v in value]
    if isinstance(value, dict):
        return {k: redacted_values(v) for k, v in value.items()}
    return value


@dataclass
class MissionListing:
    """What :func:`mission_list` found."""

    missions: list[Mission] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    """Entries of the stores that are not missions of ours, each with the reason; and missions
    shown as last stored (their lock was held), each with why."""
    roots: dict[str, str] = field(default_factory=dict)
    """Project key → the project's root (``project.json``)."""


@dataclass
class MissionView:
    """One mission as :func:`mission_show` reads it: the record (its runs refreshed), the
    project's root and the next step a person would take."""

    mission: Mission
    next_step: str
    root: str | None = None
    notes: list[str] = field(default_factory=list)
    """Why the mission is shown as last stored (its lock was held), if it is."""


@dataclass
class Notice:
    """:func:`mission_next`'s answer: ``notice`` (≤ 180 characters) or None, the mission it is
    about, and why (``notice``, ``budget-exhausted``, ``run-active``, ``no-progress``,
    ``nothing-ready``, ``no-goal-missions``)."""

    notice: str | None
    mission_id: str | None
    reason: str
    skipped: list[str] = field(default_factory=list)
    """Goal missions left out of this answer (unreadable state, a held lock), each with why
    (the CLI prints them on stderr; not in :meth:`to_json`)."""

    def to_json(self) -> dict[str, Any]:
        return {"notice": self.notice, "missionId": self.mission_id, "reason": self.reason}


def _cwd(cwd: str | Path | None) -> Path:
    from pisub.runs.launch import working_dir

    try:
        return working_dir(cwd)
    except InvalidInput as exc:
        if cwd is not None:
            raise
        raise InvalidInput(f"{exc.message[:300]}; run it from another directory, or give --cwd DIR") from None
    except OSError as exc:  # (a path too long to resolve: ENAMETOOLONG, ELOOP)
        where = os.fsdecode(exc.filename or cwd or ".")
        shown = where if len(where) <= 120 else where[:60] + "…" + where[-59:]
        fix = (
            "give --cwd with a shorter path"
            if cwd is not None
            else "run it from a shorter path, or give --cwd DIR"
        )
        raise InvalidInput(f"working directory {shown}: {exc.strerror or exc}; {fix}") from None


def _store_of(home: Home, cwd: str | Path | None) -> MissionStore:
    return MissionStore(home, project_of(_cwd(cwd))[0])


def _found(home: Home, mission_id: str, cwd: str | Path | None) -> MissionStore:
    """The store holding ``mission_id``: this project's first, else any."""
    check_mission_id(mission_id)
    try:
        first: str | None = project_of(_cwd(cwd))[0]
    except InvalidInput:
        if cwd is not None:
            raise
        first = None  # (a working directory pisub cannot use: every store is searched)
    return find(home, mission_id, first=first)


# ---- reading runs ------------------------------------------------------------------------


def _usage_of_result(home: Home, run_id: str) -> MissionUsage:
    from pisub.store.runs import load_result

    result = load_result(home.run(run_id))
    total = MissionUsage()
    for single in result.details.results if result is not None else []:
        u = single.usage  # (a negative count — a broken result — counts 0, never against others)
        total.tokens += sum(max(0, int(n)) for n in (u.input, u.output, u.cache_read, u.cache_write))
        total.cost_usd += max(0.0, u.cost)
        total.turns += max(0, u.turns)
    total.cost_usd = round(total.cost_usd, 6)
    return total


def see_run(home: Home, run: MissionRun) -> RunSeen:
    """Linked run ``run`` now, read as ``pisub status`` reads it (a dead runner's run is
    repaired); ``missing`` once its directory is gone, as it was when it cannot be read."""
    from pisub.runs.reconcile import observe

    try:
        st = observe(home.run(run.run_id))
    except RunNotFound:
        return RunSeen(status="missing", ended_at=run.ended_at)
    except PisubError:
        return RunSeen(status=run.status, ended_at=run.ended_at)
    children = None
    if st.runner == "workflow":
        children = [
            WorkflowChild(
                workflow_run_id=run.run_id, key=s.key, status=str(s.status), run_id=s.run_id, agent=s.agent
            )
            for s in st.steps
        ]
    state = str(st.state)
    usage: MissionUsage | None = None
    try:
        if st.state.is_terminal:
            if state != run.status or st.ended_at != run.ended_at:
                usage = _usage_of_result(home, run.run_id)
        elif st.usage is not None:
            usage = MissionUsage(
                tokens=max(0, int(st.usage.tokens)), cost_usd=round(max(0.0, st.usage.cost_usd), 6)
            )
        else:  # a live workflow: what its ended children used
            usage = MissionUsage()
            for step in st.steps:
                if step.run_id and str(step.status) in TERMINAL_RUN:
                    part = _usage_of_result(home, step.run_id)
                    usage.tokens += part.tokens
                    usage.cost_usd = round(usage.cost_usd + part.cost_usd, 6)
                    usage.turns += part.turns
    except PisubError:
        usage = None  # (a result that cannot be read counts as before)
    return RunSeen(status=state, ended_at=st.ended_at, usage=usage, children=children)


def _refreshed(
    home: Home,
    store: MissionStore,
    mission: Mission,
    timeout: float | None = None,
    notes: list[str] | None = None,
) -> Mission:
    """``mission`` with its runs read now. With ``timeout`` (a read): a lock held longer gives
    the record as last stored, and a line saying so in ``notes``."""
    if not mission.runs:
        return mission
    if timeout is None:
        return store.refresh(mission.id, lambda run: see_run(home, run))
    try:
        return store.refresh(mission.id, lambda run: see_run(home, run), timeout=timeout)
    except LockBusy as exc:
        if notes is not None:
            notes.append(f"mission {mission.id}: shown as last stored, not refreshed ({exc.message})")
        return mission


# ---- the actions -------------------------------------------------------------------------


def mission_create(
    *,
    title: str | None = None,
    summary: str | None = None,
    objective: str | None = None,
    goal: bool = False,
    budget_tokens: int | None = None,
    labels: Sequence[str] = (),
    cwd: str | Path | None = None,
    session_key: str | None = None,
    home: Path | None = None,
) -> Mission:
    """A new ``planned`` mission in ``cwd``'s project (exactly one of ``title`` and
    ``summary``; a ``goal`` mission needs ``budget_tokens``; ``session_key``: the pi session
    that owns it, whose idle turns get its continuation notices).

    Raises:
        InvalidInput: naming the field."""
    given = [v for v in (title, summary) if v is not None]
    if len(given) != 1:
        raise InvalidInput("give exactly one of --title and --summary")
    h = open_home(home)
    workdir = _cwd(cwd)
    store = MissionStore(h, project_of(workdir)[0])
    return _create(store, workdir, title, summary, objective, goal, budget_tokens, labels, session_key)


def _create(
    store: MissionStore,
    workdir: Path,
    title: str | None,
    summary: str | None,
    objective: str | None,
    goal: bool,
    budget_tokens: int | None,
    labels: Sequence[str],
    session_key: str | None,
) -> Mission:
    given = title if title is not None else summary
    assert given is not None
    return shown(
        store.create(
            title=check_one_line(given, "title" if title is not None else "summary", 200),
            cwd=workdir,
            objective=objective,
            goal=goal,
            budget_tokens=budget_tokens,
            labels=list(labels),
            owner_session=session_key,
        )
    )


def mission_list(
    *, scope: str = "project", cwd: str | Path | None = None, home: Path | None = None
) -> MissionListing:
    """This project's missions (``scope`` ``global``: every project's), newest first, each
    refreshed from its runs; entries that are not missions are skipped with the reason."""
    if scope not in ("project", "global"):
        raise InvalidInput(f"--scope: project or global, not {scope!r:.40}")
    h = open_home_to_read(home)  # (no home: no missions)
    listing = MissionListing()
    if scope == "global":
        keys, listing.skipped = project_keys(h)
    else:
        keys = [project_of(_cwd(cwd))[0]]
    for key in keys:
        store = MissionStore(h, key)
        found = store.listing()
        listing.skipped += found.skipped
        info = store.info()
        if info is not None:
            listing.roots[key] = info.root
        for mission in found.missions:
            try:
                listing.missions.append(
                    shown(_refreshed(h, store, mission, READ_LOCK_TIMEOUT, listing.skipped))
                )
            except PisubError as exc:
                listing.skipped.append(f"mission {mission.id}: {exc.message}")
    listing.missions.sort(key=lambda m: m.created_at, reverse=True)
    return listing


def mission_show(mission_id: str, *, cwd: str | Path | None = None, home: Path | None = None) -> MissionView:
    """Mission ``mission_id`` (this project's, else any project's), its runs refreshed.

    Raises:
        MissionNotFound: no such mission."""
    h = open_home_to_read(home)
    store = _found(h, mission_id, cwd)
    notes: list[str] = []
    mission = shown(_refreshed(h, store, store.get(mission_id), SHOW_LOCK_TIMEOUT, notes))
    try:
        step = next_step(mission, redacted_values(store.state(mission.id).snapshot().values))
    except PisubError as exc:
        step = f"repair its state: {exc.message}"
    info = store.info()
    return MissionView(mission, step, info.root if info else None, notes)


def mission_update(
    mission_id: str,
    update: str | bytes | dict[str, Any] | MissionUpdate,
    *,
    cwd: str | Path | None = None,
    home: Path | None = None,
) -> Mission:
    """Apply the seed's ``missionUpdate`` (JSON text or an object; strict, the field's path in
    every error): ``title``, ``objective`` and ``labels`` replace; ``status`` sets it (a final
    one closes the mission); ``budget`` replaces the token budget; ``decisions`` add or change
    decisions by id (an open one gates the mission as ``needs_decision``); ``artifacts`` and
    ``receipts`` are added (a receipt of the same kind and url replaced)."""
    checked = update if isinstance(update, MissionUpdate) else parse_mission_update(update)
    h = open_home(home)
    store = _found(h, mission_id, cwd)
    return shown(_refreshed(h, store, store.update(mission_id, checked)))


def mission_resolve_decision(
    mission_id: str,
    decision_id: str,
    summary: str,
    *,
    cwd: str | Path | None = None,
    home: Path | None = None,
) -> Mission:
    """Resolve one decision with ``summary``; resolving the last open one returns the mission to
    ``active``."""
    h = open_home(home)
    store = _found(h, mission_id, cwd)
    return shown(_refreshed(h, store, store.resolve_decision(mission_id, decision_id, summary)))


def mission_attach_run(
    mission_id: str,
    run: str,
    *,
    mode: str | None = None,
    cwd: str | Path | None = None,
    home: Path | None = None,
) -> Mission:
    """Link run ``run`` (an id, a unique prefix or ``@LABEL``) to the mission; ``mode``
    ``workflow`` or ``run`` (default: what the run is). Idempotent.

    Raises:
        RunNotFound, AmbiguousRun: ``run`` names no single run.
        InvalidInput: the mission is closed."""
    from pisub.runs.reconcile import observe
    from pisub.store.runs import RunStore

    h = open_home(home)
    store = _found(h, mission_id, cwd)
    paths = RunStore(h).resolve(run)
    if mode is None:
        mode = RunMode.WORKFLOW if observe(paths).runner == "workflow" else RunMode.RUN
    elif mode not in ("workflow", "run"):
        raise InvalidInput(f"--mode: workflow or run, not {mode!r:.40}")
    return shown(_refreshed(h, store, store.attach_run(mission_id, paths.run_id, mode)))


def mission_close(
    mission_id: str,
    status: str,
    *,
    summary: str | None = None,
    cwd: str | Path | None = None,
    home: Path | None = None,
) -> Mission:
    """Close the mission as ``completed``, ``failed`` or ``cancelled`` (with ``summary``): an
    explicit close wins over whatever its runs do later."""
    try:
        final = MissionStatus(status)
    except ValueError:
        raise InvalidInput(f"--status: completed, failed or cancelled, not {status!r:.40}") from None
    h = open_home(home)
    store = _found(h, mission_id, cwd)
    mission = _refreshed(h, store, store.get(mission_id))
    return shown(store.close(mission.id, final, summary))


# ---- goal continuation notices --------------------------------------------------------------


def mission_next(session_key: str, *, home: Path | None = None) -> Notice:
    """The continuation notice for pi session ``session_key``'s goal missions (every project):
    one line of at most 180 characters drawn from the mission's ``state.nextReadyAction``,
    ``state.nextAction``, a ``ready`` item or an open decision; ``budget-exhausted`` once its
    usage reached its budget. None while any of their linked runs is live, and never twice
    in a row for a mission that made no progress since (no new run, no change of its state,
    no update): a parent that only answers "ok" is not woken again and again.
    Nothing is launched."""
    check_session_key(session_key, "--session-key")
    h = open_home(home)
    keys, _ = project_keys(h)
    skipped: list[str] = []
    goals: list[tuple[MissionStore, Mission]] = []
    for key in keys:
        store = MissionStore(h, key)
        try:
            found = store.listing().missions
        except PisubError as exc:
            skipped.append(exc.message)
            continue
        for mission in found:
            if mission.goal and mission.owner_session == session_key and not mission.status.is_terminal:
                try:
                    goals.append((store, _refreshed(h, store, mission, READ_LOCK_TIMEOUT, skipped)))
                except PisubError as exc:
                    skipped.append(f"mission {mission.id}: {exc.message}")
    goals = [(s, m) for s, m in goals if not m.status.is_terminal]
    if not goals:
        return Notice(None, None, "no-goal-missions", skipped)
    goals.sort(key=lambda sm: sm[1].created_at)
    for _, mission in goals:
        if any(r.status not in TERMINAL_RUN for r in mission.runs):
            return Notice(None, mission.id, "run-active", skipped)
    why = "nothing-ready"
    about: str | None = goals[0][1].id
    for store, mission in goals:
        try:  # one goal mission that cannot be read never silences the others
            state = store.state(mission.id).snapshot()
        except PisubError as exc:
            skipped.append(f"mission {mission.id}: its state is unreadable, no notice from it: {exc.message}")
            continue
        text, reason = continuation(shown(mission), redacted_values(state.values))
        if text is None:
            continue
        progress = _progress(mission, state)
        if mission.last_notice is not None and mission.last_notice.progress == progress:
            why, about = "no-progress", mission.id
            continue
        try:
            taken = _mark(store, mission.id, text, reason, progress)
        except PisubError as exc:
            skipped.append(f"mission {mission.id}: {exc.message}")
            continue
        if taken:
            return Notice(text, mission.id, reason, skipped)
        why, about = "no-progress", mission.id
    return Notice(None, about, why, skipped)


def _progress(mission: Mission, state: SharedState) -> str:
    """What counts as progress between two notices: a new run, a change of the state, an update."""
    return f"runs={len(mission.runs)};revision={mission.revision};state={state.updated_at or '-'}"


def _mark(store: MissionStore, mission_id: str, text: str, reason: str, progress: str) -> bool:
    """Record the notice under the lock, unless another caller noticed the same progress first."""
    taken: list[bool] = []

    def mark(mission: Mission) -> bool:
        if mission.last_notice is not None and mission.last_notice.progress == progress:
            return False
        if _progress_now(mission, progress) != progress:
            return False  # (changed meanwhile: the next call sees it)
        mission.last_notice = NoticeMark(at=now_iso(), text=text, reason=reason, progress=progress)
        taken.append(True)
        return True

    store.modify(mission_id, mark, by_person=False, timeout=READ_LOCK_TIMEOUT)
    return bool(taken)


def _progress_now(mission: Mission, progress: str) -> str:
    state_part = progress.rsplit(";state=", 1)[1]
    return f"runs={len(mission.runs)};revision={mission.revision};state={state_part}"


def continuation(mission: Mission, values: dict[str, Any]) -> tuple[str | None, str]:
    """The notice a goal mission gives now (and its reason), or None and why not."""
    head = f"Goal mission {mission.id} ({_squeeze(mission.title, 40)})"
    budget = mission.budget.tokens if mission.budget else 0
    used = mission.usage.tokens
    if budget and used >= budget:
        text = f"{head}: budget exhausted, {used}/{budget} tokens; close it or raise budget.tokens"
        return _fit(text), "budget-exhausted"
    action = next_action(mission, values)
    if action is None:
        return None, "nothing-ready"
    tail = f" ({used}/{budget} tokens)"
    room = NOTICE_MAX - len(head) - len(": next: ") - len(tail)
    return f"{head}: next: {_squeeze(action, max(room, 10))}{tail}"[:NOTICE_MAX], "notice"
    # (the mission and state given are redacted already, before anything is cut: a secret cut
    # in half by "…" would no longer look like one)


def next_action(mission: Mission, values: dict[str, Any]) -> str | None:
    """From the state: ``nextReadyAction``, ``nextAction``, a ``ready`` item (``ready``'s first,
    or the first item of a list in the state whose ``status`` is ``ready``), else an open
    decision."""
    for name in ("nextReadyAction", "nextAction"):
        shown = _item_text(values.get(name))
        if shown:
            return shown
    ready = values.get("ready")
    if isinstance(ready, list) and ready:
        shown = _item_text(ready[0])
        if shown:
            return shown
    elif _item_text(ready):
        return _item_text(ready)
    for value in values.values():
        if isinstance(value, list):
            for item in value:
                if isinstance(item, dict) and item.get("status") == "ready":
                    shown = _item_text(item)
                    if shown:
                        return shown
    for decision in mission.decisions:
        if decision.status == DecisionStatus.OPEN:
            return f"decide {decision.id}: {decision.title}"
    return None


def _item_text(item: Any) -> str | None:
    if isinstance(item, str):
        return item.strip() or None
    if isinstance(item, dict):
        for name in ("title", "summary", "action", "task", "name", "description"):
            if isinstance(item.get(name), str) and item[name].strip():
                return str(item[name]).strip()
        return json.dumps(item, ensure_ascii=False)[:200] if item else None
    return None


def _squeeze(text: str, width: int) -> str:
    """``text`` on one line (control characters escaped, runs of spaces one), cut to ``width``."""
    from pisub.termsafe import printable

    flat = " ".join(printable(text, one_line=True).replace("\\n", " ").split())
    return flat if len(flat) <= width else flat[: max(width - 1, 0)] + "…"


def _fit(text: str) -> str:
    return text if len(text) <= NOTICE_MAX else text[: NOTICE_MAX - 1] + "…"


def next_step(mission: Mission, values: dict[str, Any]) -> str:
    """What a person would do next with the mission (``pisub mission show``)."""
    mid = mission.id
    if mission.status.is_terminal:
        how = "closed" if mission.closed else "its runs ended"
        return f"none: the mission is {mission.status} ({how})"
    for decision in mission.decisions:
        if decision.status == DecisionStatus.OPEN:
            return (
                f"decide {decision.id} ({decision.title}): "
                f"pisub mission resolve-decision {mid} {decision.id} --summary TEXT"
            )
    live = [r for r in mission.runs if r.status not in TERMINAL_RUN]
    if live:
        return f"wait for run {live[0].run_id[:8]} ({live[0].status}): pisub status {live[0].run_id[:8]}"
    if mission.goal and mission.budget and mission.usage.tokens >= mission.budget.tokens:
        return f"budget exhausted: pisub mission close {mid} --status completed, or raise budget.tokens"
    action = next_action(mission, values)
    if action is not None:
        return action
    if not mission.runs:
        return f"start work: pisub run --workflow FILE --mission-id {mid}"
    if mission.status == MissionStatus.WAITING:
        last = mission.runs[-1].run_id[:8]
        return f"run {last} paused: pisub resume {last}, or start another with --mission-id {mid}"
    return f"start the next workflow with --mission-id {mid}, or pisub mission close {mid} --status completed"
