"""Runs on disk: create a run directory atomically, resolve ids, load its files.

A run directory is built under ``runs/.creating-<id>`` and renamed into place only
when its manifest and first status exist, so a reader never sees half a run.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from pisub.core.fsio import (
    JsonlAppender,
    atomic_write,
    file_kind,
    fsync_dir,
    load_json,
    private_mkdir,
    read_bytes,
    write_all,
)
from pisub.errors import (
    AmbiguousRun,
    HomeUnusable,
    InvalidInput,
    PisubError,
    ProtocolError,
    RunNotFound,
    storage_error,
)
from pisub.protocol.codec import encode, encode_pretty, now_iso
from pisub.protocol.events import Event
from pisub.protocol.placement import BackendName, Heartbeat, Placement
from pisub.protocol.result import Result
from pisub.protocol.status import RunState, Status
from pisub.store import fencing, live_index
from pisub.store.paths import LABEL_REF, Home, RunPaths, is_run_id, validate_run_ref

if TYPE_CHECKING:
    from pisub.protocol.manifest import Manifest

T = TypeVar("T")

MAX_FILE = 16 * 1024 * 1024
"""Largest run file a reader decodes."""

SEED_NAMES = ("session.jsonl", "workflow.py", "workflow.js")
"""The files a run may be created with besides its own (see :meth:`RunStore.create`)."""


class RunStore:
    """Create, find and read runs under a home."""

    def __init__(self, home: Home) -> None:
        self.home = home

    def create(
        self, manifest: Manifest, *, seeds: Mapping[str, Path | bytes] | None = None
    ) -> tuple[RunPaths, int]:
        """Create the run directory of ``manifest`` with a ``starting`` status, and a private
        copy of each ``seeds`` file under its name (a pi session to start from, a workflow's
        script; given as bytes, they are written as they are).

        Returns the run's paths and an fd holding ``runner.lock``: the launcher hands
        it to the runner, so the lock is held from the moment the run exists.
        """
        final = self.home.run(manifest.run_id)
        staging = RunPaths(self.home.runs / f".creating-{manifest.run_id}")
        try:
            encode_pretty(manifest)  # before anything exists: text a file cannot hold is refused
        except (UnicodeEncodeError, ValueError) as exc:
            raise _unencodable(manifest, exc) from None
        try:
            return self._create(manifest, staging, final, dict(seeds or {}))
        except BaseException as exc:
            import shutil  # (only here: a runner that reads its run need not import it)

            shutil.rmtree(staging.root, ignore_errors=True)
            if not isinstance(exc, OSError):
                raise
            if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):  # the home, not the disk
                why = exc.strerror or str(exc)
                raise HomeUnusable(f"cannot create a run in {self.home.runs}: {why}") from exc
            raise storage_error(exc, "create a run in", self.home.runs) from exc

    def _create(
        self, manifest: Manifest, staging: RunPaths, final: RunPaths, seeds: dict[str, Path | bytes]
    ) -> tuple[RunPaths, int]:
        from pisub.core.locks import try_lock
        from pisub.core.procs import host_name
        from pisub.store.session_fork import copy_session

        private_mkdir(staging.root)
        for directory in staging.control_dirs():
            private_mkdir(directory)
        for name, source in seeds.items():
            assert name in SEED_NAMES, name
            if isinstance(source, bytes):
                atomic_write(staging.root / name, source)
                continue
            # A file inside the home (a run's own copy) is never followed through a symlink
            # someone planted there; a path the caller gave is the caller's to choose.
            copy = copy_session if name == "session.jsonl" else copy_private  # a fork: checked, filtered
            copy(source, staging.root / name, follow=not _inside(source, self.home.root))
        lock_fd = try_lock(staging.runner_lock)
        assert lock_fd is not None, "a fresh run's lock cannot be held"
        try:
            live_index.add(self.home, manifest.run_id)  # before the run is visible
            atomic_write(staging.manifest, encode_pretty(manifest))
            atomic_write(staging.placement, encode_pretty(first_placement(manifest)), durable=False)
            status = Status(
                v=1,
                run_id=manifest.run_id,
                state=RunState.STARTING,
                agent=manifest.agent.name,
                runner=manifest.agent.runner,
                host=host_name(),
                started_at=manifest.created_at,
                updated_at=manifest.created_at,
                parent_run_id=manifest.parent_run_id,
                root_run_id=manifest.root_run_id,
                key=manifest.key,
                depth=manifest.depth,
                label=manifest.label,
                task=task_head(manifest.task),
                cwd=manifest.cwd,
                group=manifest.queue.group if manifest.queue is not None else None,
                mission_id=manifest.workflow.mission_id if manifest.workflow is not None else None,
            )
            atomic_write(staging.status, encode_pretty(status))
            append_event(staging, "run.created", agent=manifest.agent.name, pid=os.getpid(), sync=True)
            fsync_dir(staging.root)
            os.rename(staging.root, final.root)
            fsync_dir(self.home.runs)
        except BaseException:
            os.close(lock_fd)
            live_index.remove(self.home, manifest.run_id)
            raise
        return final, lock_fd

    def ids(self) -> list[str]:
        """Every run under the home (unordered): entries named by a run id that are real
        directories (a symlink named like a run is never followed; see :meth:`strays`)."""
        return self.entries()[0]

    def strays(self) -> list[str]:
        """Entries of ``runs/`` named like a run that are not directories (symlinks, files, ...)."""
        return self.entries()[1]

    def entries(self) -> tuple[list[str], list[str]]:
        """:meth:`ids` and :meth:`strays` from one listing of ``runs/``."""
        entries = self._entries()
        return [name for name, real in entries if real], [name for name, real in entries if not real]

    def _entries(self) -> list[tuple[str, bool]]:
        try:
            with os.scandir(self.home.runs) as it:
                return [(e.name, _is_real_dir(e)) for e in it if is_run_id(e.name)]
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise storage_error(exc, "list", self.home.runs) from exc

    def resolve(self, ref: str) -> RunPaths:
        """The run that ``ref`` names: an id, a unique prefix of at least
        :data:`~pisub.defaults.MIN_PREFIX` characters, or ``@LABEL`` (the one run with that label).

        Raises:
            InvalidInput: ``ref`` is not an id, prefix or ``@LABEL`` (checked before any disk access).
            RunNotFound: nothing matches.
            AmbiguousRun: several runs match; the one-line message lists them.
        """
        norm = validate_run_ref(ref)
        if norm.startswith(LABEL_REF):
            return self._by_label(norm[len(LABEL_REF) :])
        if is_run_id(norm):
            paths = self.home.run(norm)
            try:
                mode = os.lstat(paths.root).st_mode
            except OSError:
                raise RunNotFound(f"no run {norm} in {self.home.runs}") from None
            if not stat.S_ISDIR(mode):
                raise RunNotFound(f"{paths.root} is a {file_kind(mode)}, not a run directory")
            return paths
        matches = sorted(i for i in self.ids() if i.startswith(norm))
        if not matches:
            raise RunNotFound(f"no run matches {norm!r} in {self.home.runs}")
        if len(matches) > 1:
            raise AmbiguousRun(
                f"{norm!r} matches {len(matches)} runs: {self._candidates(matches)}; give more characters"
            )
        return self.home.run(matches[0])

    def _by_label(self, label: str) -> RunPaths:
        matches = sorted(i for i in self.ids() if self._label_of(i) == label)
        if not matches:
            raise RunNotFound(f"no run is labelled {label!r} in {self.home.runs}")
        if len(matches) > 1:
            raise AmbiguousRun(
                f"{len(matches)} runs are labelled {label!r}: {self._candidates(matches)}; give a run id"
            )
        return self.home.run(matches[0])

    def _status_of(self, run_id: str) -> Status | None:
        try:
            return load_status(self.home.run(run_id))
        except (PisubError, OSError):
            return None

    def _label_of(self, run_id: str) -> str | None:
        status = self._status_of(run_id)
        return status.label if status is not None else None

    def _candidates(self, run_ids: list[str]) -> str:
        """The runs ``run_ids`` in one line, each with its agent, state and label (at most
        :data:`CANDIDATES`)."""
        from pisub.termsafe import printable

        shown = []
        for run_id in run_ids[:CANDIDATES]:
            status = self._status_of(run_id)
            what = f"{status.agent}, {status.state}" if status is not None else "unreadable"
            if status is not None and status.label:
                what += f", @{status.label}"
            shown.append(f"{run_id} ({printable(what, one_line=True)})")
        more = f" and {len(run_ids) - CANDIDATES} more" if len(run_ids) > CANDIDATES else ""
        return ", ".join(shown) + more


CANDIDATES = 10
"""How many runs an ambiguous reference lists."""


def _unencodable(manifest: Manifest, exc: Exception) -> PisubError:
    """The error of a manifest a file cannot hold: the field whose text is not UTF-8 (a lone
    surrogate: an undecodable byte of a path or argument)."""
    import msgspec

    from pisub.protocol.json_words import first_not_utf8
    from pisub.termsafe import printable

    found = first_not_utf8(msgspec.to_builtins(manifest))
    if found is None:
        return InvalidInput(f"the launch holds text that is not valid UTF-8 (a lone surrogate): {exc}")
    where, value = found
    return InvalidInput(
        f"{printable(value, one_line=True)} is not valid UTF-8 text, so no run file can hold it "
        f"- at `{where}`"
    )


def load_manifest(paths: RunPaths) -> Manifest:
    """The run's manifest.

    Raises:
        RunNotFound: the run's folder is gone.
        ProtocolError: the manifest is unreadable, malformed, or missing from a folder that is
            there (a run appears whole, its manifest first: someone removed it).
    """
    from pisub.protocol.manifest import Manifest

    try:
        return _load(paths.manifest, Manifest)
    except RunNotFound:
        if not os.path.lexists(paths.root):
            raise
        if not os.path.lexists(paths.status):
            load_status(paths)  # (an empty folder: named as the status names it, never "removed since")
        raise ProtocolError(
            f"{paths.manifest} is missing: the run's folder is damaged (a run appears with its "
            "manifest, so it was removed since); its status and result can still be read, and "
            "`pisub gc` removes it once it has ended"
        ) from None


def load_status(paths: RunPaths) -> Status:
    """The run's status.

    Raises:
        RunNotFound: the run's folder is gone.
        ProtocolError: the status is unreadable, malformed, or missing from a folder that is
            there (a run appears with its status: someone removed it, or made the folder).
    """
    try:
        return _load(paths.status, Status)
    except RunNotFound:
        if not os.path.lexists(paths.root):
            raise
        raise ProtocolError(
            f"{paths.status} is missing: the run's folder is damaged (a run appears with its "
            "status, so it was removed since, or the folder was made by hand); pisub never "
            "removes it: look inside, and remove it yourself"
        ) from None


def status_lost(paths: RunPaths) -> bool:
    """Whether the run's folder is there without its status and no runner of it is left to
    write one again: nothing will ever say how it ended (a follower settles it as failed)."""
    from pisub.core.locks import is_held

    return os.path.isdir(paths.root) and not os.path.lexists(paths.status) and not is_held(paths.runner_lock)


def load_result(paths: RunPaths) -> Result | None:
    """The run's result, or None while it has none."""
    try:
        return _load(paths.result, Result)
    except RunNotFound:
        return None


def first_placement(manifest: Manifest) -> Placement:
    """The placement a run is created with: its backend and the launcher's identity (the
    engine's job id comes once the engine accepted the job)."""
    from pisub.core.procs import boot_id, host_name

    backend = manifest.placement.backend if manifest.placement is not None else BackendName.LOCAL
    return Placement(
        v=1,
        backend=backend,
        launcher_host=host_name(),
        launcher_boot_id=boot_id(),
        job_name=f"pisub-{manifest.run_id}" if backend != BackendName.LOCAL else None,
    )


def load_placement(paths: RunPaths) -> Placement:
    """Where the run's runner lives; ``local`` on this host for a run made before placements
    existed.

    Raises:
        ProtocolError: the file is unreadable or malformed.
    """
    try:
        return load_json(paths.placement, Placement, limit=MAX_FILE)
    except FileNotFoundError:
        from pisub.core.procs import host_name

        return Placement(v=1, backend=BackendName.LOCAL, launcher_host=host_name())


def write_placement(paths: RunPaths, placement: Placement) -> None:
    atomic_write(paths.placement, encode_pretty(placement))


def load_heartbeat(paths: RunPaths) -> tuple[Heartbeat, float] | None:
    """The runner's heartbeat lease and its mtime (the file server's clock); None when there is
    none. The name is looked up in a fresh listing of the run directory: on shared storage a
    by-name lookup can be answered "absent" from a stale negative cache.

    Raises:
        ProtocolError: the entry is not a readable lease (garbage, a FIFO, a symlink, a directory).
    """
    try:
        if paths.heartbeat.name not in os.listdir(paths.root):
            return None
    except OSError as exc:
        raise ProtocolError(f"{paths.root}: cannot be listed: {exc.strerror or exc}") from exc
    try:
        beat = load_json(paths.heartbeat, Heartbeat, limit=64 * 1024)
        return beat, os.stat(paths.heartbeat, follow_symlinks=False).st_mtime
    except FileNotFoundError:
        return None


def write_heartbeat(paths: RunPaths, beat: Heartbeat) -> None:
    atomic_write(paths.heartbeat, encode_pretty(beat), durable=False)


def _load(path: Path, type_: type[T]) -> T:
    try:
        return load_json(path, type_, limit=MAX_FILE)
    except FileNotFoundError as exc:
        raise RunNotFound(f"{path} does not exist") from exc


def write_status(paths: RunPaths, status: Status, *, durable: bool = True) -> None:
    """Replace ``status.json`` (its free texts redacted: it is read outside the run)."""
    from pisub.core.redact import scrub

    fencing.check()
    atomic_write(paths.status, encode_pretty(scrub(status)), durable=durable, fence=fencing.check)
    if status.state.is_terminal:
        live_index.remove(paths.home, paths.run_id)  # after: the index may only name too many


def write_result(paths: RunPaths, result: Result) -> None:
    fencing.check()
    atomic_write(paths.result, encode_pretty(result), fence=fencing.check)


def append_event(
    paths: RunPaths,
    type_: str,
    child: int | None = None,
    *,
    sync: bool = False,
    repair: bool = False,
    **data: object,
) -> None:
    """Append one event (for writers that append rarely; the runner keeps its own appender).
    ``repair``: into ``events.repair.jsonl``, the repairer's own file (on shared storage an
    ``O_APPEND`` from two hosts is not atomic: each file keeps one writer)."""
    appender = JsonlAppender(paths.repair_events if repair else paths.events)
    try:
        appender.append(encode(Event(v=1, ts=now_iso(), type=type_, child=child, data=data)))
        if sync:
            appender.sync()
    finally:
        appender.close()


def read_events(paths: RunPaths, limit: int = MAX_FILE) -> list[Event]:
    """The run's events: ``events.jsonl`` and the repairer's ``events.repair.jsonl`` merged by
    time (a line that is not an event — a torn last line — is skipped)."""
    import msgspec

    events: list[Event] = []
    for path in (paths.events, paths.repair_events):
        try:
            data = read_bytes(path, limit=limit)
        except OSError:
            continue  # none yet, or not a regular file (never followed through a symlink)
        for line in data[:limit].splitlines():
            try:
                events.append(msgspec.json.decode(line, type=Event))
            except (msgspec.ValidationError, msgspec.DecodeError):
                continue
    return sorted(events, key=lambda e: e.ts)


def _inside(path: Path, root: Path) -> bool:
    return os.path.abspath(path).startswith(os.path.abspath(root) + os.sep)


def copy_private(source: Path, dest: Path, *, follow: bool = True) -> None:
    """Copy the regular file ``source`` to a new 0600 file ``dest`` (synced); without
    ``follow`` a symlink at ``source`` is refused (``ELOOP``)."""
    flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | (0 if follow else os.O_NOFOLLOW)
    src_fd = os.open(source, flags)
    try:
        if not stat.S_ISREG(os.fstat(src_fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(source))
        dst_fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            while chunk := os.read(src_fd, 1 << 20):
                write_all(dst_fd, chunk)
            os.fsync(dst_fd)
        finally:
            os.close(dst_fd)
    finally:
        os.close(src_fd)


def _is_real_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir(follow_symlinks=False)
    except OSError:
        return False


TASK_HEAD = 120
"""How much of a task a run's status carries (its first line)."""


def task_head(task: str) -> str:
    """The first non-blank line of ``task``, redacted, cut to :data:`TASK_HEAD` characters."""
    from pisub.core.redact import redact

    line = next((ln.strip() for ln in task.splitlines() if ln.strip()), "")
    line = redact(line)
    return line if len(line) <= TASK_HEAD else line[: TASK_HEAD - 1] + "…"
