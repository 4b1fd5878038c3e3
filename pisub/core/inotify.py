"""One inotify descriptor on one directory, for a selector (Linux): no thread, no parsing.

The runner only needs to *wake* when something arrives in its inbox (it then lists the whole
directory), so the events themselves are never decoded: :func:`drain` reads them away. This is
what the watchdog observer thread did for each run, at a fraction of its cost (no thread, no
``ctypes.util.find_library``, which runs ``ldconfig``): libc is the process's own symbols.
"""

from __future__ import annotations

import contextlib
import os

IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_ONLYDIR = 0x01000000
IN_DONT_FOLLOW = 0x02000000
ARRIVALS = IN_CREATE | IN_MOVED_TO
"""Something new in a directory (a queue overflow, ``IN_Q_OVERFLOW``, is always reported)."""

_IN_NONBLOCK = os.O_NONBLOCK
_IN_CLOEXEC = os.O_CLOEXEC


def watch_dir(path: str | os.PathLike[str], mask: int = ARRIVALS) -> int:
    """A non-blocking, close-on-exec inotify descriptor watching the directory ``path`` (never
    through a symlink) for ``mask``; the caller closes it.

    Raises:
        OSError: inotify is unavailable (not Linux, no instance left: ``EMFILE``) or ``path``
            is not a directory.
    """
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        init1, add_watch = libc.inotify_init1, libc.inotify_add_watch
    except (OSError, AttributeError) as exc:
        raise OSError(0, f"no inotify in this libc ({exc})") from None
    fd = int(init1(_IN_NONBLOCK | _IN_CLOEXEC))
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    wd = int(add_watch(fd, os.fsencode(path), mask | IN_ONLYDIR | IN_DONT_FOLLOW))
    if wd < 0:
        err = ctypes.get_errno()
        os.close(fd)
        raise OSError(err, os.strerror(err), str(path))
    return fd


def drain(fd: int) -> None:
    """Read every pending event away (they are only a hint to look)."""
    with contextlib.suppress(BlockingIOError, InterruptedError):
        while os.read(fd, 65536):
            pass
