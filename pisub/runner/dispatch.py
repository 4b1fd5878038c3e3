"""Claiming requests from the inbox and answering each with exactly one receipt.

The runner lists ``inbox/new`` in name order, claims each file by renaming it into
``inbox/cur/``, validates it and hands it to one ``handle_<type>`` function. Every
request gets one receipt in ``outbox/<id>.json``; a receipt is rewritten (atomically) as
its request advances (``pending`` → ``queued`` → ``delivered``) and never after it is
final. A bad file is moved to ``inbox/rejected/`` with its reason; a duplicate id too,
leaving the first request's receipt alone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from pisub.fsio import BatchWriter
from pisub.mailbox import (
    FINISHED_REASON,
    claim,
    close_inbox,
    delivery_status,
    encode_receipt,
    make_receipt,
    mark_answered,
    parse_request_file,
    pending_files,
    receipt_path,
    recovery_claim,
    reject_file,
    write_receipt,
)
from pisub.paths import RunPaths
from pisub.protocol.codec import now_iso
from pisub.protocol.control import (
    FollowUp,
    Interrupt,
    Ledger,
    LedgerEntry,
    Receipt,
    ReceiptState,
    Request,
    Steer,
    Stop,
    Target,
    request_type,
)
from pisub.redact import preview

LEDGER_SIZE = 20
RECOVERY_REASON = "recovery in progress"

SteerBehavior = str  # "steer" | "followUp" (pi's streamingBehavior)


class Controller(Protocol):
    """What the dispatcher needs from the supervisor."""

    def steer(self, child: int, request_id: str, message: str, behavior: SteerBehavior) -> str | None:
        """Hand a message to a child; None when accepted for delivery, else why not."""

    def interrupt(self, child: int | None, reason: str | None) -> str | None:
        """Abort the child's work (run ends ``paused``); None when done, else why not."""

    def stop(self, child: int | None, reason: str | None) -> str | None:
        """End the child (run ends ``stopped``); None when done, else why not."""


class Dispatcher:
    """Turns inbox files into actions and receipts, and keeps the steering ledger."""

    def __init__(
        self,
        paths: RunPaths,
        run_id: str,
        ledger: Ledger,
        controller: Controller,
        on_change: Callable[[], None],
        on_event: Callable[..., None],
    ) -> None:
        self.paths = paths
        self.run_id = run_id
        self.ledger = ledger
        self.controller = controller
        self.on_change = on_change
        self.on_event = on_event
        self.open: dict[str, Receipt] = {}
        self._seen: set[str] = set()
        self.batch = BatchWriter(paths.outbox)
        self.closed = False

    # -- scanning ---------------------------------------------------------------------
    def scan(self) -> int:
        """Claim and handle every request waiting in ``inbox/new``; how many were taken."""
        names = pending_files(self.paths, "new")
        for name in names:
            self._take(name)
        self._sync()
        return len(names)

    def _take(self, name: str) -> None:
        cur = claim(self.paths, name)
        if cur is None:
            return  # withdrawn, or claimed by someone else
        parsed = parse_request_file(cur, name)
        rid = parsed.request_id
        if rid in self._seen or receipt_path(self.paths, rid).exists():
            reject_file(self.paths, cur, f"duplicate request id {rid!r}: it was already used", name)
            return
        self._seen.add(rid)
        if parsed.request is None:
            self.on_event("control.rejected", id=rid, reason=parsed.error)
            self._count("rejected")
            self._final(
                make_receipt(self.run_id, rid, "unknown", ReceiptState.REJECTED, reason=parsed.error),
                message=None,
            )
            reject_file(self.paths, cur, parsed.error or "invalid request", name)  # after its receipt
            return
        request = parsed.request
        self.ledger.requested += 1
        self.on_event("control.received", id=rid, request=request_type(request))
        if self.closed:
            self._answer(request, rid, ReceiptState.FAILED, FINISHED_REASON)
            return
        HANDLERS[request_type(request)](self, request, rid)

    # -- handlers -----------------------------------------------------------------------
    def handle_steer(self, request: Request, rid: str) -> None:
        assert isinstance(request, Steer | FollowUp)
        follow = isinstance(request, FollowUp) or request.mode == "follow_up"
        child = request.child or 0
        # Open in memory first: a refusal is answered with one final receipt, no "pending" before it.
        receipt = self._open(rid, request, child)
        refusal = self.controller.steer(child, rid, request.message, "followUp" if follow else "steer")
        if refusal is not None:
            self.open.pop(rid, None)
            self._count("failed")
            self._ledger_state(rid, ReceiptState.FAILED, now_iso())
            receipt.state = ReceiptState.FAILED
            receipt.reason = refusal
            for target in receipt.targets:
                target.state, target.reason = ReceiptState.FAILED, refusal
            self._write_batched(receipt)
        elif self.open.get(rid) is receipt and receipt.state == ReceiptState.PENDING:
            self._write_batched(receipt)

    def handle_interrupt(self, request: Request, rid: str) -> None:
        assert isinstance(request, Interrupt)
        refusal = self.controller.interrupt(request.child, request.reason)
        state = ReceiptState.FAILED if refusal else ReceiptState.DELIVERED
        self._answer(request, rid, state, refusal, child=request.child or 0)

    def handle_stop(self, request: Request, rid: str) -> None:
        assert isinstance(request, Stop)
        refusal = self.controller.stop(request.child, request.reason)
        state = ReceiptState.FAILED if refusal else ReceiptState.DELIVERED
        self._answer(request, rid, state, refusal, child=request.child or 0)

    # -- receipts ---------------------------------------------------------------------
    def update(self, rid: str, state: ReceiptState, *, reason: str | None = None) -> None:
        """Advance an open request (called by children as pi reports progress)."""
        receipt = self.open.get(rid)
        if receipt is None or receipt.state == state:
            return
        now = now_iso()
        receipt.state = state
        receipt.delivery_status = delivery_status(state)
        receipt.reason = reason
        receipt.updated_at = now
        for target in receipt.targets:
            target.state = state
            target.reason = reason
            if state == ReceiptState.DELIVERED:
                target.delivered_at = now
        self._count(state.value)
        self._ledger_state(rid, state, now)
        if state.is_final:
            del self.open[rid]
        if receipt_path(self.paths, rid) in self.batch:  # not yet published: replace the queued copy
            self.batch.add(receipt_path(self.paths, rid), encode_receipt(receipt))
        else:
            write_receipt(self.paths, receipt)
        self.on_change()

    def fail_open(self, reason: str) -> None:
        """Fail every request that is not final yet (the child's queue died with it).

        A request named by a pause-and-revive claim stays ``pending`` ("recovery in
        progress"): the recovering process writes its final receipt.
        """
        claimed = recovery_claim(self.paths)
        for rid in list(self.open):
            if rid == claimed:
                receipt = self.open[rid]
                receipt.state = ReceiptState.PENDING
                receipt.reason = RECOVERY_REASON
                receipt.updated_at = now_iso()
                write_receipt(self.paths, receipt)
            else:
                self.update(rid, ReceiptState.FAILED, reason=reason)

    def close(self, state: str) -> None:
        """Finish: tombstone first, then answer everything still waiting or open."""
        self.closed = True
        close_inbox(self.paths, state)
        self.scan()
        self.fail_open(FINISHED_REASON)
        mark_answered(self.paths)

    def _open(self, rid: str, request: Request, child: int) -> Receipt:
        state = ReceiptState.PENDING
        receipt = make_receipt(
            self.run_id, rid, request_type(request), state, targets=[Target(child=child, state=state)]
        )
        message = request.message if isinstance(request, Steer | FollowUp) else None
        self._ledger_add(rid, request_type(request), state, message, receipt.created_at)
        self.open[rid] = receipt
        return receipt

    def _answer(
        self, request: Request, rid: str, state: ReceiptState, reason: str | None, child: int = 0
    ) -> None:
        target = Target(
            child=child,
            state=state,
            reason=reason,
            delivered_at=now_iso() if state == ReceiptState.DELIVERED else None,
        )
        receipt = make_receipt(
            self.run_id, rid, request_type(request), state, reason=reason, targets=[target]
        )
        self._count(state.value)
        message = request.message if isinstance(request, Steer | FollowUp) else None
        self._final(receipt, message=message)

    def _final(self, receipt: Receipt, message: str | None) -> None:
        self._ledger_add(receipt.request_id, receipt.type, receipt.state, message, receipt.created_at)
        self._write_batched(receipt)

    def _write_batched(self, receipt: Receipt) -> None:
        """Queue a receipt of this scan; :meth:`_sync` publishes the batch with one filesystem
        sync and one directory fsync (receipts appear only once they are durable)."""
        self.batch.add(receipt_path(self.paths, receipt.request_id), encode_receipt(receipt))
        self.on_change()

    def _sync(self) -> None:
        self.batch.commit()

    # -- the ledger -------------------------------------------------------------------
    def _count(self, state: str) -> None:
        if state in ("delivered", "queued", "failed", "rejected"):
            setattr(self.ledger, state, getattr(self.ledger, state) + 1)

    def _ledger_add(self, rid: str, type_: str, state: ReceiptState, message: str | None, at: str) -> None:
        entry = LedgerEntry(
            id=rid, type=type_, state=state, preview=preview(message or ""), requested_at=at, updated_at=at
        )
        self.ledger.recent.append(entry)
        del self.ledger.recent[:-LEDGER_SIZE]

    def _ledger_state(self, rid: str, state: ReceiptState, at: str) -> None:
        for entry in reversed(self.ledger.recent):
            if entry.id == rid:
                entry.state = state
                entry.updated_at = at
                return


HANDLERS: dict[str, Callable[[Dispatcher, Request, str], None]] = {
    "steer": Dispatcher.handle_steer,
    "follow_up": Dispatcher.handle_steer,
    "interrupt": Dispatcher.handle_interrupt,
    "stop": Dispatcher.handle_stop,
}
