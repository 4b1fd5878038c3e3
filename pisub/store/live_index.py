"""The index of live runs: ``<home>/index/live/<run id>``, one empty file per run not known to
have ended, so that ``pisub list --state running`` reads a handful of runs, not all of them.

The run directories stay the source of truth; the index only ever names *too many* runs:

- A launcher adds a run's entry while it holds the run's staging directory
  (``runs/.creating-<id>``) and its lock, *before* the run becomes visible; a launch that
  cannot add it fails.
- Whoever writes a run's terminal status removes the entry *after* that status is written.
- A reader removes an entry whose run has ended, or that names no run: ``runs/.creating-<id>``
  is gone (looked up first) and then ``runs/<id>`` is gone too (the rename between the two
  is atomic, so a creation in progress is never mistaken for an abandoned one).
- ``index/live.ok`` says the index is complete. Without it (a new or old home, a deleted or
  unreadable index) readers scan every run directory instead and then rebuild the index:
  the folder first, an entry for every run not ended, and ``live.ok`` last.

So a lost or stale index never hides a run: at worst it sends a reader to a finished run.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path

from pisub.core.fsio import private_mkdir
from pisub.store.paths import Home, is_run_id

_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


def add(home: Home, run_id: str) -> None:
    """Add ``run_id``'s entry (the folders are made when missing; something else standing
    at ``index`` or ``index/live`` is set aside first).

    Raises:
        StorageError: the entry cannot be written, naming the index (the launch must fail: a
            run without an entry would be hidden from ``--state running``).
    """
    from pisub.errors import storage_error

    try:
        try:
            _create(home, run_id)
        except FileNotFoundError:
            _forget_complete(home)  # the folder was lost with its entries
            _make_folders(home)
            _create(home, run_id)
    except OSError as exc:
        raise storage_error(exc, "add the run to the index of live runs in", home.live_index) from exc


def _create(home: Home, run_id: str) -> None:
    with _folder(home) as folder:
        os.close(os.open(run_id, _FLAGS, 0o600, dir_fd=folder))


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@contextlib.contextmanager
def _folder(home: Home) -> Iterator[int]:
    """``index/live`` opened as a directory, each level without following a symlink; a file,
    FIFO or symlink standing at either level is set aside and the folder made anew.

    Raises:
        FileNotFoundError: it is missing. OSError: it cannot be opened.
    """
    fd = _open_level(home, home.live_index.parent, None)
    try:
        live = _open_level(home, home.live_index, fd)
    finally:
        os.close(fd)
    try:
        yield live
    finally:
        os.close(live)


def _open_level(home: Home, path: Path, parent: int | None) -> int:
    name: str | Path = path.name if parent is not None else path
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent)
    except OSError as exc:
        if exc.errno not in (errno.ENOTDIR, errno.ELOOP):
            raise
    _set_aside(home, path)
    private_mkdir(path)
    return os.open(name, _DIR_FLAGS, dir_fd=parent)


def _make_folders(home: Home) -> None:
    for folder in (home.live_index.parent, home.live_index):
        try:
            private_mkdir(folder)
        except NotADirectoryError:  # a file or a symlink stands there
            _set_aside(home, folder)
            private_mkdir(folder)


def _forget_complete(home: Home) -> None:
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        os.unlink(home.live_index_ok)


def _set_aside(home: Home, path: Path) -> None:
    """Quarantine what stands at ``path`` (``index`` or ``index/live``): the index is lost, so
    ``live.ok`` goes first (readers scan until the next rebuild), then it is renamed to
    ``<name>.bad-<hex>`` beside it."""
    import uuid

    _forget_complete(home)
    os.rename(path, path.with_name(f"{path.name}.bad-{uuid.uuid4().hex[:12]}"))


def remove(home: Home, run_id: str) -> None:
    """Drop ``run_id``'s entry (best effort: a stale entry only costs a reader one look)."""
    with contextlib.suppress(OSError), _folder(home) as folder:
        os.unlink(run_id, dir_fd=folder)


def live_ids(home: Home) -> list[str] | None:
    """The run ids the index names, or None when it cannot be trusted (no ``live.ok``, or the
    folder cannot be listed): the caller scans every run instead."""
    if not is_complete(home):
        return None
    try:
        index = os.open(home.live_index.parent, _DIR_FLAGS)
        try:
            fd = os.open(home.live_index.name, _DIR_FLAGS, dir_fd=index)
        finally:
            os.close(index)
    except OSError:
        return None
    try:
        return [name for name in os.listdir(fd) if is_run_id(name)]
    except OSError:
        return None
    finally:
        os.close(fd)


def is_complete(home: Home) -> bool:
    """``live.ok`` is there, and ``index`` and ``index/live`` are real folders."""
    try:
        index = os.stat(home.live_index.parent, follow_symlinks=False)
        folder = os.stat(home.live_index, follow_symlinks=False)
        os.stat(home.live_index_ok, follow_symlinks=False)
    except OSError:
        return False
    return stat.S_ISDIR(index.st_mode) and stat.S_ISDIR(folder.st_mode)


def rebuild(home: Home, live: Iterable[str]) -> None:
    """After a scan of every run: an entry for each run in ``live`` (those not ended), then
    ``live.ok`` (best effort: a home whose index cannot be written is simply scanned)."""
    try:
        _make_folders(home)
        with _folder(home) as folder:
            for run_id in live:
                os.close(os.open(run_id, _FLAGS, 0o600, dir_fd=folder))
        os.close(os.open(home.live_index_ok, _FLAGS, 0o600))
    except OSError:
        return


def prune(home: Home, run_id: str) -> None:
    """Drop the entry of a run that names no run directory (its creation was abandoned, or it
    was removed by hand) — the staging folder is looked up first (see the module's text)."""
    runs = home.runs
    if os.path.lexists(runs / f".creating-{run_id}") or os.path.lexists(runs / run_id):
        return
    remove(home, run_id)
