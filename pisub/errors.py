"""The one error tree of pisub.

Every error pisub raises on purpose is a :class:`PisubError` with a stable ``code``
(a string that scripts may match on; spec/cli.md lists them) and a one-line human message::

    PisubError                       code
    ├── InvalidInput                 INVALID_INPUT       bad argument, id, file or request
    ├── UnknownAgent                 UNKNOWN_AGENT       no agent by that name
    ├── AgentDisabled                SUBAGENT_DISABLED   the agent exists but is disabled
    ├── AgentConflict                AGENT_CONFLICT      an agent file is not what the caller read
    ├── RunNotFound                  RUN_NOT_FOUND       no run matches the id or prefix
    ├── AmbiguousRun                 AMBIGUOUS_RUN       a prefix matches several runs
    ├── HomeUnusable                 HOME_UNUSABLE       the pisub home cannot be used safely
    ├── ProtocolError                PROTOCOL_ERROR      a run file does not decode (names the field)
    ├── LaunchFailed                 SUBAGENT_FAILED     the runner or child could not be started
    │   └── UnsupportedPi            UNSUPPORTED_PI      the pi binary is of a version pisub does not drive
    ├── NotResumable                 NOT_RESUMABLE       the run cannot be resumed (its state says why)
    ├── WaitTimeout                  WAIT_TIMEOUT        a wait ran out before its condition held
    ├── DepthExceeded                SUBAGENT_DEPTH_EXCEEDED  a run started too deep inside runs
    ├── FanoutLimit                  RUN_FANOUT_LIMIT    a batch does not fit in the tree's spawn budget
    ├── UsageBudgetExceeded          USAGE_BUDGET_EXCEEDED  the tree's usage budget has nothing left
    ├── InboxClosed                  RUN_CLOSED          the run no longer takes requests
    ├── NotSteerable                 NOT_STEERABLE       the run cannot take a message (an external CLI)
    ├── LockBusy                     LOCK_BUSY           a lock could not be taken before its deadline
    ├── LeaseHeld                    LEASE_HELD          another live run drives the pi session
    ├── StaleLease                   STALE_LEASE         a fenced write with an old lease generation
    ├── WorktreeError                WORKTREE_ERROR      a git operation of worktree isolation failed
    ├── EvidenceMismatch             EVIDENCE_MISMATCH   a lane's stored patch is not the captured one
    ├── StaleEvidence                EVIDENCE_STALE      lane evidence contradicting the recorded
    ├── SlurmError                   SLURM_ERROR         a Slurm client command failed
    ├── TimerError                   TIMER_ERROR         the cron/systemd timer could not be read or written
    ├── WorkflowFailed               WORKFLOW_FAILED     a workflow's ``main`` ended it ``failed``
    ├── StorageError                 IO_ERROR            a file cannot be read or written (with the fix)
    └── InternalError                INTERNAL_ERROR      a bug: anything else reaching a command's top

Foreign exceptions (``OSError``, ``msgspec.ValidationError``, ``RecursionError``, ``yaml.YAMLError``)
are translated into these at the seam where they enter (:func:`storage_error` for ``OSError``);
the CLI's top level turns anything that still escapes into one ``INTERNAL_ERROR`` line.
"""

from __future__ import annotations

import errno
import functools
import os
from collections.abc import Callable
from typing import ClassVar, ParamSpec, TypeVar

from pisub.termsafe import printable

P = ParamSpec("P")
T = TypeVar("T")


class PisubError(Exception):
    """Base of every deliberate pisub error; ``code`` is stable, ``message`` is one line."""

    code: ClassVar[str] = "PISUB_ERROR"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class WorkflowFailed(PisubError):
    """Raise it in a workflow's ``main`` to end the workflow ``failed`` with ``message`` (no
    traceback line); ``text`` is shown after it (partial output)."""

    code = "WORKFLOW_FAILED"

    def __init__(self, message: str, text: str = "") -> None:
        super().__init__(message)
        self.text = text


class InvalidInput(PisubError):
    """An argument, id, agent file or request is malformed."""

    code = "INVALID_INPUT"


class HostCommandFailed(PisubError):
    """A workflow's ``runs.host`` command exited nonzero, timed out, was cancelled by the
    workflow's stop, or could not be run (``spec/resources.md``)."""

    code = "HOST_COMMAND_FAILED"


class UnknownAgent(PisubError):
    """No agent of that name exists in any scope."""

    code = "UNKNOWN_AGENT"


class AgentDisabled(PisubError):
    """The agent exists but is disabled (``pisub agents enable NAME``)."""

    code = "SUBAGENT_DISABLED"


class AgentConflict(PisubError):
    """An agent file is not what the caller read (it changed, or already exists)."""

    code = "AGENT_CONFLICT"


class RunNotFound(PisubError):
    """No run directory matches the given id or prefix."""

    code = "RUN_NOT_FOUND"


class ScheduleNotFound(PisubError):
    """No schedule has the given id."""

    code = "SCHEDULE_NOT_FOUND"


class MissionNotFound(PisubError):
    """No mission has the given id (in this project, or at all with a global scope)."""

    code = "MISSION_NOT_FOUND"


class AmbiguousRun(PisubError):
    """A prefix matches more than one run; the message lists the candidates."""

    code = "AMBIGUOUS_RUN"


class HomeUnusable(PisubError):
    """The pisub home cannot be created or is not private to this user."""

    code = "HOME_UNUSABLE"


class ProtocolError(PisubError):
    """A run file exists but does not decode; the message names the file and the field."""

    code = "PROTOCOL_ERROR"


class LaunchFailed(PisubError):
    """The runner could not be started or failed before its startup commit."""

    code = "SUBAGENT_FAILED"


class NotResumable(PisubError):
    """The run cannot be resumed: stopped, still running, not a pi run, or no session."""

    code = "NOT_RESUMABLE"


class WaitTimeout(PisubError):
    """A wait ran out of time before its condition held."""

    code = "WAIT_TIMEOUT"


class DepthExceeded(PisubError):
    """A run was to be started from inside a run that is already at the depth limit; nothing
    was created."""

    code = "SUBAGENT_DEPTH_EXCEEDED"


class UnsupportedPi(LaunchFailed):
    """The pi binary is of a version pisub does not drive, or does not run at all."""

    code = "UNSUPPORTED_PI"


class NoModel(PisubError):
    """pi lists no model it can use (no provider key, no ``models.json``), or none matching."""

    code = "NO_MODEL"


class FanoutLimit(PisubError):
    """A batch of child starts does not fit in what is left of the root run's spawn budget."""

    code = "RUN_FANOUT_LIMIT"


class UsageBudgetExceeded(PisubError):
    """A child start would spend from a usage budget that has nothing left."""

    code = "USAGE_BUDGET_EXCEEDED"


class InboxClosed(PisubError):
    """The run no longer takes requests."""

    code = "RUN_CLOSED"


class NotSteerable(PisubError):
    """The run cannot take a message (an external CLI's runner cannot pass one on)."""

    code = "NOT_STEERABLE"


class LockBusy(PisubError):
    """A lock could not be taken before its deadline."""

    code = "LOCK_BUSY"


class LeaseHeld(PisubError):
    """The session is driven by another live run (or its owner cannot be proven dead)."""

    code = "LEASE_HELD"


class StaleLease(PisubError):
    """A write was fenced off: the writer's lease generation is no longer current."""

    code = "STALE_LEASE"


class WorktreeError(PisubError):
    """A git operation of worktree isolation failed (git missing, timed out, refused); the
    message names the operation and the fix."""

    code = "WORKTREE_ERROR"


class EvidenceMismatch(PisubError):
    """A child's stored patch is not the one captured: evidence about it is refused and its
    cleanup blocked until the patch is restored."""

    code = "EVIDENCE_MISMATCH"


class StaleEvidence(PisubError):
    """New evidence contradicts evidence already recorded for the same facts (another reviewed
    head, merge commit or pull request)."""

    code = "EVIDENCE_STALE"


class SlurmError(PisubError):
    """A Slurm client command failed (missing, timed out or refused; its message is one line)."""

    code = "SLURM_ERROR"


class TimerError(PisubError):
    """The real timer of schedules (a crontab entry or a systemd user timer) could not be read,
    installed or removed: ``crontab``/``systemctl`` missing, refused or failed (one line)."""

    code = "TIMER_ERROR"


class StorageError(PisubError):
    """A file or directory could not be read or written (full disk, permissions, I/O error, ...).

    ``errno`` is the operating system's error number when there was one.
    """

    code = "IO_ERROR"

    def __init__(self, message: str, errno_: int | None = None) -> None:
        super().__init__(message)
        self.errno = errno_


class InternalError(PisubError):
    """An unexpected exception reached the top of a command (a bug in pisub)."""

    code = "INTERNAL_ERROR"


_FIXES: dict[int, str] = {
    errno.ENOSPC: "free disk space (e.g. pisub gc --older-than 7d) and retry",
    errno.EDQUOT: "free space within your disk quota (e.g. pisub gc --older-than 7d) and retry",
    errno.EACCES: "check the owner and permissions of the path (pisub doctor)",
    errno.EPERM: "check the owner and permissions of the path (pisub doctor)",
    errno.EROFS: "the filesystem is read-only: point PISUB_HOME at a writable one",
    errno.ENAMETOOLONG: "use a shorter PISUB_HOME or name",
    errno.ELOOP: "a symlink is in the way (pisub never follows one inside its home): remove it",
    errno.EIO: "the disk reported an I/O error: check the filesystem (dmesg) and retry",
    errno.ENOTDIR: "a file stands where pisub expects a directory: remove or rename it",
    errno.EISDIR: "a directory stands where pisub expects a file: remove or rename it",
    errno.EMFILE: "too many open files: raise the limit (ulimit -n) and retry",
}


def storage_error(exc: OSError, action: str, path: object = None) -> StorageError:
    """Translate ``exc`` raised while doing ``action`` (e.g. "write") on ``path`` into one line
    that names the path, the reason and the fix."""
    where = path if path is not None else exc.filename
    reason = exc.strerror or str(exc) or type(exc).__name__
    fix = _FIXES.get(exc.errno or 0, "check the path (pisub doctor)")
    target = f" {printable(os.fsdecode(where))}" if isinstance(where, str | bytes | os.PathLike) else ""
    return StorageError(f"cannot {action}{target}: {reason}; {fix}", exc.errno)


def translating(action: str) -> Callable[[Callable[P, T]], Callable[P, T]]:
    """Decorate a function at a seam so that an ``OSError`` escaping it becomes a
    :class:`StorageError` ("cannot <action> <path>: <reason>; <fix>")."""

    def decorate(fn: Callable[P, T]) -> Callable[P, T]:
        @functools.wraps(fn)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
            try:
                return fn(*args, **kwargs)
            except OSError as exc:
                raise storage_error(exc, action) from exc

        return wrapper

    return decorate
