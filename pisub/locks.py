"""Advisory whole-file locks (``flock``).

A lock is held by an open file description, so the kernel drops it the moment its
holder dies. pisub uses that as proof of life: the runner holds ``runner.lock`` for
its whole life, and a reader that can take the lock knows the runner is gone.

Read-modify-write sections (crash repair, leases) use portalocker (:func:`exclusive`).
The liveness probe and the launcher's first lock (:func:`try_lock`, :func:`is_held`) use
``fcntl.flock`` directly: portalocker's POSIX locker *is* ``flock``, so both see the same
locks, and launching or reading a run does not pay portalocker's ~20 ms import.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pisub.errors import PisubError

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


class LockBusy(PisubError):
    """A lock could not be taken before its deadline."""

    code = "LOCK_BUSY"


def _open_lockfile(path: Path) -> int:
    return os.open(path, os.O_RDWR | os.O_CREAT | _NOFOLLOW | _CLOEXEC, 0o600)


def try_lock(path: Path) -> int | None:
    """Take an exclusive lock on ``path`` without waiting; the open fd, or None if held."""
    fd = _open_lockfile(path)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    return fd


def is_held(path: Path) -> bool:
    """Whether some live process holds the lock on ``path`` (False if the file is missing)."""
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW | _CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


@contextmanager
def exclusive(path: Path, timeout: float = 10.0) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` for the ``with`` block (portalocker).

    Raises:
        LockBusy: the lock was not free within ``timeout`` seconds.
    """
    import portalocker

    deadline = time.monotonic() + timeout
    delay = 0.002
    while True:
        fd = _open_lockfile(path)
        try:
            portalocker.lock(fd, portalocker.LockFlags.EXCLUSIVE | portalocker.LockFlags.NON_BLOCKING)
            break
        except portalocker.exceptions.LockException:
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
