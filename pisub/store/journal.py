"""A workflow's journal: every child start and end, by key and fingerprint, in ``journal.jsonl``.

The coordinator appends a ``started`` entry — durably — *before* it creates the child's run,
and an ``ended`` entry once it has the child's result. A workflow that is resumed replays its
script against the journal: a key with a settled end returns its result at once, a key that
started without an end is re-attached to its run (created, if the crash came between the
entry and the run), and only keys the journal does not know start children. The journal is
shared by a workflow and every run that resumes it, one at a time (the journal's lease).

An entry is durable when its method returns, unless it was written with ``sync=False``: then
it is durable once :meth:`Journal.sync` returns (or any later durable entry is written) — a
batch of starts or ends shares one fsync, made before any of them is acted on.

A torn last line (a crash mid-append) is skipped and cut off by the next writer; a line that
does not decode is skipped and counted in :attr:`Replay.skipped`.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from pisub.core.fsio import JsonlAppender, iter_jsonl_lines, read_bytes
from pisub.errors import ProtocolError
from pisub.protocol.codec import encode, now_iso
from pisub.protocol.host import HostReason, HostResult, HostState, JournalHostEnded, JournalHostStarted
from pisub.protocol.workflow import (
    ChildResult,
    JournalCreated,
    JournalEnded,
    JournalEntry,
    JournalOwner,
    JournalStarted,
)

MAX_JOURNAL_BYTES = 256 * 1024 * 1024
"""Largest journal a coordinator replays."""

_decoder: msgspec.json.Decoder[JournalEntry] = msgspec.json.Decoder(JournalEntry)


@dataclass
class KeyRecord:
    """What the journal knows of one key."""

    fingerprint: str
    run_id: str | None = None
    created: bool = False
    """Its run was created (a run that is gone now was removed, not never made)."""
    ended: JournalEnded | None = None
    recovered: bool = False
    """Found from its run's manifest, the journal's line being unreadable: its parameters are
    unknown (``pisub.workflow.lost_keys``)."""

    @property
    def settled(self) -> ChildResult | None:
        """The key's result, when the script has seen it."""
        return self.ended.result if self.ended is not None and self.ended.settled else None


@dataclass
class HostRecord:
    """What the journal knows of one ``runs.host`` key."""

    fingerprint: str
    open_starts: int = 0
    """Starts since its last end (a coordinator that died while the command ran)."""
    ended: JournalHostEnded | None = None

    @property
    def settled(self) -> JournalHostEnded | None:
        """The key's recorded outcome, when the script saw it."""
        return self.ended if self.ended is not None and self.ended.settled else None


@dataclass
class Replay:
    """The journal as a resumed coordinator needs it."""

    keys: dict[str, KeyRecord] = field(default_factory=dict)
    skipped: int = 0
    """Lines that did not decode (skipped)."""
    owner: str | None = None
    """The run of the last coordinator that took the journal over."""
    host: dict[str, HostRecord] = field(default_factory=dict)
    """The ``runs.host`` keys (a namespace shared with the children's keys)."""
    host_calls: int = 0
    """Host commands started by this workflow and every earlier run of it."""


def replay(path: Path) -> Replay:
    """Read the journal (none yet: an empty replay).

    Raises:
        ProtocolError: it cannot be read (a symlink, too large, an I/O error).
    """
    try:
        data = read_bytes(path, limit=MAX_JOURNAL_BYTES)
    except FileNotFoundError:
        return Replay()
    except OSError as exc:
        raise ProtocolError(f"{path}: cannot read the journal: {exc.strerror or exc}") from exc
    if len(data) > MAX_JOURNAL_BYTES:
        raise ProtocolError(f"{path}: the journal is larger than {MAX_JOURNAL_BYTES} bytes")
    found = Replay()
    for _number, line in iter_jsonl_lines(data):
        try:
            entry = _decoder.decode(line)
        except (msgspec.DecodeError, RecursionError):
            found.skipped += 1
            continue
        _apply(found, entry)
    return found


def _apply(found: Replay, entry: JournalEntry) -> None:
    if isinstance(entry, JournalOwner):
        found.owner = entry.run_id
        return
    if isinstance(entry, JournalHostStarted | JournalHostEnded):
        _apply_host(found, entry)
        return
    record = found.keys.get(entry.key)
    if isinstance(entry, JournalCreated):
        if record is not None and record.run_id == entry.run_id:
            record.created = True
        return
    if isinstance(entry, JournalStarted):
        # A new start of the key (a resumed workflow starting an unsettled key again).
        found.keys[entry.key] = KeyRecord(fingerprint=entry.fingerprint, run_id=entry.run_id)
    elif record is None or record.run_id in (entry.run_id, None):
        found.keys[entry.key] = KeyRecord(fingerprint=entry.fingerprint, run_id=entry.run_id, ended=entry)


def _apply_host(found: Replay, entry: JournalHostStarted | JournalHostEnded) -> None:
    record = found.host.get(entry.key)
    if record is None or record.fingerprint != entry.fingerprint:
        record = found.host[entry.key] = HostRecord(fingerprint=entry.fingerprint)
    if isinstance(entry, JournalHostStarted):
        found.host_calls += 1
        record.open_starts += 1
        record.ended = None
    else:
        record.open_starts = 0
        record.ended = entry


class Journal:
    """The one writer of a workflow's journal (the coordinator holding its lease)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._out = JsonlAppender(path)
        self._lock = threading.Lock()
        self._unsynced = 0
        """Entries appended with ``sync=False`` since the last fsync."""

    def _write(self, line: bytes, sync: bool) -> None:
        with self._lock:
            self._out.append(line)
            self._unsynced += 1
            if sync:
                self._sync_locked()

    def _sync_locked(self) -> None:
        if self._unsynced:
            self._out.sync()
            self._unsynced = 0

    def sync(self) -> None:
        """Make every entry appended so far durable (one fsync; none when nothing is pending).

        Raises:
            OSError: the fsync failed (the entries stay pending).
        """
        with self._lock:
            self._sync_locked()

    @property
    def pending(self) -> int:
        """Entries appended with ``sync=False`` not yet made durable."""
        return self._unsynced

    def owned_by(self, run_id: str) -> None:
        """Record (durably) that coordinator ``run_id`` took the journal over."""
        self._write(encode(JournalOwner(run_id=run_id, at=now_iso())), True)

    def started(self, key: str, fingerprint: str, run_id: str, *, sync: bool = True) -> None:
        """Record (durably; with ``sync=False`` at the next :meth:`sync`) that ``key``'s child
        is about to be created as ``run_id``."""
        entry = JournalStarted(key=key, fingerprint=fingerprint, run_id=run_id, at=now_iso())
        self._write(encode(entry), sync)

    def created(self, key: str, run_id: str, *, sync: bool = True) -> None:
        """Record (durably; with ``sync=False`` at the next :meth:`sync`) that ``key``'s run exists."""
        self._write(encode(JournalCreated(key=key, run_id=run_id, at=now_iso())), sync)

    def ended(
        self,
        key: str,
        fingerprint: str,
        run_id: str | None,
        result: ChildResult,
        *,
        settled: bool,
        sync: bool = True,
    ) -> None:
        """Record (durably; with ``sync=False`` at the next :meth:`sync`) ``key``'s outcome."""
        entry = JournalEnded(
            key=key, fingerprint=fingerprint, run_id=run_id, result=result, settled=settled, at=now_iso()
        )
        self._write(encode(entry), sync)

    def host_started(self, key: str, fingerprint: str) -> None:
        """Record (durably) that host command ``key`` is about to run."""
        self._write(encode(JournalHostStarted(key=key, fingerprint=fingerprint, at=now_iso())), True)

    def host_ended(
        self,
        key: str,
        fingerprint: str,
        result: HostResult,
        state: HostState,
        reason: HostReason | None,
        error: str | None,
        *,
        settled: bool,
    ) -> None:
        """Record (durably) host command ``key``'s outcome."""
        entry = JournalHostEnded(
            key=key,
            fingerprint=fingerprint,
            state=state,
            reason=reason,
            error=error,
            result=result,
            settled=settled,
            at=now_iso(),
        )
        self._write(encode(entry), True)

    def close(self) -> None:
        """Close the journal (what is still pending is synced first, best effort)."""
        with self._lock:
            with contextlib.suppress(OSError):
                self._sync_locked()
            self._out.close()
