"""Ending a workflow's children with the workflow: queued ones never start, running ones are
asked to stop (or, for an interrupt, to pause), and those that do not end in time are given up;
and a queued child stopped on its own by request (:meth:`Stopping.stop_queued`).

A workflow's end reaches its running children at once: their requests are written in parallel
threads (each durably, as :func:`pisub.store.mailbox.write_request` writes any request: the
fsyncs of many children's inboxes are made together), not one child after another.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from pisub.errors import PisubError
from pisub.protocol.control import Interrupt, Request, Stop
from pisub.workflow import outcomes
from pisub.workflow.entries import ChildEntry, ChildTable, Phase
from pisub.workflow.settling import Settling

STOP_THREADS = 16
"""Children's inboxes written at once when the workflow ends (64 requests take about as long
with 8, 16 or 64 threads: their fsyncs are made together by the filesystem either way)."""


@dataclass(eq=False)
class Stopping:
    """Ends a workflow's children with it."""

    table: ChildTable
    settling: Settling

    def end_all(self, request: type[Stop] | type[Interrupt]) -> None:
        """The workflow ends: queued children never start, running ones are sent ``request``."""
        self.table.ending = request
        with self.table.lock:
            entries = list(self.table.entries)
            self.table.waiting.clear()
        self.settling.forwarding.fail_unstarted("the workflow ended before this child started")
        running = []
        with self.settling.batch():  # the queued ones end together: one status write
            for entry in entries:
                if entry.phase is Phase.QUEUED:
                    self.settling.never_started(entry, "the workflow ended before this child started")
                elif entry.phase is Phase.RUNNING:
                    running.append(entry)
        self.stop_children(running)

    def stop_children(self, entries: list[ChildEntry]) -> None:
        """Ask ``entries`` to end with the workflow, all at once (see :meth:`stop_child`)."""
        if len(entries) <= 1:
            for entry in entries:
                self.stop_child(entry)
            return
        request = self._request()
        for entry in entries:
            entry.ended_by_workflow = True
        workers = min(len(entries), STOP_THREADS)
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="stop") as pool:
            errors = list(pool.map(lambda e: self._deliver(e, request), entries))
        for error in errors:
            if error is not None:
                self.table.host.trouble("ask a child to stop", OSError(0, error))

    def stop_orphans(self) -> None:
        """Stop the children an earlier run of this workflow started that this run's script
        never asked for again (a key made of the clock): nothing a finished workflow started
        outlives it. Best effort — one that has ended takes no request. (Not when the workflow
        fails or pauses: a later resume may still ask for the key and re-attach its child.)"""
        from pisub.errors import InboxClosed, RunNotFound
        from pisub.store.mailbox import write_request

        with self.table.lock:
            asked = set(self.table.by_key)
        reason = f"workflow {self.table.manifest.run_id} ended without asking for this key again"
        for key, record in list(self.table.replayed.keys.items()):
            if key in asked or record.ended is not None or record.run_id is None:
                continue
            try:
                write_request(
                    self.table.home.run(record.run_id), Stop(v=1, reason=reason, source=self.table.source)
                )
            except (InboxClosed, RunNotFound):
                continue
            except PisubError as exc:
                self.table.host.trouble(
                    "stop a child the workflow no longer asks for", OSError(0, exc.message)
                )
                continue
            self.table.host.event("workflow.orphan_stopped", key=key, runId=record.run_id)

    def stop_queued(self, entry: ChildEntry, reason: str | None) -> bool:
        """A stop request for ``entry``: when it is queued it never starts — it ends ``stopped``,
        journaled as its key's result like a running child stopped by request (a resume does
        not start it). False when it is not queued (the request goes on as any other). Also
        for a planned child stopped before the script called it (``reason`` ``""`` for none)."""
        with self.table.lock:
            if entry.phase is not Phase.QUEUED:
                return False
            if entry in self.table.waiting:
                self.table.waiting.remove(entry)
        why = "stopped by request before it started" + (f" ({reason})" if reason else "")
        self.settling.settle(entry, outcomes.not_started(entry.key, entry.call, "stopped", why), settled=True)
        return True

    def stop_attached(self, entry: ChildEntry, reason: str | None) -> None:
        """A child stopped by request before the script called it again, and the call
        re-attached its running child (a resumed workflow): it is stopped now."""
        from pisub.errors import InboxClosed
        from pisub.store.mailbox import write_request

        if entry.phase is not Phase.RUNNING or entry.run_id is None:
            return
        why = "stopped by request before the workflow called it again" + (f" ({reason})" if reason else "")
        try:
            write_request(self.table.home.run(entry.run_id), Stop(v=1, reason=why, source=self.table.source))
        except InboxClosed:
            pass  # it has ended: the next check settles it
        except PisubError as exc:
            self.table.host.trouble("stop a child", OSError(0, exc.message))

    def give_up(self, why: str) -> None:
        """Stop waiting for the children still going (they are recorded as failed, together)."""
        with self.settling.batch():
            for entry in self.table.active():
                self.settling.settle(
                    entry, outcomes.failure(entry.key, entry.call, why, run_id=entry.run_id), settled=False
                )

    def stop_child(self, entry: ChildEntry) -> None:
        """Ask a child to end as part of the workflow's own ending (stop, or interrupt: pause)."""
        entry.ended_by_workflow = True
        error = self._deliver(entry, self._request())
        if error is not None:
            self.table.host.trouble("ask a child to stop", OSError(0, error))

    def _request(self) -> type[Stop] | type[Interrupt]:
        """What a child is sent when the workflow ends (a stop, or for an interrupt a pause)."""
        return Interrupt if self.table.ending is Interrupt else Stop

    def _deliver(self, entry: ChildEntry, kind: type[Stop] | type[Interrupt]) -> str | None:
        """Write ``kind`` into ``entry``'s inbox (from any thread: it touches nothing but that
        inbox); why it could not be, or None."""
        from pisub.errors import InboxClosed
        from pisub.store.mailbox import write_request

        assert entry.run_id is not None
        request: Request = kind(
            v=1, reason=f"workflow {self.table.manifest.run_id} is ending", source=self.table.source
        )
        try:
            write_request(self.table.home.run(entry.run_id), request)
        except InboxClosed:
            pass  # it has ended: the next check settles it
        except PisubError as exc:
            return exc.message
        except Exception as exc:  # never lost in a thread
            return f"{type(exc).__name__}: {exc}"
        return None
