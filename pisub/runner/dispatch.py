"""Claiming requests from the inbox and answering each with exactly one receipt.

The runner lists ``inbox/new`` in name order, claims each file into ``inbox/cur/``, validates
it and hands it to one ``handle_<type>`` function. Every request gets one receipt in
``outbox/<id>.json``; a receipt is rewritten (atomically) as its request advances (``pending``
→ ``queued`` → ``delivered``) and never after it is final. A bad file, and a duplicate id, is
moved to ``inbox/rejected/`` with its reason — only once its receipt is durable, so a crash
never leaves a rejected file without its answer.

Receipts wait in memory until they are published (:class:`~pisub.core.fsio.BatchWriter`): when a
write fails (full disk), nothing is lost — they stay pending and every later scan retries, and
the runner goes on supervising its child meanwhile.
"""

from __future__ import annotations

import errno
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from pisub.core import fsio
from pisub.core.fsio import BatchWriter
from pisub.core.redact import preview
from pisub.errors import PisubError
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
    advance,
    request_type,
)
from pisub.store.mailbox import (
    FINISHED_REASON,
    UNCLAIMABLE_ERRNOS,
    claim,
    close_inbox,
    encode_receipt,
    make_receipt,
    mark_answered,
    new_key,
    new_mtime,
    parse_request_file,
    pending_files,
    read_receipt_or_quarantine,
    receipt_path,
    recovery_claim,
    reject_file,
    rejected_receipt,
    replace_symlinked_dirs,
    run_owner,
)
from pisub.store.paths import RunPaths

LEDGER_SIZE = 20
RECOVERY_REASON = "recovery in progress"

SteerBehavior = str  # "steer" | "followUp" (pi's streamingBehavior)
ErrorHook = Callable[[str, OSError], None]
"""Told what could not be done (``"publish receipts"``, ``"list the inbox"``...) and why."""


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
        on_error: ErrorHook,
    ) -> None:
        self.paths = paths
        self.run_id = run_id
        self.ledger = ledger
        self.controller = controller
        self.on_change = on_change
        self.on_event = on_event
        self.on_error = on_error
        self.open: dict[str, Receipt] = {}
        self.messages: dict[str, str] = {}
        """The message of each open steer or follow-up (what a carried one becomes a brief of)."""
        self._seen: set[str] = set()
        self._stuck: set[str] = set()
        """Names in ``new/`` that could be neither linked nor renamed (answered once)."""
        self._moves: list[tuple[Path, str, str]] = []
        """Rejected files to move once their receipts are published: (path, reason, id)."""
        self.batch = BatchWriter(paths.outbox)
        self.owner = run_owner(paths)
        self.closed = False

    @property
    def unpublished(self) -> int:
        """Receipts waiting for a write that failed (retried by every scan)."""
        return len(self.batch)

    # -- scanning ---------------------------------------------------------------------
    def scan(self) -> int:
        """Claim and handle every request waiting in ``inbox/new``, then publish the receipts;
        how many files were claimed. Never raises for a bad entry or a failed write."""
        for line in replace_symlinked_dirs(self.paths):
            self.on_event("control.quarantined", reason=line)
        try:
            names = pending_files(self.paths, "new")
        except PisubError:
            names = []
        claimed = 0
        for name in names:
            if name in self._stuck:
                continue
            try:
                claimed += self._take(name)
            except OSError as exc:  # the folder or the disk (full, read-only...): the next scan retries
                self.on_error("claim a request", exc)
                break
        self.publish()
        return claimed

    def _take(self, name: str) -> int:
        try:
            cur = claim(self.paths, name)
        except OSError as exc:
            if exc.errno not in UNCLAIMABLE_ERRNOS:
                raise
            self._unclaimable(name, exc)
            return 0
        if cur is None:
            return 0  # withdrawn, or claimed by someone else
        parsed = parse_request_file(cur, new_key(name), name, self.owner)
        rid = parsed.request_id
        if rid in self._seen or self._answered(rid):
            self._moves.append((cur, f"duplicate request id {rid!r}: it was already used", rid))
            return 1
        self._seen.add(rid)
        if parsed.request is None:
            self.on_event("control.rejected", id=rid, reason=parsed.error)
            self._count(ReceiptState.REJECTED)
            self._final(rejected_receipt(self.run_id, rid, parsed.error), message=None)
            self._moves.append((cur, parsed.error or "invalid request", rid))
            return 1
        request = parsed.request
        self.ledger.requested += 1
        self.on_event("control.received", id=rid, request=request_type(request))
        if self.closed:
            self._answer(request, rid, ReceiptState.FAILED, FINISHED_REASON)
        else:
            getattr(self, HANDLERS[request_type(request)])(request, rid)
        return 1

    def _answered(self, rid: str) -> bool:
        """Whether ``rid`` already has a receipt (an unreadable file in its place is quarantined:
        it is no answer)."""
        return (
            _exists(receipt_path(self.paths, rid)) and read_receipt_or_quarantine(self.paths, rid) is not None
        )

    def _unclaimable(self, name: str, exc: OSError) -> None:
        """An entry that can be neither linked nor renamed stays in ``new/``: answered once."""
        self._stuck.add(name)
        key = new_key(name)
        if key in self._seen or self._answered(key):
            return
        self._seen.add(key)
        reason = f"cannot be claimed: {exc.strerror or exc}"
        self.on_event("control.rejected", id=key, reason=reason)
        self._count(ReceiptState.REJECTED)
        self._final(rejected_receipt(self.run_id, key, reason), message=None)

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
            self.messages.pop(rid, None)
            self._count(ReceiptState.FAILED)
            advance(receipt, ReceiptState.FAILED, refusal)
            self._ledger_state(rid, ReceiptState.FAILED, receipt.updated_at)
            self._write(receipt)
        elif self.open.get(rid) is receipt and receipt.state == ReceiptState.PENDING:
            self._write(receipt)

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
        if receipt is None or receipt.state == state or not advance(receipt, state, reason):
            return
        self._count(state)
        self._ledger_state(rid, state, receipt.updated_at)
        if state.is_final:
            del self.open[rid]
            self.messages.pop(rid, None)
        self._write(receipt)
        self.publish()

    def carry(self, rid: str, reason: str) -> None:
        """An open steer kept as a brief for the run's next resume: its receipt ``scheduled``
        with ``reason`` and no targets (a brief's receipt, answered by the resume that delivers
        it); the caller has stored the brief."""
        receipt = self.open.pop(rid, None)
        self.messages.pop(rid, None)
        if receipt is None:
            return
        receipt.targets = []
        if not advance(receipt, ReceiptState.SCHEDULED, reason):
            return
        self.ledger.carried += 1
        self._ledger_state(rid, ReceiptState.SCHEDULED, receipt.updated_at)
        self._write(receipt)
        self.publish()

    def fail_open(self, reason: str) -> None:
        """Fail every request that is not final yet (the child's queue died with it).

        A request named by a pause-and-revive claim stays ``pending`` ("recovery in
        progress"): the recovering process writes its final receipt.
        """
        claimed = recovery_claim(self.paths)
        for rid in list(self.open):
            if rid == claimed:
                receipt = self.open.pop(rid)
                advance(receipt, ReceiptState.PENDING, RECOVERY_REASON)
                self._write(receipt)
            else:
                self.update(rid, ReceiptState.FAILED, reason=reason)

    def close(self, state: str) -> None:
        """Finish: tombstone first, then answer everything still waiting or open.

        Raises:
            OSError: something could not be written; calling again continues where it stopped.
        """
        self.closed = True
        close_inbox(self.paths, state)
        while True:
            before = new_mtime(self.paths)
            if not self.scan():
                break
        self.fail_open(FINISHED_REASON)
        self._commit()
        mark_answered(self.paths, before)

    def _open(self, rid: str, request: Request, child: int) -> Receipt:
        state = ReceiptState.PENDING
        receipt = make_receipt(
            self.run_id, rid, request_type(request), state, targets=[Target(child=child, state=state)]
        )
        message = request.message if isinstance(request, Steer | FollowUp) else None
        self._ledger_add(rid, request_type(request), state, message, receipt.created_at)
        self.open[rid] = receipt
        if message is not None:
            self.messages[rid] = message
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
        self._count(state)
        message = request.message if isinstance(request, Steer | FollowUp) else None
        self._final(receipt, message=message)

    def _final(self, receipt: Receipt, message: str | None) -> None:
        self._ledger_add(receipt.request_id, receipt.type, receipt.state, message, receipt.created_at)
        self._write(receipt)

    def _write(self, receipt: Receipt) -> None:
        """Queue a receipt; :meth:`publish` makes the batch durable with one sync and one
        directory fsync (a receipt appears only once it is durable)."""
        self.batch.add(receipt_path(self.paths, receipt.request_id), encode_receipt(receipt))
        self.on_change()

    def publish(self) -> bool:
        """Publish the pending receipts, then move the rejected files they answer; False (and
        everything kept for the next try) when a write failed."""
        try:
            self._commit()
        except OSError as exc:
            self.on_error("publish receipts", exc)
            return False
        return True

    def _commit(self) -> None:
        self.batch.commit()
        moves, self._moves = self._moves, []
        for path, reason, rid in moves:
            reject_file(self.paths, path, reason, rid)

    # -- the ledger -------------------------------------------------------------------
    def _count(self, state: ReceiptState) -> None:
        if state.value in ("delivered", "queued", "failed", "rejected"):
            setattr(self.ledger, state.value, getattr(self.ledger, state.value) + 1)

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


def _exists(path: Path) -> bool:
    try:
        fsio.lstat(path)
    except OSError as exc:
        return exc.errno != errno.ENOENT
    return True


HANDLERS: dict[str, str] = {
    "steer": "handle_steer",
    "follow_up": "handle_steer",
    "interrupt": "handle_interrupt",
    "stop": "handle_stop",
}
"""Request type → the name of the :class:`Dispatcher` method that handles it (a subclass — a
workflow's — may handle a type its own way)."""
