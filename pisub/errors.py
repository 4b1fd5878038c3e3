"""The one error tree of pisub.

Every error pisub raises on purpose is a :class:`PisubError` with a stable ``code``
(a string that scripts may match on) and a one-line human message::

    PisubError                       code
    ├── InvalidInput                 INVALID_INPUT       bad argument, id, file or request
    ├── UnknownAgent                 UNKNOWN_AGENT       no agent by that name
    ├── RunNotFound                  RUN_NOT_FOUND       no run matches the id or prefix
    ├── AmbiguousRun                 AMBIGUOUS_RUN       a prefix matches several runs
    ├── HomeUnusable                 HOME_UNUSABLE       the pisub home cannot be used safely
    ├── ProtocolError                PROTOCOL_ERROR      a run file does not decode (names the field)
    ├── LaunchFailed                 SUBAGENT_FAILED     the runner or child could not be started
    ├── NotResumable                 NOT_RESUMABLE       the run cannot be resumed (its state says why)
    └── WaitTimeout                  WAIT_TIMEOUT        a wait ran out before its condition held

Elsewhere, beside the code that raises them: ``LockBusy`` (LOCK_BUSY), ``InboxClosed``
(RUN_CLOSED), ``LeaseHeld`` (LEASE_HELD, busy: another run drives the session) and
``StaleLease`` (STALE_LEASE, a fenced write with an old generation).

Foreign exceptions (``OSError``, ``msgspec.ValidationError``, portalocker's) are
translated into these at the seam where they enter, never further up.
"""

from __future__ import annotations

from typing import ClassVar


class PisubError(Exception):
    """Base of every deliberate pisub error; ``code`` is stable, ``message`` is one line."""

    code: ClassVar[str] = "PISUB_ERROR"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class InvalidInput(PisubError):
    """An argument, id, agent file or request is malformed."""

    code = "INVALID_INPUT"


class UnknownAgent(PisubError):
    """No agent of that name exists in any scope."""

    code = "UNKNOWN_AGENT"


class RunNotFound(PisubError):
    """No run directory matches the given id or prefix."""

    code = "RUN_NOT_FOUND"


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
