"""The seam between the runner and one child process.

A :class:`Child` starts a process in its own process group, hands the runner the
file descriptors to watch (``register``), reports activity and output through
:class:`ChildHooks`, and finally describes how it ended (:class:`ChildOutcome`).
The runner owns the loop, the limits and every file except the child's own logs.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

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


@dataclass
class ChildOutcome:
    """How a child ended, as far as the child itself can tell."""

    exit_code: int
    signal: int | None = None
    output: str = ""
    error: str | None = None
    """A failure reported by the child (stderr tail, provider error), None on success."""
    usage: Usage = field(default_factory=Usage)
    session_file: str | None = None


class Child(ABC):
    """One supervised child process."""

    def __init__(self, index: int, hooks: ChildHooks) -> None:
        self.index = index
        self.hooks = hooks
        self.proc: subprocess.Popen[bytes] | None = None
        self._pidfd: int | None = None
        self._open_streams = 0

    # -- lifecycle -------------------------------------------------------------
    @abstractmethod
    def start(self) -> None:
        """Start the process (in its own process group). Raises OSError on failure."""

    @abstractmethod
    def outcome(self) -> ChildOutcome:
        """Describe how the child ended; called once it has exited and been drained."""

    def register(self, sel: selectors.BaseSelector) -> None:
        """Register every fd the runner should watch; ``key.data`` is a :data:`Callback`."""
        assert self.proc is not None
        try:
            self._pidfd = os.pidfd_open(self.proc.pid)
        except (AttributeError, OSError):
            self._pidfd = None
        if self._pidfd is not None:
            sel.register(self._pidfd, selectors.EVENT_READ, self._on_exit)

    def _on_exit(self, _mask: int) -> None:
        self.poll()

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def poll(self) -> int | None:
        """The return code once the process has exited (it is reaped here), else None."""
        return self.proc.poll() if self.proc else None

    @property
    def streams_open(self) -> bool:
        return self._open_streams > 0

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the child's whole process group."""
        if self.proc is None or (self.proc.returncode is not None and not self.streams_open):
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)

    def terminate(self) -> None:
        """Ask the child to end (TERM to its group); the runner escalates to KILL."""
        self.signal(signal.SIGTERM)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)

    def close(self, sel: selectors.BaseSelector) -> None:
        """Release the child's fds."""
        if self._pidfd is not None:
            with contextlib.suppress(KeyError, ValueError):
                sel.unregister(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = None
