"""The seam between the runner and one child: what a child is, as the runner sees it.

A :class:`Child` is started, hands the runner what to watch (``register``), reports activity
and output through :class:`ChildHooks`, takes control (``steer``, ``abort``, ``terminate``,
``kill``) and finally describes how it ended (:class:`ChildOutcome`). The runner owns the loop,
the limits and every file except the child's own logs. Implementations: the two kinds of
process child (:mod:`pisub.children.external_cli`, :mod:`pisub.children.pi.rpc`, on
:class:`~pisub.children.process.ProcessChild`) and, for tests, a scripted child
(:mod:`pisub.testing.scripted_child`); ``tests/contract/test_child_contract.py`` holds them all to
this contract.
"""

from __future__ import annotations

import selectors
from collections import deque
from collections.abc import Callable
from typing import Protocol

import msgspec

from pisub.core.redact import redact
from pisub.protocol.control import ReceiptState
from pisub.protocol.result import Usage

Callback = Callable[[int], None]
"""Called with the selector event mask when a registered fd is ready."""


class ChildHooks(Protocol):
    """What a child may tell the runner."""

    def activity(self, child: int) -> None:
        """The child did something (output, an event): resets the idle timer."""

    def output(self, child: int, nbytes: int, truncated: bool) -> None:
        """The child produced ``nbytes`` more bytes; ``truncated`` once a log is capped."""

    def event(self, type_: str, child: int | None = None, **data: object) -> None:
        """Append an event to ``events.jsonl``."""

    def raw_event(self, child: int, kind: str, raw: bytes) -> None:
        """Append one of the child's own events (``raw`` is its JSON object) to ``events.jsonl``."""

    def steer_update(self, request_id: str, state: ReceiptState, reason: str | None = None) -> None:
        """A steering request advanced (``queued``, ``delivered``) or failed."""


class ChildOutcome(msgspec.Struct):
    """How a child ended, as far as the child itself can tell."""

    exit_code: int
    signal: int | None = None
    output: str = ""
    error: str | None = None
    """A failure reported by the child (stderr tail, provider error), None on success."""
    usage: Usage = msgspec.field(default_factory=Usage)
    session_file: str | None = None
    process_exit: int | None = None
    """The process's own exit status (128+N when signal N ended it), where it differs from
    ``exit_code`` (pi: ``exit_code`` is the task's outcome)."""


RECENT_LINES = 50
RECENT_LINE_CHARS = 500


class Progress(msgspec.Struct):
    """Live progress a child reports; the runner copies it into ``status.json`` (where its
    texts are redacted)."""

    turns: int = 0
    tools: int = 0
    current_tool: str | None = None
    tools_running: dict[str, tuple[str, float]] = msgspec.field(default_factory=dict)
    """Tool calls started and not yet ended: call id → (tool name, monotonic start)."""
    recent: deque[str] = msgspec.field(default_factory=lambda: deque(maxlen=RECENT_LINES))
    _partial: bytearray = msgspec.field(default_factory=bytearray)

    def add_line(self, text: str) -> None:
        """Keep ``text`` as one of the last :data:`RECENT_LINES` lines (if it is not blank),
        redacted before it is cut to :data:`RECENT_LINE_CHARS` (a cut secret is not recognised)."""
        if text.strip():
            self.recent.append(redact(text[: RECENT_LINE_CHARS * 4])[:RECENT_LINE_CHARS])

    def add_output(self, data: bytes) -> None:
        """Keep the last lines of raw output; a partial last line waits for its newline."""
        self._partial += data
        *lines, rest = self._partial.split(b"\n")
        self._partial = bytearray(rest[: RECENT_LINE_CHARS * 4])
        kept: list[str] = []
        for line in reversed(lines):  # only the last non-empty ones can stay
            text = line.decode("utf-8", "replace")
            if text.strip():
                kept.append(text)
                if len(kept) == RECENT_LINES:
                    break
        for text in reversed(kept):
            self.add_line(text)


class Child(Protocol):
    """One supervised child."""

    index: int
    progress: Progress
    session_file: str | None
    """The session the child works in (pi), or None."""

    @property
    def pid(self) -> int | None:
        """The process to record (its group is ended with it), or None without one."""

    @property
    def streams_open(self) -> bool:
        """Whether output may still arrive after the child exited."""

    def start(self) -> None:
        """Start. Raises OSError (or ValueError) when it cannot be started."""

    def register(self, sel: selectors.BaseSelector) -> None:
        """Register what the runner should watch; each ``key.data`` is a :data:`Callback`."""

    def poll(self) -> int | None:
        """The exit status once the child has ended, else None."""

    def steer(self, request_id: str, message: str, behavior: str) -> str | None:
        """Deliver ``message`` (``behavior``: ``steer`` or ``followUp``); None when accepted for
        delivery (progress comes through :meth:`ChildHooks.steer_update`), else why not."""

    def abort(self) -> bool:
        """Abort the current work gracefully; False when the runner must end the child instead."""

    def terminate(self) -> None:
        """Ask the child to end (the runner escalates to :meth:`kill` after the grace period)."""

    def kill(self) -> None:
        """End the child now."""

    def close(self, sel: selectors.BaseSelector) -> None:
        """Release what :meth:`register` registered."""

    def outcome(self) -> ChildOutcome:
        """How the child ended; called once, after it ended and its output was drained."""
