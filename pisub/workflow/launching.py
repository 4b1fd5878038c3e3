"""Starting a workflow's queued children, up to its concurrency: every start is journaled
(durably) before the child's run is created, in a launch thread that places the child
(:meth:`~pisub.workflow.placement.Placement.place`) and waits for its runner's commit; a child
re-attached to a run that exists is watched again.

The starts of one look at the queue are journaled together (one fsync for all, before any of
their runs is created), then each is started in a thread of its own: as many starts are under
way at once as the workflow's concurrency allows (up to :func:`launch_threads`, what the machine
takes), none waiting for another child's commit.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from pisub.errors import PisubError
from pisub.protocol.codec import now_iso
from pisub.protocol.manifest import Manifest
from pisub.protocol.status import StepState
from pisub.protocol.workflow import Shape
from pisub.workflow import outcomes
from pisub.workflow.entries import ChildEntry, ChildTable, Phase
from pisub.workflow.placement import Placement
from pisub.workflow.settling import Settling
from pisub.workflow.stopping import Stopping

if TYPE_CHECKING:
    from pisub.backends.zygote import Zygote

ZYGOTE_FROM = 2
"""Children started at once from which a workflow starts its zygote (:mod:`pisub.backends.zygote`)."""

ENV_ZYGOTE = "PISUB_ZYGOTE"
"""``0``: no zygote (each child's runner is started as any run's: for measuring it)."""

STARTS_PER_CPU = 32
"""Child starts under way at once per CPU, at most (each start's thread mostly waits: for the
run's fsyncs and its runner's commit)."""


def launch_threads(concurrency: int) -> int:
    """How many children of a workflow of ``concurrency`` start at once: as many as may run,
    bounded by the machine (:data:`STARTS_PER_CPU` per CPU this process may use)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(1, min(concurrency, STARTS_PER_CPU * max(cpus, 1)))


@dataclass(eq=False)
class Launching:
    """Starts a workflow's children."""

    table: ChildTable
    placement: Placement
    settling: Settling
    stopping: Stopping
    launcher: ThreadPoolExecutor = field(init=False)
    zygote: Zygote | None = field(init=False, default=None)
    """The fork server of this workflow's warm runners (:mod:`pisub.backends.zygote`), started
    with its first start of more than one child at once; None until then, or without one."""
    zygote_tried: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        self.launcher = ThreadPoolExecutor(
            max_workers=launch_threads(self.table.spec.concurrency), thread_name_prefix="launch"
        )

    def prestart_zygote(self) -> None:
        """Before the workflow's startup commit: start the zygote now (its imports overlap the
        coordinator's own start) when the workflow will start more than one child — a script,
        lanes, or two tasks or more."""
        spec = self.table.spec
        if spec.concurrency >= ZYGOTE_FROM and (
            spec.shape in (Shape.WORKFLOW, Shape.LANES) or len(spec.tasks) >= ZYGOTE_FROM
        ):
            self._start_zygote(ZYGOTE_FROM)

    def _start_zygote(self, starting: int) -> None:
        """On the control loop (one thread, before the starts are handed to launch threads):
        start the zygote when ``starting`` children start at once (one child's start costs one
        interpreter either way), unless warm runners are off (``PISUB_WARM=0``)."""
        if self.zygote_tried or starting < ZYGOTE_FROM:
            return
        self.zygote_tried = True
        from pisub.backends import warm

        if warm.enabled() and os.environ.get(ENV_ZYGOTE, "") != "0":
            from pisub.backends.zygote import Zygote

            self.zygote = Zygote.start()

    def _warm_from_zygote(self, manifest: Manifest) -> None:
        """In a launch thread: a warm runner forked by the zygote for this start (a local run),
        put in this process's pool where the start takes it (nothing when there is no zygote:
        the start makes its runner as ever)."""
        from pisub.protocol.placement import BackendName, PlacementRequest

        zygote = self.zygote
        if zygote is None or (manifest.placement or PlacementRequest()).backend != BackendName.LOCAL:
            return
        made = zygote.make()
        if made is not None:
            from pisub.backends import warm

            warm.offer(made)  # type: ignore[arg-type]

    def launch_waiting(self) -> None:
        """Start queued children, first in line first, while the workflow's concurrency allows
        and it is not ending: their starts journaled with one fsync, then each started in a
        thread of its own."""
        with self.table.lock:
            active = sum(1 for e in self.table.entries if e.phase in (Phase.STARTING, Phase.RUNNING))
            journaled: list[ChildEntry] = []
            while self.table.waiting and active < self.table.spec.concurrency and self.table.ending is None:
                entry = self.table.waiting.popleft()
                if entry.phase is Phase.QUEUED and self._journal_start(entry):
                    journaled.append(entry)
                    active += 1
            if not journaled:
                return
            self._start_zygote(len(journaled))
            try:
                self.table.journal.sync()  # durable before any of their runs is created
            except OSError as exc:
                for entry in journaled:
                    self._unjournaled(entry, exc)
                return
            for entry in journaled:
                self._launch(entry)

    def _journal_start(self, entry: ChildEntry) -> bool:
        """Append ``entry``'s start to the journal (made durable by the caller); False when it
        cannot be (the child then fails)."""
        assert entry.manifest is not None
        try:
            self.table.journal.started(entry.key, entry.fingerprint, entry.manifest.run_id, sync=False)
        except OSError as exc:
            self._unjournaled(entry, exc)
            return False
        return True

    def _unjournaled(self, entry: ChildEntry, exc: OSError) -> None:
        self.table.host.trouble("append to the journal", exc)
        self.settling.settle(
            entry,
            outcomes.failure(entry.key, entry.call, f"cannot journal the start: {exc.strerror or exc}"),
            settled=True,
            journal=False,
        )

    def _launch(self, entry: ChildEntry) -> None:
        """Start ``entry``, its start journaled durably: in a launch thread of its own."""
        assert entry.manifest is not None
        run_id = entry.manifest.run_id
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
            self._warm_from_zygote(manifest)
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
            try:  # in the loop's batch: durable with the batch's one fsync
                self.table.journal.created(entry.key, entry.run_id, sync=not self.settling.batching)
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
        self.dismiss_zygote()

    def dismiss_zygote(self) -> None:
        """End the zygote (no child starts any more; a start under way falls back to the
        ordinary start)."""
        if self.zygote is not None:
            self.zygote.dismiss()
