"""Exclusive leases on pi sessions: exactly one live run drives a given session.

A lease is the file ``<home>/leases/<key>.json`` (key: SHA-256 of the session file's
canonical path) holding a :class:`~pisub.protocol.lease.LeaseOwner`. Every operation on a
lease runs under ``<key>.lock`` (portalocker); the owner record itself is placed by
hard-linking a fully written, fsynced candidate into place, so a crash never leaves an empty
or half-written owner. ``<key>.gen`` keeps the generation counter across releases; each
acquire takes the next number, which fences writes tied to the session.

A lease is reclaimed only when its owner is *proven* dead: same host and boot, and its pid
gone, a zombie, or alive with another start time. An unreadable record, or one from another
host or boot, is never reclaimed automatically (fail closed): ``pisub lease break`` is the
manual way out.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from pisub.errors import PisubError
from pisub.fsio import atomic_write, fsync_dir, private_mkdir, read_bytes, temp_name
from pisub.locks import exclusive
from pisub.procs import boot_id, host_name, is_alive, start_time
from pisub.protocol.codec import decode, encode_pretty, now_iso
from pisub.protocol.lease import LeaseOwner


class LeaseHeld(PisubError):
    """The session is driven by another live run (or its owner cannot be proven dead)."""

    code = "LEASE_HELD"


class StaleLease(PisubError):
    """A write was fenced off: the writer's lease generation is no longer current."""

    code = "STALE_LEASE"


def canonical(session_file: str | Path) -> str:
    """The canonical path of a session file (it need not exist yet)."""
    return os.path.realpath(session_file)


def lease_key(session_file: str | Path) -> str:
    return hashlib.sha256(canonical(session_file).encode()).hexdigest()[:32]


@dataclass(frozen=True)
class LeasePaths:
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
        data = read_bytes(lp.owner, limit=64 * 1024)
    except FileNotFoundError:
        return None
    return decode(data, LeaseOwner, f"lease {lp.owner}")


def proven_dead(owner: LeaseOwner) -> bool:
    """Whether the owner is provably gone (same host and boot, process gone or reused)."""
    if owner.host != host_name() or owner.boot_id is None or owner.boot_id != boot_id():
        return False
    return not is_alive(owner.pid, owner.pid_start_time)


def describe(owner: LeaseOwner) -> str:
    return f"run {owner.run_id} (pid {owner.pid} on {owner.host}, generation {owner.generation})"


def current_generation(lp: LeasePaths) -> int:
    try:
        return int(read_bytes(lp.generation).decode().strip() or 0)
    except FileNotFoundError:
        return 0


def _owner_or_held(lp: LeasePaths, session_file: str | Path) -> LeaseOwner | None:
    """The current owner; an unreadable record is never taken for a free lease (fail closed)."""
    try:
        return read_owner(lp)
    except PisubError as exc:
        raise LeaseHeld(
            f"the session {canonical(session_file)} has an unreadable lease ({exc}); "
            "if no run drives it, break it with: pisub lease break RUN --force"
        ) from exc


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
            if not proven_dead(existing):
                where = "" if existing.host == host_name() else " (another host: not reclaimed automatically)"
                raise LeaseHeld(f"the session is driven by {describe(existing)}{where}")
            os.unlink(lp.owner)
        generation = current_generation(lp) + 1
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
            host=host_name(),
            boot_id=boot_id(),
            acquired_at=now_iso(),
        )
        _place(lp.owner, encode_pretty(owner))
        return owner


def _place(path: Path, data: bytes) -> None:
    """Create ``path`` with ``data`` by linking a complete candidate; fails if it exists."""
    candidate = temp_name(path)
    fd = os.open(candidate, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(candidate, path)
    finally:
        os.unlink(candidate)
    fsync_dir(path.parent)


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
    """
    lp = lease_paths(leases_dir, owner.session_file)
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


@contextmanager
def unleased(leases_dir: Path, session_file: str | Path) -> Iterator[int]:
    """Hold the lease lock while no live run drives the session; yields the generation.

    For writes tied to a session that nobody drives (briefs).

    Raises:
        LeaseHeld: a live run drives the session.
    """
    private_mkdir(leases_dir)
    lp = lease_paths(leases_dir, session_file)
    with exclusive(lp.lock, timeout=30):
        owner = _owner_or_held(lp, session_file)
        if owner is not None and not proven_dead(owner):
            raise LeaseHeld(f"the session is driven by {describe(owner)}")
        yield current_generation(lp)


@dataclass
class LeaseInfo:
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
        alive = is_alive(owner.pid, owner.pid_start_time) if same_boot else None
        infos.append(LeaseInfo(lp.owner, owner, None, alive))
    return infos


def reclaim_if_dead(leases_dir: Path, session_file: str | Path, run_id: str) -> bool:
    """Remove the lease of a crashed run (its owner proven dead); whether it was removed."""
    lp = lease_paths(leases_dir, session_file)
    if not lp.owner.exists():
        return False
    with exclusive(lp.lock, timeout=30):
        try:
            owner = read_owner(lp)
        except PisubError:
            return False
        if owner is None or owner.run_id != run_id or not proven_dead(owner):
            return False
        os.unlink(lp.owner)
        return True


def break_lease(leases_dir: Path, record: Path) -> None:
    """Remove a lease record by force (the documented manual way out)."""
    key = record.name[: -len(".json")]
    lp = LeasePaths(leases_dir, key)
    with exclusive(lp.lock, timeout=30):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(lp.owner)
        fsync_dir(leases_dir)
