"""Default limits and intervals, one constant each."""

from __future__ import annotations

DEFAULT_TIMEOUT_S: float = 30 * 60
"""Runtime limit of a run when neither the agent nor the caller sets one."""

DEFAULT_IDLE_TIMEOUT_S: float | None = None
"""Idle limit (no child output for this long); None means no idle limit."""

DEFAULT_GRACE_S: float = 3.0
"""Time between TERM and KILL when a child is ended."""

DEFAULT_OUTPUT_CAP: int = 8 * 1024 * 1024
"""Bytes of one child stream kept in its log file; the rest is counted, not written."""

DEFAULT_OUTPUT_HARD_CAP: int = 64 * 1024 * 1024
"""Bytes of child output (all streams) after which the child is stopped."""

TAIL_BYTES: int = 64 * 1024
"""Bytes of each child stream kept in memory for the result."""

RESULT_MAX_BYTES: int = 200 * 1024
"""Output in result.json is cut to this many bytes..."""

RESULT_MAX_LINES: int = 5000
"""...and this many lines, with a marker naming the full log."""

STARTUP_TIMEOUT_S: float = 30.0
"""How long the launcher waits for the runner's startup commit."""

STATUS_COALESCE_S: float = 0.25
"""Activity-only status changes are written at most this often."""

READ_POLL_S: float = 0.02
"""Poll interval of readers that wait for a file to change (wait, logs -f)."""

MIN_PREFIX: int = 4
"""Shortest run-id prefix a command accepts (a longer one when it is ambiguous)."""

DEFAULT_MAX_DEPTH: int = 2
"""How deep runs may nest: a run started from inside a run at this depth or deeper is refused
(``PISUB_MAX_DEPTH``; top-level runs have depth 0)."""

FAST_TOOLS: tuple[str, ...] = ("read", "grep", "find", "ls", "edit", "write")
"""pi's built-in tools that finish quickly: they get :data:`FAST_TOOL_TIMEOUT_S` by default."""

FAST_TOOL_TIMEOUT_S: float = 300.0
"""How long one call of a fast built-in tool may take when no tool timeout is set."""

CHECKPOINT_MIN_LEFT_S: float = 1.0
"""A deadline checkpoint is not sent when less than this would remain."""

USAGE_ESTIMATE_TOKENS: float = 50_000.0
"""What one child start reserves from a usage budget's tokens (``budgets.usage_estimate_tokens``)."""

USAGE_ESTIMATE_COST_USD: float = 0.5
"""What one child start reserves from a usage budget's cost."""

HEARTBEAT_TTL_S = 30.0
"""How long a runner placed by an engine may go without renewing its heartbeat lease before a
reader may treat it as gone (``[placement] heartbeat_ttl``)."""
