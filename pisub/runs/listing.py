"""Reading the statuses of many runs at once (``pisub list``), fast and after crash repair.

A finished run costs one ``open``/``fstat``/``read`` of its status and two ``stat`` calls
(its inbox is quiet since its last answer); everything is looked up relative to the ``runs``
directory's descriptor from one listing of it. A live run, or a finished one whose inbox
holds something new, is observed in full (:func:`pisub.runs.reconcile.observe`: repaired when its
runner died, late requests answered). Live runs only come from the index of live runs
(:mod:`pisub.store.live_index`) when it is complete; else every run is read and the index rebuilt.

A reader that lists again and again (``pisub top``) keeps a :data:`Seen` between listings: an
ended run whose ``status.json`` is the same file as when it was read (its inode, size and
mtime by one ``stat``) is not read and decoded again — its inbox is still checked each time.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import TypeVar

from pisub.core.fsio import load_json
from pisub.errors import PisubError, RunNotFound
from pisub.protocol.status import Status
from pisub.store import live_index
from pisub.store.mailbox import quiet_since_answered
from pisub.store.paths import STATUS_FILE, Home, RunPaths

T = TypeVar("T")

Seen = dict[str, tuple[tuple[int, int, int], Status]]
"""Ended runs as last read: run id → (``status.json``'s inode, size and mtime, its status)."""


@dataclass
class Listing:
    statuses: list[Status] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    """One line per run that could not be read, and per stray entry of ``runs/``."""


def list_statuses(home: Home, *, live_only: bool = False, seen: Seen | None = None) -> Listing:
    """Every run's status (``live_only``: at least every run not ended, from the index when it
    is complete — the caller filters by state; ``seen``: ended runs as read by the caller's
    last listings, updated)."""
    if live_only:
        ids = live_index.live_ids(home)
        if ids is not None:
            return _read_index(home, ids)
    listing = Listing()
    names = _runs_entries(home, listing)
    if seen is not None:
        for gone in seen.keys() - set(names):
            del seen[gone]
    unread = _read(home, names, listing, quiet_missing=False, known=seen)
    if not live_index.is_complete(home):
        live = [st.run_id for st in listing.statuses if not st.state.is_terminal]
        live_index.rebuild(home, live + unread)  # unreadable ones too: only too many, never too few
    return listing


def _runs_entries(home: Home, listing: Listing) -> list[str]:
    """The run directories' names (one listing; strays — symlinks, files — are problems)."""
    from pisub.store.runs import RunStore

    names, strays = RunStore(home).entries()
    listing.problems += [f"{name}: not a run directory (a symlink or file in runs/)" for name in strays]
    return names


def _read_index(home: Home, ids: list[str]) -> Listing:
    listing = Listing()
    _read(home, ids, listing, quiet_missing=True)
    for st in listing.statuses:
        if st.state.is_terminal:
            live_index.remove(home, st.run_id)  # ended: a stale entry
    return listing


def _read(
    home: Home, names: list[str], listing: Listing, *, quiet_missing: bool, known: Seen | None = None
) -> list[str]:
    """Append the statuses of runs ``names``; the names that could not be read."""
    from pisub.backends import prime
    from pisub.errors import storage_error
    from pisub.runs.reconcile import observe

    unread: list[str] = []
    if not names:
        return unread
    try:
        # O_PATH: looking names up needs search permission only, as opening them by path does.
        runs_fd = os.open(home.runs, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise storage_error(exc, "read the runs in", home.runs) from exc
    loaded: list[tuple[str, Status, bool]] = []
    try:
        for name in names:

            def first_read(name: str = name) -> tuple[Status, bool]:
                st = _status(name, runs_fd, known)
                return st, not st.state.is_terminal or not quiet_since_answered(f"{name}/inbox", runs_fd)

            read = _guarded(home, name, listing, unread, quiet_missing, first_read)
            if read is not None:
                loaded.append((name, *read))
    finally:
        os.close(runs_fd)
    # One engine query for every live run an engine placed, before any of them is observed.
    prime([RunPaths(home.runs / name) for name, st, observing in loaded if not st.state.is_terminal])
    for name, st, observing in loaded:
        seen = st
        if observing:
            observed = _guarded(
                home, name, listing, unread, quiet_missing, partial(observe, RunPaths(home.runs / name))
            )
            if observed is None:
                continue
            seen = observed
        listing.statuses.append(seen)
    return unread


def _status(name: str, runs_fd: int, seen: Seen | None) -> Status:
    """Run ``name``'s ``status.json``; from ``seen`` when it is the same file as when an ended
    status was read from it (a file replaced meanwhile has another inode or mtime)."""
    from pisub.store.runs import MAX_FILE

    path = f"{name}/{STATUS_FILE}"
    if seen is None:
        return load_json(path, Status, limit=MAX_FILE, dir_fd=runs_fd)
    info = os.stat(path, dir_fd=runs_fd, follow_symlinks=False)  # before the read: never too new
    key = (info.st_ino, info.st_size, info.st_mtime_ns)
    known = seen.get(name)
    if known is not None and known[0] == key:
        return known[1]
    st = load_json(path, Status, limit=MAX_FILE, dir_fd=runs_fd)
    if st.state.is_terminal:
        seen[name] = (key, st)
    return st


def _guarded(
    home: Home, name: str, listing: Listing, unread: list[str], quiet: bool, read: Callable[[], T]
) -> T | None:
    """``read()``; None when the run is gone (noted by :func:`_missing`) or unreadable (a problem)."""
    try:
        return read()
    except (FileNotFoundError, RunNotFound):
        _missing(home, name, listing, unread, quiet)
    except PisubError as exc:
        listing.problems.append(f"{name}: {exc}")
        unread.append(name)
    return None


def _missing(home: Home, name: str, listing: Listing, unread: list[str], quiet: bool) -> None:
    """A run whose status is gone (removed meanwhile, or never written)."""
    if quiet:
        live_index.prune(home, name)
    elif os.path.isdir(home.runs / name):
        listing.problems.append(f"{name}: it has no status.json")
        unread.append(name)
