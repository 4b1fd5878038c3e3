"""Reading the statuses of many runs at once (``pisub list``), fast and after crash repair.

A finished run costs one ``open``/``fstat``/``read`` of its status and two ``stat`` calls
(its inbox is quiet since its last answer); everything is looked up relative to the ``runs``
directory's descriptor from one listing of it. A live run, or a finished one whose inbox
holds something new, is observed in full (:func:`pisub.runs.reconcile.observe`: repaired when its
runner died, late requests answered). Live runs only come from the index of live runs
(:mod:`pisub.store.live_index`) when it is complete; else every run is read and the index rebuilt.

A listing of every run keeps the ended runs it read in the home's cache
(:mod:`pisub.runs.ended_cache`): an ended run whose ``status.json`` and ``inbox/new`` are as
they were then costs two ``stat`` calls, its status taken from the cache. A reader that lists
again and again (``pisub top``) keeps those entries in memory between listings (a
:data:`Seen`): the same two ``stat`` calls, no read of the cache file.
"""

from __future__ import annotations

import contextlib
import gc
import os
from collections.abc import Callable, Iterator
from functools import partial
from typing import TypeVar

from pisub.core.fsio import load_json
from pisub.errors import PisubError, RunNotFound
from pisub.protocol.status import Status
from pisub.runs.ended_cache import Entry
from pisub.store import live_index
from pisub.store.mailbox import quiet_since_answered
from pisub.store.paths import ANSWERED_MARKER, STATUS_FILE, Home, RunPaths
from pisub.store.runs import MAX_FILE

T = TypeVar("T")

Seen = dict[str, Entry]
"""Ended runs as last read, by run directory name (kept by a caller that lists again and again)."""


class Listing:
    """What a listing found. (Not a dataclass: ``dataclasses`` imports ``inspect``, some 8 ms
    of ``pisub list`` that imports neither otherwise.)"""

    __slots__ = ("problems", "statuses")

    def __init__(self) -> None:
        self.statuses: list[Status] = []
        self.problems: list[str] = []
        """One line per run that could not be read, and per stray entry of ``runs/``."""


def list_statuses(home: Home, *, live_only: bool = False, seen: Seen | None = None) -> Listing:
    """Every run's status (``live_only``: at least every run not ended, from the index when it
    is complete — the caller filters by state; ``seen``: ended runs as read by the caller's
    last listings, updated)."""
    with _no_cycle_collection():
        if live_only:
            ids = live_index.live_ids(home)
            if ids is not None:
                return _read_index(home, ids)
        return _read_all(home, seen)


@contextlib.contextmanager
def _no_cycle_collection() -> Iterator[None]:
    """No cyclic garbage collection while many statuses are decoded (each of its passes walks
    every object made so far: ~4 of the 5 µs a status takes); memory is still freed as it
    always is, the collector runs again afterwards."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _read_all(home: Home, seen: Seen | None) -> Listing:
    listing = Listing()
    names = _runs_entries(home, listing)
    if seen is not None:
        for gone in seen.keys() - set(names):
            del seen[gone]
    unread = _read(home, names, listing, quiet_missing=False, cache=True, seen=seen)
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
    home: Home,
    names: list[str],
    listing: Listing,
    *,
    quiet_missing: bool,
    cache: bool = False,
    seen: Seen | None = None,
) -> list[str]:
    """Append the statuses of runs ``names``; the names that could not be read. ``cache``:
    through the home's cache of ended runs (or ``seen``, when it holds entries), both brought
    up to date."""
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
        cached = _Cached(home, runs_fd, seen) if cache else None
        if cached is not None:  # the cached ended runs first (statuses kept in their order)
            names = cached.hits(names, listing.statuses)
        for name in names:

            def first_read(name: str = name) -> tuple[Status, bool]:
                if cached is not None:
                    return cached.read(name)
                st = _named(load_json(f"{name}/{STATUS_FILE}", Status, limit=MAX_FILE, dir_fd=runs_fd), name)
                return st, not st.state.is_terminal or not quiet_since_answered(f"{name}/inbox", runs_fd)

            read = _guarded(home, name, listing, unread, quiet_missing, first_read)
            if read is not None:
                loaded.append((name, *read))
        if cached is not None:
            cached.save()
    finally:
        os.close(runs_fd)
    # One engine query for every live run an engine placed, before any of them is observed
    # (a run not to be observed has ended).
    prime([RunPaths(home.runs / n) for n, st, observing in loaded if observing and not st.state.is_terminal])
    for name, st, observing in loaded:
        shown: Status | None = st
        if observing:
            shown = _guarded(
                home, name, listing, unread, quiet_missing, partial(observe, RunPaths(home.runs / name))
            )
        if shown is not None:
            listing.statuses.append(shown)
    return unread


_STATUS = f"/{STATUS_FILE}"
_INBOX_NEW = "/inbox/new"


class _Cached:
    """Reading runs through the home's cache of ended runs (:mod:`pisub.runs.ended_cache`)."""

    def __init__(self, home: Home, runs_fd: int, seen: Seen | None) -> None:
        from pisub.runs import ended_cache

        self.home = home
        self.runs_fd = runs_fd
        self.runs = os.fstat(runs_fd)
        self.seen = seen
        self.old = seen if seen else ended_cache.load(home, self.runs)
        self.new: list[Entry] = []
        self.added = 0

    def hits(self, names: list[str], found: list[Status]) -> list[str]:
        """Append to ``found`` the status of each run of ``names`` whose ``status.json`` and
        ``inbox/new`` are as they were when it was cached; the other names. (One loop with
        its names bound locally: it runs once per run, 10,000 times for 10,000 runs.)"""
        get, stat, fd, kept, misses = self.old.get, os.stat, self.runs_fd, self.new, []
        for name in names:
            entry = get(name)
            if entry is not None:
                try:
                    info = stat(name + _STATUS, dir_fd=fd, follow_symlinks=False)
                    if (info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns) == entry.status_key:
                        new = stat(name + _INBOX_NEW, dir_fd=fd, follow_symlinks=False)
                        if (new.st_ino, new.st_mtime_ns) == entry.inbox_key:
                            kept.append(entry)
                            found.append(entry.status)
                            continue
                except OSError:
                    pass
            misses.append(name)
        return misses

    def read(self, name: str) -> tuple[Status, bool]:
        """Run ``name``'s status, and whether it must be observed (it has not ended, or its
        inbox is not quiet), as :func:`_read` reads it without a cache; an ended run with a
        quiet inbox is cached."""
        from pisub.runs.ended_cache import inbox_key, status_key

        path = f"{name}/{STATUS_FILE}"
        try:
            info: os.stat_result | None = os.stat(path, dir_fd=self.runs_fd, follow_symlinks=False)
        except FileNotFoundError:
            raise
        except OSError:
            info = None  # read as without a cache: the read names the problem
        st = _named(load_json(path, Status, limit=MAX_FILE, dir_fd=self.runs_fd), name)
        if not st.state.is_terminal:
            return st, True
        new = _quiet_inbox(name, self.runs_fd)
        if new is None:
            return st, True
        if info is not None:  # the stat before the read: an entry is never newer than the file
            self.new.append(Entry(name, status_key(info), inbox_key(new), st))
            self.added += 1
        return st, False

    def save(self) -> None:
        """Write the cache when an entry was added or dropped; ``seen`` holds the entries."""
        from pisub.runs import ended_cache

        if self.added or len(self.new) != len(self.old):
            ended_cache.store(self.home, self.runs, self.new)
        if self.seen is not None:
            self.seen.clear()
            self.seen.update((entry.name, entry) for entry in self.new)


def _named(status: Status, name: str) -> Status:
    """``status`` when it is the status of run ``name`` (its folder).

    Raises:
        ProtocolError: it names another run (a copied folder): listed as a problem, never as
            a second copy of that run.
    """
    if status.run_id != name:
        from pisub.errors import ProtocolError

        raise ProtocolError(f"its status.json names another run, {status.run_id[:40]!r} (a copied folder?)")
    return status


def _lstat(path: str, dir_fd: int) -> os.stat_result | None:
    try:
        return os.stat(path, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return None


def _quiet_inbox(name: str, runs_fd: int) -> os.stat_result | None:
    """``inbox/new``'s ``stat`` when nothing was published into it since its ``answered``
    marker was written (as :func:`pisub.store.mailbox.quiet_since_answered`); else None."""
    marker = _lstat(f"{name}/inbox/{ANSWERED_MARKER}", runs_fd)
    new = _lstat(f"{name}/inbox/new", runs_fd)
    if marker is None or new is None or new.st_mtime_ns != marker.st_mtime_ns:
        return None
    return new


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
