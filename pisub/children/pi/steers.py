"""Steer bookkeeping of a pi child: where each steering message is on its way into pi, and its
receipt's state as pi takes it (queued, delivered) or drops it (failed). Delivered steers are
forgotten."""

from __future__ import annotations

import enum
from collections.abc import Iterable

import msgspec

from pisub.children.base import ChildHooks
from pisub.protocol.control import ReceiptState

CLEARED_REASON = "the interrupt cleared it from pi's queue before it was delivered"


class SteerState(enum.Enum):
    """Where a steering message is on its way into pi (delivered ones are forgotten)."""

    HELD = "held"
    """Waiting until pi has answered the task's prompt (before that pi drops it)."""
    SENT = "sent"
    """Sent as a ``prompt`` with ``streamingBehavior``; pi has not listed it yet."""
    QUEUED = "queued"
    """pi listed it in a ``queue_update``."""


IN_PI = (SteerState.SENT, SteerState.QUEUED)


class Steer(msgspec.Struct):
    request_id: str
    text: str
    behavior: str
    state: SteerState = SteerState.HELD


class SteerBook:
    """The steers of one child not yet delivered, in the order they came; every change of
    state is reported through ``hooks.steer_update``."""

    def __init__(self, hooks: ChildHooks) -> None:
        self.hooks = hooks
        self._steers: list[Steer] = []

    def add(self, request_id: str, text: str, behavior: str) -> Steer:
        """A new steer, held until it is sent."""
        item = Steer(request_id, text, behavior)
        self._steers.append(item)
        return item

    def held(self) -> list[Steer]:
        return [item for item in self._steers if item.state is SteerState.HELD]

    def fail(self, item: Steer, reason: str) -> bool:
        """Fail ``item`` (if it is still here); whether it was."""
        if item not in self._steers:
            return False
        self._steers.remove(item)
        self.hooks.steer_update(item.request_id, ReceiptState.FAILED, reason)
        return True

    def listed(self, texts: Iterable[str]) -> None:
        """pi listed ``texts`` as queued: the first sent steer with each text is queued."""
        for text in texts:
            item = self._first(text, (SteerState.SENT,))
            if item is not None:
                item.state = SteerState.QUEUED
                self.hooks.steer_update(item.request_id, ReceiptState.QUEUED)

    def cleared(self, texts: Iterable[str]) -> None:
        """pi cleared ``texts`` from its queue: the first steer in pi with each text failed."""
        for text in texts:
            item = self._first(text, IN_PI)
            if item is not None:
                self.fail(item, CLEARED_REASON)

    def delivered(self, text: str) -> None:
        """pi took a user message with ``text``: the first steer in pi with it is delivered."""
        item = self._first(text, IN_PI)
        if item is not None:
            self._steers.remove(item)
            self.hooks.steer_update(item.request_id, ReceiptState.DELIVERED)

    def _first(self, text: str, states: tuple[SteerState, ...]) -> Steer | None:
        return next((item for item in self._steers if item.state in states and item.text == text), None)
