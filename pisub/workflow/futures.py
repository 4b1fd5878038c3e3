"""The futures a workflow script awaits, and how the coordinator's threads resolve them on the
script's event loop."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Generator
from typing import Any


class ChildFuture(asyncio.Future[Any]):
    """A call's future that knows whether anything waits for it."""

    observed = False
    label = ""

    def add_done_callback(self, fn: Callable[..., object], *, context: Any = None) -> None:
        self.observed = True
        super().add_done_callback(fn, context=context)

    def __await__(self) -> Generator[Any, None, Any]:
        self.observed = True  # awaiting a future that is already done adds no callback
        return super().__await__()

    __iter__ = __await__


def call_soon(loop: asyncio.AbstractEventLoop, fn: Callable[..., Any], *args: Any) -> bool:
    """Schedule ``fn(*args)`` on ``loop`` from another thread; False when the loop is closed."""
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:
        return False
    return True
