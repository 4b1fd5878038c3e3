"""Why a child is ended, and the verdict on a run: pure rules, no processes or files.

A run's child may be ended for several causes at once (a stop arriving during a timeout);
:class:`EndCause` orders them by precedence and :func:`judge` gives the verdict of the one that
wins — or, with none, of the child's own outcome — from one table.
"""

from __future__ import annotations

import enum
from collections.abc import Callable

import msgspec

from pisub.children.base import ChildOutcome
from pisub.protocol.manifest import Limits
from pisub.protocol.result import ErrorCode, ErrorInfo
from pisub.protocol.status import RunState


class EndCause(enum.IntEnum):
    """Why the runner ends the child, by precedence: the smallest value decides the verdict."""

    STOP = 1
    """A ``stop`` request."""
    SIGNAL = 2
    """SIGTERM or SIGINT to the runner."""
    RUNTIME = 3
    """The runtime limit."""
    IDLE = 4
    """The idle limit (no output)."""
    TOOL = 5
    """One tool call took longer than the tool timeout."""
    OUTPUT = 6
    """The output hard cap."""
    INTERRUPT = 7
    """An ``interrupt`` request (pi did not end its work in time, or an external CLI)."""

    @property
    def label(self) -> str:
        """The word in ``child.ending`` events (``stop``, ``runtime``, ...)."""
        return self.name.lower()


class Verdict(msgspec.Struct, frozen=True):
    """The run's final state and how it is explained."""

    state: RunState
    exit_code: int
    error: ErrorInfo | None = None
    timeout_reason: str | None = None


class Circumstances(msgspec.Struct, frozen=True):
    """What a verdict may quote besides the child's outcome."""

    limits: Limits
    signal: int | None = None
    """The signal the runner received (for :attr:`EndCause.SIGNAL`)."""
    tool: tuple[str, float] | None = None
    """The tool that timed out and its timeout in seconds (for :attr:`EndCause.TOOL`)."""


def judge(causes: set[EndCause], outcome: ChildOutcome, circumstances: Circumstances) -> Verdict:
    """The verdict: the winning cause's rule, else the child's own outcome.

    Exit codes: a stopped or paused run reports the child process's own status (128+N when
    signal N ended it); a timeout 124, a flood 1; otherwise the child's outcome (for pi: 0
    success, 1 failure, since pi's own exit code says nothing).
    """
    if causes:
        return RULES[min(causes)](outcome, circumstances)
    if outcome.exit_code == 0 and outcome.error is None:
        return Verdict(RunState.COMPLETE, 0)
    message = outcome.error or f"Subagent exited with code {outcome.exit_code}"
    return _failed(RunState.FAILED, outcome.exit_code, ErrorCode.SUBAGENT_FAILED, message)


def _ended(outcome: ChildOutcome) -> int:
    return outcome.process_exit if outcome.process_exit is not None else outcome.exit_code


def _failed(
    state: RunState, exit_code: int, code: ErrorCode, message: str, timeout_reason: str | None = None
) -> Verdict:
    return Verdict(state, exit_code, ErrorInfo(code=code, message=message), timeout_reason)


Rule = Callable[[ChildOutcome, Circumstances], Verdict]

RULES: dict[EndCause, Rule] = {
    EndCause.STOP: lambda o, c: _failed(
        RunState.STOPPED, _ended(o), ErrorCode.SUBAGENT_FAILED, "Subagent stopped by request."
    ),
    EndCause.SIGNAL: lambda o, c: _failed(
        RunState.STOPPED,
        _ended(o),
        ErrorCode.SUBAGENT_FAILED,
        f"Subagent stopped: the runner received signal {c.signal}.",
    ),
    EndCause.RUNTIME: lambda o, c: _failed(
        RunState.FAILED,
        124,
        ErrorCode.SUBAGENT_TIMEOUT,
        f"Subagent exceeded maximum runtime after {c.limits.timeout:g}s.",
        "runtime",
    ),
    EndCause.IDLE: lambda o, c: _failed(
        RunState.FAILED,
        124,
        ErrorCode.SUBAGENT_TIMEOUT,
        f"Subagent timed out after {c.limits.idle_timeout:g}s without activity.",
        "idle",
    ),
    EndCause.TOOL: lambda o, c: _failed(
        RunState.FAILED,
        124,
        ErrorCode.SUBAGENT_TIMEOUT,
        f"Tool '{c.tool[0] if c.tool else '?'}' exceeded its timeout of {c.tool[1] if c.tool else 0:g}s.",
        "tool",
    ),
    EndCause.OUTPUT: lambda o, c: _failed(
        RunState.FAILED,
        1,
        ErrorCode.SUBAGENT_OUTPUT_TRUNCATED,
        f"Subagent child output exceeded {c.limits.output_hard_cap} bytes and was stopped.",
    ),
    EndCause.INTERRUPT: lambda o, c: Verdict(RunState.PAUSED, _ended(o)),
}
"""The verdict of each cause, when it is the one that wins."""
