"""Groups with a parallel limit and a queue (``spec/queue.md``): a group's settings
(``groups/<name>/group.json``), a queued run's entry (``groups/<name>/q-…`` / ``a-…``) and what a
run asked for at launch (``Manifest.queue``)."""

from __future__ import annotations

import re
from typing import Literal

from pisub.errors import InvalidInput
from pisub.protocol.codec import Record

DEFAULT_GROUP = "default"
"""The group of a top-level run launched without ``--group`` once ``default`` is configured."""
MAX_LIMIT = 10_000
"""The largest parallel limit a group takes."""
MAX_PRIORITY = 1_000_000
"""Priorities lie in ``[-MAX_PRIORITY, MAX_PRIORITY]``."""
MAX_AFTER = 64
"""How many runs one run may wait for (``--after``)."""
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")


class GroupConfig(Record, kw_only=True):
    """``groups/<name>/group.json``: a group's settings (written by ``pisub group``)."""

    v: Literal[1]
    name: str
    limit: int | None = None
    """How many of its runs may be admitted at once (None: no limit)."""
    paused: bool = False
    """No run is admitted while paused; admitted runs go on."""


class QueueRequest(Record, kw_only=True):
    """``Manifest.queue``: the group a top-level run waits in, its priority and what it waits for."""

    group: str
    priority: int = 0
    """Higher first; equal priorities in launch order."""
    after: list[str] = []
    """Run ids that must have ended ``complete`` before it may start (one that ends otherwise
    fails this run without starting it)."""


class QueueEntry(Record, kw_only=True):
    """One run in a group: ``groups/<name>/q-<key>-<seq>-<run id>`` while it waits, renamed
    ``a-…`` when admitted. Written by the run's runner under the group's lock."""

    v: Literal[1]
    run_id: str
    priority: int = 0
    after: list[str] = []
    pid: int | None = None
    """The runner's pid (woken with SIGUSR1 when admitted)."""
    pid_start_ticks: int | None = None
    """Its start in clock ticks since boot: the pid is signalled only while it is the same process."""


def check_group_name(name: object, field: str = "group") -> str:
    """``name`` when it is a usable group name: 1-64 of ``A-Z a-z 0-9 _ -``, starting with a
    letter or digit.

    Raises:
        InvalidInput: naming ``field``.
    """
    if not isinstance(name, str):
        raise InvalidInput(f"{field}: give a group name, not {type(name).__name__}")
    if not _NAME.fullmatch(name):
        shown = name[:40].encode("unicode_escape").decode("ascii")
        raise InvalidInput(
            f"{field}: {shown!r} is not a group name (1-64 letters, digits, '_' or '-', "
            "starting with a letter or digit)"
        )
    return name


def check_limit(limit: object, field: str = "limit") -> int:
    """``limit`` when it is a usable parallel limit: an integer in ``1..MAX_LIMIT``.

    Raises:
        InvalidInput: naming ``field``.
    """
    return _whole(limit, field, 1, MAX_LIMIT, " (pause the group to admit none)")


def check_priority(priority: object, field: str = "priority") -> int:
    """Raises: InvalidInput: not an integer in ``[-MAX_PRIORITY, MAX_PRIORITY]`` (naming ``field``)."""
    return _whole(priority, field, -MAX_PRIORITY, MAX_PRIORITY)


def _whole(value: object, field: str, low: int, high: int, hint: str = "") -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput(f"{field}: give a whole number, not {type(value).__name__}")
    if not low <= value <= high:
        raise InvalidInput(f"{field}: {value} is out of range; give {low} to {high}{hint}")
    return value
