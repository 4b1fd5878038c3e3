"""Control between a workflow and its children: a request to the workflow is forwarded into
the inboxes of the children it names (:meth:`Forwarding.route`, :meth:`Forwarding.forward`)
and its receipts follow theirs; a request for a child that has not started is held and sent
when it starts (:meth:`Forwarding.release_held`); ``runs.steer`` from the script steers one child.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import msgspec

from pisub.errors import InvalidInput, PisubError
from pisub.protocol.control import Interrupt, Receipt, ReceiptState, Request, Steer, Stop
from pisub.protocol.status import children_words
from pisub.protocol.workflow import ChildResult, SteerResult
from pisub.store.paths import RunPaths
from pisub.workflow.entries import ChildEntry, ChildTable, Phase, Unstarted

MAX_HELD = 20
"""Requests held at most for one child that has not started (more are refused)."""

Forwarded = tuple[ReceiptState, str | None]
"""What became of a request for one child, and why: ``pending`` (in its inbox, or a stop held
for a child that is starting), ``scheduled`` (held until it starts), ``delivered`` (a queued
child stopped: it never starts) or ``failed``."""


@dataclass(eq=False)
class Forwarding:
    """Passes control requests and receipts between a workflow and its children."""

    table: ChildTable

    def route(self, child: int | None) -> list[int] | str:
        """The children a request goes to: every running child, or child ``child`` (by index) —
        one that has not started too (:meth:`forward` holds the request for it)."""
        with self.table.lock:
            if child is None:
                running = [e.index for e in self.table.entries if e.phase is Phase.RUNNING]
                return running or "no child of this workflow is running"
            if child >= len(self.table.entries):
                if child < len(self.table.planned):  # planned, not called yet: held for it
                    return [child]
                known = max(len(self.table.entries), len(self.table.planned))
                return f"no child {child} ({children_words(known)})"
            entry = self.table.entries[child]
        if entry.phase is Phase.ENDED:
            return f"{_name(entry)} has already ended"
        return [child]

    def forward_unstarted(self, index: int, request_id: str, request: Request) -> Forwarded:
        """A request for planned child ``index`` the script has not called yet (a chain's later
        step; the caller holds the table's lock and found no entry): a steer or follow-up is held
        for its start (``scheduled``), a stop means it never starts (``delivered``), an
        interrupt fails."""
        key = self.table.planned[index]
        name = f"child {index} ({key})"
        if self.table.ending is not None:
            return ReceiptState.FAILED, f"{name} never starts: the workflow is ending"
        early = self.table.unstarted.setdefault(index, Unstarted(key=key))
        if early.stopped is not None:
            return ReceiptState.FAILED, f"{name} was stopped before it started: it never starts"
        if isinstance(request, Interrupt):
            return ReceiptState.FAILED, f"{name} has not started yet"
        if isinstance(request, Stop):
            early.stopped = request.reason or ""
            held, early.held = early.held, []
            self.table.host.event("control.held", index, id=request_id, key=key)
            if held:  # what was held for its start fails now: it never starts
                why = "it never started: stopped by request before it started"
                self.table.host.post(lambda: self.fail_held(index, held, why))
            return ReceiptState.DELIVERED, None
        if len(early.held) >= MAX_HELD:
            why = f"has not started yet and already holds {MAX_HELD} requests for its start"
            return ReceiptState.FAILED, f"{name} {why}"
        early.held.append((request_id, request))
        self.table.host.event("control.held", index, id=request_id, key=key)
        return ReceiptState.SCHEDULED, f"{name} has not started yet: sent to it when it starts"

    def adopt(self, entry: ChildEntry, held: list[tuple[str, Request]]) -> None:
        """On the loop: the script called ``entry``, for which ``held`` came before it was
        called — sent when it starts (now, if it runs already), failed if it never does."""
        with self.table.lock:  # a call settled on the script thread is settled under it
            phase = entry.phase
            if phase is not Phase.ENDED:
                entry.held[:0] = held
        if phase is Phase.ENDED:
            result = entry.result
            if entry.run_id is not None:
                why = "it ended before the request could be sent"
            elif result is not None and result.error is not None:
                why = f"it never started: {result.error.message}"
            else:
                why = f"it never started: it ended {result.state if result is not None else 'first'}"
            self.fail_held(entry.index, held, why)
            return
        if phase is Phase.RUNNING:
            self.release_held(entry)

    def fail_unstarted(self, why: str) -> None:
        """On the loop: the workflow ends — what was held for planned children never called
        fails (they never start)."""
        with self.table.lock:
            unstarted, self.table.unstarted = self.table.unstarted, {}
        for index, early in sorted(unstarted.items()):
            self.fail_held(index, early.held, f"it never started: {why}")

    def fail_held(self, index: int, held: list[tuple[str, Request]], why: str) -> None:
        """On the loop: the requests ``held`` for child ``index``'s start fail, ``why``."""
        for rid, _request in held:
            self.table.host.receipt_moved(rid, index, ReceiptState.FAILED, why)

    def forward(self, index: int, request_id: str, request: Request) -> Forwarded:
        """Pass ``request`` to child ``index``: into its inbox when it runs (``pending``: its
        receipt follows the child's), held for its start when it has not started (``scheduled``;
        a stop of a child still starting: ``pending``), else ``failed`` and why. (A stop of a
        queued child is :meth:`~pisub.workflow.stopping.Stopping.stop_queued`'s.)"""
        entry = self.table.entries[index]
        with self.table.lock:
            phase = entry.phase
        if phase is Phase.ENDED:
            return ReceiptState.FAILED, f"{_name(entry)} has already ended"
        if phase is not Phase.RUNNING:
            return self._hold(entry, request_id, request)
        why = self._write(entry, request_id, request)
        return (ReceiptState.PENDING, None) if why is None else (ReceiptState.FAILED, why)

    def _hold(self, entry: ChildEntry, request_id: str, request: Request) -> Forwarded:
        """Keep ``request`` for ``entry``'s start (an interrupt of a child that has not started
        is refused, as is a request past :data:`MAX_HELD`)."""
        if isinstance(request, Interrupt):
            why = "has not started yet" if entry.phase is Phase.QUEUED else "is still starting"
            return ReceiptState.FAILED, f"{_name(entry)} {why}"
        if len(entry.held) >= MAX_HELD:
            why = f"has not started yet and already holds {MAX_HELD} requests for its start"
            return ReceiptState.FAILED, f"{_name(entry)} {why}"
        entry.held.append((request_id, request))
        self.table.host.event("control.held", entry.index, id=request_id, key=entry.key)
        if isinstance(request, Stop):
            return ReceiptState.PENDING, None  # it is starting: stopped as soon as it runs
        return ReceiptState.SCHEDULED, f"{_name(entry)} has not started yet: sent to it when it starts"

    def release_held(self, entry: ChildEntry) -> None:
        """``entry``'s child runs: the requests held for it go into its inbox, in order."""
        held, entry.held = entry.held, []
        for request_id, request in held:
            why = self._write(entry, request_id, request)
            state = ReceiptState.PENDING if why is None else ReceiptState.FAILED
            self.table.host.receipt_moved(request_id, entry.index, state, why)

    def _write(self, entry: ChildEntry, request_id: str, request: Request) -> str | None:
        """Write ``request`` into ``entry``'s inbox; None when written (its receipt follows the
        child's), else why not."""
        from pisub.errors import InboxClosed
        from pisub.store.mailbox import write_request

        assert entry.run_id is not None
        index = entry.index
        child_rid = forwarded_id(request_id, index)
        copy = msgspec.structs.replace(request, id=child_rid, child=None, source=self.table.source)
        try:
            write_request(self.table.home.run(entry.run_id), copy)
        except InboxClosed:
            return f"{_name(entry)} has already ended"
        except PisubError as exc:
            return f"cannot reach {_name(entry)}: {exc.message}"
        entry.forwards[child_rid] = (request_id, index)
        self.table.host.event(
            "control.forwarded", index, id=request_id, childRequest=child_rid, runId=entry.run_id
        )
        return None

    def pass_receipts(self, entry: ChildEntry, paths: RunPaths) -> None:
        """Forwarded requests: their receipts in the workflow follow the child's."""
        from pisub.store.mailbox import read_receipt

        if not entry.forwards:
            return
        for child_rid, (rid, index) in list(entry.forwards.items()):
            try:
                receipt = read_receipt(paths, child_rid)
            except PisubError:
                continue
            if receipt is None:
                continue
            self.table.host.receipt_moved(rid, index, _target_state(receipt), receipt.reason)
            if receipt.state.is_final:
                del entry.forwards[child_rid]

    def fail_forwards(self, entry: ChildEntry, outcome: ChildResult) -> None:
        """A child ended (``outcome``): pass on the receipts it wrote; what it never answered
        fails, and so does what was held for a start that never came."""
        if entry.run_id is not None and entry.forwards:
            self.pass_receipts(entry, self.table.home.run(entry.run_id))
        for rid, index in entry.forwards.values():
            self.table.host.receipt_moved(rid, index, ReceiptState.FAILED, "the child ended first")
        entry.forwards.clear()
        held, entry.held = entry.held, []
        why = outcome.error.message if outcome.error is not None else f"it ended {outcome.state}"
        self.fail_held(entry.index, held, f"it never started: {why}")

    def send_steer(self, key: str, message: str, mode: str) -> SteerResult:
        """``runs.steer`` (from the script's thread): write a steer into child ``key``'s inbox;
        ``queued``, or ``missed`` / ``failed`` naming why not."""
        from pisub.errors import InboxClosed
        from pisub.store.mailbox import write_request

        with self.table.lock:
            entry = self.table.by_key.get(key)
        if entry is None:
            raise InvalidInput(f"runs.steer: no child {key!r} was started by this workflow")
        with self.table.lock:  # every call counts, so that a replay's calls get the same ids
            rid = steer_id(self.table.spec.journal, key, entry.steers)
            entry.steers += 1
        if entry.run_id is not None and self._answered(entry.run_id, rid):
            # an earlier run of this workflow sent it, and the child answered (it may have
            # ended since): its receipt is the answer, as it was then
            return SteerResult(key=key, state="queued", request_id=rid, delivery_status="queued")
        if entry.phase is not Phase.RUNNING or entry.run_id is None:
            why = "it has not started yet" if entry.phase is not Phase.ENDED else "it has already ended"
            return SteerResult(key=key, state="missed", error=f"child {key!r}: {why}")
        request = Steer(v=1, id=rid, message=message, mode=mode, source=self.table.source)  # type: ignore[arg-type]
        try:
            request_id = write_request(self.table.home.run(entry.run_id), request)
        except InboxClosed:
            return SteerResult(key=key, state="missed", error=f"child {key!r}: it has already ended")
        except InvalidInput:  # an earlier run of this workflow sent it: its receipt answers
            request_id = rid
        except PisubError as exc:
            return SteerResult(key=key, state="failed", error=exc.message)
        return SteerResult(key=key, state="queued", request_id=request_id, delivery_status="queued")

    def _answered(self, run_id: str, request_id: str) -> bool:
        """Whether child run ``run_id`` has a receipt for ``request_id`` (an unreadable one
        counts: :meth:`steer_outcome` says why it failed)."""
        from pisub.store.mailbox import read_receipt

        try:
            return read_receipt(self.table.home.run(run_id), request_id) is not None
        except PisubError:
            return True

    def steer_outcome(self, key: str, request_id: str) -> SteerResult:
        """What became of steer ``request_id`` sent to child ``key``, as its receipt says."""
        from pisub.store.mailbox import read_receipt

        with self.table.lock:
            entry = self.table.by_key[key]
        assert entry.run_id is not None
        try:
            receipt = read_receipt(self.table.home.run(entry.run_id), request_id)
        except PisubError as exc:
            return SteerResult(key=key, state="failed", request_id=request_id, error=exc.message)
        if receipt is None or not receipt.state.is_final:
            status = receipt.delivery_status if receipt is not None else "queued"
            return SteerResult(key=key, state="queued", request_id=request_id, delivery_status=status)
        if receipt.state in (ReceiptState.DELIVERED, ReceiptState.RECOVERED):
            return SteerResult(key=key, state="delivered", request_id=request_id, delivery_status="delivered")
        # the seed's `missed`: the child was terminal (it had ended, or finished its work before it
        # took the steer: pisub/store/mailbox.py FINISHED_REASON, the pi child's own refusal)
        missed = receipt.reason is not None and ("ended" in receipt.reason or "finished" in receipt.reason)
        return SteerResult(
            key=key,
            state="missed" if missed else "failed",
            request_id=request_id,
            delivery_status=receipt.delivery_status,
            error=receipt.reason,
        )


def _name(entry: ChildEntry) -> str:
    return f"child {entry.index} ({entry.key})"


def _target_state(receipt: Receipt) -> ReceiptState:
    if receipt.state in (ReceiptState.PENDING, ReceiptState.QUEUED, ReceiptState.SCHEDULED):
        return ReceiptState.QUEUED if receipt.state != ReceiptState.PENDING else ReceiptState.PENDING
    if receipt.state in (ReceiptState.DELIVERED, ReceiptState.RECOVERED):
        return ReceiptState.DELIVERED
    return ReceiptState.FAILED


def steer_id(journal: str, key: str, ordinal: int) -> str:
    """The request id of the ``ordinal``-th ``runs.steer`` to child ``key`` of the workflow whose
    journal is ``journal``: the same in every run that resumes it, so a replayed steer the child
    already has is answered by its receipt, not sent again."""
    digest = hashlib.sha256(f"{journal}\0{key}".encode("utf-8", "surrogateescape")).hexdigest()[:24]
    return f"steer-{digest}-{ordinal}"


def forwarded_id(request_id: str, index: int) -> str:
    """The id of ``request_id`` forwarded to child ``index``: ``<id>.c<index>``, or for a long
    id its first 150 characters and a hash of the whole (two ids never share a forward)."""
    if len(request_id) <= 180:
        return f"{request_id}.c{index}"
    digest = hashlib.sha256(request_id.encode("utf-8", "surrogateescape")).hexdigest()[:16]
    return f"{request_id[:150]}.{digest}.c{index}"
