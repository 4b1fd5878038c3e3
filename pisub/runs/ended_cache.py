"""A home's cache of ended runs' statuses (``cache/ended-runs``), so that ``pisub list`` over
many ended runs reads one file and makes two ``stat`` calls per run instead of opening,
reading and decoding every ``status.json``.

It is only ever a cache: the run directories stay the source of truth.

- An entry is used only while the run's ``status.json`` is the same file as when its ended
  status was read (inode, size, mtime and ctime by one ``stat``, taken *before* that read, so
  an entry is never newer than the file), and its ``inbox/new`` is the same folder with the
  same mtime as when the inbox was found quiet (``inbox/new``'s mtime equal to its
  ``answered`` marker's, :func:`pisub.store.mailbox.quiet_since_answered`): a request
  published into an ended run changes that mtime, so the run is read in full and the request
  answered (promise 2 of ``spec/guarantees.md``). Anything else — another file, a replaced
  run directory, an inbox touched — and the run is read as if there were no cache.
- Only terminal statuses are kept (a terminal status is final: promise 4 repairs only runs
  that have not ended).
- The file is ignored, never trusted, when it is not a regular file owned by this user with
  no group or other permission bits, is larger than :data:`MAX_BYTES`, does not decode, is of
  another version or was written by a pisub whose status records differ (:func:`_records`),
  or was made for another ``runs`` folder (its device and inode): the reader then reads every
  run and writes the cache anew.
- It is written to a temp name beside it (mode 0600) and renamed into place, without fsync
  (a cache lost to a crash is rebuilt), only by the owner of the home's ``cache`` folder
  (``root`` listing a user's home leaves no file of its own), and only when an entry changed.
  Concurrent writers each rename a complete file: the last one wins.
"""

from __future__ import annotations

import contextlib
import functools
import os
import stat

import msgspec

from pisub.protocol.status import RunState, Status
from pisub.store.paths import Home

VERSION = 1
MAGIC = "pisub-ended-runs"
MAX_BYTES = 512 << 20
"""A cache file larger than this is ignored (100,000 ended runs take ~50 MB)."""

StatusKey = tuple[int, int, int, int]
"""``status.json``'s inode, size, mtime and ctime (ns)."""
InboxKey = tuple[int, int]
"""``inbox/new``'s inode and mtime (ns) while the inbox was quiet."""


class Entry(msgspec.Struct, array_like=True):
    name: str
    status_key: StatusKey
    inbox_key: InboxKey
    status: Status


class _File(msgspec.Struct, array_like=True):
    magic: str
    v: int
    records: int
    """:func:`_records`: the status records as this pisub knows them."""
    runs_dev: int
    runs_ino: int
    entries: list[Entry]


def status_key(info: os.stat_result) -> StatusKey:
    return (info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)


def inbox_key(info: os.stat_result) -> InboxKey:
    return (info.st_ino, info.st_mtime_ns)


def load(home: Home, runs: os.stat_result) -> dict[str, Entry]:
    """The cached entries by run directory name; none when the file is missing or cannot be
    trusted (see the module's text). ``runs``: the ``runs`` folder's ``stat``."""
    from pisub.core.fsio import open_dir

    path = home.ended_cache
    try:
        folder = open_dir(path.parent)  # no symlink followed below the home
        try:
            fd = os.open(path.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=folder)
        finally:
            os.close(folder)
    except OSError:
        return {}
    try:
        info = os.fstat(fd)
        if (
            not stat.S_ISREG(info.st_mode)
            or info.st_uid != os.geteuid()
            or info.st_mode & 0o077
            or info.st_size > MAX_BYTES
        ):
            return {}
        data = _read_all(fd, info.st_size)
    except OSError:
        return {}
    finally:
        os.close(fd)
    try:
        found = msgspec.msgpack.decode(data, type=_File)
    except (msgspec.DecodeError, RecursionError, ValueError):
        return {}
    header = (found.magic, found.v, found.records, found.runs_dev, found.runs_ino)
    if header != (MAGIC, VERSION, _records(), runs.st_dev, runs.st_ino):
        return {}
    return {e.name: e for e in found.entries if e.status.state not in _NOT_ENDED}


_NOT_ENDED = frozenset(state for state in RunState if not state.is_terminal)

_RECORD_MODULES = ("status", "budget", "control", "result", "acceptance", "codec")
"""The modules of :class:`~pisub.protocol.status.Status` and of the records inside it."""


@functools.cache
def _records() -> int | None:
    """A checksum of the source of the status records: a cache written by a pisub whose
    records differ (a field it did not know is missing from its entries) is not believed.
    None when a source cannot be read: no cache is then read or written."""
    import importlib
    import zlib

    crc = zlib.crc32(str(VERSION).encode())
    for name in _RECORD_MODULES:
        try:
            with open(importlib.import_module(f"pisub.protocol.{name}").__file__ or "", "rb") as fh:
                crc = zlib.crc32(fh.read(), crc)
        except (OSError, TypeError, ValueError):
            return None
    return crc


def _read_all(fd: int, size: int) -> bytes:
    chunks = []
    total = 0
    while total <= size:  # a file grown meanwhile: read at most one byte more, then refused
        chunk = os.read(fd, max(size + 1 - total, 1 << 16))
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    if total > size:
        raise OSError("the cache changed while it was read")
    return b"".join(chunks)


def store(home: Home, runs: os.stat_result, entries: list[Entry]) -> None:
    """Replace the cache with ``entries`` (best effort: a home whose cache cannot be written
    is simply read in full each time)."""
    from pisub.core.fsio import atomic_write, private_mkdir

    folder = home.ended_cache.parent
    with contextlib.suppress(OSError, ValueError, msgspec.EncodeError):
        try:
            owner = os.stat(folder, follow_symlinks=False)
        except FileNotFoundError:
            if os.stat(home.root).st_uid != os.geteuid():
                return
            private_mkdir(folder)
            owner = os.stat(folder, follow_symlinks=False)
        if not stat.S_ISDIR(owner.st_mode) or owner.st_uid != os.geteuid():
            return
        records = _records()
        if records is None:
            return
        data = msgspec.msgpack.encode(_File(MAGIC, VERSION, records, runs.st_dev, runs.st_ino, entries))
        atomic_write(home.ended_cache, data, mode=0o600, durable=False)
