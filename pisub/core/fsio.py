"""File primitives: atomic replace, append-only JSON lines, private dirs, no-follow reads.

Rules every writer in pisub follows:

* A file others read appears atomically: written to a temp name in the same directory
  (``.<name>.<pid>.<random>.tmp`` — never ending in ``.json``), fsynced, renamed over the
  target, then the directory is fsynced.
* Logs are append-only; a JSON-lines writer repairs a torn last line before appending.
* Files are created 0600 and directories 0700; paths inside a run are opened with
  ``O_NOFOLLOW`` so a planted symlink is not followed, and every directory below a home
  (:func:`trust_home`) is opened component by component with ``O_NOFOLLOW`` and the file
  made relative to that descriptor (:func:`open_dir`), so a symlink planted in place of a
  folder (``outbox``, ``inbox/new``, the run itself) is never followed either
  (:class:`SymlinkedDir`), and with ``O_NONBLOCK`` plus a
  regular-file check so a FIFO, socket or device in place of a file never blocks or feeds a
  reader (:func:`open_regular`).
* A write may fail at any point (full disk, quota, I/O error): nothing half-written is ever
  visible under a final name, and temp files are removed again.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from pisub.errors import ProtocolError
from pisub.protocol.codec import decode
from pisub.termsafe import printable

T = TypeVar("T")

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)

TEMP_NAME_KEEP = 100
"""Characters of a target's name kept in its temp name (so a long name cannot overflow 255 bytes)."""


class NotRegularFile(OSError):
    """A directory, symlink, FIFO, socket or device stands where a regular file is expected."""

    def __init__(self, path: str | Path, kind: str) -> None:
        super().__init__(errno.EINVAL, f"not a regular file ({kind})", os.fspath(path))
        self.kind = kind


class SymlinkedDir(OSError):
    """A symlink stands, inside a pisub home, where a directory is expected: never followed."""

    def __init__(self, path: str | Path) -> None:
        super().__init__(
            errno.ELOOP, "a symlink stands where a directory is expected (not followed)", os.fspath(path)
        )


_PATH = getattr(os, "O_PATH", 0)
"""O_PATH where the platform has it: a descriptor for lookups that needs no read permission."""

_homes: set[str] = set()
"""The homes this process uses: below them no directory is reached through a symlink."""


def trust_home(root: str | Path) -> None:
    """Record ``root`` as a pisub home: every directory below it is opened without following
    a symlink (the home itself may be reached through one)."""
    _homes.add(os.path.normpath(os.path.abspath(root)))


def _home_of(path: str) -> str | None:
    best = None
    for home in _homes:
        if (path == home or path.startswith(home.rstrip("/") + "/")) and (
            best is None or len(home) > len(best)
        ):
            best = home
    return best


def open_dir(directory: str | Path, *, nofollow: bool = False) -> int:
    """A descriptor of ``directory``. Below a home (:func:`trust_home`) it is opened component
    by component from the home with ``O_NOFOLLOW``, so no symlink on the way is followed;
    elsewhere only its last component is opened without following one with ``nofollow``.

    Raises:
        SymlinkedDir: a component below the home is a symlink.
        OSError: a component is missing (``ENOENT``) or not a directory (``ENOTDIR``).
    """
    path = os.path.normpath(os.path.abspath(directory))
    flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _CLOEXEC
    home = _home_of(path)
    if home is None:
        return os.open(path, flags | (_NOFOLLOW if nofollow else 0))
    parts = [p for p in path[len(home) :].split("/") if p]
    # Folders on the way are opened O_PATH: like a path lookup, they need search permission
    # only (a runs/ that can be searched but not listed still yields its runs).
    fd = os.open(home, (_PATH | getattr(os, "O_DIRECTORY", 0) | _CLOEXEC) if parts else flags)
    try:
        walked = home
        for n, part in enumerate(parts):
            walked = os.path.join(walked, part)
            last = n == len(parts) - 1
            try:
                nfd = os.open(part, (flags if last else flags | _PATH) | _NOFOLLOW, dir_fd=fd)
            except OSError as exc:
                try:
                    link = stat.S_ISLNK(os.stat(part, dir_fd=fd, follow_symlinks=False).st_mode)
                except OSError:
                    link = False
                if link:
                    raise SymlinkedDir(walked) from exc
                raise OSError(exc.errno, exc.strerror, walked) from exc
            os.close(fd)
            fd = nfd
    except BaseException:
        os.close(fd)
        raise
    return fd


@contextlib.contextmanager
def in_dir(directory: str | Path) -> Iterator[int]:
    """:func:`open_dir` as a context manager."""
    fd = open_dir(directory)
    try:
        yield fd
    finally:
        os.close(fd)


def listdir(directory: str | Path) -> list[str]:
    """The names in ``directory``, reached without following a symlink (:func:`open_dir`)."""
    with in_dir(directory) as fd:
        return os.listdir(fd)


def lstat(path: str | Path) -> os.stat_result:
    """``os.lstat`` of ``path`` whose folder is reached without following a symlink."""
    path = Path(path)
    with in_dir(path.parent) as fd:
        return os.stat(path.name, dir_fd=fd, follow_symlinks=False)


def lexists(path: str | Path) -> bool:
    """Whether ``path`` exists (as anything); its folder is reached without following a symlink.

    Raises:
        SymlinkedDir: a folder on the way is a symlink.
    """
    try:
        lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return False
    return True


def unlink(path: str | Path) -> None:
    """``os.unlink`` relative to the folder reached without following a symlink."""
    path = Path(path)
    with in_dir(path.parent) as fd:
        os.unlink(path.name, dir_fd=fd)


def rename(src: str | Path, dst: str | Path, *, link: bool = False) -> None:
    """``os.rename`` (``os.link`` with ``link``) between folders reached without following a symlink."""
    src, dst = Path(src), Path(dst)
    with in_dir(src.parent) as sfd, in_dir(dst.parent) as dfd:
        if link:
            os.link(src.name, dst.name, src_dir_fd=sfd, dst_dir_fd=dfd, follow_symlinks=False)
        else:
            os.rename(src.name, dst.name, src_dir_fd=sfd, dst_dir_fd=dfd)


def file_kind(mode: int) -> str:
    """A word for the type of a file mode (``directory``, ``FIFO``, ...)."""
    for test, word in (
        (stat.S_ISREG, "regular file"),
        (stat.S_ISDIR, "directory"),
        (stat.S_ISLNK, "symlink"),
        (stat.S_ISFIFO, "FIFO"),
        (stat.S_ISSOCK, "socket"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
    ):
        if test(mode):
            return word
    return "unknown file type"


def open_regular(
    path: str | Path, flags: int = os.O_RDONLY, mode: int = 0o600, *, dir_fd: int | None = None
) -> int:
    """Open ``path`` (relative to ``dir_fd`` when given) only if it is a regular file: never
    follows a symlink (``ELOOP``), never blocks on a FIFO, and refuses anything that is not a
    regular file (:class:`NotRegularFile`).
    """
    if dir_fd is None:
        path = os.path.abspath(path)
        with in_dir(os.path.dirname(path)) as parent:
            return open_regular(os.path.basename(path), flags, mode, dir_fd=parent)
    fd = os.open(path, flags | _NOFOLLOW | _NONBLOCK | _CLOEXEC, mode, dir_fd=dir_fd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFile(path, file_kind(st.st_mode))
    except BaseException:
        os.close(fd)
        raise
    return fd


def fsync_dir(path: Path) -> None:
    """fsync a directory so that renames and creations inside it are durable."""
    fd = open_dir(path)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def temp_name(target: Path) -> Path:
    """A unique temp path beside ``target`` that never ends in ``.json`` (and stays short)."""
    return target.with_name(f".{target.name[:TEMP_NAME_KEEP]}.{os.getpid()}.{os.urandom(4).hex()}.tmp")


def atomic_write(
    path: Path,
    data: bytes,
    *,
    mode: int = 0o600,
    durable: bool = True,
    fence: Callable[[], None] | None = None,
) -> None:
    """Replace ``path`` with ``data`` so that no reader ever sees a partial file.

    With ``durable`` the file and then its directory are fsynced (the file is on disk
    when this returns); without, only the atomic rename is promised. ``fence`` runs
    right before the rename — the last moment a writer that may have lost its lease
    (paused during the write, the fsync) can still stop it landing. Many files of one
    directory are cheaper through :class:`BatchWriter`.
    """
    tmp = temp_name(path).name
    with in_dir(path.parent) as dfd:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, mode, dir_fd=dfd)
        try:
            try:
                write_all(fd, data)
                if durable:
                    os.fsync(fd)
            finally:
                os.close(fd)
            if fence is not None:
                fence()
            os.replace(tmp, path.name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=dfd)
            raise
        if durable:
            os.fsync(dfd)


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

    :meth:`add` keeps each file's content in memory; :meth:`commit` writes the temp copies,
    flushes them (one ``fsync`` for a single file, else one ``syncfs``), renames every temp file
    over its target, then fsyncs the directory once. No target is visible before its content is
    durable. When a write fails (full disk, I/O error) the temp files are removed, nothing is
    published, everything stays pending and the error is raised: a later :meth:`commit` retries.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._pending: dict[Path, bytes] = {}

    def add(self, path: Path, data: bytes) -> None:
        self._pending[path] = data

    def __contains__(self, path: Path) -> bool:
        return path in self._pending

    def __len__(self) -> int:
        return len(self._pending)

    def commit(self) -> int:
        """Publish everything added; how many files.

        Raises:
            OSError: a write failed: nothing was published and every file stays pending; or
                a rename failed: that file stays pending, the others are published.
        """
        if not self._pending:
            return 0
        count = len(self._pending)
        with in_dir(self.directory) as dfd:
            failed = self._commit(dfd)
        if failed is not None:
            raise failed
        return count

    def _commit(self, dfd: int) -> OSError | None:
        temps: dict[Path, str] = {}
        try:
            for path, data in self._pending.items():
                tmp = temp_name(path).name
                fd = os.open(
                    tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, 0o600, dir_fd=dfd
                )
                temps[path] = tmp
                try:
                    write_all(fd, data)
                    if len(self._pending) == 1:
                        os.fsync(fd)
                finally:
                    os.close(fd)
            if len(self._pending) > 1:
                sync_filesystem(self.directory)
        except BaseException:
            for tmp in temps.values():
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=dfd)
            raise
        failed: OSError | None = None
        for path, tmp in temps.items():
            try:
                os.replace(tmp, path.name, src_dir_fd=dfd, dst_dir_fd=dfd)
            except OSError as exc:  # this one stays pending; the others are published
                failed = failed or exc
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=dfd)
                continue
            del self._pending[path]
        os.fsync(dfd)
        return failed


def create_exclusive(path: Path, data: bytes, *, mode: int = 0o600) -> None:
    """Create ``path`` with ``data``; fail with FileExistsError if it exists. A failed write
    removes the file again."""
    with in_dir(path.parent) as dfd:
        _create_exclusive(dfd, path.name, data, mode)


def _create_exclusive(dfd: int, name: str, data: bytes, mode: int = 0o600) -> None:
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, mode, dir_fd=dfd)
    try:
        try:
            write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(name, dir_fd=dfd)
        raise


def publish_new(tmp_dir: Path, target: Path, data: bytes) -> None:
    """Create ``target`` with ``data`` by hard-linking a complete, fsynced temp file written in
    ``tmp_dir`` (same filesystem): ``target`` appears whole or not at all, and an existing
    ``target`` is never replaced. The temp file is removed in every case. Both folders are
    reached without following a symlink (:func:`open_dir`).

    Raises:
        FileExistsError: ``target`` exists.
        OSError: the write failed (nothing was published); :class:`SymlinkedDir` when a
            folder on the way is a symlink.
    """
    tmp = temp_name(tmp_dir / target.name).name
    with in_dir(tmp_dir) as tfd, in_dir(target.parent) as dfd:
        _create_exclusive(tfd, tmp, data)
        try:
            os.link(tmp, target.name, src_dir_fd=tfd, dst_dir_fd=dfd, follow_symlinks=False)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=tfd)
        os.fsync(dfd)


def read_bytes(path: str | Path, *, limit: int | None = None, dir_fd: int | None = None) -> bytes:
    """Read a whole regular file (see :func:`open_regular`); at most ``limit`` + 1 bytes.

    Raises:
        FileNotFoundError: the file does not exist.
        NotRegularFile: a directory, FIFO, socket or device stands there.
        OSError: ``ELOOP`` when ``path`` is a symlink; any read error.
    """
    fd = open_regular(path, dir_fd=dir_fd)
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


def load_json(path: str | Path, type_: type[T], *, limit: int, dir_fd: int | None = None) -> T:
    """Read and decode one JSON file written by pisub, translating every failure where it enters.

    Raises:
        FileNotFoundError: the file (or its directory) does not exist.
        ProtocolError: it cannot be read (a symlink, FIFO, directory, permissions, I/O error),
            is larger than ``limit`` bytes, or does not decode (naming the field).
    """
    try:
        data = read_bytes(path, limit=limit, dir_fd=dir_fd)
    except (FileNotFoundError, NotADirectoryError) as exc:
        raise FileNotFoundError(errno.ENOENT, "no such file", os.fspath(path)) from exc
    except OSError as exc:
        raise ProtocolError(f"{printable(os.fspath(path))}: cannot read: {exc.strerror or exc}") from exc
    if len(data) > limit:
        raise ProtocolError(f"{printable(os.fspath(path))}: larger than {limit} bytes")
    return decode(data, type_, os.fspath(path))  # (a decode error is printed escaped, like every line)


def read_tail(path: Path, nbytes: int) -> bytes:
    """The last ``nbytes`` of a regular file (all of it when shorter); b"" when it is missing
    or cannot be read (for diagnostics only)."""
    try:
        fd = open_regular(path)
    except OSError:
        return b""
    try:
        size = os.fstat(fd).st_size
        return os.pread(fd, nbytes, max(0, size - nbytes))
    except OSError:
        return b""
    finally:
        os.close(fd)


def private_mkdir(path: Path) -> None:
    """Create a 0700 directory (its parent must exist); refuse a symlink or a non-directory."""
    path = Path(os.path.abspath(path))
    parent = open_dir(path.parent)
    try:
        try:
            os.mkdir(path.name, 0o700, dir_fd=parent)
        except FileExistsError:
            if not stat.S_ISDIR(os.stat(path.name, dir_fd=parent, follow_symlinks=False).st_mode):
                raise NotADirectoryError(
                    errno.ENOTDIR, "exists and is not a plain directory", str(path)
                ) from None
    finally:
        os.close(parent)


def open_append(path: Path, *, mode: int = 0o600, readable: bool = False) -> int:
    """Open the regular file ``path`` for appending (created 0600; see :func:`open_regular`)."""
    access = os.O_RDWR if readable else os.O_WRONLY
    fd = open_regular(path, access | os.O_CREAT | os.O_APPEND, mode)
    # Writes to a regular file ignore O_NONBLOCK; clear it anyway for whoever inherits the fd.
    os.set_blocking(fd, True)
    return fd


def reserve_space(fd: int, nbytes: int) -> bool:
    """Allocate ``nbytes`` of disk beyond the end of ``fd``'s file without changing its size
    (Linux ``fallocate(FALLOC_FL_KEEP_SIZE)``), so that appends up to that much succeed on a
    full disk; whether it worked."""
    libc = _libc()
    fallocate = getattr(libc, "fallocate", None)
    if fallocate is None:
        return False
    import ctypes

    fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
    try:
        size = os.fstat(fd).st_size
    except OSError:
        return False
    return int(fallocate(fd, 1, size, nbytes)) == 0  # 1 = FALLOC_FL_KEEP_SIZE


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
        """Append one record; ``line`` must not contain a newline.

        A failed write (full disk) is cut back off, so no torn line stays behind for readers.
        """
        end = os.lseek(self._fd, 0, os.SEEK_END)
        try:
            write_all(self._fd, line + b"\n")
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, end)
            raise

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


def write_all(fd: int, data: bytes) -> None:
    """Write all of ``data``; a short write is continued, a write of 0 bytes is an error."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        if written <= 0:
            raise OSError(errno.EIO, "write made no progress")
        view = view[written:]


def quarantine(path: Path, directory: Path, tag: str, reason: str) -> Path | None:
    """Move the bad file or folder ``path`` into ``directory`` as ``<6 hex>-<tag>`` with
    ``<that>.reason`` beside it (one printable line), so that no later reader trips over it;
    where it went (None when it could not be moved: it stays, and the caller says so)."""
    dest = directory / f"{os.urandom(3).hex()}-{tag}"
    try:
        private_mkdir(directory)
        rename(path, dest)
    except OSError:
        return None
    with contextlib.suppress(OSError):
        atomic_write(
            dest.with_name(dest.name + ".reason"), (printable(reason) + "\n").encode(), durable=False
        )
    return dest


def own_private_dir(path: Path, what: str, fix: str, foreign_fix: str | None = None) -> bool:
    """Whether the folder ``path`` exists. It must be a real directory (never followed through a
    symlink) of this user's; one of ours open to others is tightened to 0700, said on stderr (as
    pisub does for the home).

    Raises:
        StorageError: something else stands there, or the folder is another user's — the line
            names ``what`` it is and ``fix`` (``foreign_fix``, when given, for another user's).
    """
    from pisub.errors import StorageError, storage_error

    try:
        st = lstat(path)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise storage_error(exc, "inspect", path) from exc
    where = printable(str(path))
    if not stat.S_ISDIR(st.st_mode):
        raise StorageError(
            f"{what} {where} is a {file_kind(st.st_mode)}, not a directory (never followed); {fix}"
        )
    if st.st_uid != os.getuid():
        raise StorageError(
            f"{what} {where} belongs to uid {st.st_uid}, not to you (uid {os.getuid()}); {foreign_fix or fix}"
        )
    if st.st_mode & 0o077:
        try:
            os.chmod(path, 0o700, follow_symlinks=False)
        except OSError as exc:
            raise storage_error(exc, "tighten the permissions of", path) from exc
        import sys

        print(f"pisub: tightened permissions of {path} to 0700", file=sys.stderr)
    return True
