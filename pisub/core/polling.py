"""Waiting for a condition: the one loop behind every wait of pisub's readers.

Readers wait on files that another process replaces (a receipt, a status, a lock): there is
nothing to block on portably, so they poll — always with a deadline, never a bare sleep.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from pisub.defaults import READ_POLL_S

T = TypeVar("T")


def poll(
    check: Callable[[], T | None],
    timeout: float | None,
    *,
    interval: float = READ_POLL_S,
    first: float | None = None,
    first_for: float = 0.2,
) -> T | None:
    """Call ``check`` until it returns something other than None; that value, or None once
    ``timeout`` seconds have passed (None: wait for ever). ``check`` runs at least once.

    It sleeps ``interval`` between calls — ``first`` instead during the first ``first_for``
    seconds, for waits that usually end at once (a receipt) — never past the deadline.
    """
    start = time.monotonic()
    deadline = None if timeout is None else start + timeout
    while True:
        value = check()
        if value is not None:
            return value
        now = time.monotonic()
        if deadline is not None and now >= deadline:
            return None
        step = first if first is not None and now - start < first_for else interval
        time.sleep(step if deadline is None else max(0.0, min(step, deadline - now)))


class Every:
    """A side task due at most once every ``interval`` seconds inside a poll (the crash check
    while waiting for a receipt): :meth:`due` says when, and re-arms."""

    def __init__(self, interval: float, *, now: bool = True) -> None:
        self.interval = interval
        self._next = 0.0 if now else time.monotonic() + interval

    def due(self) -> bool:
        at = time.monotonic()
        if at < self._next:
            return False
        self._next = at + self.interval
        return True
