"""Watching a workflow's running children and settling their ends: each check mirrors a
child's progress into the workflow's ``steps[]`` and passes on its receipts; its end is
journaled, counted in the usage budget and handed to the script. A child whose run never
started its child is started again as a new run (up to :data:`MAX_RELAUNCHES` times).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pisub.errors import PisubError, RunNotFound
from pisub.protocol.codec import now_iso
from pisub.protocol.manifest import Manifest
from pisub.protocol.status import RepairCause, RunState, Status, StepState
from pisub.protocol.workflow import ChildResult
from pisub.store.runs import load_result, status_lost
from pisub.store.spawn_budget import claim_name
from pisub.workflow import outcomes
from pisub.workflow.entries import ChildEntry, ChildTable, Phase, step_state
from pisub.workflow.forwarding import Forwarding
from pisub.workflow.placement import Placement

if TYPE_CHECKING:
    from pisub.workflow.futures import ChildFuture

MAX_RELAUNCHES = 3
"""How many times one coordinator starts a key again whose run never started its child."""


@dataclass
class _Batch:
    """Ends settled together on the control loop: journaled with one fsync, then handed to the
    script, and the workflow's status written once."""

    thread: int
    """The loop's thread (a settle from another thread, the script's, is not batched)."""
    ends: list[tuple[ChildEntry, ChildResult]] = field(default_factory=list)


@dataclass(eq=False)
class Settling:
    """Watches a workflow's children and settles their ends."""

    table: ChildTable
    placement: Placement
    forwarding: Forwarding
    next_poll: float = field(default=0.0, init=False)
    """When every running child is looked at again (its inotify watch may miss a change)."""
    _batch: _Batch | None = field(default=None, init=False)

    @property
    def batching(self) -> bool:
        """Whether this thread is inside :meth:`batch` (journal entries wait for its fsync)."""
        return self._batch is not None and self._batch.thread == threading.get_ident()

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Settle the ends found in the body together (on the control loop): each is journaled
        at once but made durable by one fsync when the body is done, and only then handed to
        the script (its future resolved); the workflow's status is written once. A fan-out
        whose children end together (a stop) is recorded without an fsync per child."""
        if self._batch is not None:
            yield  # nested: the outer batch settles
            return
        self._batch = _Batch(threading.get_ident())
        try:
            yield
        finally:
            batch, self._batch = self._batch, None
            self._flush(batch)

    def _flush(self, batch: _Batch) -> None:
        try:
            self.table.journal.sync()
        except OSError as exc:  # a resume then takes the results from the children's runs
            self.table.host.trouble("append to the journal", exc)
        for entry, outcome in batch.ends:
            for future, loop in entry.futures:
                _resolve(future, loop, outcome)
        if batch.ends:
            self.table.host.commit()

    def check(self, now: float) -> None:
        """Look at the children whose runs changed, or at every running one when a poll is due
        (only their new receipts for those whose outboxes alone changed); the ends found are
        settled as one :meth:`batch`."""
        changed, receipts = self.table.watch.changed()
        due = now >= self.next_poll
        if due:
            self.next_poll = now + self.table.watch.poll_interval
        with self.table.lock:
            running = [e for e in self.table.entries if e.phase is Phase.RUNNING]
        with self.batch():
            for entry in running:
                if due or entry.run_id in changed:
                    self.check_one(entry)
                elif entry.run_id in receipts and entry.run_id is not None:
                    self.forwarding.pass_receipts(entry, self.table.home.run(entry.run_id))  # only new ones

    def check_one(self, entry: ChildEntry) -> None:
        """Look at a running child: mirror its progress, pass on its receipts, settle its end."""
        from pisub.runs.reconcile import observe

        assert entry.run_id is not None
        paths = self.table.home.run(entry.run_id)
        try:
            status = observe(paths)
        except RunNotFound:
            self.settle(
                entry,
                outcomes.failure(
                    entry.key, entry.call, "the child's run directory disappeared", run_id=entry.run_id
                ),
                settled=True,
            )
            return
        except PisubError as exc:
            if status_lost(paths):
                failure = outcomes.failure(entry.key, entry.call, exc.message, run_id=entry.run_id)
                self.settle(entry, failure, settled=True)
                return
            self.table.host.trouble("read a child's status", OSError(0, exc.message))
            return
        self._mirror(entry, status)
        self.forwarding.pass_receipts(entry, paths)
        if not status.state.is_terminal:
            return
        if status.repaired is RepairCause.NEVER_STARTED and status.state is RunState.FAILED:
            self._never_ran(entry, status)
            return
        try:
            result = load_result(paths)
        except PisubError as exc:
            result = None
            why = exc.message
        else:
            why = "the child ended without a result"
        if result is None:
            outcome = outcomes.failure(entry.key, entry.call, why, run_id=entry.run_id)
        else:
            outcome = outcomes.from_result(entry.key, entry.call, entry.run_id, result)
            outcome = outcomes.save_output(outcome, entry.call, entry.cwd, self.table.manifest.umask)
        self.settle(
            entry, outcome, settled=not (entry.ended_by_workflow and outcome.state in ("stopped", "paused"))
        )

    def _never_ran(self, entry: ChildEntry, status: Status) -> None:
        """``entry``'s run ended before its runner's startup commit (its launcher died while
        launching it, or the runner could not start): its child never started, so this is not
        the key's result. The key is started again as a new run — journaled before it is
        created, by the one coordinator holding the journal — up to :data:`MAX_RELAUNCHES`
        times; after that, or while the workflow ends, it ends unsettled (a resume starts it)
        and the workflow cannot end ``complete``."""
        old = entry.run_id
        why = status.error.message if status.error is not None else "its child never started"
        if self.table.ending is None and entry.relaunches < MAX_RELAUNCHES:
            try:
                manifest, seeds = self.placement.plan_start(entry.call, entry.cwd, f"key {entry.key!r}")
            except PisubError as exc:
                why = exc.message
            else:
                self._relaunch(entry, manifest, seeds)
                self.table.host.event(
                    "child.relaunched", entry.index, key=entry.key, runId=old, newRunId=manifest.run_id
                )
                return
        entry.never_ran = True
        outcome = outcomes.failure(entry.key, entry.call, f"the child never started: {why}", run_id=old)
        self.settle(entry, outcome, settled=False)

    def _relaunch(self, entry: ChildEntry, manifest: Manifest, seeds: dict[str, Path]) -> None:
        """Queue ``entry`` again (first in line) to start as the new run of ``manifest``."""
        old = entry.run_id
        if old is not None:
            self.table.watch.remove(old)
        with self.table.lock:
            if old is not None:
                self.table.by_run.pop(old, None)
            entry.relaunches += 1
            entry.manifest, entry.seeds = manifest, seeds
            entry.phase = Phase.QUEUED
            entry.run_id = None
            step = entry.step
            step.status, step.run_id, step.pid, step.started_at = StepState.QUEUED, None, None, None
            self.table.waiting.appendleft(entry)
        self.table.host.touch()

    def _mirror(self, entry: ChildEntry, status: Any) -> None:
        step = entry.step
        step.pid = status.pid
        step.pid_start_time = status.pid_start_time
        step.pid_start_ticks = status.pid_start_ticks
        step.started_at = step.started_at or status.started_at
        if status.steps:
            child = status.steps[0]
            step.turn_count, step.tool_count = child.turn_count, child.tool_count
            step.current_tool = child.current_tool
            step.last_activity_at = child.last_activity_at
            step.output_bytes = child.output_bytes
            step.output_truncated = child.output_truncated
            step.recent_output = child.recent_output[-5:]
        self.table.host.touch()

    def settle(self, entry: ChildEntry, outcome: ChildResult, *, settled: bool, journal: bool = True) -> None:
        """A child's end: journaled, shown, handed to the script, its slot freed (in a
        :meth:`batch`, the journal's fsync and the hand-over wait for the batch's end)."""
        batched = self.batching
        with self.table.lock:
            if entry.phase is Phase.ENDED:
                return
            entry.phase = Phase.ENDED
            entry.result = outcome
        if journal:
            try:
                self.table.journal.ended(
                    entry.key, entry.fingerprint, entry.run_id, outcome, settled=settled, sync=not batched
                )
            except OSError as exc:  # a resume then takes the result from the child's run
                self.table.host.trouble("append to the journal", exc)
        step = entry.step
        step.status = step_state(outcome.state)
        step.exit_code = outcome.exit_code
        step.ended_at = now_iso()
        step.current_tool = None
        if entry.run_id is not None:
            self.table.watch.remove(entry.run_id)
        self._count_usage(entry, outcome)
        self.table.host.event(
            "child.settled",
            entry.index,
            key=entry.key,
            runId=entry.run_id,
            state=outcome.state,
            settled=settled,
        )
        self.forwarding.fail_forwards(entry, outcome)
        if batched:
            assert self._batch is not None
            self._batch.ends.append((entry, outcome))
            return
        for future, loop in entry.futures:
            _resolve(future, loop, outcome)
        self.table.host.commit()

    def _count_usage(self, entry: ChildEntry, outcome: ChildResult) -> None:
        """The child's usage counted in the tree's usage budget, its reservation given back."""
        try:
            if not self.table.usage.active():
                return
            name = claim_name(self.table.spec.journal, entry.key)
            self.table.usage.settle(name, outcome.usage if entry.run_id is not None else None)
            totals = self.table.usage.totals()
        except PisubError as exc:
            self.table.host.trouble("count the usage budget", OSError(0, exc.message))
            return
        if totals is not None:
            self.table.host.usage(totals)

    def never_started(self, entry: ChildEntry, why: str, state: str = "stopped") -> None:
        """``entry`` ends without its child ever starting (not journaled: a resume starts it)."""
        self.settle(
            entry, outcomes.not_started(entry.key, entry.call, state, why), settled=False, journal=False
        )


def _resolve(future: ChildFuture, loop: asyncio.AbstractEventLoop, outcome: ChildResult) -> None:
    from pisub.workflow.futures import call_soon

    def deliver() -> None:
        if not future.done():
            future.set_result(outcome)

    call_soon(loop, deliver)
