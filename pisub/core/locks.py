"""Advisory whole-file locks.

A lock is held by an open file description, so the kernel drops it the moment its
holder dies. pisub uses that as proof of life: the runner holds ``runner.lock`` for
its whole life, and a reader on the same host that can take the lock knows the runner is gone.

``runner.lock`` (:func:`try_lock`, :func:`is_held`) is an **OFD** ``fcntl`` lock on the whole
file: on NFS, ``flock`` is emulated by such byte-range locks anyway (and needs a writable
descriptor), while classic POSIX locks are dropped when *any* descriptor of the file closes.
:func:`is_held` only asks (``F_OFD_GETLK``), it never takes the lock. Read-modify-write
sections (crash repair, leases) use ``flock`` (:func:`exclusive`: what portalocker calls on
POSIX, called directly; importing portalocker cost tens of milliseconds), held briefly by
readers on one host.
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pisub.core.fsio import NotRegularFile, open_dir, open_regular
from pisub.errors import LockBusy, storage_error


def _open_lockfile(path: Path) -> int:
    """Open (creating) a lock file. Something else in its place — a directory, symlink, FIFO
    (planted, or left by a crash) — is moved aside once to ``.<name>.bad-<hex>`` and a fresh
    lock file made, so a bad entry can never make a lock unusable for good.

    Raises:
        StorageError: the lock file cannot be created or opened.
    """
    try:
        try:
            return open_regular(path, os.O_RDWR | os.O_CREAT)
        except OSError as exc:
            if not isinstance(exc, NotRegularFile) and exc.errno not in (errno.ELOOP, errno.EISDIR):
                raise
            os.rename(path, path.with_name(f".{path.name}.bad-{os.urandom(3).hex()}"))
            return open_regular(path, os.O_RDWR | os.O_CREAT)
    except OSError as exc:
        raise storage_error(exc, "open the lock", path) from exc


_FLOCK = "hhqqi"
"""``struct flock`` on Linux: type, whence, start, len (0: to the end, whatever it grows to), pid
(0 for OFD locks)."""


def _whole_file(kind: int) -> bytes:
    return struct.pack(_FLOCK, kind, os.SEEK_SET, 0, 0, 0)


def try_lock(path: Path) -> int | None:
    """Take an exclusive lock on ``path`` without waiting; the open fd, or None if held."""
    fd = _open_lockfile(path)
    try:
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, _whole_file(fcntl.F_WRLCK))
    except (BlockingIOError, PermissionError):  # EAGAIN / EACCES: held
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    return fd


def is_held(path: Path) -> bool:
    """Whether some live process holds the lock on ``path``.

    False when the file is missing, or is not a regular file (a planted symlink or FIFO
    cannot hold the runner's lock): the lock then proves nothing, and callers rely on their
    other proof (the pid and its start ticks).
    """
    try:
        fd = open_regular(path)
    except OSError:
        return False
    try:
        answer = fcntl.fcntl(fd, fcntl.F_OFD_GETLK, _whole_file(fcntl.F_WRLCK))
    except OSError:
        return False
    finally:
        os.close(fd)
    kind: int = struct.unpack(_FLOCK, answer)[0]
    return kind != fcntl.F_UNLCK


def _open_dir(path: Path) -> int:
    """Open a directory (never through a symlink) to lock it: no file is created, so the lock
    can be taken on a full disk.

    Raises:
        StorageError: it cannot be opened (missing, not a directory).
    """
    try:
        return open_dir(path, nofollow=True)  # below the home, no symlink on the way either
    except OSError as exc:
        raise storage_error(exc, "lock", path) from exc


@contextmanager
def exclusive(path: Path, timeout: float = 10.0, *, directory: bool = False) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` for the ``with`` block (``flock``). With
    ``directory`` the lock is taken on the directory ``path`` itself.

    Raises:
        LockBusy: the lock was not free within ``timeout`` seconds.
        StorageError: the lock file (or directory) cannot be opened.
    """
    opener = _open_dir if directory else _open_lockfile
    deadline = time.monotonic() + timeout
    delay = 0.002
    while True:
        fd = opener(path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except OSError:  # held (EWOULDBLOCK), or refused (as portalocker's LockException): retried
            os.close(fd)
        except BaseException:
            os.close(fd)
            raise
        if time.monotonic() >= deadline:
            raise LockBusy(f"lock {path} is held by another process (waited {timeout:g}s)")
        time.sleep(delay)
        delay = min(delay * 2, 0.05)
    try:
        yield
    finally:
        os.close(fd)
