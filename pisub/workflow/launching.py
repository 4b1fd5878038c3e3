"""Starting a workflow's queued children, up to its concurrency: every start is journaled
(durably) before the child's run is created, in a launch thread that places the child
(:meth:`~pisub.workflow.placement.Placement.place`) and waits for its runner's commit; a child
re-attached to a run that exists is watched again.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from pisub.errors import PisubError
from pisub.protocol.codec import now_iso
from pisub.protocol.manifest import Manifest
from pisub.protocol.status import StepState
from pisub.workflow import outcomes
from pisub.workflow.entries import ChildEntry, ChildTable, Phase
from pisub.workflow.placement import Placement
from pisub.workflow.settling import Settling
from pisub.workflow.stopping import Stopping

LAUNCH_THREADS = 4
"""Child runners started at once (each start waits for the runner's commit)."""


def _launch_threads() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=LAUNCH_THREADS, thread_name_prefix="launch")


@dataclass(eq=False)
class Launching:
    """Starts a workflow's children."""

    table: ChildTable
    placement: Placement
    settling: Settling
    stopping: Stopping
    launcher: ThreadPoolExecutor = field(default_factory=_launch_threads, init=False)

    def launch_waiting(self) -> None:
        """Start queued children, first in line first, while the workflow's concurrency allows
        and it is not ending."""
        with self.table.lock:
            active = sum(1 for e in self.table.entries if e.phase in (Phase.STARTING, Phase.RUNNING))
            while self.table.waiting and active < self.table.spec.concurrency and self.table.ending is None:
                entry = self.table.waiting.popleft()
                if entry.phase is Phase.QUEUED:
                    self._launch(entry)
                    active += 1

    def _launch(self, entry: ChildEntry) -> None:
        assert entry.manifest is not None
        run_id = entry.manifest.run_id
        try:
            self.table.journal.started(entry.key, entry.fingerprint, run_id)
        except OSError as exc:
            self.table.host.trouble("append to the journal", exc)
            self.settling.settle(
                entry,
                outcomes.failure(entry.key, entry.call, f"cannot journal the start: {exc.strerror or exc}"),
                settled=True,
                journal=False,
            )
            return
        entry.phase = Phase.STARTING
        entry.run_id = run_id
        entry.step.run_id = run_id
        entry.step.status = StepState.PENDING
        entry.step.started_at = now_iso()
        self.table.by_run[run_id] = entry
        self.table.host.touch()
        self.launcher.submit(self._start_child, entry, entry.manifest, dict(entry.seeds))

    def _start_child(self, entry: ChildEntry, manifest: Manifest, seeds: dict[str, Path]) -> None:
        """In a launch thread: create the child's run and wait for its runner's commit."""
        from pisub.runs.launch import start_run

        error: str | None = None
        try:
            manifest = self.placement.place(entry, manifest)
            start_run(self.table.home, manifest, seeds=seeds, claimed=True)  # claimed at admission
        except PisubError as exc:
            error = exc.message
        except Exception as exc:  # reported as the child's failure, never lost in this thread
            error = f"{type(exc).__name__}: {exc}"
        self.table.host.post(lambda: self._launched(entry, error))

    def _launched(self, entry: ChildEntry, error: str | None) -> None:
        assert entry.run_id is not None
        exists = self.table.home.run(entry.run_id).root.is_dir()
        if exists:
            try:
                self.table.journal.created(entry.key, entry.run_id)
            except OSError as exc:  # a resume then re-attaches it while its run is there
                self.table.host.trouble("append to the journal", exc)
        if error is not None and not exists:
            self.settling.settle(
                entry, outcomes.failure(entry.key, entry.call, error, run_id=entry.run_id), settled=True
            )
            return
        entry.phase = Phase.RUNNING
        entry.step.status = StepState.RUNNING
        self.table.host.event("child.started", entry.index, key=entry.key, runId=entry.run_id)
        self.table.watch.add(entry.run_id, self.table.home.run(entry.run_id).root)
        self.settling.forwarding.release_held(entry)
        if self.table.ending is not None:
            self.stopping.stop_child(entry)
        self.settling.check_one(entry)
        self.table.host.touch()

    def attached(self, entry: ChildEntry) -> None:
        """Watch ``entry`` again: a child re-attached to its run that exists (a resumed workflow)."""
        assert entry.run_id is not None
        self.table.host.event("workflow.reattached", entry.index, key=entry.key, runId=entry.run_id)
        self.table.watch.add(entry.run_id, self.table.home.run(entry.run_id).root)
        if self.table.ending is not None:
            self.stopping.stop_child(entry)
        self.settling.check_one(entry)

    def close(self) -> None:
        """Start no more children (a start under way goes on in its thread)."""
        self.launcher.shutdown(wait=False, cancel_futures=True)
