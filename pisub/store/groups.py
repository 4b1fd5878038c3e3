"""The files of groups (``spec/queue.md``): ``<home>/groups/<name>/`` holds ``group.json`` (its
settings), ``lock`` (what every decision about the group is taken under) and one entry per run in
it — ``q-<key>-<seq>-<run id>`` while the run waits, ``a-…`` once admitted — so that one listing
gives the queue in order (``key`` = ``MAX_PRIORITY - priority``: higher priorities sort first;
``seq``: launch order). Nothing here decides who runs (:mod:`pisub.runs.queue` does)."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path

import msgspec

from pisub.core import fsio
from pisub.core.fsio import atomic_write, load_json, private_mkdir
from pisub.core.locks import exclusive
from pisub.errors import InvalidInput, PisubError, ProtocolError, StorageError, storage_error
from pisub.protocol.codec import encode, encode_pretty
from pisub.protocol.queue import DEFAULT_GROUP, MAX_PRIORITY, GroupConfig, QueueEntry, check_group_name
from pisub.store.paths import Home, is_run_id

CONFIG = "group.json"
UNCONFIGURED = ".unconfigured"
"""In ``default``'s directory when it was created for ``--after`` runs while ``default`` was
never configured (no limit); without it, a ``default`` directory lacking ``group.json`` had its
settings removed (fail closed)."""
LOCK = "lock"
MAX_CONFIG_BYTES = 16 * 1024
MAX_ENTRY_BYTES = 64 * 1024
LOCK_TIMEOUT_S = 30.0
"""How long a decision waits for the group's lock (held for milliseconds by each decider)."""
_ENTRY = re.compile(r"([qa])-(\d{7})-(\d{12})-([0-9a-f-]{36})")


class EntryName(msgspec.Struct, frozen=True):
    """One run's entry in a group, as its name says."""

    admitted: bool
    key: int
    seq: int
    run_id: str

    @property
    def priority(self) -> int:
        return MAX_PRIORITY - self.key

    @property
    def name(self) -> str:
        return f"{'a' if self.admitted else 'q'}-{self.key:07d}-{self.seq:012d}-{self.run_id}"

    def as_admitted(self) -> EntryName:
        return EntryName(True, self.key, self.seq, self.run_id)

    @staticmethod
    def parse(name: str) -> EntryName | None:
        found = _ENTRY.fullmatch(name)
        if found is None or not is_run_id(found[4]):
            return None
        return EntryName(found[1] == "a", int(found[2]), int(found[3]), found[4])

    @staticmethod
    def new(priority: int, seq: int, run_id: str) -> EntryName:
        return EntryName(False, MAX_PRIORITY - priority, seq, run_id)


def groups_dir(home: Home) -> Path:
    return home.root / "groups"


def group_dir(home: Home, name: str) -> Path:
    return groups_dir(home) / check_group_name(name)


def exists(home: Home, name: str) -> bool:
    """Whether group ``name`` was configured (``pisub group add``)."""
    try:
        return fsio.lexists(group_dir(home, name) / CONFIG)
    except OSError:
        return False


def ensure_dir(home: Home, name: str) -> Path:
    """The group's directory, created (0700) when missing.

    Raises:
        StorageError: it cannot be created (something else stands there, a symlink).
    """
    directory = group_dir(home, name)
    try:
        private_mkdir(groups_dir(home))
        private_mkdir(directory)
    except OSError as exc:
        raise storage_error(exc, "create the group directory", directory) from exc
    return directory


def check_groups_dir(home: Home) -> None:
    """Refuse a ``groups/`` that stands but is not a real directory (a symlink, a file: only
    tampering puts one in the user's own home; whether ``default`` was configured is unknown).

    Raises:
        StorageError.
    """
    path = groups_dir(home)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise storage_error(exc, "read", path) from exc
    if not stat.S_ISDIR(st.st_mode):
        raise StorageError(f"groups/ is not a directory: {path}; move it aside (pisub writes a new one)")


def unconfigured(home: Home, name: str) -> bool:
    """Whether group ``name`` is ``default`` never configured (no limit): no directory, or one
    marked :data:`UNCONFIGURED` without ``group.json``."""
    if name != DEFAULT_GROUP or exists(home, name):
        return False
    return not dir_exists(home, name) or fsio.lexists(group_dir(home, name) / UNCONFIGURED)


def mark_unconfigured(directory: Path) -> None:
    """Mark a ``default`` directory created for ``--after`` runs (under its lock).

    Raises:
        StorageError.
    """
    try:
        atomic_write(directory / UNCONFIGURED, b"", durable=False)
    except OSError as exc:
        raise storage_error(exc, "write", directory / UNCONFIGURED) from exc


def not_a_directory(name: str) -> str:
    return f"groups/{name} is not a directory (a symlink, a file?); move it aside"


def dir_exists(home: Home, name: str) -> bool:
    """Whether group ``name`` has its directory (a real one)."""
    try:
        return stat.S_ISDIR(os.lstat(group_dir(home, name)).st_mode)
    except OSError:
        return False


@contextlib.contextmanager
def locked(home: Home, name: str, *, create: bool = False) -> Iterator[Path]:
    """Hold group ``name``'s lock; its directory (created when ``create``: nothing is ever
    created for a group that does not exist).

    Raises:
        InvalidInput: no such group (its directory is gone).
        StorageError: ``groups/`` is not a directory; the lock cannot be taken.
    """
    check_groups_dir(home)
    directory = ensure_dir(home, name) if create else group_dir(home, name)
    if not dir_exists(home, name):
        if fsio.lexists(directory):
            raise StorageError(not_a_directory(name))
        raise InvalidInput(f"no group {name!r}")
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(exclusive(directory / LOCK, LOCK_TIMEOUT_S))
        except StorageError:
            if not dir_exists(home, name):
                raise InvalidInput(f"no group {name!r} (removed meanwhile)") from None
            raise
        yield directory


def load_config(home: Home, name: str) -> GroupConfig | None:
    """The group's settings; None when it was never configured.

    Raises:
        ProtocolError: ``group.json`` cannot be read (a symlink, a directory, garbage, too large).
    """
    path = group_dir(home, name) / CONFIG
    try:
        config = load_json(path, GroupConfig, limit=MAX_CONFIG_BYTES)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        raise ProtocolError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    if config.name != name:
        raise ProtocolError(f"{path}: name: {config.name!r} is not the group's name {name!r}")
    return config


def save_config(directory: Path, config: GroupConfig) -> None:
    """Replace ``group.json`` (under the group's lock); whatever bad stands there is moved aside
    to ``.group.json.bad-<hex>`` first.

    Raises:
        StorageError.
    """
    path = directory / CONFIG
    with contextlib.suppress(OSError):
        fsio.unlink(directory / UNCONFIGURED)
    try:
        try:
            atomic_write(path, encode_pretty(config))
        except IsADirectoryError:
            fsio.rename(path, directory / f".{CONFIG}.bad-{os.urandom(3).hex()}")
            atomic_write(path, encode_pretty(config))
    except OSError as exc:
        raise storage_error(exc, "write", path) from exc


def list_groups(home: Home) -> list[str]:
    """The names of the groups that have a directory (sorted; other names are left aside)."""
    try:
        names = fsio.listdir(groups_dir(home))
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise storage_error(exc, "list", groups_dir(home)) from exc
    found = []
    for name in names:
        with contextlib.suppress(InvalidInput):
            found.append(check_group_name(name))
    return sorted(found)


def entries(directory: Path) -> list[EntryName]:
    """The run entries in a group's directory, in queue order: admitted first, then waiting
    runs by priority (highest first) and launch order. A missing directory has none.

    Raises:
        StorageError: it cannot be listed.
    """
    try:
        names = fsio.listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return []
    except OSError as exc:
        raise storage_error(exc, "list", directory) from exc
    parsed = [e for e in map(EntryName.parse, names) if e is not None]
    return sorted(parsed, key=lambda e: (not e.admitted, e.key, e.seq, e.run_id))


def read_entry(directory: Path, entry: EntryName) -> QueueEntry | None:
    """An entry's content; None when it is gone. One that cannot be read (a symlink, a
    directory, garbage) is moved aside (``.bad-<name>``): its runner writes it again."""
    path = directory / entry.name
    try:
        return load_json(path, QueueEntry, limit=MAX_ENTRY_BYTES)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except ProtocolError:
        set_aside(directory, entry.name)
        return None


def peek_entry(directory: Path, entry: EntryName) -> QueueEntry | None:
    """An entry's content as it stands; None when it is gone or cannot be read (left as is)."""
    try:
        return load_json(directory / entry.name, QueueEntry, limit=MAX_ENTRY_BYTES)
    except (OSError, PisubError):
        return None


def set_aside(directory: Path, name: str) -> None:
    with contextlib.suppress(OSError):
        fsio.rename(directory / name, directory / f".bad-{os.urandom(3).hex()}-{name}")


def write_entry(directory: Path, entry: EntryName, content: QueueEntry) -> None:
    """Write a run's entry (under the group's lock).

    Raises:
        StorageError.
    """
    path = directory / entry.name
    try:
        atomic_write(path, encode(content), durable=False)
    except OSError as exc:
        raise storage_error(exc, "write the queue entry", path) from exc


def admit(directory: Path, entry: EntryName) -> EntryName:
    """Rename a waiting run's entry to its admitted name (under the group's lock): one atomic
    step, the marker its runner waits for.

    Raises:
        StorageError.
    """
    done = entry.as_admitted()
    try:
        fsio.rename(directory / entry.name, directory / done.name)
    except OSError as exc:
        raise storage_error(exc, "admit", directory / entry.name) from exc
    return done


def remove(directory: Path, entry: EntryName) -> bool:
    """Remove an entry; whether it was there."""
    try:
        fsio.unlink(directory / entry.name)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except IsADirectoryError:
        set_aside(directory, entry.name)
    except OSError as exc:
        if exc.errno not in (errno.EISDIR, errno.EPERM):
            raise StorageError(f"cannot remove {directory / entry.name}: {exc.strerror or exc}") from exc
        set_aside(directory, entry.name)
    return True


def find(directory: Path, run_id: str) -> EntryName | None:
    """A run's entry in a group (None: it has none)."""
    for entry in entries(directory):
        if entry.run_id == run_id:
            return entry
    return None
