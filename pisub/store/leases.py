"""Exclusive leases on pi sessions: exactly one live run drives a given session.

A lease is the file ``<home>/leases/<key>.json`` (key: SHA-256 of the session file's
canonical path) holding a :class:`~pisub.protocol.lease.LeaseOwner`. Every operation on a
lease runs under ``<key>.lock`` (``flock``); the owner record itself is placed by
hard-linking a fully written, fsynced candidate into place, so a crash never leaves an empty
or half-written owner. ``<key>.gen`` keeps the generation counter across releases; each
acquire takes the next number, which fences writes tied to the session.

A lease is reclaimed only when its owner is *proven* dead: same host and boot, its pid gone,
a zombie, or alive with another start (boot-relative ticks, never the wall clock), **and** the
owner run's ``runner.lock`` is free. An unreadable record, or one from another host or boot,
is never reclaimed automatically (fail closed): ``pisub lease break`` is the manual way out.

Every function raises only :class:`~pisub.errors.PisubError` (``OSError`` is translated here).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import msgspec

from pisub.core.fsio import atomic_write, fsync_dir, load_json, private_mkdir, publish_new, read_bytes
from pisub.core.locks import exclusive, is_held
from pisub.core.procs import boot_id, host_name, is_alive, start_ticks, start_time
from pisub.errors import LeaseHeld, PisubError, ProtocolError, StaleLease, storage_error, translating
from pisub.protocol.codec import encode_pretty, now_iso
from pisub.protocol.lease import LeaseOwner
from pisub.store.paths import is_run_id


def canonical(session_file: str | Path) -> str:
    """The canonical path of a session file (it need not exist yet)."""
    return os.path.realpath(session_file)


def lease_key(session_file: str | Path) -> str:
    return hashlib.sha256(os.fsencode(canonical(session_file))).hexdigest()[:32]


class LeasePaths(msgspec.Struct, frozen=True):
    root: Path
    key: str

    @property
    def owner(self) -> Path:
        return self.root / f"{self.key}.json"

    @property
    def lock(self) -> Path:
        return self.root / f"{self.key}.lock"

    @property
    def generation(self) -> Path:
        return self.root / f"{self.key}.gen"


def lease_paths(leases_dir: Path, session_file: str | Path) -> LeasePaths:
    return LeasePaths(leases_dir, lease_key(session_file))


def read_owner(lp: LeasePaths) -> LeaseOwner | None:
    """The current owner, None when the lease is free.

    Raises:
        ProtocolError: the record exists but cannot be read (never treated as free).
    """
    try:
        return load_json(lp.owner, LeaseOwner, limit=64 * 1024)
    except FileNotFoundError:
        return None


def proven_dead(owner: LeaseOwner, leases_dir: Path) -> bool:
    """Whether the owner is provably gone: same host and boot, its process gone or another one
    (by start ticks), and its run's ``runner.lock`` free. Nothing here reads the wall clock."""
    if owner.host != host_name() or owner.boot_id is None or owner.boot_id != boot_id():
        return False
    if is_alive(owner.pid, owner.pid_start_time, owner.pid_start_ticks):
        return False
    return not (
        is_run_id(owner.run_id) and is_held(leases_dir.parent / "runs" / owner.run_id / "runner.lock")
    )


def describe(owner: LeaseOwner) -> str:
    return f"run {owner.run_id} (pid {owner.pid} on {owner.host}, generation {owner.generation})"


def current_generation(lp: LeasePaths) -> int:
    """The session's last generation (0 before the first acquire).

    Raises:
        ProtocolError: the counter exists but cannot be read.
    """
    try:
        text = read_bytes(lp.generation, limit=64).decode("ascii").strip()
        return int(text or 0)
    except FileNotFoundError:
        return 0
    except (OSError, ValueError) as exc:
        raise ProtocolError(f"lease generation {lp.generation} is unreadable: {exc}") from exc


def _owner_or_held(lp: LeasePaths, session_file: str | Path) -> LeaseOwner | None:
    """The current owner; an unreadable record is never taken for a free lease (fail closed)."""
    try:
        return read_owner(lp)
    except PisubError as exc:
        raise LeaseHeld(
            f"the session {canonical(session_file)} has an unreadable lease ({exc}); "
            "if no run drives it, break it with: pisub lease break RUN --force"
        ) from exc


@translating("take the session lease in")
def acquire(leases_dir: Path, session_file: str | Path, run_id: str, source_run_id: str | None) -> LeaseOwner:
    """Take the lease on ``session_file`` for this process (the runner of ``run_id``).

    Raises:
        LeaseHeld: another live run holds it, or its owner cannot be proven dead.
    """
    private_mkdir(leases_dir)
    lp = lease_paths(leases_dir, session_file)
    with exclusive(lp.lock, timeout=30):
        existing = _owner_or_held(lp, session_file)
        if existing is not None:
            if not proven_dead(existing, leases_dir):
                where = "" if existing.host == host_name() else " (another host: not reclaimed automatically)"
                raise LeaseHeld(f"the session is driven by {describe(existing)}{where}")
            os.unlink(lp.owner)
        try:
            generation = current_generation(lp) + 1
        except ProtocolError as exc:
            raise LeaseHeld(f"{exc}; remove it only if no run drives {canonical(session_file)}") from exc
        atomic_write(lp.generation, f"{generation}\n".encode())
        owner = LeaseOwner(
            v=1,
            token=os.urandom(16).hex(),
            generation=generation,
            session_file=canonical(session_file),
            run_id=run_id,
            source_run_id=source_run_id,
            pid=os.getpid(),
            pid_start_time=start_time(os.getpid()),
            pid_start_ticks=start_ticks(os.getpid()),
            host=host_name(),
            boot_id=boot_id(),
            acquired_at=now_iso(),
        )
        publish_new(leases_dir, lp.owner, encode_pretty(owner))
        return owner


@translating("release the session lease in")
def release(leases_dir: Path, owner: LeaseOwner) -> bool:
    """Give the lease up if ``owner`` still holds it (same token); whether it was removed."""
    lp = lease_paths(leases_dir, owner.session_file)
    with exclusive(lp.lock, timeout=30):
        try:
            current = read_owner(lp)
        except PisubError:
            return False
        if current is None or current.token != owner.token:
            return False
        os.unlink(lp.owner)
        fsync_dir(lp.root)
        return True


@contextmanager
def fenced(leases_dir: Path, owner: LeaseOwner) -> Iterator[None]:
    """Hold the lease lock while checking that ``owner`` is still the current holder.

    Raises:
        StaleLease: the lease was broken or taken by a newer generation.
        StorageError: a file could not be read or written (also inside the block).
    """
    lp = lease_paths(leases_dir, owner.session_file)
    try:
        with exclusive(lp.lock, timeout=30):
            try:
                current = read_owner(lp)
            except PisubError as exc:
                raise StaleLease(f"lease of {owner.session_file} is unreadable") from exc
            if current is None or current.token != owner.token or current.generation != owner.generation:
                raise StaleLease(
                    f"lease generation {owner.generation} of {owner.session_file} is no longer current"
                )
            yield
    except OSError as exc:
        raise storage_error(exc, "write under the session lease in") from exc


@contextmanager
def unleased(leases_dir: Path, session_file: str | Path) -> Iterator[int]:
    """Hold the lease lock while no live run drives the session; yields the generation.

    For writes tied to a session that nobody drives (briefs).

    Raises:
        LeaseHeld: a live run drives the session.
        StorageError: a file could not be read or written (also inside the block).
    """
    try:
        private_mkdir(leases_dir)
        lp = lease_paths(leases_dir, session_file)
        with exclusive(lp.lock, timeout=30):
            owner = _owner_or_held(lp, session_file)
            if owner is not None and not proven_dead(owner, leases_dir):
                raise LeaseHeld(f"the session is driven by {describe(owner)}")
            try:
                generation = current_generation(lp)
            except ProtocolError as exc:
                raise LeaseHeld(str(exc)) from exc
            yield generation
    except OSError as exc:
        raise storage_error(exc, "write under the session lease in") from exc


class LeaseInfo(msgspec.Struct):
    path: Path
    owner: LeaseOwner | None
    error: str | None
    alive: bool | None
    """True: owner alive; False: proven dead; None: cannot tell (other host/boot, unreadable)."""


def list_leases(leases_dir: Path) -> list[LeaseInfo]:
    """Every lease record with what is known of its owner."""
    infos = []
    try:
        names = sorted(os.listdir(leases_dir))
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise storage_error(exc, "list", leases_dir) from exc
    for name in names:
        if not name.endswith(".json"):
            continue
        lp = LeasePaths(leases_dir, name[: -len(".json")])
        try:
            owner = read_owner(lp)
        except PisubError as exc:
            infos.append(LeaseInfo(lp.owner, None, str(exc), None))
            continue
        if owner is None:
            continue
        same_boot = owner.host == host_name() and owner.boot_id == boot_id()
        alive = not proven_dead(owner, leases_dir) if same_boot else None
        infos.append(LeaseInfo(lp.owner, owner, None, alive))
    return infos


@translating("reclaim the session lease in")
def reclaim_if_dead(leases_dir: Path, session_file: str | Path, run_id: str) -> bool:
    """Remove the lease of a crashed run (its owner proven dead); whether it was removed."""
    lp = lease_paths(leases_dir, session_file)
    if not os.path.lexists(lp.owner):
        return False
    with exclusive(lp.lock, timeout=30):
        try:
            owner = read_owner(lp)
        except PisubError:
            return False
        if owner is None or owner.run_id != run_id or not proven_dead(owner, leases_dir):
            return False
        os.unlink(lp.owner)
        return True


@translating("break the session lease in")
def break_lease(leases_dir: Path, record: Path) -> None:
    """Remove a lease record by force (the documented manual way out)."""
    key = record.name[: -len(".json")]
    lp = LeasePaths(leases_dir, key)
    with exclusive(lp.lock, timeout=30):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(lp.owner)
        fsync_dir(leases_dir)
