"""Ownership records of isolated worktrees: ``<root>/<run_id>.json`` (0600, replaced
atomically), read without ever following a symlink or blocking on a FIFO, and listed so that
no entry an attacker or a crash leaves in the root can hang or fool a reader."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from pisub.core.fsio import atomic_write, file_kind, load_json, publish_new
from pisub.errors import InvalidInput, ProtocolError, storage_error
from pisub.protocol.codec import encode_pretty
from pisub.protocol.worktree import WorktreeRecord
from pisub.store.paths import is_run_id
from pisub.termsafe import printable

RECORD_LIMIT = 4 * 1024 * 1024
"""Largest record file read (a record lists at most a few thousand paths)."""

RECORD_SUFFIX = ".json"
REMOVED_DIR = ".removed"
"""Where cleanup moves the records of removed worktrees (``<root>/.removed/<run_id>.json``)."""

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def record_path(root: Path, run_id: str) -> Path:
    """Where the record of ``run_id``'s worktree lives."""
    return root / f"{run_id}{RECORD_SUFFIX}"


def load_owned(path: Path) -> WorktreeRecord:
    """:func:`load_record`, once the record is known to describe ``<its dir>/<run_id>``.

    Raises:
        InvalidInput: no record, or it is forged or copied (see :func:`ownership_problem`).
        ProtocolError: it cannot be read or does not decode.
    """
    record = load_record(path)
    problem = ownership_problem(path.parent, path, record)
    if problem is not None:
        raise InvalidInput(f"{printable(os.fspath(path), one_line=True)}: {problem}; not touched")
    return record


def load_record(path: Path) -> WorktreeRecord:
    """Read one record (no symlink followed, at most :data:`RECORD_LIMIT` bytes).

    Raises:
        InvalidInput: there is no record at ``path``.
        ProtocolError: it cannot be read or does not decode (naming the file and field).
    """
    try:
        return load_json(path, WorktreeRecord, limit=RECORD_LIMIT)
    except FileNotFoundError:
        raise InvalidInput(f"no worktree record at {printable(os.fspath(path))}") from None


def save_record(path: Path, record: WorktreeRecord) -> None:
    """Replace ``path`` with ``record`` atomically and durably (0600).

    Raises:
        StorageError: it cannot be written.
    """
    try:
        atomic_write(path, encode_pretty(record))
    except OSError as exc:
        raise storage_error(exc, "write the worktree record", path) from exc


def publish_record(path: Path, record: WorktreeRecord) -> None:
    """Create the record ``path`` (0600, whole or not at all); an existing one is never replaced.

    Raises:
        InvalidInput: a record (or anything else) is already there.
        StorageError: it cannot be written.
    """
    try:
        publish_new(path.parent, path, encode_pretty(record))
    except FileExistsError:
        raise InvalidInput(
            f"{printable(os.fspath(path))} already exists: this run already has a worktree"
        ) from None
    except OSError as exc:
        raise storage_error(exc, "write the worktree record", path) from exc


def entry_names(root: Path) -> list[str]:
    """Sorted names in ``root`` that do not begin with a dot (temp files, ``.removed``); [] when
    ``root`` does not exist.

    Raises:
        StorageError: ``root`` is a symlink, not a directory, or cannot be read.
    """
    try:
        fd = os.open(root, os.O_RDONLY | _DIRECTORY | _NOFOLLOW | _CLOEXEC)
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise storage_error(exc, "list the worktree root", root) from exc
    try:
        with os.scandir(fd) as entries:
            return sorted(entry.name for entry in entries if not entry.name.startswith("."))
    except OSError as exc:
        raise storage_error(exc, "list the worktree root", root) from exc
    finally:
        os.close(fd)


def read_entry(path: Path) -> WorktreeRecord | str:
    """The record at ``path``, or one printable line saying why it is not one (not a regular
    file, unreadable, too large, not a record, or naming another run)."""
    name = printable(path.name, one_line=True)
    try:
        mode = os.lstat(path).st_mode
    except OSError as exc:
        return f"{name}: cannot inspect: {exc.strerror or exc}"
    if not stat.S_ISREG(mode):
        return f"{name}: not a regular file ({file_kind(mode)}); never followed or read"
    try:
        record = load_json(path, WorktreeRecord, limit=RECORD_LIMIT)
    except FileNotFoundError:
        return f"{name}: vanished while being read"
    except ProtocolError as exc:
        return printable(exc.message, one_line=True)
    if path.name != f"{record.run_id}{RECORD_SUFFIX}":
        return f"{name}: the record names another run ({printable(record.run_id, one_line=True)})"
    return record


def expected_branch(run_id: str, key: str) -> str:
    """The branch of a run's worktree: ``pisub/<run_id[:8]>/<key>``."""
    return f"pisub/{run_id[:8]}/{key}"


def private_problem(path: Path, what: str) -> str | None:
    """Why ``path`` (a worktree root or a record) is not this user's own, unwritable by others
    (None when it is): something another user could have written is never acted on."""
    try:
        st = os.lstat(path)
    except OSError as exc:
        return f"the {what} cannot be inspected: {exc.strerror or exc}"
    if st.st_uid != os.geteuid():
        return f"the {what} belongs to uid {st.st_uid}, not to this user"
    if st.st_mode & 0o022:
        return f"the {what} is writable by other users (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def ownership_problem(root: Path, rec_path: Path, record: WorktreeRecord) -> str | None:
    """Why the record read from ``rec_path`` is not trusted to describe the worktree
    ``<root>/<run_id>`` (None when it is): a forged or copied record must never make pisub
    run git in, or remove, a directory — or delete a branch — that is not its own."""
    if not is_run_id(record.run_id):
        return "the record's runId is not a run id"
    if rec_path.name != f"{record.run_id}{RECORD_SUFFIX}":
        return "the record names another run"
    if record.path != os.path.join(os.path.realpath(root), record.run_id):
        return f"the record's worktree {printable(record.path, one_line=True)} is not in this root"
    if record.branch != expected_branch(record.run_id, record.key):
        return f"the record's branch {printable(record.branch, one_line=True)} is not the run's own"
    if not os.path.isabs(record.repo):
        return "the record's repository is not an absolute path"
    return private_problem(root, "worktree root") or private_problem(rec_path, "record")


def list_records(root: Path) -> list[tuple[Path, WorktreeRecord | str]]:
    """Every ``*.json`` entry of ``root`` with its record or the reason it is not one (see
    :func:`read_entry`), sorted by name. Never follows a symlink, never blocks on a FIFO, reads
    at most :data:`RECORD_LIMIT` bytes of any file.

    Raises:
        StorageError: ``root`` itself cannot be listed.
    """
    found: list[tuple[Path, WorktreeRecord | str]] = []
    for name in entry_names(root):
        if name.endswith(RECORD_SUFFIX):
            path = root / name
            found.append((path, read_entry(path)))
    return found


def is_plain_dir(path: Path) -> bool:
    """Whether ``path`` is a directory itself (not a symlink to one)."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def checked_base(base: Path, home_root: Path) -> Path:
    """``base`` (where worktree roots live), refused when it is the home's own ``worktrees``
    and something other than a directory (a planted symlink) stands there.

    Raises:
        InvalidInput: naming it and the fix.
    """
    if not base.is_absolute():
        raise InvalidInput(f"PISUB_WORKTREES must be an absolute path, not {printable(os.fspath(base))!r}")
    runs = home_root / "runs"
    if base == runs or runs in base.parents:
        raise InvalidInput("PISUB_WORKTREES must not be inside pisub's runs (gc removes runs)")
    if base.parent == home_root and os.path.lexists(base) and not is_plain_dir(base):
        raise InvalidInput(
            f"{printable(os.fspath(base))} is not a directory (a symlink?): remove it, or set PISUB_WORKTREES"
        )
    return base


def check_root(base: Path, home_root: Path, repo: Path) -> Path:
    """The worktree root of ``repo`` under ``base`` (see :func:`checked_base`), refused when it
    exists and is not this user's own and private.

    Raises:
        InvalidInput: naming it and the fix.
    """
    root = checked_base(base, home_root) / repo.name
    if os.path.lexists(root):
        problem = private_problem(root, "worktree root")
        if problem is not None:
            raise InvalidInput(
                f"{printable(os.fspath(root))}: {problem}; use a directory of your own (chmod 700)"
            )
    return root
