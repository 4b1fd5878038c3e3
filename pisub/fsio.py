"""File primitives: atomic replace, append-only JSON lines, private dirs, no-follow reads.

Rules every writer in pisub follows:

* A file others read appears atomically: written to a temp name in the same directory
  (``.<name>.<pid>.<random>.tmp`` — never ending in ``.json``), fsynced, renamed over the
  target, then the directory is fsynced.
* Logs are append-only; a JSON-lines writer repairs a torn last line before appending.
* Files are created 0600 and directories 0700; paths inside a run are opened with
  ``O_NOFOLLOW`` so a planted symlink is not followed.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def fsync_dir(path: Path) -> None:
    """fsync a directory so that renames and creations inside it are durable."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def temp_name(target: Path) -> Path:
    """A unique temp path beside ``target`` that never ends in ``.json``."""
    return target.with_name(f".{target.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")


def atomic_write(path: Path, data: bytes, *, mode: int = 0o600, durable: bool = True) -> None:
    """Replace ``path`` with ``data`` so that no reader ever sees a partial file.

    With ``durable`` the file and then its directory are fsynced (the file is on disk
    when this returns); without, only the atomic rename is promised. Many files of one
    directory are cheaper through :class:`BatchWriter`.
    """
    tmp = temp_name(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, mode)
    try:
        try:
            _write_all(fd, data)
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    if durable:
        fsync_dir(path.parent)


@functools.cache
def _libc() -> Any:
    import ctypes

    return ctypes.CDLL(None, use_errno=True)


def sync_filesystem(path: Path) -> None:
    """Flush every dirty file of the filesystem holding ``path`` (Linux ``syncfs``; else ``sync``)."""
    fd = os.open(path, os.O_RDONLY | _CLOEXEC)
    try:
        if getattr(_libc(), "syncfs", None) is None or _libc().syncfs(fd) != 0:
            os.sync()
    finally:
        os.close(fd)


class BatchWriter:
    """Atomic replacement of many files in one directory for the price of two syncs.

    :meth:`add` writes each file's temp copy; :meth:`commit` flushes the filesystem once
    (``syncfs``), renames every temp file over its target, then fsyncs the directory once.
    No target is visible before its content is durable.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._pending: dict[Path, Path] = {}

    def add(self, path: Path, data: bytes, *, mode: int = 0o600) -> None:
        old = self._pending.pop(path, None)
        if old is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(old)
        tmp = temp_name(path)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, mode)
        try:
            _write_all(fd, data)
        finally:
            os.close(fd)
        self._pending[path] = tmp

    def __contains__(self, path: Path) -> bool:
        return path in self._pending

    def commit(self) -> int:
        """Publish everything added; how many files."""
        if not self._pending:
            return 0
        sync_filesystem(self.directory)
        for path, tmp in self._pending.items():
            os.replace(tmp, path)
        fsync_dir(self.directory)
        count = len(self._pending)
        self._pending.clear()
        return count


def create_exclusive(path: Path, data: bytes, *, mode: int = 0o600) -> None:
    """Create ``path`` with ``data``; fail with FileExistsError if it exists."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, mode)
    try:
        _write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def read_bytes(path: str | Path, *, limit: int | None = None) -> bytes:
    """Read a whole file without following a symlink at ``path``.

    Raises:
        FileNotFoundError: the file does not exist.
        OSError: ``ELOOP`` when ``path`` is a symlink.
    """
    fd = os.open(path, os.O_RDONLY | _NOFOLLOW | _CLOEXEC)
    try:
        chunks = []
        total = 0
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if limit is not None and total > limit:
                break
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_tail(path: Path, nbytes: int) -> bytes:
    """The last ``nbytes`` of a file (all of it when shorter); b"" when missing."""
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW | _CLOEXEC)
    except FileNotFoundError:
        return b""
    try:
        size = os.fstat(fd).st_size
        os.lseek(fd, max(0, size - nbytes), os.SEEK_SET)
        return os.read(fd, nbytes)
    finally:
        os.close(fd)


def private_mkdir(path: Path) -> None:
    """Create a 0700 directory (and parents); refuse a symlink or a non-directory."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        if path.is_symlink() or not path.is_dir():
            raise NotADirectoryError(
                errno.ENOTDIR, "exists and is not a plain directory", str(path)
            ) from None


def open_append(path: Path, *, mode: int = 0o600, readable: bool = False) -> int:
    """Open ``path`` for appending (created 0600, not following a symlink); returns an fd."""
    access = os.O_RDWR if readable else os.O_WRONLY
    return os.open(path, access | os.O_CREAT | os.O_APPEND | _NOFOLLOW | _CLOEXEC, mode)


def repair_torn_tail(fd: int) -> int:
    """Cut a torn last line (bytes after the last newline) from a JSON-lines file.

    Returns the number of bytes removed. Needs an fd opened for writing; must only be
    called by the file's single writer.
    """
    size = os.fstat(fd).st_size
    if size == 0:
        return 0
    pos = size
    block = 4096
    while pos > 0:
        start = max(0, pos - block)
        chunk = os.pread(fd, pos - start, start)
        idx = chunk.rfind(b"\n")
        if idx >= 0:
            keep = start + idx + 1
            if keep != size:
                os.ftruncate(fd, keep)
            return size - keep
        pos = start
    os.ftruncate(fd, 0)
    return size


class JsonlAppender:
    """The single writer of a JSON-lines file: repairs the tail once, then appends whole lines."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd = open_append(path, readable=True)
        repair_torn_tail(self._fd)

    def append(self, line: bytes) -> None:
        """Append one record; ``line`` must not contain a newline."""
        _write_all(self._fd, line + b"\n")

    def sync(self) -> None:
        os.fsync(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def iter_jsonl_lines(data: bytes) -> Iterator[tuple[int, bytes]]:
    """Complete lines of a JSON-lines buffer as ``(line_number, line)``.

    A last line without its newline is torn (its writer died mid-append) and skipped.
    """
    lines = data.split(b"\n")
    for number, line in enumerate(lines[:-1], start=1):
        if line.strip():
            yield number, line


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]
