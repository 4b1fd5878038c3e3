"""Crash detection and repair, done by whichever reader notices first.

A run that is not terminal is checked by the backend that placed its runner
(:func:`pisub.backends.liveness`; ``local``: its pid still runs with the recorded start —
boot-relative ticks, never the wall clock — on this boot, or ``runner.lock`` is held; ``slurm``:
the engine says its job is terminal and its heartbeat lease expired). Only when the runner is
proven dead does the reader, under the repair lock (a ``flock`` on the run directory), fence the
run (a Slurm run's heartbeat taken over), end every process left of the child, write a
``failed`` result (with the tail of ``runner.log``) unless one exists, and write the terminal
status — exactly once. Without proof (another host, an unreachable engine) nothing is repaired.

Every function here raises only :class:`~pisub.errors.PisubError`: an ``OSError`` (full disk,
permissions) is translated into :class:`~pisub.errors.StorageError` where it enters.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from pisub.core.fsio import read_tail
from pisub.core.locks import exclusive
from pisub.errors import PisubError, ProtocolError, RunNotFound, StorageError, storage_error
from pisub.protocol.codec import now_iso
from pisub.protocol.host import HostReason, HostState
from pisub.protocol.result import (
    UNWRITTEN_END,
    Details,
    ErrorCode,
    ErrorInfo,
    Result,
    TextContent,
    UnwrittenEnd,
)
from pisub.protocol.status import RepairCause, RunState, Status, StepState
from pisub.store.mailbox import (
    FINISHED_REASON,
    close_inbox,
    is_closed,
    needs_answers,
    quarantine,
    settle_closed_inbox,
)
from pisub.store.paths import RunPaths
from pisub.store.runs import append_event, load_manifest, load_result, load_status, write_result, write_status

P = ParamSpec("P")
T = TypeVar("T")

RUNNER_DIED_REASON = "the runner died before the request was consumed"
_TRACEBACK_LINE = re.compile(r"^(?:Traceback \(most recent call last\):|\s+File \"|\s{4,}\S|\s+\^+\s*$)")
"""The frames of a Python traceback in ``runner.log``: left out of a crash message (its last
line, the exception, stays)."""
STRAY_SWEEPS = 5
OUTPUT_KEPT = 1024 * 1024
"""How much of the end of a child's output log a repaired result of an unwritten end keeps."""
LOG_TAIL_LINES = 30
LOG_TAIL_CHARS = 4000


def _translated(fn: Callable[P, T]) -> Callable[P, T]:
    """Translate an ``OSError`` escaping ``fn(paths, ...)`` into :class:`StorageError` — or into
    :class:`RunNotFound` when the run directory itself is gone meanwhile (``pisub gc``)."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        paths = args[0]
        assert isinstance(paths, RunPaths)
        try:
            return fn(*args, **kwargs)
        except (OSError, StorageError) as exc:
            if not os.path.isdir(paths.root):
                raise RunNotFound(f"run {paths.run_id} was removed (pisub gc) while it was read") from exc
            if isinstance(exc, StorageError):
                raise
            # (an OSError from a write of a file object names no file: name the run then)
            raise storage_error(exc, "update the run files at", exc.filename or paths.root) from exc

    return wrapper


def runner_alive(paths: RunPaths, status: Status) -> bool:
    """Whether the run's runner (or its launcher, before the commit) may still live: anything
    but a proven death."""
    from pisub.backends import Liveness, liveness

    return liveness(paths, status) != Liveness.DEAD


@_translated
def observe(paths: RunPaths) -> Status:
    """The run's status after any crash repair.

    A run whose ``result.json`` exists is reported terminal even if ``status.json`` has
    not caught up yet.
    """
    status = load_status(paths)
    if status.state.is_terminal:
        if needs_answers(paths):
            _answer_closed_inbox(paths, status)
        if status.steering.carried:  # a resume may have delivered them since: the receipts say
            from pisub.store.briefs import with_carried_answers

            return with_carried_answers(paths, status)
        return status
    if runner_alive(paths, status):
        result = _result_or_none(paths) if os.path.lexists(paths.result) else None
        return _as_terminal(status, result) if result is not None else status
    return repair(paths)


def _result_or_none(paths: RunPaths, *, quarantine_bad: bool = False) -> Result | None:
    """The run's result; None when there is none or it cannot be read (then moved aside to
    ``quarantine/`` when ``quarantine_bad``, so the repair can write a good one)."""
    try:
        return load_result(paths)
    except ProtocolError as exc:
        if quarantine_bad:
            quarantine(paths, paths.result, str(exc))
        return None


@_translated
def repair(paths: RunPaths) -> Status:
    """Mark a run whose runner is dead as ended (idempotent; under the run's repair lock)."""
    with exclusive(paths.repair_lock, directory=True):
        status = load_status(paths)
        if status.state.is_terminal or runner_alive(paths, status):
            return status
        placed_elsewhere = _fence(paths)
        ended = end_strays(paths, status)
        from pisub.store.leases import reclaim_if_dead

        if status.session_file:
            reclaim_if_dead(paths.home.leases, status.session_file, status.run_id)
        journal = _journal_of(paths)
        if journal is not None:
            reclaim_if_dead(paths.home.leases, journal, status.run_id)
        # A job cancelled while queued after a stop request (pisub stop's backstop): stopped.
        stopped_while_queued = status.pid is None and placed_elsewhere and _stop_waiting(paths)
        if not is_closed(paths):
            close_inbox(paths, "stopped" if stopped_while_queued else "failed")
        why = "the run was stopped before its runner started" if stopped_while_queued else RUNNER_DIED_REASON
        # (a dead coordinator's stop it had passed on to some children says so, not "before")
        from pisub.runs.dead_coordinator import forwarded_reasons

        reasons = forwarded_reasons(paths, status) if not stopped_while_queued else None
        answered = settle_closed_inbox(paths, status.run_id, why, reasons)
        ledger = status.steering
        ledger.requested += answered["claimed"]
        ledger.failed += answered["failed"]
        ledger.rejected += answered["rejected"]
        result = _result_or_none(paths, quarantine_bad=True)
        if result is None:
            result = _crash_result(paths, status, stopped=stopped_while_queued)
            write_result(paths, result)
        # (the startup commit comes before the child's start: without it, nothing ever ran)
        cause = RepairCause.NEVER_STARTED if status.pid is None else RepairCause.RUNNER_DIED
        status = _as_terminal(status, result)
        status.repaired = cause
        write_status(paths, status)
        append_event(
            paths,
            "run.repaired",
            pid=status.pid,
            cause=cause.value,
            state=status.state.value,
            ended=ended,
            sync=True,
            repair=placed_elsewhere,
        )
        _on_done(paths)
        _leave_group(paths)
        return status


def _leave_group(paths: RunPaths) -> None:
    """A repaired run of a group frees its slot: the next run of the group is admitted."""
    from pisub.runs.queue import leave_run

    leave_run(paths)


def _fence(paths: RunPaths) -> bool:
    """Take the heartbeat lease of a run an engine placed over before repairing it: a runner that
    was only cut off (and comes back) meets a generation not its own and writes nothing more.
    Whatever stands at ``heartbeat.json`` and is not a readable lease (planted, garbage) is
    quarantined first. Whether the run was placed by an engine (its repair then writes its events
    into a file of its own)."""
    from pisub.protocol.placement import BackendName, Heartbeat
    from pisub.store.runs import load_heartbeat, load_manifest, load_placement, write_heartbeat

    try:
        if load_placement(paths).backend == BackendName.LOCAL:
            return False
    except ProtocolError:
        pass  # unknown: fence as if an engine placed it
    try:
        found = load_heartbeat(paths)
    except (ProtocolError, OSError) as exc:
        quarantine(paths, paths.heartbeat, f"not a heartbeat lease: {exc}")
        found = None
    try:
        placement = load_manifest(paths).placement
        ttl = placement.heartbeat_ttl if placement is not None else 30.0
    except PisubError:
        ttl = 30.0
    generation = found[0].generation + 1 if found is not None else 1
    write_heartbeat(paths, Heartbeat(v=1, generation=generation, owner="repair", ttl=ttl))
    return True


def _on_done(paths: RunPaths) -> None:
    """The run's ``--on-done`` command, which its dead runner could not run (detached)."""
    from pisub.store.on_done import spawn_detached

    try:
        wanted = load_manifest(paths).on_done
    except PisubError:
        return
    if wanted and not os.path.lexists(paths.on_done_claim):
        spawn_detached(paths)


def _answer_closed_inbox(paths: RunPaths, status: Status) -> None:
    """Requests written by hand into the inbox of a finished run are answered ``failed``."""
    with exclusive(paths.repair_lock, directory=True):
        settle_closed_inbox(paths, status.run_id, FINISHED_REASON)


def end_strays(paths: RunPaths, status: Status) -> list[int]:
    """End every process left of the run's children; the pids that were found."""
    from pisub.core.procs import is_alive, kill_all, marked_processes

    pids: set[int] = set()
    pgids: set[int] = set()
    # A workflow's steps name its children's runners: they outlive it (resume re-attaches them).
    for step in status.steps if status.runner != "workflow" else []:
        if step.pid is not None and is_alive(step.pid, step.pid_start_time, step.pid_start_ticks):
            pids.add(step.pid)
            if step.pgid is not None:
                pgids.add(step.pgid)
    found: set[int] = set()
    # A child that forks while it is being ended can leave a new process behind the first
    # sweep: sweep again (by the run's environment marker) until nothing is left.
    for _ in range(STRAY_SWEEPS):
        pids.update(marked_processes(status.run_id))
        if not pids and not pgids:
            break
        kill_all(pids, pgids=pgids, grace=1.0)
        found |= pids
        pids, pgids = set(), set()
    return sorted(found)


def _journal_of(paths: RunPaths) -> str | None:
    """A workflow run's journal (whose lease its coordinator held), else None."""
    try:
        workflow = load_manifest(paths).workflow
    except PisubError:
        return None
    return workflow.journal if workflow is not None else None


def _engine_job(paths: RunPaths) -> str | None:
    """``slurm job 12`` for a run an engine placed (None for a local one, or none recorded)."""
    from pisub.store.runs import load_placement

    try:
        placement = load_placement(paths)
    except ProtocolError:
        return None
    if placement.backend == "local" or placement.job_id is None:
        return None
    return f"{placement.backend.value.capitalize()} job {placement.job_id}"


def _stop_waiting(paths: RunPaths) -> bool:
    """Whether a stop request for the whole run waits in the inbox, unclaimed."""
    from pisub.protocol.control import Stop
    from pisub.store.mailbox import parse_request_file, pending_files

    for name in pending_files(paths, "new"):
        parsed = parse_request_file(paths.inbox / "new" / name)
        if isinstance(parsed.request, Stop) and parsed.request.child is None:
            return True
    return False


def _unwritten_end(tail: str) -> UnwrittenEnd | None:
    """The end a runner could not write (its last :class:`UnwrittenEnd` line), if it said one."""
    from pisub.protocol.codec import decode

    for line in reversed(tail.splitlines()):
        at = line.find(f" pisub runner: {UNWRITTEN_END}")
        if at >= 0:
            text = line[at + len(" pisub runner: ") + len(UNWRITTEN_END) :]
            try:
                return decode(text, UnwrittenEnd, "runner.log")
            except ProtocolError:
                return None
    return None


def _unwritten_result(paths: RunPaths, status: Status, end: UnwrittenEnd) -> Result:
    """A run whose child ended but whose runner could not write its final files: ``failed``
    with ``IO_ERROR`` naming the file, keeping the child's exit code and its logged output."""
    from pisub.store.results import make_result

    log = paths.output_log(0)
    try:
        output = read_tail(log, OUTPUT_KEPT).decode("utf-8", "replace")
    except OSError:
        output = ""
    try:
        manifest = load_manifest(paths)
        agent, task, max_output = manifest.agent.name, manifest.task, manifest.max_output
    except ProtocolError:
        agent, task, max_output = status.agent, "", None
    signal = f", signal {end.signal}" if end.signal else ""
    message = (
        f"The child ended (would be {end.state}: exit code {end.exit_code}{signal}) but its runner "
        f"could not write {end.path}: {end.error}. The output logged before is kept (full output at {log})."
    )
    return make_result(
        run_id=status.run_id,
        state="failed",
        agent=agent,
        task=task,
        exit_code=end.exit_code,
        output=output,
        error=ErrorInfo(code=StorageError.code, message=message),  # IO_ERROR
        full_output=log,
        max_output=max_output,
    )


def _crash_result(paths: RunPaths, status: Status, *, stopped: bool = False) -> Result:
    from pisub.store.results import make_result

    tail = read_tail(paths.runner_log, 64 * 1024).decode("utf-8", "replace")
    end = _unwritten_end(tail) if status.runner != "workflow" else None
    if end is not None and not stopped:
        return _unwritten_result(paths, status, end)
    kept = [line for line in tail.strip().splitlines() if not _TRACEBACK_LINE.match(line)]
    tail = "\n".join(kept[-LOG_TAIL_LINES:])[-LOG_TAIL_CHARS:]
    job = _engine_job(paths)
    if stopped:
        message = f"Stopped while queued: {job} was cancelled before its runner started."
    elif status.pid is None and job is not None:
        message = f"{job} ended before its runner started (cancelled or failed while queued)."
    elif status.pid is None:
        message = (
            "The runner never committed its startup (the launch was interrupted): its child never started."
        )
    else:
        message = f"Runner process {status.pid} exited or disappeared before writing a result."
    if tail:
        message += f" runner.log ends with:\n{tail}"
    try:
        manifest = load_manifest(paths)
        agent, task = manifest.agent.name, manifest.task
    except ProtocolError:
        manifest, agent, task = None, status.agent, ""
    if manifest is not None and manifest.workflow is not None:
        return _workflow_crash_result(status, manifest.workflow.shape.value, message)
    return make_result(
        run_id=status.run_id,
        state="stopped" if stopped else "failed",
        agent=agent,
        task=task,
        exit_code=1,
        output="",
        error=ErrorInfo(code=ErrorCode.SUBAGENT_FAILED, message=message),
        full_output=paths.output_log(0),
    )


def _workflow_crash_result(status: Status, mode: str, message: str) -> Result:
    """A dead coordinator's result: its children run on under their own runners."""
    from pisub.core.redact import redact

    # Only children that have a run may go on (a pending key without one never started).
    live = [
        s for s in status.steps if s.status in (StepState.RUNNING, StepState.PENDING) and s.run_id is not None
    ]
    if live:
        keys = ", ".join(s.key or str(s.index) for s in live)
        message += (
            f" Its children go on under their own runners ({keys}): `pisub resume {status.run_id}` "
            "re-attaches them and starts only what is unfinished."
        )
    error = ErrorInfo(code=ErrorCode.SUBAGENT_FAILED, message=redact(message))
    return Result(
        v=1,
        state="failed",
        ended_at=now_iso(),
        content=[TextContent(type="text", text=f"{error.code}: {error.message}")],
        details=Details(mode=mode, run_id=status.run_id, error=error),  # type: ignore[arg-type]
    )


def _as_terminal(status: Status, result: Result) -> Status:
    """``status`` as the terminal one that ``result`` implies (for a reader that meets the result
    before the runner's terminal status, and for the repair): state, end, error, exit codes."""
    state = RunState(result.state)
    singles = result.details.results
    # A workflow's steps are its children's runs, which outlive it: they keep what was seen last.
    for step in status.steps if status.runner != "workflow" else []:
        if step.status in (StepState.RUNNING, StepState.PENDING):
            step.status = StepState(state.value)
            step.ended_at = step.ended_at or result.ended_at
        if step.exit_code is None and step.index < len(singles):
            step.exit_code = singles[step.index].exit_code
    # A host command is the coordinator's own: it ended with it (the repair ends its group).
    for host in status.host_steps:
        if host.state == HostState.RUNNING:
            host.state, host.reason_code = HostState.CANCELLED, HostReason.INTERRUPTED
            host.ended_at = host.ended_at or result.ended_at
    status.state = state
    status.ended_at = status.ended_at or result.ended_at
    status.error = status.error or result.details.error
    status.updated_at = now_iso()
    return status
