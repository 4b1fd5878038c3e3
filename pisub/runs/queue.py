"""Who may run in a group: the promotion rule (``spec/queue.md``), decided only under the
group's lock by whoever frees a slot or finds one free — a runner that ends, a reader that
repairs a dead run, a waiting runner's own check, ``pisub group resume`` / ``set-limit``.

The rule: the *holders* are the admitted entries (``a-…``) whose run has not ended (one whose
runner is proven dead holds its slot until a repair — a reader's, or a waiting runner's —
ended what is left of its child); while fewer than the group's limit hold a slot and the group is not
paused, the first waiting entries (``q-…``, highest priority first, then launch order) whose
runner lives and whose ``--after`` runs all ended ``complete`` are admitted — each by one
atomic rename to ``a-…`` — and their runners rung (``SIGUSR1``). An entry of an ended run,
and a waiting entry whose runner is provably dead, is removed. Liveness is the runner's lock or
its pid with its start ticks (never the wall clock), as :mod:`pisub.runs.reconcile` proves it;
a run whose state cannot be read holds its slot (never more than the limit run).
"""

from __future__ import annotations

import contextlib
import enum
import os
import signal
from pathlib import Path

import msgspec

from pisub.core.locks import is_held
from pisub.core.procs import is_alive, start_ticks
from pisub.errors import InvalidInput, PisubError
from pisub.protocol.queue import DEFAULT_GROUP, GroupConfig, QueueEntry, QueueRequest
from pisub.protocol.status import RunState
from pisub.store import groups
from pisub.store.groups import EntryName
from pisub.store.paths import Home, RunPaths


def _step(point: str) -> None:
    """A named step of a promotion (fault injection replaces this in tests; a no-op here)."""


class Verdict(enum.Enum):
    RUNS = "runs"
    """Its runner is not proven dead and its run has not ended."""
    DEAD = "dead"
    """Its runner is proven dead but its run is not repaired yet: an admitted one keeps its
    slot until a repair ends what is left of its child (its slot is never used twice)."""
    GONE = "gone"
    """Its run ended, or its directory is gone: its entry is removed."""


def verdict(home: Home, run_id: str, entry: QueueEntry | None = None) -> Verdict:
    """What became of the run of an entry: anything but proof of its end or its runner's death
    is :attr:`Verdict.RUNS`. A run whose directory is gone is :attr:`Verdict.GONE` unless its
    entry (``entry``: its runner's pid and start ticks) shows that runner still alive."""
    paths = home.run(run_id)
    if is_held(paths.runner_lock):
        return Verdict.RUNS
    if not os.path.isdir(paths.root):
        return Verdict.RUNS if entry is not None and _runner_alive(entry) else Verdict.GONE
    from pisub.backends import Liveness, liveness
    from pisub.store.runs import load_status

    try:
        status = load_status(paths)
        if status.state.is_terminal or os.path.lexists(paths.result):
            return Verdict.GONE
        return Verdict.DEAD if liveness(paths, status) == Liveness.DEAD else Verdict.RUNS
    except (PisubError, OSError):
        return Verdict.RUNS  # unreadable: it keeps its slot (fail closed)


def deps_state(home: Home, after: list[str]) -> tuple[bool, str | None]:
    """Whether every run of ``after`` ended ``complete``; and, when one ended otherwise or is
    gone, why the waiting run fails (read as found: a reader's repair ends a dead one)."""
    from pisub.store.runs import load_status

    ready = True
    for run_id in after:
        try:
            state = load_status(home.run(run_id)).state
        except (PisubError, OSError):
            if not os.path.isdir(home.run(run_id).root):
                return False, f"run {run_id} it waits for (--after) no longer exists"
            ready = False
            continue
        if state.is_terminal and state != RunState.COMPLETE:
            return False, f"run {run_id} it waits for (--after) ended {state.value}"
        ready = ready and state == RunState.COMPLETE
    return ready, None


def _runner_alive(entry: QueueEntry) -> bool:
    return entry.pid is not None and is_alive(entry.pid, None, entry.pid_start_ticks)


def holder_verdict(home: Home, directory: Path, entry: EntryName) -> Verdict:
    """:func:`verdict` of an admitted entry's run, its runner's identity read from the entry
    (a run directory removed under a live runner keeps its slot until that runner ends)."""
    return verdict(home, entry.run_id, groups.peek_entry(directory, entry))


class Promotion(msgspec.Struct):
    """What one decision did."""

    admitted: list[str]
    holders: int
    dropped: list[str]


def promote(home: Home, group: str) -> Promotion:
    """Admit what the group's free slots allow (under its lock)."""
    with groups.locked(home, group) as directory:
        return _promote(home, group, directory)


def _limit_of(home: Home, group: str) -> tuple[int | None, bool]:
    """The group's limit and whether it is paused; a ``group.json`` that cannot be read admits
    nothing (paused) until ``pisub group set-limit`` rewrites it."""
    try:
        config = groups.load_config(home, group)
    except PisubError:
        return 0, True
    if config is None:  # `default` never configured: no limit; otherwise: fail closed
        return (None, False) if groups.unconfigured(home, group) else (0, True)
    return config.limit, config.paused


def _promote(home: Home, group: str, directory: Path) -> Promotion:
    _step("queue.locked")
    limit, paused = _limit_of(home, group)
    found = groups.entries(directory)
    done = Promotion([], 0, [])
    for entry in found:
        if entry.admitted:
            if holder_verdict(home, directory, entry) is not Verdict.GONE:
                done.holders += 1  # a dead one until its repair ended what is left of it
            elif groups.remove(directory, entry):
                done.dropped.append(entry.run_id)
    if paused:
        return done
    free = (limit - done.holders) if limit is not None else len(found)
    for entry in found:
        if free <= 0:
            break
        if entry.admitted:
            continue
        if verdict(home, entry.run_id) is not Verdict.RUNS:  # a dead waiter never started a child
            if groups.remove(directory, entry):
                done.dropped.append(entry.run_id)
            continue
        content = groups.read_entry(directory, entry)
        if content is None or not deps_state(home, content.after)[0]:
            continue  # unreadable (set aside: its runner writes it again), or waiting for runs
        groups.admit(directory, entry)
        _step("queue.admitted")
        free -= 1
        done.admitted.append(entry.run_id)
        _ring(content)
        _step("queue.rung")
    return done


def _ring(entry: QueueEntry) -> None:
    """Wake an admitted runner (it also finds its admission on its own: the signal only saves
    it the wait for its next check)."""
    if entry.pid is None or not is_alive(entry.pid, None, entry.pid_start_ticks):
        return
    with contextlib.suppress(OSError):
        os.kill(entry.pid, signal.SIGUSR1)


def register(home: Home, run_id: str, request: QueueRequest, name: EntryName | None = None) -> EntryName:
    """Put a run into its group (again, under ``name``, when its entry vanished) and decide at
    once; its entry as it stands after the decision (``admitted``: it may start)."""
    me = os.getpid()
    content = QueueEntry(
        v=1,
        run_id=run_id,
        priority=request.priority,
        after=request.after,
        pid=me,
        pid_start_ticks=start_ticks(me),
    )
    fresh = request.group == DEFAULT_GROUP and groups.unconfigured(home, DEFAULT_GROUP)
    with groups.locked(home, request.group, create=request.group == DEFAULT_GROUP) as directory:
        if request.group != DEFAULT_GROUP and not groups.exists(home, request.group):
            raise InvalidInput(f"no group {request.group!r} (removed while it waited)")
        if fresh and not groups.exists(home, DEFAULT_GROUP):
            groups.mark_unconfigured(directory)
        entry = groups.find(directory, run_id)
        if entry is None:
            if name is None:
                seq = 1 + max((e.seq for e in groups.entries(directory)), default=0)
                name = EntryName.new(request.priority, seq, run_id)
            entry = name
            groups.write_entry(directory, entry, content)
        _promote(home, request.group, directory)
        return groups.find(directory, run_id) or entry


def leave(home: Home, group: str, run_id: str) -> Promotion | None:
    """A run of ``group`` ended (or was found dead): its entry removed, then its slot given to
    the next run; None when it had no entry (already left)."""
    with groups.locked(home, group) as directory:
        entry = groups.find(directory, run_id)
        if entry is None:
            return None
        groups.remove(directory, entry)
        _step("queue.left")
        return _promote(home, group, directory)


def leave_run(paths: RunPaths) -> None:
    """:func:`leave` for the run of ``paths`` when its manifest names a group, then the event
    ``run.left`` (``group``, ``admitted``: the runs given a slot). Never raises: the waiting
    runners' own checks fill the slot when this could not."""
    from pisub.store.runs import append_event, load_manifest

    try:
        request = load_manifest(paths).queue
        if request is None:
            return
        done = leave(paths.home, request.group, paths.run_id)
        if done is not None:
            append_event(paths, "run.left", group=request.group, admitted=done.admitted)
    except (PisubError, OSError):
        pass


def position(home: Home, group: str, run_id: str) -> tuple[int, int] | None:
    """A waiting run's place in its group's queue (1-based) and the queue's length; None when
    it is not waiting there."""
    try:
        waiting = [e for e in groups.entries(groups.group_dir(home, group)) if not e.admitted]
    except PisubError:
        return None
    for n, entry in enumerate(waiting, start=1):
        if entry.run_id == run_id:
            return n, len(waiting)
    return None


def request_for(
    home: Home,
    group: str | None,
    priority: int | None,
    after: list[str] | None,
    *,
    top_level: bool,
    backend: str | None,
) -> QueueRequest | None:
    """What a launch asks of the queue: ``group`` (else ``default`` once it is configured), the
    priority and the ``--after`` runs resolved to ids; None when the run is in no group.

    Raises:
        InvalidInput: a bad name or value (named), a group that does not exist, a run inside a
            run, a Slurm run, an ``--after`` run that does not exist.
    """
    from pisub.protocol.queue import MAX_AFTER, check_group_name, check_priority

    asked = group is not None or priority is not None or bool(after)
    if group is not None:
        check_group_name(group, "group")
    if priority is not None:
        check_priority(priority, "priority")
    if asked and not top_level:
        raise InvalidInput("group: a run started inside a run is in no group (its tree has a spawn budget)")
    if not top_level:
        return None
    name = group or DEFAULT_GROUP
    groups.check_groups_dir(home)
    if group is not None and name != DEFAULT_GROUP and not groups.exists(home, name):
        raise InvalidInput(f"group: no group {name!r}; create it: pisub group add {name} --limit N")
    if not asked and groups.unconfigured(home, DEFAULT_GROUP):
        return None  # the default group is unconfigured: today's behaviour, everything starts
    if backend not in (None, "local"):
        raise InvalidInput("group: a Slurm run is queued by Slurm itself; drop --group/--priority/--after")
    refs = list(after or [])
    if len(refs) > MAX_AFTER:
        raise InvalidInput(f"after: at most {MAX_AFTER} runs")
    from pisub.store.runs import RunStore

    store = RunStore(home)
    ids = []
    for n, ref in enumerate(refs):
        if not isinstance(ref, str):
            raise InvalidInput(f"after[{n}]: give a run id, not {type(ref).__name__}")
        ids.append(store.resolve(ref).run_id)
    return QueueRequest(group=name, priority=priority or 0, after=sorted(set(ids)))


class GroupView(msgspec.Struct):
    """One group as ``pisub group list`` shows it."""

    name: str
    limit: int | None
    paused: bool
    running: int
    queued: int
    error: str | None = None


def view(home: Home, name: str) -> GroupView:
    """A group's settings and counts (read without its lock: a moment's view)."""
    error = None
    try:
        config = groups.load_config(home, name)
        if config is None and not groups.unconfigured(home, name):
            error = f"group.json is missing (admits nothing); rewrite it: pisub group set-limit {name} N"
    except PisubError as exc:
        config, error = None, exc.message
    directory = groups.group_dir(home, name)
    if not groups.dir_exists(home, name) and os.path.lexists(directory):
        return GroupView(name, None, True, 0, 0, groups.not_a_directory(name))
    try:
        found = groups.entries(directory)
    except PisubError as exc:
        found, error = [], exc.message
    running = sum(1 for e in found if e.admitted and holder_verdict(home, directory, e) is not Verdict.GONE)
    queued = sum(1 for e in found if not e.admitted)
    config = config or GroupConfig(v=1, name=name)
    return GroupView(name, config.limit, config.paused or error is not None, running, queued, error)
