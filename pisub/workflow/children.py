"""A workflow's children: admitting the script's calls, placing, starting, watching and
settling child runs, ending them with the workflow, and passing control requests and receipts
between the workflow and them — one module a job, put together by :class:`ChildRuns`.

Calls are admitted from the script's thread (:mod:`~pisub.workflow.admission`) and run on the
coordinator's control loop; :attr:`~pisub.workflow.entries.ChildTable.lock` guards the entries
between the two. Every start is journaled (durably) before the child's run is created, every end
once its result is in (:mod:`pisub.store.journal`).
"""

from __future__ import annotations

import contextlib

from pisub.protocol.control import Interrupt, ReceiptState, Request, Stop
from pisub.protocol.manifest import Manifest
from pisub.protocol.result import SingleResult
from pisub.protocol.status import StepStatus
from pisub.store.journal import Journal, Replay
from pisub.store.paths import Home
from pisub.workflow.admission import Admission
from pisub.workflow.entries import ChildEntry, ChildTable, Host, Phase
from pisub.workflow.forwarding import Forwarded, Forwarding
from pisub.workflow.host_steps import HostSteps
from pisub.workflow.launching import Launching
from pisub.workflow.placement import Placement
from pisub.workflow.settling import Settling
from pisub.workflow.stopping import Stopping
from pisub.workflow.watch import ChildWatch


class ChildRuns:
    """The children of one workflow run: what its coordinator asks of them, each answered by
    the job it belongs to (:attr:`admission` and :attr:`forwarding` serve the script too)."""

    def __init__(
        self,
        host: Host,
        home: Home,
        manifest: Manifest,
        steps: list[StepStatus],
        journal: Journal,
        replayed: Replay,
    ) -> None:
        self.table = ChildTable(host, home, manifest, steps, journal, replayed)
        self.placement = Placement(self.table)
        self.forwarding = Forwarding(self.table)
        self.settling = Settling(self.table, self.placement, self.forwarding)
        self.stopping = Stopping(self.table, self.settling)
        self.launching = Launching(self.table, self.placement, self.settling, self.stopping)
        self.admission = Admission(self.table, self.placement, self.launching, self.settling, self.stopping)
        self.hosts = HostSteps(self.table)
        """The ``runs.host`` steps (a named resource's workflow)."""
        self.table.host_keys = self.hosts.known
        self.watch: ChildWatch = self.table.watch
        """The inotify watch of the running children's run directories."""

    @property
    def next_poll(self) -> float:
        """When the running children are looked at again even if no watch fired."""
        return self.settling.next_poll

    def active(self) -> list[ChildEntry]:
        """The children starting or running."""
        return self.table.active()

    def results(self) -> list[SingleResult]:
        """One entry of the workflow's ``details.results`` per child that has an outcome."""
        return self.table.results()

    def ended_runners(self) -> set[int]:
        """The pids of the runners of the children that ended (each wrote its terminal status;
        it may still be exiting)."""
        with self.table.lock:
            return {
                e.step.pid for e in self.table.entries if e.phase is Phase.ENDED and e.step.pid is not None
            }

    def leftovers(self) -> list[str]:
        """The calls ``main`` returned without waiting for: never awaited, or still running."""
        return self.table.leftovers()

    def never_ran(self) -> list[str]:
        """The keys whose child ended without ever starting (the workflow cannot be complete)."""
        return self.table.never_ran()

    def batch(self) -> contextlib.AbstractContextManager[None]:
        """On the control loop: the ends settled (and the runs created) in the body are made
        durable in the journal with one fsync at its end (see :meth:`Settling.batch`)."""
        return self.settling.batch()

    def launch_waiting(self) -> None:
        """Start queued children while the workflow's concurrency allows."""
        self.launching.launch_waiting()

    def check(self, now: float) -> None:
        """Look at the children whose runs changed (all of them when a poll is due)."""
        self.settling.check(now)

    def end_all(self, request: type[Stop] | type[Interrupt]) -> None:
        """The workflow ends: queued children never start, running ones are sent ``request``."""
        self.stopping.end_all(request)

    def stop_orphans(self) -> None:
        """Stop the live children of earlier runs this run's script never asked for again."""
        self.stopping.stop_orphans()

    def give_up(self, why: str) -> None:
        """Stop waiting for the children still going (they are recorded as failed)."""
        self.stopping.give_up(why)

    def route(self, child: int | None) -> list[int] | str:
        """The children a request goes to, or why it goes to none."""
        return self.forwarding.route(child)

    def forward(self, index: int, request_id: str, request: Request) -> Forwarded:
        """Pass ``request`` to child ``index``: a stop of a queued child, or of a planned one the
        script has not called yet, ends it at once (it never starts); anything else is forwarded
        into its inbox, or held for its start."""
        with self.table.lock:  # the script thread calls children meanwhile
            if index >= len(self.table.entries):  # planned, not called yet (a chain's later step)
                return self.forwarding.forward_unstarted(index, request_id, request)
        if isinstance(request, Stop) and self.stopping.stop_queued(self.table.entries[index], request.reason):
            return ReceiptState.DELIVERED, None
        return self.forwarding.forward(index, request_id, request)

    def prestart_zygote(self) -> None:
        """Start the fork server of warm runners now, when the workflow will start several children."""
        self.launching.prestart_zygote()

    def dismiss_zygote(self) -> None:
        """End the fork server of warm runners (no child starts any more)."""
        self.launching.dismiss_zygote()

    def close(self) -> None:
        self.launching.close()
        self.table.watch.close()
        self.table.journal.close()
