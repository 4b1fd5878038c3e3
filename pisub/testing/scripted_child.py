"""A child that plays a script instead of running a process, for fast tests of the supervisor.

It implements :class:`~pisub.children.base.Child`: each :class:`Step` happens at its time
after :meth:`ScriptedChild.start` (a timer thread wakes the runner's selector through a pipe),
``terminate`` ends it with ``on_term`` (or is ignored, when None), ``kill`` ends it with 137.
:class:`NoProcesses` is the process tree to give the supervisor with it, so that nothing
touches the test process's own children.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import threading
import time
from dataclasses import dataclass

from pisub.children.base import ChildHooks, ChildOutcome, Progress
from pisub.protocol.control import ReceiptState


@dataclass(frozen=True)
class Step:
    """At ``at`` seconds after the start: write ``output``, then end with ``exit`` (if set)."""

    at: float
    output: bytes = b""
    exit: int | None = None


class ScriptedChild:
    """A scripted stand-in for a child process."""

    def __init__(
        self,
        index: int,
        hooks: ChildHooks,
        steps: list[Step],
        *,
        on_term: int | None = 143,
        abortable: bool = False,
        steerable: bool = False,
    ) -> None:
        self.index = index
        self.hooks = hooks
        self.steps = sorted(steps, key=lambda step: step.at)
        self.on_term = on_term
        self.abortable = abortable
        self.steerable = steerable
        self.progress = Progress()
        self.session_file: str | None = None
        self.output = bytearray()
        self.calls: list[str] = []
        self._exit: int | None = None
        self._started = 0.0
        self._done = 0
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._timers: list[threading.Timer] = []

    @property
    def pid(self) -> int | None:
        return None

    @property
    def streams_open(self) -> bool:
        return False

    def start(self) -> None:
        self._started = time.monotonic()
        for step in self.steps:
            timer = threading.Timer(step.at, self._ring)
            timer.daemon = True
            timer.start()
            self._timers.append(timer)

    def register(self, sel: selectors.BaseSelector) -> None:
        sel.register(self._wake_r, selectors.EVENT_READ, self._on_wake)

    def poll(self) -> int | None:
        return self._exit

    def steer(self, request_id: str, message: str, behavior: str) -> str | None:
        self.calls.append(f"steer {message}")
        if not self.steerable:
            return "steering is not supported by the scripted child"
        self.hooks.steer_update(request_id, ReceiptState.DELIVERED)
        return None

    def abort(self) -> bool:
        self.calls.append("abort")
        if self.abortable:
            self._end(0)
        return self.abortable

    def terminate(self) -> None:
        self.calls.append("terminate")
        if self.on_term is not None:
            self._end(self.on_term)

    def kill(self) -> None:
        self.calls.append("kill")
        self._end(137)

    def close(self, sel: selectors.BaseSelector) -> None:
        for timer in self._timers:
            timer.cancel()
        with contextlib.suppress(KeyError, ValueError):
            sel.unregister(self._wake_r)
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)

    def outcome(self) -> ChildOutcome:
        assert self._exit is not None
        code = self._exit
        error = None if code == 0 else f"the scripted child ended with {code}"
        return ChildOutcome(
            exit_code=code,
            process_exit=code,
            signal=code - 128 if code > 128 else None,
            output=self.output.decode("utf-8", "replace"),
            error=error,
        )

    # -- the script ---------------------------------------------------------------------
    def _ring(self) -> None:
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"!")

    def _on_wake(self, _mask: int) -> None:
        with contextlib.suppress(BlockingIOError):
            os.read(self._wake_r, 4096)
        elapsed = time.monotonic() - self._started
        while self._done < len(self.steps) and self.steps[self._done].at <= elapsed and self._exit is None:
            step = self.steps[self._done]
            self._done += 1
            if step.output:
                self.output += step.output
                self.progress.add_output(step.output)
                self.hooks.output(self.index, len(step.output), False)
                self.hooks.activity(self.index)
            if step.exit is not None:
                self._end(step.exit)

    def _end(self, code: int) -> None:
        if self._exit is None:
            self._exit = code
            self._ring()


class NoProcesses:
    """The process tree of a supervisor whose child is scripted: there is none."""

    def reap(self, keep: int | None) -> None:
        return None

    def end_leftovers(self, group: int | None, grace: float) -> tuple[list[int], list[int]] | None:
        return None
