"""The files of schedules (``spec/schedules.md``): ``<home>/schedules/<id>/`` holds
``schedule.json`` (the record), ``lock`` (every change of the schedule is made holding it; never
replaced), ``history.json`` (the newest fires), ``events.jsonl`` and the script's copy
(``workflow.js`` / ``workflow.py``). ``schedules/.create.lock`` serialises creations (the pending
limit), ``schedules/last-tick.json`` is the last tick, ``schedules/.quarantine/`` what could not
be read. Nothing here decides when a schedule fires (:mod:`pisub.protocol.schedule`,
:mod:`pisub.api.schedules`)."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path

from pisub.core import fsio
from pisub.core.fsio import JsonlAppender, atomic_write, load_json, private_mkdir
from pisub.core.locks import exclusive
from pisub.errors import (
    InvalidInput,
    PisubError,
    ProtocolError,
    ScheduleNotFound,
    StorageError,
    storage_error,
)
from pisub.protocol.codec import encode, encode_pretty, now_iso
from pisub.protocol.schedule import (
    MAX_HISTORY,
    MAX_PENDING,
    SCHEDULE_ID,
    SESSION_KEY,
    Fire,
    History,
    LastTick,
    Presence,
    Schedule,
    ScheduleEvent,
)
from pisub.store.paths import Home
from pisub.termsafe import printable

RECORD = "schedule.json"
HISTORY = "history.json"
EVENTS = "events.jsonl"
LOCK = "lock"
CREATE_LOCK = ".create.lock"
LAST_TICK = "last-tick.json"
TIMER = "timer.json"
"""What `pisub schedule install` installed (pisub.api.schedule_timer)."""
QUARANTINE = ".quarantine"
RESERVED = frozenset({LAST_TICK, TIMER})
"""Names of pisub's own files in ``schedules/`` that the id pattern allows: never a schedule's id."""
MAX_RECORD_BYTES = 1024 * 1024
"""A schedule.json larger than this is not read (quarantined)."""
MAX_HISTORY_BYTES = 4 * 1024 * 1024
MAX_EVENTS_BYTES = 512 * 1024
"""``events.jsonl`` is cut to its newer half when it grows past this."""
MAX_NOTICE_BYTES = 64 * 1024
_NOT_A_FILE = (errno.ELOOP, errno.EISDIR, errno.ENXIO)
LOCK_TIMEOUT_S = 60.0
"""How long a change waits for a schedule's lock (a tick holds it while it starts a run: the
runner's startup commit, seconds)."""


def root(home: Home) -> Path:
    return home.schedules


def ensure_root(home: Home) -> Path:
    """``schedules/``, created 0700 when missing.

    Raises:
        StorageError: something else stands there (a symlink, a file).
    """
    try:
        private_mkdir(home.schedules)
    except OSError as exc:
        raise storage_error(exc, "create the schedules folder", home.schedules) from exc
    return home.schedules


def check_root(home: Home) -> None:
    """Make sure ``schedules/`` is this user's own private folder before anything in it is
    fired: one of ours open to others (0777 by a careless hand) is tightened to 0700 (said on
    stderr, as pisub does for its own folders); a missing one is fine.

    Raises:
        StorageError: it is not a real directory, or it belongs to another user (nothing in it
            is trusted: move it aside).
    """
    fsio.own_private_dir(
        home.schedules,
        "the schedules folder",
        "nothing in it is fired; move it aside (pisub makes a new one)",
    )


def foreign(path: Path, st: os.stat_result) -> str | None:
    """Why the entry ``path`` (its ``lstat``) is not to be trusted: another user owns it, or
    others may write it (group or world writable); None when it is this user's own."""
    if st.st_uid != os.getuid():
        return f"{printable(str(path))} belongs to uid {st.st_uid}, not to you (uid {os.getuid()})"
    if st.st_mode & 0o022 and not stat.S_ISLNK(st.st_mode):
        return f"{printable(str(path))} is writable by others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def is_real_dir(path: Path) -> bool:
    try:
        return stat.S_ISDIR(fsio.lstat(path).st_mode)
    except OSError:
        return False


class ScheduleStore:
    """The schedules of one home."""

    def __init__(self, home: Home) -> None:
        self.home = home
        self.root = home.schedules

    def dir(self, schedule_id: str) -> Path:
        return self.root / schedule_id

    # ---- listing ------------------------------------------------------------------------

    def ids(self) -> list[str]:
        """The ids of the schedules (sorted): entries named like an id that are real
        directories. Anything else (a symlink, FIFO, file, a name that is no id — not UTF-8,
        a dot file) is left aside, never followed."""
        try:
            names = fsio.listdir(self.root)
        except (FileNotFoundError, NotADirectoryError):
            return []
        except OSError as exc:
            raise storage_error(exc, "list", self.root) from exc
        found = []
        for name in names:
            if (
                SCHEDULE_ID.fullmatch(name)
                and name.isascii()
                and name not in RESERVED
                and is_real_dir(self.root / name)
            ):
                found.append(name)
        return sorted(found)

    def strays(self) -> list[str]:
        """Entries of ``schedules/`` that are not what they should be (printable names)."""
        try:
            names = fsio.listdir(self.root)
        except OSError:
            return []
        known = {CREATE_LOCK, LAST_TICK, QUARANTINE, TIMER}
        return sorted(
            printable(n)
            for n in names
            if n not in known
            and not n.startswith(".")
            and not (SCHEDULE_ID.fullmatch(n) and n.isascii() and is_real_dir(self.root / n))
        )

    # ---- one schedule -------------------------------------------------------------------

    def exists(self, schedule_id: str) -> bool:
        return is_real_dir(self.dir(schedule_id))

    def sweep_temps(self, schedule_id: str) -> None:
        """Remove the temp files (``.<name>.<pid>.<hex>.tmp``) a process killed mid-write left in
        the schedule's folder. Only holding its lock: every write there is made holding it, so
        none of them is being written now."""
        directory = self.dir(schedule_id)
        try:
            names = fsio.listdir(directory)
        except OSError:
            return
        for name in names:
            if name.startswith(".") and name.endswith(".tmp"):
                with contextlib.suppress(OSError):
                    if stat.S_ISREG(fsio.lstat(directory / name).st_mode):
                        os.unlink(directory / name)

    def hostile(self, schedule_id: str) -> str | None:
        """Why schedule ``schedule_id``'s folder must not be used (None: it is this user's
        own): the folder, or an entry in it (``schedule.json``, the script's copy, ...), is
        another user's or writable by others — planted, so never fired."""
        directory = self.dir(schedule_id)
        try:
            st = fsio.lstat(directory)
        except OSError:
            return None  # gone: the caller finds that out
        reason = foreign(directory, st)
        if reason is not None:
            return reason
        try:
            names = fsio.listdir(directory)
        except OSError:
            return None
        for name in names:
            try:
                reason = foreign(directory / name, fsio.lstat(directory / name))
            except OSError:
                continue
            if reason is not None:
                return reason
        return None

    @contextlib.contextmanager
    def locked(self, schedule_id: str, timeout: float = LOCK_TIMEOUT_S) -> Iterator[Path]:
        """Hold schedule ``schedule_id``'s lock; its directory.

        Raises:
            ScheduleNotFound: no such schedule (or it was deleted meanwhile).
            LockBusy: the lock was not free in ``timeout`` seconds.
            StorageError.
        """
        directory = self.dir(schedule_id)
        if not is_real_dir(directory):
            raise self._not_found(schedule_id)
        with contextlib.ExitStack() as stack:
            try:
                stack.enter_context(exclusive(directory / LOCK, timeout))
            except StorageError:
                if not is_real_dir(directory):
                    raise self._not_found(schedule_id) from None
                raise
            if not is_real_dir(directory) or not fsio.lexists(directory / RECORD):
                raise self._not_found(schedule_id)  # deleted (or quarantined) while we waited
            yield directory

    def _not_found(self, schedule_id: str) -> ScheduleNotFound:
        path = self.dir(schedule_id)
        try:
            kind = fsio.file_kind(fsio.lstat(path).st_mode)
        except OSError:
            return ScheduleNotFound(f"no schedule {schedule_id!r} (pisub schedule list --all shows them)")
        if kind != "directory":
            return ScheduleNotFound(f"{printable(str(path))} is a {kind}, not a schedule; move it aside")
        return ScheduleNotFound(f"no schedule {schedule_id!r}: its schedule.json is missing")

    def load(self, schedule_id: str) -> Schedule:
        """The schedule's record.

        Raises:
            ScheduleNotFound: no such schedule.
            ProtocolError: ``schedule.json`` cannot be read (a symlink, FIFO, garbage, too large).
        """
        directory = self.dir(schedule_id)
        if not is_real_dir(directory):
            raise self._not_found(schedule_id)
        reason = self.hostile(schedule_id)
        if reason is not None:
            raise ProtocolError(f"{reason}: not a schedule of yours")
        try:
            record = load_json(directory / RECORD, Schedule, limit=MAX_RECORD_BYTES)
        except FileNotFoundError:
            raise self._not_found(schedule_id) from None
        if record.id != schedule_id:
            raise ProtocolError(f"{directory / RECORD}: id {record.id!r} is not its folder's {schedule_id!r}")
        return record

    def save(self, schedule: Schedule) -> None:
        """Replace ``schedule.json`` (under the schedule's lock): the claim of a slot is this one
        atomic, durable write.

        Raises:
            StorageError.
        """
        schedule.updated_at = now_iso()
        path = self.dir(schedule.id) / RECORD
        try:
            atomic_write(path, encode_pretty(schedule))
        except OSError as exc:
            raise storage_error(exc, "write", path) from exc

    def script(self, schedule: Schedule) -> str:
        """The text of the schedule's script copy.

        Raises:
            ProtocolError: it is missing or cannot be read.
        """
        path = self.dir(schedule.id) / schedule.target.copy_name
        try:
            fd = fsio.open_regular(path)
        except OSError as exc:
            raise ProtocolError(f"{path}: cannot read the script's copy: {exc.strerror or exc}") from exc
        try:
            reason = foreign(path, os.fstat(fd))
            if reason is not None:
                raise ProtocolError(f"{reason}: a script copy that is not yours is never run")
            data = os.read(fd, MAX_RECORD_BYTES + 1)
        except OSError as exc:
            raise ProtocolError(f"{path}: cannot read the script's copy: {exc.strerror or exc}") from exc
        finally:
            os.close(fd)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise ProtocolError(f"{path}: the script's copy is not UTF-8") from None

    # ---- history and events -------------------------------------------------------------

    def history(self, schedule_id: str, *, repair: bool = False) -> list[Fire]:
        """The schedule's fires, newest first. One that cannot be read counts as empty (and is
        quarantined with ``repair``, under the lock)."""
        path = self.dir(schedule_id) / HISTORY
        try:
            return list(load_json(path, History, limit=MAX_HISTORY_BYTES).fires)
        except FileNotFoundError:
            return []
        except ProtocolError as exc:
            if repair:
                self.quarantine(schedule_id, path, str(exc))
            return []

    def record(self, schedule_id: str, fire: Fire) -> None:
        """Put ``fire`` in the history (replacing the row with its id; newest first, at most
        :data:`MAX_HISTORY`). Under the schedule's lock.

        Raises:
            StorageError.
        """
        fires = [f for f in self.history(schedule_id, repair=True) if f.id != fire.id]
        fires.insert(0, fire)
        fires.sort(key=lambda f: f.claimed_at or f.planned_at, reverse=True)
        path = self.dir(schedule_id) / HISTORY
        try:
            atomic_write(path, encode_pretty(History(fires=fires[:MAX_HISTORY])), durable=False)
        except IsADirectoryError:
            self.quarantine(schedule_id, path, "a directory stood in place of history.json")
            self.record(schedule_id, fire)
        except OSError as exc:
            raise storage_error(exc, "write", path) from exc

    def event(self, schedule_id: str, kind: str, fire: Fire | None = None, detail: str | None = None) -> None:
        """Append one line to ``events.jsonl`` (under the schedule's lock; best effort: an
        event that cannot be written never stops a fire). A file grown past
        :data:`MAX_EVENTS_BYTES` is cut to its newer half first."""
        path = self.dir(schedule_id) / EVENTS
        line = encode(
            ScheduleEvent(
                at=now_iso(),
                type=kind,
                fire_id=fire.id if fire is not None else None,
                run_id=fire.run_id if fire is not None else None,
                state=fire.state.value if fire is not None else None,
                detail=detail,
            )
        )
        for _attempt in range(2):
            try:
                self._bound_events(path)
                appender = JsonlAppender(path)
                try:
                    appender.append(line)
                finally:
                    appender.close()
                return
            except OSError as exc:
                if isinstance(exc, fsio.NotRegularFile) or exc.errno in _NOT_A_FILE:
                    self.quarantine(schedule_id, path, f"events.jsonl was not a regular file: {exc}")
                    continue
                return

    def _bound_events(self, path: Path) -> None:
        try:
            size = fsio.lstat(path).st_size
        except FileNotFoundError:
            return
        if size <= MAX_EVENTS_BYTES:
            return
        tail = fsio.read_tail(path, MAX_EVENTS_BYTES // 2)
        cut = tail.find(b"\n")
        atomic_write(path, tail[cut + 1 :] if cut >= 0 else b"", durable=False)

    def events(self, schedule_id: str) -> list[ScheduleEvent]:
        """The schedule's events (lines that do not decode are left out)."""
        import msgspec

        data = fsio.read_tail(self.dir(schedule_id) / EVENTS, MAX_EVENTS_BYTES * 2)
        found = []
        for _n, line in fsio.iter_jsonl_lines(data):
            with contextlib.suppress(msgspec.MsgspecError):
                found.append(msgspec.json.decode(line, type=ScheduleEvent))
        return found

    def quarantine(self, schedule_id: str, path: Path, reason: str) -> Path | None:
        """Move a bad file (or folder) out of the way into ``schedules/.quarantine/`` with
        ``<name>.reason`` beside it; where it went (None: it could not be moved)."""
        return fsio.quarantine(
            path, self.root / QUARANTINE, f"{schedule_id}-{printable(path.name)[:80]}", reason
        )

    def pending_count(self) -> int:
        """How many schedules may still fire (unreadable ones count: they may be repaired)."""
        count = 0
        for schedule_id in self.ids():
            try:
                count += self.load(schedule_id).pending
            except ScheduleNotFound:
                continue
            except PisubError:
                count += 1
        return count

    def create(self, schedule: Schedule, script: bytes) -> None:
        """Create the schedule's folder with its script copy, an empty history and its record
        (built in ``.creating-<id>`` and renamed into place: never seen half made).

        Raises:
            InvalidInput: the id is taken, or :data:`MAX_PENDING` schedules are pending.
            StorageError.
        """
        ensure_root(self.home)
        with exclusive(self.root / CREATE_LOCK, LOCK_TIMEOUT_S):
            final = self.dir(schedule.id)
            if fsio.lexists(final):
                raise InvalidInput(f"a schedule {schedule.id!r} exists; give another --id or delete it first")
            pending = self.pending_count()
            if pending >= MAX_PENDING:
                raise InvalidInput(
                    f"{pending} schedules are pending (at most {MAX_PENDING} per home); delete one first "
                    "(pisub schedule list --all)"
                )
            staging = self.root / f".creating-{schedule.id}"
            try:
                if fsio.lexists(staging):
                    _remove_tree(staging)
                private_mkdir(staging)
                atomic_write(staging / schedule.target.copy_name, script)
                atomic_write(staging / HISTORY, encode_pretty(History()))
                atomic_write(staging / RECORD, encode_pretty(schedule))
                fsio.rename(staging, final)
                fsio.fsync_dir(self.root)
            except OSError as exc:
                _remove_tree(staging)
                raise storage_error(exc, "create the schedule", final) from exc
        self.event(schedule.id, "schedule.created")

    def delete(self, schedule_id: str) -> None:
        """Remove the schedule's folder (under its lock: first renamed out of the way, so a tick
        waiting for the lock finds nothing).

        Raises:
            StorageError.
        """
        directory = self.dir(schedule_id)
        gone = self.root / f".deleted-{schedule_id}-{os.urandom(3).hex()}"
        try:
            fsio.rename(directory, gone)
        except OSError as exc:
            raise storage_error(exc, "delete the schedule", directory) from exc
        _remove_tree(gone)

    # ---- the tick's mark ----------------------------------------------------------------

    def write_last_tick(self, tick: LastTick) -> None:
        """``schedules/last-tick.json`` (atomic; a failure to write it is an error: a timer's
        health is read from it).

        Raises:
            StorageError.
        """
        ensure_root(self.home)
        path = self.root / LAST_TICK
        try:
            atomic_write(path, encode(tick) + b"\n", durable=False)
        except IsADirectoryError:
            self.quarantine("last-tick", path, "a directory stood in place of last-tick.json")
            atomic_write(path, encode(tick) + b"\n", durable=False)
        except OSError as exc:
            raise storage_error(exc, "write", path) from exc

    def last_tick(self) -> LastTick | None:
        try:
            return load_json(self.root / LAST_TICK, LastTick, limit=MAX_NOTICE_BYTES)
        except (FileNotFoundError, ProtocolError):
            return None


def _remove_tree(path: Path) -> None:
    """Remove a folder of ours (never following a symlink in it)."""
    with contextlib.suppress(OSError):
        if stat.S_ISDIR(os.lstat(path).st_mode):
            shutil.rmtree(path, ignore_errors=True)
        else:
            os.unlink(path)


# ---- the pi extension's notices ledger (``spec/pi-extension.md``) ------------------------------


def notices_dir(home: Home, session_key: str) -> Path:
    if not SESSION_KEY.fullmatch(session_key):
        raise InvalidInput(f"session key {session_key[:40]!r} is not 32 hex digits")
    return home.root / "notices" / session_key


def record_notice(
    home: Home, session_key: str, run_id: str, schedule_id: str, name: str, quiet: bool
) -> str | None:
    """Record run ``run_id`` (a fire of schedule ``schedule_id``) in the session's notices
    ledger, once: the extension tells the session when it ends. Best effort — a ledger that
    cannot be written never stops a fire — but never silent: returns why the entry was not
    written (None: written, or already there or sent). A session folder that is not this
    user's own real directory (a symlink, a FIFO, a file, another user's folder, one open to
    others) is moved aside to ``notices/.<KEY>.bad-<hex>`` and made again, as a bad ``lock``
    is."""
    directory = notices_dir(home, session_key)
    entry = {
        "v": 1,
        "runId": run_id,
        "agent": None,
        "schedule": {"id": schedule_id, "name": name},
        "quiet": quiet,
    }
    moved = ""
    try:
        private_mkdir(directory.parent)
        st = fsio.lstat(directory.parent)
        reason = foreign(directory.parent, st)
        if reason is not None:
            return f"the notices ledger was not written: {reason}"
        try:
            here: os.stat_result | None = fsio.lstat(directory)
        except FileNotFoundError:
            here = None
        if here is not None:
            bad = (
                f"a {fsio.file_kind(here.st_mode)}"
                if not stat.S_ISDIR(here.st_mode)
                else foreign(directory, here)
            )
            if bad is not None:
                aside = directory.with_name(f".{session_key}.bad-{os.urandom(3).hex()}")
                fsio.rename(directory, aside)
                moved = f"notices/{session_key} was {bad}: moved aside to {aside.name} and made again; "
        private_mkdir(directory)
        if fsio.lexists(directory / f"{run_id}.sent"):
            return moved[:-2] if moved else None
        fsio.create_exclusive(directory / f"{run_id}.json", encode(entry) + b"\n")
    except FileExistsError:
        return moved[:-2] if moved else None  # recorded already (a later tick, the same fire)
    except OSError as exc:
        return f"{moved}the notices ledger entry was not written: {printable(str(exc))}"
    return moved[:-2] if moved else None


def session_present(home: Home, session_key: str) -> bool:
    """Whether a pi process of session ``session_key`` is open: a presence file of its ledger
    (``presence/<pid>.json``, written by the extension) names a live process (pid and start
    ticks). Entries that are not readable presence files are ignored."""
    from pisub.core.procs import is_alive

    directory = notices_dir(home, session_key) / "presence"
    try:
        names = fsio.listdir(directory)
    except OSError:
        return False
    for name in names:
        stem = name[: -len(".json")] if name.endswith(".json") else ""
        if not (stem.isascii() and stem.isdigit()):
            continue
        try:
            presence = load_json(directory / name, Presence, limit=MAX_NOTICE_BYTES)
        except (OSError, PisubError):
            continue
        if presence.pid == int(stem) and is_alive(presence.pid, ticks=presence.start_ticks):
            return True
    return False
