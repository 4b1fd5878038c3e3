"""``result.json``: the tool result of a finished run (the devkit-pi ``subagent`` shape)."""

from __future__ import annotations

import enum
from typing import Literal

from pisub.protocol.acceptance import AcceptanceRecord
from pisub.protocol.codec import Record


class ErrorCode(enum.StrEnum):
    """The eight ``SUBAGENT_*`` error codes of the result schema."""

    INVALID_INPUT = "INVALID_INPUT"
    """A required argument (agent, task) is missing or malformed."""
    SUBAGENTS_DISABLED = "SUBAGENTS_DISABLED"
    """Sub-agents are turned off."""
    UNKNOWN_AGENT = "UNKNOWN_AGENT"
    """No agent of that name."""
    SUBAGENT_DISABLED = "SUBAGENT_DISABLED"
    """The agent exists but is disabled."""
    SUBAGENT_DEPTH_EXCEEDED = "SUBAGENT_DEPTH_EXCEEDED"
    """A sub-agent tried to start a sub-agent beyond the depth limit."""
    SUBAGENT_TIMEOUT = "SUBAGENT_TIMEOUT"
    """The runtime or idle limit was hit."""
    SUBAGENT_FAILED = "SUBAGENT_FAILED"
    """Any other failure: spawn, runtime, provider, a dead runner."""
    SUBAGENT_OUTPUT_TRUNCATED = "SUBAGENT_OUTPUT_TRUNCATED"
    """The output was truncated, or the child flooded past the hard cap and was stopped."""


UNWRITTEN_END = "final files not written: "
"""How a runner's line in ``runner.log`` that carries an :class:`UnwrittenEnd` begins (after
``<ts> pisub runner: ``)."""


class UnwrittenEnd(Record, kw_only=True):
    """What a runner knew when it gave up writing its final files: one JSON line in
    ``runner.log`` (where disk space is reserved), read by the crash repair."""

    state: str
    """The state the run would have ended in."""
    exit_code: int
    signal: int | None = None
    path: str
    """The file that could not be written."""
    error: str


class ErrorInfo(Record, kw_only=True):
    """A structured error: stable code plus one human line."""

    code: str
    message: str


class Usage(Record, kw_only=True):
    """Token usage summed over the child's assistant messages."""

    input: int = 0
    output: int = 0
    cache_read: int = 0
    cache_write: int = 0
    cost: float = 0.0
    turns: int = 0


class ResultProgress(Record, kw_only=True):
    """The child's progress when it ended (``--include-progress``), as ``status`` showed it."""

    turn_count: int = 0
    tool_count: int = 0
    output_bytes: int = 0
    output_truncated: bool = False
    """The output log stopped at the run's ``outputCap``."""
    duration_ms: int | None = None
    """From the child's start to its end (None: it never started)."""
    recent_output: list[str] = []
    """The last lines of the child's output log, redacted."""


class SingleResult(Record, kw_only=True, omit_defaults=True):
    """The outcome of one child."""

    agent: str
    task: str
    exit_code: int
    usage: Usage
    error: str | None = None
    session_file: str | None = None
    output: str | None = None
    timeout_reason: Literal["runtime", "idle", "tool"] | None = None
    key: str | None = None
    """A workflow's child: its key."""
    run_id: str | None = None
    """A workflow's child: its own run."""
    state: str | None = None
    """A workflow's child: how it ended (``complete``, ``failed``, ``stopped``, ``paused``,
    ``skipped``)."""
    acceptance: AcceptanceRecord | None = None
    """What the runner checked of the child's work (acceptance gates)."""
    progress: ResultProgress | None = None
    """The child's progress, when the run was started with ``--include-progress``."""


class TextContent(Record, kw_only=True):
    """One text block of the result's ``content``."""

    type: Literal["text"]
    text: str


class Details(Record, kw_only=True, omit_defaults=True):
    """Machine-readable details of the result."""

    mode: Literal["single", "management", "workflow", "parallel", "chain", "lanes"]
    run_id: str | None = None
    results: list[SingleResult] = []
    error: ErrorInfo | None = None


class Result(Record, kw_only=True):
    """The final result, written before the terminal status."""

    v: Literal[1]
    state: Literal["complete", "failed", "stopped", "paused"]
    ended_at: str
    content: list[TextContent]
    details: Details
