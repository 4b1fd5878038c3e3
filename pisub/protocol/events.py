"""``events.jsonl``: one :class:`Event` per line, append-only."""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from pisub.protocol.codec import Record


class Event(Record, kw_only=True, omit_defaults=True):
    """A lifecycle or child event.

    ``type`` is a dotted name (``run.started``, ``child.exited``, ...); ``child`` is the
    child index for child events; ``data`` holds the event's fields.
    """

    v: Literal[1]
    ts: str
    type: str
    child: int | None = None
    data: dict[str, Any] = msgspec.field(default_factory=dict)
