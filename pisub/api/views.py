"""What the commands show of runs, for any caller: a run's output log (read, or followed until
the run ends), a workflow's children's logs interleaved, the fleet of live runs, the tail of a
transcript, and the last line a live run wrote.

The record types and helpers the views are made of are named here too (:class:`FleetRow`,
:func:`fleet_of`, :func:`json_lines_of`, :func:`redact`), so that a caller above the API (the
CLI) needs nothing below it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from pisub.api.text import redact
from pisub.core.polling import Every
from pisub.errors import InvalidInput, PisubError
from pisub.runs.views import FleetRow, fleet_of, json_lines_of
from pisub.store.paths import Home, open_home, open_home_to_read

if TYPE_CHECKING:
    from pisub.api.client import Run
    from pisub.protocol.status import Status

__all__ = [
    "FleetRow",
    "Home",
    "fleet",
    "fleet_of",
    "json_lines_of",
    "last_line",
    "log_bytes",
    "mission_of",
    "open_home",
    "open_home_to_read",
    "redact",
    "transcript",
    "workflow_log_lines",
]

T = TypeVar("T")
END_CHECK_S = 0.5
"""How often a follow asks whether the run has ended."""
SPARK_BYTES = 4096
"""Bytes of a live run's log read for its last line."""


def log_bytes(
    run: Run, *, follow: bool = False, tail: int | None = None, stderr: bool = False
) -> Iterator[bytes]:
    """The bytes of ``run``'s output log as written (escape sequences included: escape them
    before a terminal shows them); with ``follow``, new bytes as they come until the run ends.
    ``tail``: from the start of its last ``tail`` lines only. ``stderr``: the child's standard
    error (``stderr-0.log``) instead.

    Raises:
        InvalidInput: the run has no such log (and ``follow`` is not given); ``stderr`` of a
            run started without artifacts (it keeps none); a negative ``tail``.
        StorageError: the log is not a readable regular file.
    """
    from pisub.runs.views import tail_offset

    _check_tail(tail)
    if stderr and not run.manifest().artifacts:
        raise InvalidInput(f"run {run.id} was started with --no-artifacts: it kept no stderr log")
    log = run.paths.stderr_log(0) if stderr else run.paths.output_log(0)
    if not os.path.lexists(log) and not follow:
        raise InvalidInput(f"run {run.id} has no {'stderr' if stderr else 'output'} log")
    offset = tail_offset(log, tail) if tail is not None else 0

    def read(final: bool) -> Iterator[bytes]:
        nonlocal offset
        for chunk in _chunks(log, offset):
            offset += len(chunk)
            yield chunk

    return _until_ended(run, read, follow, interval=_log_poll_s())


def _check_tail(tail: int | None) -> None:
    if tail is not None and (isinstance(tail, bool) or not isinstance(tail, int) or tail < 0):
        raise InvalidInput(f"tail: give a number of lines >= 0, not {tail!r:.40}")


def workflow_log_lines(run: Run, *, follow: bool = False, tail: int | None = None) -> Iterator[str]:
    """A workflow's children's output, each line as ``[key] line``, the children's interleaved as
    they are read; with ``follow``, until the workflow ends. ``tail``: of what is there now,
    the last ``tail`` lines only. A byte that is not UTF-8 is kept as a lone surrogate
    (``surrogateescape``): escape it before a terminal shows it."""
    from pisub.runs.views import InterleavedLogs

    _check_tail(tail)
    reader = InterleavedLogs(run.home, run.paths)
    keep = tail

    def read(final: bool) -> list[str]:
        nonlocal keep
        found = reader.read(final=final)
        if keep is not None:
            found, keep = (found[-keep:] if keep else []), None
        return found

    return _until_ended(run, read, follow, interval=0.1)


def _until_ended(
    run: Run, read: Callable[[bool], Iterable[T]], follow: bool, *, interval: float
) -> Iterator[T]:
    """What ``read`` gives, once (``read(True)``: everything); with ``follow``, again every
    ``interval`` seconds until the run has ended, then the rest."""
    if not follow:
        yield from read(True)
        return
    end_check = Every(END_CHECK_S)
    while True:
        yield from read(False)
        if end_check.due() and run.status().state.is_terminal:
            yield from read(True)
            return
        time.sleep(interval)


def _log_poll_s() -> float:
    from pisub.defaults import READ_POLL_S

    return READ_POLL_S * 2


def _chunks(log: Path, offset: int) -> Iterator[bytes]:
    from pisub.runs.views import open_log

    fd = open_log(log)
    if fd is None:
        return
    try:
        os.lseek(fd, offset, os.SEEK_SET)
        while chunk := os.read(fd, 1 << 16):
            yield chunk
    finally:
        os.close(fd)


def fleet(run: Run | None = None, *, home: Path | None = None) -> list[FleetRow]:
    """One row per live run and workflow child (``run``: that run and its children, queued
    calls included)."""
    if run is None:
        from pisub.api.client import list_runs

        return fleet_of(list_runs(children=True, home=home))
    from pisub.runs.views import children_of

    status = run.status()
    return fleet_of([status, *children_of(run.home, status)])


def transcript(run: Run | Home, lines: int = 80, *, run_id: str | None = None) -> list[str]:
    """The last ``lines`` (at most 500) lines of a run's transcript: its pi session's messages, or
    its output log (``run``: a handle, or a home and ``run_id``).

    Raises:
        InvalidInput: the run is a workflow (name a child).
    """
    from pisub.runs.views import transcript as tail

    if isinstance(run, Home):
        return tail(run.run(run_id or ""), lines)
    if run.manifest().workflow is not None:
        raise InvalidInput(f"run {run.id} is a workflow: name a child with --child KEY|INDEX")
    return tail(run.paths, lines)


def last_line(home: Home, status: Status) -> str:
    """The last line a live run wrote to its output (redacted; nothing for an ended run, a
    workflow, or a log that cannot be read)."""
    if status.state.is_terminal or status.runner == "workflow":
        return ""
    return log_last_line(home.run(status.run_id).output_log(0))


def log_last_line(log: Path) -> str:
    """The last line of output log ``log`` that is not blank, redacted, from its last
    :data:`SPARK_BYTES`: a line that began before them is shown behind ``…``, from a whole
    character; nothing when the log cannot be read."""
    from pisub.runs.views import read_log_tail

    try:
        tail = read_log_tail(log, SPARK_BYTES, keep_cut=True)
    except (OSError, PisubError):
        return ""
    lines = [line for line in (tail or b"").decode("utf-8", "surrogateescape").splitlines() if line.strip()]
    return redact(lines[-1].strip()) if lines else ""


def mission_of(run: Run, status: Status | None = None) -> tuple[str, str] | None:
    """The mission workflow run ``run`` belongs to, ``(id, status)`` (``spec/missions.md``),
    its status as :func:`pisub.api.missions.mission_show` reads it (its runs refreshed, never
    stale); ``gone`` when the mission is no longer there, ``unreadable`` when it cannot be
    read. None: the run belongs to none."""
    from pisub.api.missions import mission_show
    from pisub.errors import MissionNotFound

    st = status if status is not None else run.status()
    if st.mission_id is None:
        return None
    cwd = st.cwd if st.cwd is not None and os.path.isdir(st.cwd) else None  # else: any project's
    try:
        shown = mission_show(st.mission_id, cwd=cwd, home=run.home.root)
    except MissionNotFound:
        return st.mission_id, "gone"
    except (PisubError, OSError):
        return st.mission_id, "unreadable"
    return st.mission_id, str(shown.mission.status)


class Statuses:
    """Every run's status (child runs too, oldest first, after crash repair), listed again and
    again by one reader (``pisub top``): an ended run whose ``status.json`` has not changed
    since this reader read it is not read again (its inbox is still checked each time, by one
    ``stat``); the first listing starts from the home's cache of ended runs
    (``spec/protocol.md``, The cache of ended runs)."""

    def __init__(self, home: Path | None = None) -> None:
        from pisub.runs.listing import Seen

        self.home = open_home_to_read(home)  # a reader: a home that does not exist has no runs
        self.seen: Seen = {}

    def __call__(self, problems: list[str] | None = None) -> list[Status]:
        from pisub.runs.listing import list_statuses

        listing = list_statuses(self.home, seen=self.seen)
        if problems is not None:
            problems += listing.problems
        return sorted(listing.statuses, key=lambda s: s.started_at)
