"""Runs on disk: create a run directory atomically, resolve ids, load its files.

A run directory is built under ``runs/.creating-<id>`` and renamed into place only
when its manifest and first status exist, so a reader never sees half a run.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import TypeVar

from pisub.errors import AmbiguousRun, HomeUnusable, ProtocolError, RunNotFound
from pisub.fsio import JsonlAppender, atomic_write, fsync_dir, private_mkdir, read_bytes
from pisub.locks import try_lock
from pisub.paths import Home, RunPaths, is_run_id, validate_run_ref
from pisub.procs import host_name
from pisub.protocol.codec import decode, encode, encode_pretty, now_iso
from pisub.protocol.events import Event
from pisub.protocol.manifest import Manifest
from pisub.protocol.result import Result
from pisub.protocol.status import RunState, Status

T = TypeVar("T")

MAX_FILE = 16 * 1024 * 1024
"""Largest run file a reader decodes."""


class RunStore:
    """Create, find and read runs under a home."""

    def __init__(self, home: Home) -> None:
        self.home = home

    def create(self, manifest: Manifest) -> tuple[RunPaths, int]:
        """Create the run directory of ``manifest`` with a ``starting`` status.

        Returns the run's paths and an fd holding ``runner.lock``: the launcher hands
        it to the runner, so the lock is held from the moment the run exists.
        """
        final = self.home.run(manifest.run_id)
        staging = RunPaths(self.home.runs / f".creating-{manifest.run_id}")
        try:
            return self._create(manifest, staging, final)
        except OSError as exc:
            shutil.rmtree(staging.root, ignore_errors=True)
            raise HomeUnusable(f"cannot create a run in {self.home.runs}: {exc.strerror or exc}") from exc

    def _create(self, manifest: Manifest, staging: RunPaths, final: RunPaths) -> tuple[RunPaths, int]:
        private_mkdir(staging.root)
        for directory in staging.control_dirs():
            private_mkdir(directory)
        lock_fd = try_lock(staging.runner_lock)
        assert lock_fd is not None, "a fresh run's lock cannot be held"
        try:
            atomic_write(staging.manifest, encode_pretty(manifest))
            status = Status(
                v=1,
                run_id=manifest.run_id,
                state=RunState.STARTING,
                agent=manifest.agent.name,
                runner=manifest.agent.runner,
                host=host_name(),
                started_at=manifest.created_at,
                updated_at=manifest.created_at,
            )
            atomic_write(staging.status, encode_pretty(status))
            append_event(staging, "run.created", agent=manifest.agent.name, pid=os.getpid(), sync=True)
            fsync_dir(staging.root)
            os.rename(staging.root, final.root)
            fsync_dir(self.home.runs)
        except BaseException:
            os.close(lock_fd)
            raise
        return final, lock_fd

    def ids(self) -> list[str]:
        """Every run id under the home (unordered)."""
        try:
            return [name for name in os.listdir(self.home.runs) if is_run_id(name)]
        except FileNotFoundError:
            return []

    def resolve(self, ref: str) -> RunPaths:
        """The run that ``ref`` (an id or a unique prefix of at least 8 characters) names.

        Raises:
            InvalidInput: ``ref`` is not an id or prefix (checked before any disk access).
            RunNotFound: nothing matches.
            AmbiguousRun: several runs match; the message lists them.
        """
        norm = validate_run_ref(ref)
        if is_run_id(norm):
            paths = self.home.run(norm)
            if paths.root.is_dir():
                return paths
            raise RunNotFound(f"no run {norm} in {self.home.runs}")
        matches = sorted(i for i in self.ids() if i.startswith(norm))
        if not matches:
            raise RunNotFound(f"no run matches {norm!r} in {self.home.runs}")
        if len(matches) > 1:
            raise AmbiguousRun(f"{norm!r} matches {len(matches)} runs: {', '.join(matches)}")
        return self.home.run(matches[0])


def load_manifest(paths: RunPaths) -> Manifest:
    return _load(paths.manifest, Manifest)


def load_status(paths: RunPaths) -> Status:
    return _load(paths.status, Status)


def load_result(paths: RunPaths) -> Result | None:
    """The run's result, or None while it has none."""
    try:
        return _load(paths.result, Result)
    except RunNotFound:
        return None


def _load(path: Path, type_: type[T]) -> T:
    try:
        data = read_bytes(path, limit=MAX_FILE)
    except FileNotFoundError as exc:
        raise RunNotFound(f"{path} does not exist") from exc
    except OSError as exc:
        raise ProtocolError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    if len(data) > MAX_FILE:
        raise ProtocolError(f"{path}: larger than {MAX_FILE} bytes")
    return decode(data, type_, str(path))


def write_status(paths: RunPaths, status: Status, *, durable: bool = True) -> None:
    atomic_write(paths.status, encode_pretty(status), durable=durable)


def write_result(paths: RunPaths, result: Result) -> None:
    atomic_write(paths.result, encode_pretty(result))


def append_event(
    paths: RunPaths, type_: str, child: int | None = None, *, sync: bool = False, **data: object
) -> None:
    """Append one event (for writers that append rarely; the runner keeps its own appender)."""
    appender = JsonlAppender(paths.events)
    try:
        appender.append(encode(Event(v=1, ts=now_iso(), type=type_, child=child, data=data)))
        if sync:
            appender.sync()
    finally:
        appender.close()
