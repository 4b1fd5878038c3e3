"""The skeleton every run mode shares: what a detached runner does the same way around
whatever it runs.

:class:`RunShell` takes the signals (SIGTERM/SIGINT end the run, SIGUSR1 is the doorbell of a
waiting control request), commits the startup (``running``, with the runner's identity) before
anything runs and answers the launcher, watches and scans the inbox, runs one control loop over
one selector whose timeout is the nearest thing due, holds the run's lease from startup to the
end, and ends the run in one order: every open request answered, the lease released,
``result.json``, the terminal status, ``run.finished`` — each write retried for
:data:`~pisub.runner.lifecycle.FINAL_WRITE_S` while the disk is full, and a run that cannot be
written left to a reader's repair.

A mode fills in small hooks, each documented below: what to prepare before the startup commit
and what to start after it (:meth:`_prepare`, :meth:`_start`, :meth:`_begin`), which dispatcher
answers its control requests (:meth:`_dispatcher_class`), one turn of its work in the loop —
its deadlines checked, the inbox scanned where it wants it, whether it is done
(:meth:`_tend`) — and what else the loop waits for (:meth:`_due`), how its end is judged
(:meth:`_conclude`) and written (:meth:`_result`, :meth:`_settle`), and what a failed start or an
unexpected failure ends (:meth:`_write_failed_start`, :meth:`_abandon`). The modes:
:class:`~pisub.runner.supervise.Supervisor` and :class:`~pisub.runner.coordinator.Coordinator`.
"""

from __future__ import annotations

import os
import selectors
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, ClassVar, Generic, TypeVar, cast

from pisub.errors import storage_error
from pisub.protocol.manifest import Manifest
from pisub.protocol.status import RunState, Status
from pisub.runner.lifecycle import (
    FINAL_WRITE_S,
    RETRY_S,
    mark_running,
    persist,
    placed_by_engine,
    take_signals,
)
from pisub.runner.recorder import Recorder, WriteTrouble
from pisub.runner.tree import ProcessTree, Subreaper
from pisub.store.paths import RunPaths
from pisub.store.runs import load_status, write_result

if TYPE_CHECKING:
    from pathlib import Path

    from pisub.protocol.lease import LeaseOwner
    from pisub.protocol.result import Result
    from pisub.runner.dispatch import Controller, Dispatcher
    from pisub.runner.inbox import InboxWatcher

Report = Callable[[dict[str, object]], None]
D = TypeVar("D", bound="Dispatcher")


class RunShell(Generic[D]):
    """One run's runner from its startup to its final files; a mode fills in the hooks."""

    LEASED: ClassVar[str]
    """What the run's lease is of, as ``runner.log`` names it (``"session lease"``)."""
    OPEN_AT_END: ClassVar[str]
    """What a control request still open when the run ends is told."""

    def __init__(self, paths: RunPaths, manifest: Manifest, report: Report, tree: ProcessTree | None) -> None:
        self.paths = paths
        self.manifest = manifest
        self.report = report
        """Answers the launcher (once: the startup committed, or why it failed)."""
        self.tree: ProcessTree = tree or Subreaper(manifest.run_id, paths.root.parent)
        self.limits = manifest.limits
        self.sel = selectors.DefaultSelector()
        self.trouble = WriteTrouble()
        self.recorder: Recorder | None = None
        self.dispatcher: D | None = None
        self.watcher: InboxWatcher | None = None
        self.lease: LeaseOwner | None = None
        self.started = time.monotonic()
        self.signalled: int | None = None
        self.scan_due = True
        self.next_scan = 0.0

    # == the run ========================================================================
    def run(self) -> int:
        """Run the run to its end; the runner's exit code (0: its final files are written)."""
        take_signals(self.sel, self._on_signal, self._on_doorbell)
        try:
            if not self._startup():
                return 1
            self._start_inbox()
            self._begin()
            self._loop()
            finished = self._finish()
            if self.manifest.queue is not None:  # its slot to the next run of its group, first
                from pisub.runs.queue import leave_run

                leave_run(self.paths)
            if finished and self.recorder is not None and self.manifest.on_done:
                from pisub.store.on_done import after_end  # after the terminal status: it never delays it

                after_end(self.paths, self.manifest, self.recorder.status.state.value)
            return 0 if finished else 1
        except BaseException:
            self._abandon()
            raise

    def _on_doorbell(self, _signum: int, _frame: object) -> None:
        self.scan_due = True

    def _on_signal(self, signum: int, _frame: object) -> None:
        self.signalled = signum

    # == the startup ====================================================================
    def _startup(self) -> bool:
        """``running`` with this runner's identity committed before anything runs (a run whose
        status never named its runner provably never started its child), then the launcher
        answered; False when the start failed (its end is written)."""
        self.recorder = Recorder(self.paths, mark_running(load_status(self.paths)), self.trouble)
        if not self._prepare(self.recorder.status):
            return False
        self._commit_startup()
        if not self._start():
            return False
        self.report({"ok": True, "pid": os.getpid()})
        return True

    def _commit_startup(self, undo: Callable[[], None] | None = None, *, durable: bool = True) -> None:
        """Commit the status now; a failure (``undo()`` first) is the launcher's answer, raised.
        ``durable=False``: renamed into place without the fsyncs (a commit that names only this
        boot's processes, made after the durable one that says the runner may start a child)."""
        assert self.recorder is not None
        try:
            self.recorder.commit(required=True, durable=durable)
        except OSError as exc:
            if undo is not None:
                undo()
            self.report({"ok": False, "error": storage_error(exc, "write", self.paths.status).message})
            raise

    def _take_lease(self, key: str) -> LeaseOwner:
        """Hold the lease of ``key`` (a session or a journal file) until the run's end.

        Raises:
            LeaseHeld: another live run holds it.
            OSError: the lease could not be written.
        """
        from pisub.store.leases import acquire

        self.lease = acquire(self.paths.home.leases, key, self.manifest.run_id, self.manifest.resumed_from)
        return self.lease

    def _release_lease(self) -> None:
        if self.lease is not None:
            from pisub.store.leases import release

            released = release(self.paths.home.leases, self.lease)
            self.event("lease.released", generation=self.lease.generation, released=released)
            self.lease = None

    def _fail_startup(self, message: str) -> None:
        """The run could not start: the requests written before the start answered, its end
        written (``failed``), the launcher told why."""
        from pisub.store.mailbox import close_inbox, settle_closed_inbox

        close_inbox(self.paths, "failed")
        settle_closed_inbox(self.paths, self.manifest.run_id, "the run failed to start")
        self._write_failed_start(message)
        self.report({"ok": False, "error": message})

    def _start_inbox(self) -> None:
        """Watch the inbox (after the startup commit, so that launching stays fast)."""
        from pisub.runner.inbox import InboxWatcher

        assert self.recorder is not None
        watcher = InboxWatcher(self.paths.inbox / "new", shared=placed_by_engine(self.manifest))
        self.watcher = watcher
        self.recorder.status.inbox = watcher.start()
        if watcher.fd is not None:  # the loop's selector wakes on an arrival: no thread
            self.sel.register(watcher.fd, selectors.EVENT_READ, lambda _mask: self._inbox_woke(watcher))
        rec = self.recorder
        # the mode is its dispatcher's controller (a Controller, or a WorkflowController)
        controller = cast("Controller", self)
        self.dispatcher = self._dispatcher_class()(
            self.paths,
            self.manifest.run_id,
            rec.status.steering,
            controller,
            rec.touch,
            self.event,
            self.trouble,
        )
        self.recorder.commit(durable=False)  # how the inbox is watched: this boot's, as the pids

    def _inbox_woke(self, watcher: InboxWatcher) -> None:
        watcher.drain()
        self.scan_due = True

    # == the loop =======================================================================
    def _loop(self) -> None:
        """Tend the mode's work until it is done, sleeping on the selector in between."""
        assert self.recorder is not None
        while True:
            now = time.monotonic()
            if self._tend(now):
                return
            for key, mask in self.sel.select(self._next_timeout(now)):
                key.data(mask)
            self.recorder.flush_due()
            self.tree.reap(self._child_pid())

    def _scan_inbox(self, now: float) -> None:
        """Answer the waiting control requests when the doorbell rang or the poll is due (and
        retry unpublished receipts every :data:`RETRY_S`)."""
        if self.dispatcher is None or self.watcher is None:
            return
        if self.scan_due or now >= self.next_scan:
            self.scan_due = False
            self.dispatcher.scan()
            retry = RETRY_S if self.dispatcher.unpublished else self.watcher.poll_interval
            self.next_scan = now + min(retry, self.watcher.poll_interval)

    def _next_timeout(self, now: float) -> float:
        """How long the loop may sleep: until the nearest deadline, scan or status write (<= 1 s)."""
        assert self.recorder is not None
        candidates = [1.0, *self._due(now)]
        if self.watcher is not None:
            candidates.append(0.0 if self.scan_due else self.next_scan - now)
        flush = self.recorder.next_flush_in()
        if flush is not None:
            candidates.append(flush)
        return max(0.0, min(candidates))

    # == the end ========================================================================
    def _finish(self) -> bool:
        """End the run: its end judged, the inbox answered, result, terminal status. False when
        the final files could not be written within :data:`FINAL_WRITE_S` (a reader repairs)."""
        state = self._conclude()
        deadline = time.monotonic() + FINAL_WRITE_S
        dispatcher = self.dispatcher
        if dispatcher is not None:
            self._carry_steers(state)
            dispatcher.fail_open(self.OPEN_AT_END)
            if not self._persist("answer the inbox", lambda: dispatcher.close(state.value), deadline):
                self._unwritten("answer the inbox", self.paths.outbox)
                return False
        if self.watcher is not None:
            if self.watcher.fd is not None:
                self.sel.unregister(self.watcher.fd)
            self.watcher.stop()
        return self._write_end(deadline)

    def _write_end(self, deadline: float | None = None) -> bool:
        """The lease released, ``result.json``, the terminal status and ``run.finished``, in
        that order (readers take a result as the end); False when a write gave up."""
        rec = self.recorder
        assert rec is not None
        result = self._result()
        deadline = deadline if deadline is not None else time.monotonic() + FINAL_WRITE_S
        # before result.json: a resume that sees the result finds the lease free (nothing of
        # this run writes what the lease guards any more)
        self._persist(f"release the {self.LEASED}", self._release_lease, deadline)
        if rec.dirty:
            # readers take the result as the end and show the status beside it (its steering
            # ledger, its steps' last activity) until the terminal one lands: bring it up to date
            rec.commit(durable=False)
        if not self._persist("write result.json", lambda: write_result(self.paths, result), deadline):
            self._unwritten("write result.json", self.paths.result)
            return False
        rec.status.state = RunState(result.state)
        rec.status.ended_at = result.ended_at
        finished = self._settle(rec.status)
        if not self._persist("write the terminal status.json", lambda: rec.commit(required=True), deadline):
            return False
        rec.event("run.finished", None, state=result.state, **finished)
        rec.close()
        return True

    def _persist(self, what: str, write: Callable[[], object], deadline: float) -> bool:
        return persist(self.trouble, what, write, deadline)

    # == bookkeeping ====================================================================
    def event(self, type_: str, child: int | None = None, **data: object) -> None:
        """Append to the run's ``events.jsonl``."""
        if self.recorder is not None:
            self.recorder.event(type_, child, **data)

    def touch(self) -> None:
        """The status changed a little (written within 250 ms)."""
        if self.recorder is not None:
            self.recorder.touch()

    def commit(self) -> None:
        """The status changed: write it now."""
        if self.recorder is not None:
            self.recorder.commit()

    # == the hooks a mode fills in ========================================================
    def _prepare(self, status: Status) -> bool:
        """Before the startup commit: take what the run needs (its lease, its steps); False
        when it cannot start (it called :meth:`_fail_startup`)."""
        raise NotImplementedError

    def _start(self) -> bool:
        """After the startup commit, before the launcher is answered: start the work; False
        when it could not start (it called :meth:`_fail_startup`)."""
        raise NotImplementedError

    def _begin(self) -> None:
        """Once the inbox is watched: start what runs beside the loop (nothing by default)."""

    def _dispatcher_class(self) -> type[D]:
        """The mode's answerer of control requests (imported when the inbox is watched)."""
        raise NotImplementedError

    def _tend(self, now: float) -> bool:
        """One turn of the loop: check the deadlines, scan the inbox (:meth:`_scan_inbox`) where
        the mode wants it, tend the work; whether the run may finish."""
        raise NotImplementedError

    def _due(self, now: float) -> list[float]:
        """How soon (seconds from ``now``) the mode has something due."""
        raise NotImplementedError

    def _child_pid(self) -> int | None:
        """The runner's own child (reaped by it), if it has one."""
        return None

    def _carry_steers(self, state: RunState) -> None:
        """Before the requests still open are failed: keep what the next run may take (a pi
        run's undelivered steers, as briefs for its resume)."""

    def _conclude(self) -> RunState:
        """The work is over: end what is left of it and judge the end; the run's final state."""
        raise NotImplementedError

    def _result(self) -> Result:
        """The run's result, as judged."""
        raise NotImplementedError

    def _settle(self, status: Status) -> dict[str, object]:
        """The terminal status's own fields (its state and end are set); what else
        ``run.finished`` says."""
        raise NotImplementedError

    def _unwritten(self, what: str, path: Path) -> None:
        """``what`` (a final write) gave up: the end the runner knows, for a reader's repair."""

    def _write_failed_start(self, message: str) -> None:
        """The run failed to start: write its end (``failed``, ``message``)."""
        raise NotImplementedError

    def _abandon(self) -> None:
        """The runner is failing unexpectedly: end (or stop) what it started."""
        raise NotImplementedError
