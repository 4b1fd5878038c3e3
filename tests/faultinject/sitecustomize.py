"""Fault injection for pisub's own processes, loaded through ``PYTHONPATH`` (tests only).

While the file named by ``PISUB_FAULT_FILE`` exists, every write-side call of a process whose
command line matches ``PISUB_FAULT_WHO`` (``runner`` or ``cli``) on a path under
``PISUB_FAULT_DIR`` fails with the errno named in that file (``ENOSPC``, ``EIO``, ...) — the
way a full disk, a quota, a dying disk or a read-only remount would make it fail. ``runner.log``
is spared: it stands for the space the runner reserves for saying why it could not write.
Other processes (the agent's child, the test itself) are untouched.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from typing import Any

_CONTROL = os.environ.get("PISUB_FAULT_FILE")
_ROOT = os.environ.get("PISUB_FAULT_DIR", "")
_WHO = os.environ.get("PISUB_FAULT_WHO", "runner")


def _is_target() -> bool:
    try:
        with open("/proc/self/cmdline", "rb") as fh:
            argv = fh.read().split(b"\0")
    except OSError:
        return False
    runner = b"pisub.runner" in argv
    cli = b"pisub" in argv and not runner
    return (_WHO == "runner" and runner) or (_WHO == "cli" and cli)


def _install() -> None:
    real_open, real_write, real_exists = os.open, os.write, os.path.exists
    names = ("link", "rename", "replace", "mkdir", "fsync", "ftruncate")
    real: dict[str, Callable[..., Any]] = {name: getattr(os, name) for name in names}

    def failing() -> int | None:
        if not real_exists(_CONTROL or "/nonexistent"):
            return None
        try:
            with open(_CONTROL or "", encoding="ascii") as fh:
                return int(getattr(errno, fh.read().strip() or "ENOSPC"))
        except (OSError, AttributeError, ValueError):
            return errno.ENOSPC

    def hit(path: object) -> int | None:
        text = os.fsdecode(path) if isinstance(path, str | bytes | os.PathLike) else ""
        if not text.startswith(_ROOT) or text.endswith("runner.log"):
            return None
        return failing()

    def fd_path(fd: int) -> str:
        try:
            return os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return ""

    def fail(code: int, path: object) -> OSError:
        return OSError(
            code, os.strerror(code), os.fsdecode(path) if isinstance(path, str | bytes) else str(path)
        )

    def open_(path, flags, mode=0o777, *, dir_fd=None):  # type: ignore[no-untyped-def]
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT) and (code := hit(path)):
            raise fail(code, path)
        return real_open(path, flags, mode, dir_fd=dir_fd)

    def write(fd, data):  # type: ignore[no-untyped-def]
        if fd > 2 and (code := hit(fd_path(fd))):
            raise fail(code, fd_path(fd))
        return real_write(fd, data)

    def by_path(name: str):  # type: ignore[no-untyped-def]
        fn = real[name]

        def wrapped(*args, **kwargs):  # type: ignore[no-untyped-def]
            target = args[1] if name in ("link", "rename", "replace") else args[0]
            if isinstance(target, int):
                target = fd_path(target)
            if code := hit(target):
                raise fail(code, target)
            return fn(*args, **kwargs)

        return wrapped

    os.open = open_
    os.write = write
    for name in real:
        setattr(os, name, by_path(name))


if _CONTROL and _ROOT and _is_target():
    _install()
